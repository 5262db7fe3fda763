#include "nn/norm.h"

#include "absl/strings/str_cat.h"
#include "nn/functional.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

namespace {
const char* Bool(bool b) { return b ? "true" : "false"; }
}  // namespace

BatchNormImplBase::BatchNormImplBase(const char* type, const BatchNormOptions& options,
                                     int64_t min_dim, int64_t max_dim)
    : Module(type), options_(options), min_dim_(min_dim), max_dim_(max_dim) {
  const int64_t c = options.num_features();
  TG_CHECK(c > 0, type, ": num_features must be positive, got ", c);
  TG_CHECK(
      !options.momentum().has_value() || (*options.momentum() >= 0 && *options.momentum() <= 1),
      type, ": momentum must be in [0, 1] or nullopt, got ", options.momentum().value_or(0));
  if (options.affine()) {
    weight = register_parameter("weight", RawTensor::Ones({c}));
    bias = register_parameter("bias", RawTensor::Zeros({c}));
  }
  if (options.track_running_stats()) {
    register_buffer("running_mean", RawTensor::Zeros({c}));
    register_buffer("running_var", RawTensor::Ones({c}));
    register_buffer("num_batches_tracked", RawTensor::Zeros({}, kI64));
  }
}

Tensor BatchNormImplBase::running_mean() const {
  return options_.track_running_stats() ? Tensor(buffer("running_mean")) : Tensor();
}
Tensor BatchNormImplBase::running_var() const {
  return options_.track_running_stats() ? Tensor(buffer("running_var")) : Tensor();
}
Tensor BatchNormImplBase::num_batches_tracked() const {
  return options_.track_running_stats() ? Tensor(buffer("num_batches_tracked")) : Tensor();
}

void BatchNormImplBase::reset_running_stats() {
  if (!options_.track_running_stats()) return;
  buffer("running_mean").copy_(RawTensor::Scalar(0, kF32));
  buffer("running_var").copy_(RawTensor::Scalar(1, kF32));
  buffer("num_batches_tracked").copy_(RawTensor::Scalar(0, kI64));
}

Tensor BatchNormImplBase::forward(const Tensor& x) {
  TG_CHECK(x.dim() >= min_dim_ && x.dim() <= max_dim_, type_name(), ": expected ",
           min_dim_ == max_dim_ ? absl::StrCat(min_dim_, "D")
                                : absl::StrCat(min_dim_, "D or ", max_dim_, "D"),
           " input (got ", x.dim(), "D input)");
  TG_CHECK(x.size(1) == options_.num_features(), type_name(), ": expected ",
           options_.num_features(), " channels, got input ", ShapeToString(x.shape()));
  double momentum = options_.momentum().value_or(0);
  const bool update = is_training() && options_.track_running_stats();
  if (update) {
    // num_batches_tracked += 1 (an i64 scalar, read on the host: exact), and the cumulative
    // mean's weight 1 / num_batches_tracked when momentum is nullopt, as PyTorch's.
    const RawTensor& tracked = buffer("num_batches_tracked");
    const int64_t count = static_cast<int64_t>(tracked.to(Device::Cpu()).item()) + 1;
    tracked.copy_(RawTensor::Scalar(static_cast<double>(count), kI64));
    if (!options_.momentum().has_value()) momentum = 1.0 / static_cast<double>(count);
  }
  return functional::batch_norm(x, running_mean(), running_var(),
                                functional::BatchNormFuncOptions()
                                    .weight(weight)
                                    .bias(bias)
                                    .training(is_training() || !options_.track_running_stats())
                                    .momentum(momentum)
                                    .eps(options_.eps()));
}

std::string BatchNormImplBase::extra_repr() const {
  return absl::StrCat(
      options_.num_features(), ", eps=", options_.eps(), ", momentum=",
      options_.momentum().has_value() ? absl::StrCat(*options_.momentum()) : std::string("None"),
      ", affine=", Bool(options_.affine()),
      ", track_running_stats=", Bool(options_.track_running_stats()));
}

GroupNormImpl::GroupNormImpl(const GroupNormOptions& options)
    : Module("GroupNorm"), options_(options) {
  const int64_t g = options.num_groups(), c = options.num_channels();
  TG_CHECK(g > 0 && c > 0 && c % g == 0, "GroupNorm: num_channels must be divisible by ",
           "num_groups, got ", c, " channels and ", g, " groups");
  if (options.affine()) {
    weight = register_parameter("weight", RawTensor::Ones({c}));
    bias = register_parameter("bias", RawTensor::Zeros({c}));
  }
}

Tensor GroupNormImpl::forward(const Tensor& x) {
  TG_CHECK(x.dim() >= 2 && x.size(1) == options_.num_channels(), "GroupNorm: expected input ",
           "[N, ", options_.num_channels(), ", ...], got ", ShapeToString(x.shape()));
  return functional::group_norm(x, functional::GroupNormFuncOptions(options_.num_groups())
                                       .weight(weight)
                                       .bias(bias)
                                       .eps(options_.eps()));
}

std::string GroupNormImpl::extra_repr() const {
  return absl::StrCat(options_.num_groups(), ", ", options_.num_channels(),
                      ", eps=", options_.eps(), ", affine=", Bool(options_.affine()));
}

}  // namespace nn
}  // namespace tg
