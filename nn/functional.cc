#include "nn/functional.h"

#include <cstring>
#include <string>

#include "autograd/factories.h"
#include "autograd/ops.h"
#include "tensor/error.h"

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
Tensor sigmoid(const Tensor& x) { return Sigmoid(x); }
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
  const Tensor mask(keep.to(input.dtype()).to(input.device()));
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
}  // namespace tg
