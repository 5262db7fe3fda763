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

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel,
               Generator& gen, Conv2dParams params, bool bias)
    : Module("Conv2d", /*autocast_scope=*/true),
      in_(in_channels),
      out_(out_channels),
      kernel_(kernel),
      params_(params) {
  TG_CHECK(in_channels > 0 && out_channels > 0 && kernel[0] > 0 && kernel[1] > 0,
           "Conv2d: channels and kernel must be positive, got in=", in_channels,
           " out=", out_channels, " kernel=", Pair(kernel));
  weight_ = register_parameter("weight",
                               Tensor::Empty({out_channels, in_channels, kernel[0], kernel[1]}));
  init::KaimingUniform(weight_, gen, std::sqrt(5.0));
  if (bias) {
    double bound = 1.0 / std::sqrt(static_cast<double>(init::FanInAndOut(weight_.shape()).first));
    bias_ = register_parameter("bias", Tensor::Empty({out_channels}));
    init::Uniform(bias_, gen, -bound, bound);
  }
}

Variable Conv2d::forward(const Variable& x) { return tg::Conv2d(x, weight_, bias_, params_); }

std::string Conv2d::extra_repr() const {
  return absl::StrCat(in_, ", ", out_, ", kernel=", Pair(kernel_),
                      ", stride=", Pair(params_.stride), ", padding=", Pair(params_.padding),
                      ", bias=", bias_.defined() ? "true" : "false");
}

MaxPool2d::MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                     std::array<int64_t, 2> padding)
    : Module("MaxPool2d"),
      kernel_(kernel),
      stride_(stride[0] == 0 && stride[1] == 0 ? kernel : stride),
      padding_(padding) {}

Variable MaxPool2d::forward(const Variable& x) {
  return tg::MaxPool2d(x, kernel_, stride_, padding_);
}

std::string MaxPool2d::extra_repr() const {
  return absl::StrCat("kernel=", Pair(kernel_), ", stride=", Pair(stride_));
}

}  // namespace nn
}  // namespace tg
