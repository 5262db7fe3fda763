#include "nn/functional.h"

#include <cstring>
#include <string>

#include "autograd/factories.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace nn {
namespace functional {
namespace {

Tensor Reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::kMean:
      return Mean(loss);
    case Reduction::kSum:
      return Sum(loss);
    case Reduction::kNone:
      break;
  }
  return loss;
}

void CheckSameShape(const char* op, const Tensor& input, const Tensor& target) {
  TG_CHECK(input.shape() == target.shape(), op, ": input ", ShapeToString(input.shape()),
           " and target ", ShapeToString(target.shape()), " differ in shape");
}

}  // namespace

Tensor relu(const Tensor& x) { return Relu(x); }
Tensor gelu(const Tensor& x, const GELUFuncOptions& options) {
  const std::string approximate = options.approximate();
  TG_CHECK(approximate == "none" || approximate == "tanh",
           "gelu: approximate must be 'none' or "
           "'tanh', got '",
           approximate, "'");
  return approximate == "tanh" ? GeluTanh(x) : Gelu(x);
}
Tensor silu(const Tensor& x) { return Silu(x); }
Tensor sigmoid(const Tensor& x) { return tg::Sigmoid(x); }
Tensor tanh(const Tensor& x) { return Tanh(x); }
Tensor leaky_relu(const Tensor& x, const LeakyReLUFuncOptions& options) {
  // x where x > 0, slope * x elsewhere (the gradient slope there, as torch's).
  return Where(tg::Gt(x.data(), RawTensor::Scalar(0, x.dtype()).to(x.device())), x,
               MulScalar(x, options.negative_slope()));
}
Tensor softmax(const Tensor& x, const SoftmaxFuncOptions& options) {
  return x.softmax(options.dim());
}
Tensor log_softmax(const Tensor& x, const LogSoftmaxFuncOptions& options) {
  return x.log_softmax(options.dim());
}
Tensor dropout(const Tensor& x, const DropoutFuncOptions& options) {
  return dropout(x, options, DefaultGenerator());
}
Tensor dropout(const Tensor& x, const DropoutFuncOptions& options, Generator& gen) {
  TG_CHECK(options.p() >= 0 && options.p() <= 1, "dropout: p must be in [0, 1], got ", options.p());
  if (!options.training() || options.p() == 0) return x;
  if (options.p() == 1) return MulScalar(x, 0);
  return Dropout(x, options.p(), gen, /*training=*/true);
}

Tensor dropout2d(const Tensor& x, const Dropout2dFuncOptions& options) {
  return dropout2d(x, options, DefaultGenerator());
}
Tensor dropout2d(const Tensor& x, const Dropout2dFuncOptions& options, Generator& gen) {
  const double p = options.p();
  TG_CHECK(p >= 0 && p <= 1, "dropout2d: p must be in [0, 1], got ", p);
  TG_CHECK(x.dim() == 3 || x.dim() == 4, "dropout2d: expects a 3-D [C, H, W] or 4-D [N, C, H, W] ",
           "input, got ", ShapeToString(x.shape()));
  if (!options.training() || p == 0) return x;
  if (p == 1) return MulScalar(x, 0);
  // One draw per channel: kept iff u >= p, then scaled by 1/(1-p) (PyTorch's bernoulli(1 - p)).
  Shape mask_shape(x.shape().size(), 1);
  const size_t channels = x.dim() == 4 ? 2 : 1;
  for (size_t d = 0; d < channels; ++d) mask_shape[d] = x.size(static_cast<int64_t>(d));
  const RawTensor u = RandUniform(mask_shape, gen);
  const RawTensor keep = tg::Ge(u, RawTensor::Scalar(p, kF32)).to(x.dtype()).to(x.device());
  return MulScalar(Mul(x, Tensor(keep)), 1.0 / (1.0 - p));
}

namespace {
// [N, C, H, W] (or [C, H, W]) as [N * C, 1, H, W], so that a per-channel window op is one
// single-channel convolution.
Tensor AsOneChannel(const Tensor& x, const char* op) {
  TG_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expects a 3-D [C, H, W] or 4-D [N, C, H, W] ",
           "input, got ", ShapeToString(x.shape()));
  return Reshape(x, {-1, 1, x.size(-2), x.size(-1)});
}
Tensor FromOneChannel(const Tensor& y, const Tensor& x) {
  Shape shape = x.shape();
  shape[shape.size() - 2] = y.size(2);
  shape[shape.size() - 1] = y.size(3);
  return Reshape(y, shape);
}
void CheckWindow(const char* op, const ExpandingArray<2>& kernel, const ExpandingArray<2>& stride,
                 const ExpandingArray<2>& padding, bool ceil_mode) {
  for (int i = 0; i < 2; ++i) {
    TG_CHECK(kernel[i] > 0 && stride[i] > 0, op, ": kernel_size and stride must be positive");
    TG_CHECK(padding[i] >= 0 && 2 * padding[i] <= kernel[i], op,
             ": padding should be at most half of the kernel size, got padding ", padding[i],
             " for kernel ", kernel[i]);
  }
  TG_CHECK(!ceil_mode, op, ": ceil_mode=true is not supported");
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dFuncOptions& options) {
  TG_CHECK(options.groups() == 1, "conv2d: groups=", options.groups(), " is not supported");
  Conv2dParams params;
  params.stride = options.stride();
  params.padding = options.padding();
  params.dilation = options.dilation();
  return Conv2d(x, weight, options.bias(), params);
}

namespace {
// x with stride - 1 zeros between neighbours along dim d: n -> (n - 1) * stride + 1.
Tensor ZeroInsert(const Tensor& x, int64_t d, int64_t stride) {
  if (stride == 1 || x.size(d) <= 1) return x;
  const Tensor spread = Unsqueeze(x, d + 1);  // [.., n, 1, ..]
  Shape zeros_shape = spread.shape();
  zeros_shape[static_cast<size_t>(d + 1)] = stride - 1;
  const Tensor zeros(RawTensor::Zeros(zeros_shape, x.dtype(), x.device()));
  Shape merged = x.shape();
  merged[static_cast<size_t>(d)] = x.size(d) * stride;
  return Narrow(Reshape(Cat({spread, zeros}, d + 1), merged), d, 0, (x.size(d) - 1) * stride + 1);
}
// x with n zeros appended along dim d.
Tensor ZeroPadEnd(const Tensor& x, int64_t d, int64_t n) {
  if (n == 0) return x;
  Shape zeros_shape = x.shape();
  zeros_shape[static_cast<size_t>(d)] = n;
  return Cat({x, Tensor(RawTensor::Zeros(zeros_shape, x.dtype(), x.device()))}, d);
}
// x reversed along dim d.
Tensor Flip(const Tensor& x, int64_t d) {
  std::vector<int64_t> reversed(static_cast<size_t>(x.size(d)));
  for (size_t i = 0; i < reversed.size(); ++i) {
    reversed[i] = static_cast<int64_t>(reversed.size() - 1 - i);
  }
  const RawTensor index =
      RawTensor::FromVector(reversed, {static_cast<int64_t>(reversed.size())}).to(x.device());
  return Transpose(IndexSelect(Transpose(x, 0, d), index), 0, d);
}
}  // namespace

Tensor conv_transpose2d(const Tensor& x, const Tensor& weight,
                        const ConvTranspose2dFuncOptions& options) {
  TG_CHECK(options.groups() == 1, "conv_transpose2d: groups=", options.groups(),
           " is not supported");
  TG_CHECK(x.dim() == 3 || x.dim() == 4, "conv_transpose2d: expects [N, C, H, W] or [C, H, W], ",
           "got ", ShapeToString(x.shape()));
  if (x.dim() == 3) return Squeeze(conv_transpose2d(Unsqueeze(x, 0), weight, options), 0);
  TG_CHECK(weight.dim() == 4 && weight.size(0) == x.size(1), "conv_transpose2d: weight ",
           ShapeToString(weight.shape()), " does not take ", x.size(1), " input channels (input ",
           ShapeToString(x.shape()), ")");
  Tensor h = x;
  Conv2dParams params;
  params.dilation = options.dilation();
  int64_t crop[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t d = 2 + i;
    const int64_t s = options.stride()[i], dil = options.dilation()[i];
    const int64_t op = options.output_padding()[i];
    TG_CHECK(s > 0 && dil > 0 && options.padding()[i] >= 0 && op >= 0 && (op < s || op < dil),
             "conv_transpose2d: needs positive stride and dilation, non-negative padding and an ",
             "output padding smaller than either stride or dilation");
    const int64_t pad = dil * (weight.size(d) - 1) - options.padding()[i];
    h = ZeroPadEnd(ZeroInsert(h, d, s), d, op);
    params.padding[static_cast<size_t>(i)] = pad > 0 ? pad : 0;
    crop[i] = pad < 0 ? -pad : 0;  // a padding beyond the kernel's reach removes outputs
  }
  const Tensor w = Transpose(Flip(Flip(weight, 2), 3), 0, 1).contiguous();  // [O, C, kh, kw]
  Tensor y = Conv2d(h, w, options.bias(), params);
  for (int i = 0; i < 2; ++i) {
    if (crop[i] > 0) y = Narrow(y, 2 + i, crop[i], y.size(2 + i) - 2 * crop[i]);
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, const MaxPool2dFuncOptions& options) {
  CheckWindow("max_pool2d", options.kernel_size(), options.stride(), options.padding(),
              options.ceil_mode());
  TG_CHECK(options.dilation() == ExpandingArray<2>(1), "max_pool2d: dilation is not supported");
  if (x.dim() == 3) return Squeeze(max_pool2d(Unsqueeze(x, 0), options), 0);
  return MaxPool2d(x, options.kernel_size(), options.stride(), options.padding());
}

Tensor avg_pool2d(const Tensor& x, const AvgPool2dFuncOptions& options) {
  CheckWindow("avg_pool2d", options.kernel_size(), options.stride(), options.padding(),
              options.ceil_mode());
  const ExpandingArray<2>& k = options.kernel_size();
  Conv2dParams params;
  params.stride = options.stride();
  params.padding = options.padding();
  // Window sums as a convolution with a kernel of ones, then one division per window.
  const Tensor ones(RawTensor::Ones({1, 1, k[0], k[1]}, x.dtype()).to(x.device()));
  const Tensor sums = Conv2d(AsOneChannel(x, "avg_pool2d"), ones, Tensor(), params);
  Tensor y;
  if (options.divisor_override().has_value()) {
    TG_CHECK(*options.divisor_override() != 0, "avg_pool2d: divisor must be not zero");
    y = MulScalar(sums, 1.0 / static_cast<double>(*options.divisor_override()));
  } else if (options.count_include_pad() || (params.padding[0] == 0 && params.padding[1] == 0)) {
    y = MulScalar(sums, 1.0 / static_cast<double>(k[0] * k[1]));
  } else {
    // Each window's count of real (unpadded) elements: the same convolution of ones.
    const Tensor real(RawTensor::Ones({1, 1, x.size(-2), x.size(-1)}, x.dtype()).to(x.device()));
    const Tensor counts = Conv2d(real, ones, Tensor(), params).detach();
    y = Div(sums, counts);
  }
  return FromOneChannel(y, x);
}

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const BatchNormFuncOptions& options) {
  TG_CHECK(x.dim() >= 2, "batch_norm: expects [N, C, ...], got ", ShapeToString(x.shape()));
  TG_CHECK(running_mean.defined() == running_var.defined(),
           "batch_norm: running_mean and running_var must both be given or both be undefined");
  const int64_t c = x.size(1);
  Shape per_channel(x.shape().size(), 1);
  per_channel[1] = c;
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  const Tensor weight = options.weight(), bias = options.bias();
  for (const Tensor* t : {&running_mean, &running_var, &weight, &bias}) {
    TG_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == c), "batch_norm: expects [", c,
             "] statistics, weight and bias for input ", ShapeToString(x.shape()), ", got ",
             ShapeToString(t->shape()));
  }
  Tensor centered, var;
  if (options.training() || !running_mean.defined()) {
    const int64_t n = x.numel() / c;
    TG_CHECK(n > 1 || !options.training(),
             "batch_norm: expected more than 1 value per channel when training, got input size ",
             ShapeToString(x.shape()));
    const Tensor mean = Mean(x, dims, /*keepdim=*/true);
    centered = Sub(x, mean);
    var = Mean(Mul(centered, centered), dims, /*keepdim=*/true);  // biased
    if (options.training() && running_mean.defined()) {
      NoGradGuard no_grad;
      const double m = options.momentum();
      const double unbiased = static_cast<double>(n) / static_cast<double>(n - 1);
      const Tensor new_mean =
          Add(MulScalar(running_mean.detach(), 1 - m),
              MulScalar(Reshape(mean.detach(), {c}).to(running_mean.dtype()), m));
      const Tensor new_var =
          Add(MulScalar(running_var.detach(), 1 - m),
              MulScalar(Reshape(var.detach(), {c}).to(running_var.dtype()), m * unbiased));
      running_mean.data().copy_(new_mean.data());
      running_var.data().copy_(new_var.data());
    }
  } else {
    centered = Sub(x, Reshape(running_mean.detach().to(x.dtype()), per_channel));
    var = Reshape(running_var.detach().to(x.dtype()), per_channel);
  }
  Tensor y = Mul(centered, Pow(AddScalar(var, options.eps()), -0.5));
  if (weight.defined()) y = Mul(y, Reshape(weight, per_channel));
  if (bias.defined()) y = Add(y, Reshape(bias, per_channel));
  return y;
}

Tensor group_norm(const Tensor& x, const GroupNormFuncOptions& options) {
  const int64_t g = options.num_groups();
  TG_CHECK(x.dim() >= 2, "group_norm: expects [N, C, ...], got ", ShapeToString(x.shape()));
  const int64_t n = x.size(0), c = x.size(1);
  TG_CHECK(g > 0 && c % g == 0, "group_norm: expected number of channels in input to be ",
           "divisible by num_groups, but got input of shape ", ShapeToString(x.shape()),
           " and num_groups=", g);
  const Tensor grouped = Reshape(x, {n, g, -1});
  const Tensor mean = Mean(grouped, {2}, /*keepdim=*/true);
  const Tensor centered = Sub(grouped, mean);
  const Tensor var = Mean(Mul(centered, centered), {2}, /*keepdim=*/true);
  Tensor y = Reshape(Mul(centered, Pow(AddScalar(var, options.eps()), -0.5)), x.shape());
  Shape per_channel(x.shape().size(), 1);
  per_channel[1] = c;
  const Tensor weight = options.weight(), bias = options.bias();
  for (const Tensor* t : {&weight, &bias}) {
    TG_CHECK(!t->defined() || (t->dim() == 1 && t->size(0) == c), "group_norm: expects [", c,
             "] weight and bias, got ", ShapeToString(t->shape()));
  }
  if (weight.defined()) y = Mul(y, Reshape(weight, per_channel));
  if (bias.defined()) y = Add(y, Reshape(bias, per_channel));
  return y;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossFuncOptions& options) {
  CheckSameShape("mse_loss", input, target);
  const Tensor d = Sub(input, target.detach());
  return Reduce(Mul(d, d), options.reduction());
}

Tensor l1_loss(const Tensor& input, const Tensor& target, const L1LossFuncOptions& options) {
  CheckSameShape("l1_loss", input, target);
  return Reduce(Abs(Sub(input, target.detach())), options.reduction());
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      const SmoothL1LossFuncOptions& options) {
  CheckSameShape("smooth_l1_loss", input, target);
  const double beta = options.beta();
  TG_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  const Tensor d = Sub(input, target.detach());
  const Tensor a = Abs(d);
  if (beta == 0) return Reduce(a, options.reduction());
  const Tensor quadratic = MulScalar(Mul(d, d), 0.5 / beta);
  const Tensor linear = AddScalar(a, -0.5 * beta);
  return Reduce(
      Where(tg::Lt(a.data(), RawTensor::Scalar(beta, a.dtype()).to(a.device())), quadratic, linear),
      options.reduction());
}

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BinaryCrossEntropyFuncOptions& options) {
  CheckSameShape("binary_cross_entropy", input, target);
  const Tensor y = target.detach();
  // -(y log x + (1 - y) log(1 - x)), each log at least -100.
  const Tensor log_x = Log(input).clamp_min(-100);
  const Tensor log_1mx = Log(AddScalar(Neg(input), 1)).clamp_min(-100);
  Tensor loss = Neg(Add(Mul(y, log_x), Mul(AddScalar(Neg(y), 1), log_1mx)));
  if (options.weight().defined()) loss = Mul(loss, options.weight().detach());
  return Reduce(loss, options.reduction());
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossFuncOptions& options) {
  TG_CHECK(input.dim() == 2 && target.dim() == 1 && target.size(0) == input.size(0),
           "nll_loss: expects input [N, C] and target [N], got ", ShapeToString(input.shape()),
           " and ", ShapeToString(target.shape()));
  TG_CHECK(target.dtype() == kI64 || target.dtype() == kI32,
           "nll_loss: target must hold class indices (i64), got ", DTypeName(target.dtype()));
  // -input[i, target[i]] for the rows not ignored; mean over those rows.
  const RawTensor t = target.data().to(kI64);
  const RawTensor keep =
      tg::Ne(t, RawTensor::Scalar(static_cast<double>(options.ignore_index()), kI64));
  const std::vector<int64_t> ids = t.to_vector<int64_t>();
  const int64_t classes = input.size(1);
  std::vector<int64_t> safe(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool ignored = ids[i] == options.ignore_index();
    TG_CHECK(ignored || (ids[i] >= 0 && ids[i] < classes), "nll_loss: target ", ids[i],
             " is out of bounds for ", classes, " classes");
    safe[i] = ignored ? 0 : ids[i];
  }
  const RawTensor index = RawTensor::FromVector(safe, {input.size(0), 1}).to(input.device());
  const Tensor picked = Reshape(Gather(input, 1, index), {input.size(0)});
  Tensor mask(keep.to(input.dtype()).to(input.device()));
  if (options.weight().defined()) {
    const Tensor& w = options.weight();
    TG_CHECK(w.dim() == 1 && w.size(0) == classes, "nll_loss: weight must be [", classes, "], got ",
             ShapeToString(w.shape()));
    mask = Mul(mask, IndexSelect(w.detach().to(input.dtype()), index.reshape({input.size(0)})));
  }
  const Tensor loss = Neg(Mul(picked, mask));
  switch (options.reduction()) {
    case Reduction::kNone:
      return loss;
    case Reduction::kSum:
      return Sum(loss);
    case Reduction::kMean:
      break;
  }
  return Div(Sum(loss), Sum(mask));
}

Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyFuncOptions& options) {
  TG_CHECK(options.label_smoothing() == 0,
           "cross_entropy: label_smoothing is not supported here yet; use "
           "tg::nn::CrossEntropyLoss with CrossEntropyOptions::label_smoothing");
  TG_CHECK(target.dtype() == kI64 || target.dtype() == kI32,
           "cross_entropy: target must hold class indices (i64), got ", DTypeName(target.dtype()));
  return CrossEntropy(input, target.data(), options.ignore_index(), options.reduction());
}

}  // namespace functional
}  // namespace nn

Tensor dropout(const Tensor& x, double p, bool train) {
  return nn::functional::dropout(x, nn::functional::DropoutFuncOptions().p(p).training(train));
}
Tensor nll_loss(const Tensor& input, const Tensor& target) {
  return nn::functional::nll_loss(input, target);
}
Tensor cross_entropy_loss(const Tensor& input, const Tensor& target) {
  return nn::functional::cross_entropy(input, target);
}
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return nn::functional::mse_loss(input, target,
                                  nn::functional::MSELossFuncOptions().reduction(reduction));
}
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return nn::functional::l1_loss(input, target,
                                 nn::functional::L1LossFuncOptions().reduction(reduction));
}
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction, double beta) {
  return nn::functional::smooth_l1_loss(
      input, target, nn::functional::SmoothL1LossFuncOptions().reduction(reduction).beta(beta));
}
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target) {
  return nn::functional::binary_cross_entropy(input, target);
}
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight,
                Reduction reduction, int64_t ignore_index) {
  return nn::functional::nll_loss(
      input, target,
      nn::functional::NLLLossFuncOptions().weight(weight).reduction(reduction).ignore_index(
          ignore_index));
}
Tensor feature_dropout(const Tensor& x, double p, bool train) {
  return nn::functional::dropout2d(x, nn::functional::Dropout2dFuncOptions().p(p).training(train));
}
Tensor max_pool2d(const Tensor& x, ExpandingArray<2> kernel_size,
                  std::optional<ExpandingArray<2>> stride, ExpandingArray<2> padding) {
  return nn::functional::max_pool2d(x, nn::functional::MaxPool2dFuncOptions(kernel_size)
                                           .stride(stride.value_or(kernel_size))
                                           .padding(padding));
}
Tensor avg_pool2d(const Tensor& x, ExpandingArray<2> kernel_size,
                  std::optional<ExpandingArray<2>> stride, ExpandingArray<2> padding) {
  return nn::functional::avg_pool2d(x, nn::functional::AvgPool2dFuncOptions(kernel_size)
                                           .stride(stride.value_or(kernel_size))
                                           .padding(padding));
}
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps, bool /*cudnn_enabled*/) {
  return nn::functional::batch_norm(input, running_mean, running_var,
                                    nn::functional::BatchNormFuncOptions()
                                        .weight(weight)
                                        .bias(bias)
                                        .training(training)
                                        .momentum(momentum)
                                        .eps(eps));
}
}  // namespace tg
