// Batch and group normalisation: BatchNorm1d, BatchNorm2d and GroupNorm with libtorch's options,
// composed of recorded ops (nn/functional.h's batch_norm and group_norm), so their gradients
// are those ops'. Statistics are computed in the input's dtype.
//
//   tg::nn::BatchNorm2d bn(tg::nn::BatchNorm2dOptions(64).momentum(0.01));
//   tg::Tensor y = bn(x);                    // training: the batch's statistics, running ones
//   updated bn->eval(); tg::Tensor z = bn(x);        // eval: the running statistics
//
// The running statistics are buffers ("running_mean", "running_var", "num_batches_tracked"), so
// state_dict(), to() and tg::save carry them under PyTorch's names; they are read through
// running_mean() / running_var() / num_batches_tracked() (tapegrad's buffers are raw tensors
// that to() replaces, so libtorch's public members of those names would go stale).
#ifndef TAPEGRAD_NN_NORM_H_
#define TAPEGRAD_NN_NORM_H_

#include <cstdint>
#include <optional>
#include <string>

#include "nn/module.h"
#include "nn/options.h"

namespace tg {
namespace nn {

// BatchNorm's options, as torch::nn::BatchNormOptions (BatchNorm1dOptions and BatchNorm2dOptions
// are the same class): BatchNorm2dOptions(64).eps(1e-3).momentum(std::nullopt).affine(false).
class BatchNormOptions {
 public:
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit
  TG_ARG(int64_t, num_features);
  TG_ARG(double, eps) = 1e-5;
  // The weight of the batch's statistics in the running ones; nullopt: their cumulative mean.
  TG_ARG(std::optional<double>, momentum) = 0.1;
  TG_ARG(bool, affine) = true;               // a weight (ones) and a bias (zeros) of [C]
  TG_ARG(bool, track_running_stats) = true;  // false: batch statistics in eval mode too
};
using BatchNorm1dOptions = BatchNormOptions;
using BatchNorm2dOptions = BatchNormOptions;

// The shared part of BatchNorm1d and BatchNorm2d (libtorch's BatchNormImplBase).
class BatchNormImplBase : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const BatchNormOptions& options() const { return options_; }
  // running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();
  // The buffers, sharing storage (undefined without track_running_stats).
  Tensor running_mean() const;
  Tensor running_var() const;
  Tensor num_batches_tracked() const;

  Tensor weight, bias;  // [C]; undefined without affine

 protected:
  // `dims`: the input ranks the layer takes ("2D or 3D" for BatchNorm1d, "4D" for BatchNorm2d).
  BatchNormImplBase(const char* type, const BatchNormOptions& options, int64_t min_dim,
                    int64_t max_dim);

 private:
  BatchNormOptions options_;
  int64_t min_dim_, max_dim_;
};

// Over [N, C] or [N, C, L].
class BatchNorm1dImpl : public BatchNormImplBase {
 public:
  explicit BatchNorm1dImpl(const BatchNorm1dOptions& options)
      : BatchNormImplBase("BatchNorm1d", options, 2, 3) {}
};
TG_MODULE(BatchNorm1d);

// Over [N, C, H, W].
class BatchNorm2dImpl : public BatchNormImplBase {
 public:
  explicit BatchNorm2dImpl(const BatchNorm2dOptions& options)
      : BatchNormImplBase("BatchNorm2d", options, 4, 4) {}
};
TG_MODULE(BatchNorm2d);

// GroupNorm's options, as torch::nn::GroupNormOptions(num_groups, num_channels).eps(1e-5).
class GroupNormOptions {
 public:
  GroupNormOptions(int64_t num_groups, int64_t num_channels)
      : num_groups_(num_groups), num_channels_(num_channels) {}
  TG_ARG(int64_t, num_groups);
  TG_ARG(int64_t, num_channels);
  TG_ARG(double, eps) = 1e-5;
  TG_ARG(bool, affine) = true;
};

class GroupNormImpl : public Module {
 public:
  explicit GroupNormImpl(const GroupNormOptions& options);
  GroupNormImpl(int64_t num_groups, int64_t num_channels)
      : GroupNormImpl(GroupNormOptions(num_groups, num_channels)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const GroupNormOptions& options() const { return options_; }

  Tensor weight, bias;  // [C]; undefined without affine

 private:
  GroupNormOptions options_;
};
TG_MODULE(GroupNorm);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_NORM_H_
