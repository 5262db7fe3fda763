#include "nn/conv.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "nn/init.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

namespace {
std::string Pair(const std::array<int64_t, 2>& p) {
  return absl::StrCat("(", p[0], ", ", p[1], ")");
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
  weight_ = register_parameter("weight",
                               RawTensor::Empty({out_channels, in_channels, kernel[0], kernel[1]}));
  init::KaimingUniform(weight_, gen, std::sqrt(5.0));
  if (options.bias()) {
    double bound = 1.0 / std::sqrt(static_cast<double>(init::FanInAndOut(weight_.shape()).first));
    bias_ = register_parameter("bias", RawTensor::Empty({out_channels}));
    init::Uniform(bias_, gen, -bound, bound);
  }
}

Tensor Conv2dImpl::forward(const Tensor& x) { return tg::Conv2d(x, weight_, bias_, params_); }

std::string Conv2dImpl::extra_repr() const {
  return absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                      ", kernel=", Pair(options_.kernel_size()), ", stride=", Pair(params_.stride),
                      ", padding=", Pair(params_.padding),
                      ", bias=", bias_.defined() ? "true" : "false");
}

MaxPool2dImpl::MaxPool2dImpl(const MaxPool2dOptions& options)
    : Module("MaxPool2d"), options_(options) {}

Tensor MaxPool2dImpl::forward(const Tensor& x) {
  return tg::MaxPool2d(x, options_.kernel_size(), options_.stride(), options_.padding());
}

std::string MaxPool2dImpl::extra_repr() const {
  return absl::StrCat("kernel=", Pair(options_.kernel_size()),
                      ", stride=", Pair(options_.stride()));
}

}  // namespace nn
}  // namespace tg
