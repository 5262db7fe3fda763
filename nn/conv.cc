#include "nn/conv.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

namespace {
std::string Pair(const std::array<int64_t, 2>& p) {
  return absl::StrCat("(", p[0], ", ", p[1], ")");
}

// PyTorch's reset_parameters of a convolution: kaiming_uniform(a = sqrt(5)) for the weight,
// then U(-1/sqrt(fan_in), +) for the bias (if any), fan_in from the weight's dim 1 times its
// kernel elements.
void InitConv(const Tensor& weight, const Tensor& bias, Generator& gen) {
  init::KaimingUniform(weight, gen, std::sqrt(5.0));
  if (!bias.defined()) return;
  const double bound =
      1.0 / std::sqrt(static_cast<double>(init::FanInAndOut(weight.shape()).first));
  init::Uniform(bias, gen, -bound, bound);
}

}  // namespace

Conv2dImpl::Conv2dImpl(const Conv2dOptions& options, Generator& gen)
    : Module("Conv2d", /*autocast_scope=*/true), options_(options) {
  const int64_t in_channels = options.in_channels(), out_channels = options.out_channels();
  const std::array<int64_t, 2>& kernel = options.kernel_size();
  TG_CHECK(in_channels > 0 && out_channels > 0 && kernel[0] > 0 && kernel[1] > 0,
           "Conv2d: channels and kernel must be positive, got in=", in_channels,
           " out=", out_channels, " kernel=", Pair(kernel));
  params_.stride = options.stride();
  params_.padding = options.padding();
  params_.dilation = options.dilation();
  weight = register_parameter("weight",
                              RawTensor::Empty({out_channels, in_channels, kernel[0], kernel[1]}));
  if (options.bias()) bias = register_parameter("bias", RawTensor::Empty({out_channels}));
  InitConv(weight, bias, gen);
}

Tensor Conv2dImpl::forward(const Tensor& x) { return tg::Conv2d(x, weight, bias, params_); }

std::string Conv2dImpl::extra_repr() const {
  return absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                      ", kernel=", Pair(options_.kernel_size()), ", stride=", Pair(params_.stride),
                      ", padding=", Pair(params_.padding),
                      ", bias=", bias.defined() ? "true" : "false");
}

// ---- Conv1d ----------------------------------------------------------------------------------

Conv1dImpl::Conv1dImpl(const Conv1dOptions& options, Generator& gen)
    : Module("Conv1d", /*autocast_scope=*/true), options_(options) {
  const int64_t in = options.in_channels(), out = options.out_channels();
  const int64_t k = options.kernel_size()[0];
  TG_CHECK(in > 0 && out > 0 && k > 0, "Conv1d: channels and kernel must be positive, got in=", in,
           " out=", out, " kernel=", k);
  weight = register_parameter("weight", RawTensor::Empty({out, in, k}));
  if (options.bias()) bias = register_parameter("bias", RawTensor::Empty({out}));
  InitConv(weight, bias, gen);
}

Tensor Conv1dImpl::forward(const Tensor& x) {
  TG_CHECK(x.dim() == 2 || x.dim() == 3, "Conv1d: expects [N, C, L] or [C, L], got ",
           ShapeToString(x.shape()));
  if (x.dim() == 2) return Squeeze(forward(Unsqueeze(x, 0)), 0);
  Conv2dParams params;
  params.stride = {1, options_.stride()[0]};
  params.padding = {0, options_.padding()[0]};
  params.dilation = {1, options_.dilation()[0]};
  const Tensor w = Unsqueeze(weight, 2);  // [out, in, 1, k]
  // Conv2d's autocast entry: the 1-D convolution runs in low precision when Conv2d does.
  amp::AutocastModuleScope scope("Conv2d");
  return Squeeze(tg::Conv2d(Unsqueeze(x, 2), w, bias, params), 2);
}

std::string Conv1dImpl::extra_repr() const {
  return absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                      ", kernel=", options_.kernel_size()[0], ", stride=", options_.stride()[0],
                      ", padding=", options_.padding()[0],
                      ", bias=", bias.defined() ? "true" : "false");
}

// ---- ConvTranspose2d -------------------------------------------------------------------------

ConvTranspose2dImpl::ConvTranspose2dImpl(const ConvTranspose2dOptions& options, Generator& gen)
    : Module("ConvTranspose2d", /*autocast_scope=*/true), options_(options) {
  const int64_t in = options.in_channels(), out = options.out_channels();
  const Size2& k = options.kernel_size();
  TG_CHECK(in > 0 && out > 0 && k[0] > 0 && k[1] > 0,
           "ConvTranspose2d: channels and kernel must be positive, got in=", in, " out=", out,
           " kernel=", Pair(k));
  TG_CHECK(options.groups() == 1, "ConvTranspose2d: groups=", options.groups(),
           " is not supported (1 only)");
  for (int i = 0; i < 2; ++i) {
    TG_CHECK(options.stride()[i] > 0 && options.dilation()[i] > 0 && options.padding()[i] >= 0,
             "ConvTranspose2d: stride and dilation must be positive and padding non-negative");
    TG_CHECK(
        options.output_padding()[i] >= 0 && (options.output_padding()[i] < options.stride()[i] ||
                                             options.output_padding()[i] < options.dilation()[i]),
        "ConvTranspose2d: output padding must be smaller than either stride or dilation, ",
        "got output_padding=", Pair(options.output_padding()), " stride=", Pair(options.stride()),
        " dilation=", Pair(options.dilation()));
  }
  weight = register_parameter("weight", RawTensor::Empty({in, out, k[0], k[1]}));
  if (options.bias()) bias = register_parameter("bias", RawTensor::Empty({out}));
  InitConv(weight, bias, gen);
}

Tensor ConvTranspose2dImpl::forward(const Tensor& x) {
  return functional::conv_transpose2d(x, weight,
                                      functional::ConvTranspose2dFuncOptions()
                                          .bias(bias)
                                          .stride(options_.stride())
                                          .padding(options_.padding())
                                          .output_padding(options_.output_padding())
                                          .dilation(options_.dilation()));
}

std::string ConvTranspose2dImpl::extra_repr() const {
  return absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                      ", kernel=", Pair(options_.kernel_size()),
                      ", stride=", Pair(options_.stride()), ", padding=", Pair(options_.padding()),
                      ", bias=", bias.defined() ? "true" : "false");
}

// ---- Pooling ---------------------------------------------------------------------------------

MaxPool2dImpl::MaxPool2dImpl(const MaxPool2dOptions& options)
    : Module("MaxPool2d"), options_(options) {}

Tensor MaxPool2dImpl::forward(const Tensor& x) {
  return functional::max_pool2d(x, functional::MaxPool2dFuncOptions(options_.kernel_size())
                                       .stride(options_.stride())
                                       .padding(options_.padding()));
}

std::string MaxPool2dImpl::extra_repr() const {
  return absl::StrCat("kernel=", Pair(options_.kernel_size()),
                      ", stride=", Pair(options_.stride()));
}

AvgPool2dImpl::AvgPool2dImpl(const AvgPool2dOptions& options)
    : Module("AvgPool2d"), options_(options) {}

Tensor AvgPool2dImpl::forward(const Tensor& x) {
  return functional::avg_pool2d(x, functional::AvgPool2dFuncOptions(options_.kernel_size())
                                       .stride(options_.stride())
                                       .padding(options_.padding())
                                       .ceil_mode(options_.ceil_mode())
                                       .count_include_pad(options_.count_include_pad())
                                       .divisor_override(options_.divisor_override()));
}

std::string AvgPool2dImpl::extra_repr() const {
  return absl::StrCat("kernel=", Pair(options_.kernel_size()),
                      ", stride=", Pair(options_.stride()));
}

}  // namespace nn
}  // namespace tg
