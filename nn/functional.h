// tg::nn::functional: libtorch's torch::nn::functional, the stateless forms of the layers and
// losses, each composed of recorded ops (autograd/ops.h), so each records history as its ops do
// and its gradient is theirs. Options are libtorch's, with chainable setters.
//
//   namespace F = tg::nn::functional;
//   tg::Tensor loss = F::smooth_l1_loss(pred, target, F::SmoothL1LossFuncOptions().beta(0.5));
//   tg::Tensor h = F::dropout(F::relu(x), F::DropoutFuncOptions().p(0.2).training(is_training()));
#ifndef TAPEGRAD_NN_FUNCTIONAL_H_
#define TAPEGRAD_NN_FUNCTIONAL_H_

#include <cstdint>
#include <optional>

#include "autograd/variable.h"
#include "nn/options.h"
#include "tensor/generator.h"
#include "tensor/op_kinds.h"

namespace tg {

// libtorch's reduction names (torch::kMean, torch::kSum, torch::kNone).
inline constexpr Reduction kMean = Reduction::kMean;
inline constexpr Reduction kSum = Reduction::kSum;
inline constexpr Reduction kNone = Reduction::kNone;

namespace nn {
namespace functional {

// A chainable option: `Options().name(value)` sets it, `name()` reads it.
#define TG_FUNC_OPTION(Owner, type, name, initial) \
 public:                                           \
  Owner& name(type value) {                        \
    name##_ = value;                               \
    return *this;                                  \
  }                                                \
  type name() const { return name##_; }            \
                                                   \
 private:                                          \
  type name##_ = initial;

class MSELossFuncOptions {
  TG_FUNC_OPTION(MSELossFuncOptions, Reduction, reduction, kMean)
};
class SmoothL1LossFuncOptions {
  TG_FUNC_OPTION(SmoothL1LossFuncOptions, Reduction, reduction, kMean)
  TG_FUNC_OPTION(SmoothL1LossFuncOptions, double, beta, 1.0)
};
class L1LossFuncOptions {
  TG_FUNC_OPTION(L1LossFuncOptions, Reduction, reduction, kMean)
};
class BinaryCrossEntropyFuncOptions {
  TG_FUNC_OPTION(BinaryCrossEntropyFuncOptions, Reduction, reduction, kMean)
  TG_FUNC_OPTION(BinaryCrossEntropyFuncOptions, Tensor, weight, Tensor())
};
class NLLLossFuncOptions {
  TG_FUNC_OPTION(NLLLossFuncOptions, Reduction, reduction, kMean)
  TG_FUNC_OPTION(NLLLossFuncOptions, int64_t, ignore_index, -100)
  TG_FUNC_OPTION(NLLLossFuncOptions, Tensor, weight, Tensor())  // [C] class weights
};
class CrossEntropyFuncOptions {
  TG_FUNC_OPTION(CrossEntropyFuncOptions, Reduction, reduction, kMean)
  TG_FUNC_OPTION(CrossEntropyFuncOptions, int64_t, ignore_index, -100)
  TG_FUNC_OPTION(CrossEntropyFuncOptions, double, label_smoothing, 0.0)
};
class DropoutFuncOptions {
  TG_FUNC_OPTION(DropoutFuncOptions, double, p, 0.5)
  TG_FUNC_OPTION(DropoutFuncOptions, bool, training, true)
};
class SoftmaxFuncOptions {
 public:
  SoftmaxFuncOptions(int64_t dim) : dim_(dim) {}  // NOLINT: implicit, as libtorch's
  TG_FUNC_OPTION(SoftmaxFuncOptions, int64_t, dim, -1)
};
using LogSoftmaxFuncOptions = SoftmaxFuncOptions;
class GELUFuncOptions {
  // "none" (erf) or "tanh" (GPT-2's approximation).
  TG_FUNC_OPTION(GELUFuncOptions, const char*, approximate, "none")
};
class LeakyReLUFuncOptions {
  TG_FUNC_OPTION(LeakyReLUFuncOptions, double, negative_slope, 0.01)
};

class Dropout2dFuncOptions {
  TG_FUNC_OPTION(Dropout2dFuncOptions, double, p, 0.5)
  TG_FUNC_OPTION(Dropout2dFuncOptions, bool, training, true)
};
// Pooling over [N, C, H, W] (or [C, H, W]); the stride defaults to the kernel size. ceil_mode,
// dilation (max) and divisor_override (avg) are as PyTorch's; what tapegrad lacks is refused.
class MaxPool2dFuncOptions {
 public:
  MaxPool2dFuncOptions(ExpandingArray<2> kernel_size)  // NOLINT: implicit, as libtorch's
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TG_FUNC_OPTION(MaxPool2dFuncOptions, ExpandingArray<2>, kernel_size, 1)
  TG_FUNC_OPTION(MaxPool2dFuncOptions, ExpandingArray<2>, stride, 1)
  TG_FUNC_OPTION(MaxPool2dFuncOptions, ExpandingArray<2>, padding, 0)
  TG_FUNC_OPTION(MaxPool2dFuncOptions, ExpandingArray<2>, dilation, 1)  // 1 only
  TG_FUNC_OPTION(MaxPool2dFuncOptions, bool, ceil_mode, false)          // false only
};
class AvgPool2dFuncOptions {
 public:
  AvgPool2dFuncOptions(ExpandingArray<2> kernel_size)  // NOLINT: implicit, as libtorch's
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TG_FUNC_OPTION(AvgPool2dFuncOptions, ExpandingArray<2>, kernel_size, 1)
  TG_FUNC_OPTION(AvgPool2dFuncOptions, ExpandingArray<2>, stride, 1)
  TG_FUNC_OPTION(AvgPool2dFuncOptions, ExpandingArray<2>, padding, 0)
  TG_FUNC_OPTION(AvgPool2dFuncOptions, bool, ceil_mode, false)  // false only
  TG_FUNC_OPTION(AvgPool2dFuncOptions, bool, count_include_pad, true)
  TG_FUNC_OPTION(AvgPool2dFuncOptions, std::optional<int64_t>, divisor_override, std::nullopt)
};
class BatchNormFuncOptions {
  TG_FUNC_OPTION(BatchNormFuncOptions, Tensor, weight, Tensor())
  TG_FUNC_OPTION(BatchNormFuncOptions, Tensor, bias, Tensor())
  TG_FUNC_OPTION(BatchNormFuncOptions, bool, training, false)
  TG_FUNC_OPTION(BatchNormFuncOptions, double, momentum, 0.1)
  TG_FUNC_OPTION(BatchNormFuncOptions, double, eps, 1e-5)
};
class GroupNormFuncOptions {
 public:
  explicit GroupNormFuncOptions(int64_t num_groups) : num_groups_(num_groups) {}
  TG_FUNC_OPTION(GroupNormFuncOptions, int64_t, num_groups, num_groups_)
  TG_FUNC_OPTION(GroupNormFuncOptions, Tensor, weight, Tensor())
  TG_FUNC_OPTION(GroupNormFuncOptions, Tensor, bias, Tensor())
  TG_FUNC_OPTION(GroupNormFuncOptions, double, eps, 1e-5)
};
class Conv2dFuncOptions {
  TG_FUNC_OPTION(Conv2dFuncOptions, Tensor, bias, Tensor())
  TG_FUNC_OPTION(Conv2dFuncOptions, ExpandingArray<2>, stride, 1)
  TG_FUNC_OPTION(Conv2dFuncOptions, ExpandingArray<2>, padding, 0)
  TG_FUNC_OPTION(Conv2dFuncOptions, ExpandingArray<2>, dilation, 1)
  TG_FUNC_OPTION(Conv2dFuncOptions, int64_t, groups, 1)  // 1 only
};
class ConvTranspose2dFuncOptions {
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, Tensor, bias, Tensor())
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, ExpandingArray<2>, stride, 1)
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, ExpandingArray<2>, padding, 0)
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, ExpandingArray<2>, output_padding, 0)
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, int64_t, groups, 1)  // 1 only
  TG_FUNC_OPTION(ConvTranspose2dFuncOptions, ExpandingArray<2>, dilation, 1)
};

#undef TG_FUNC_OPTION

Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, const GELUFuncOptions& options = {});
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor leaky_relu(const Tensor& x, const LeakyReLUFuncOptions& options = {});
Tensor softmax(const Tensor& x, const SoftmaxFuncOptions& options);
Tensor log_softmax(const Tensor& x, const LogSoftmaxFuncOptions& options);
// Zeroes elements with probability p and scales the rest by 1/(1-p) when training (the
// default generator's draws, or `gen`'s); the identity otherwise.
Tensor dropout(const Tensor& x, const DropoutFuncOptions& options = {});
Tensor dropout(const Tensor& x, const DropoutFuncOptions& options, Generator& gen);
// Zeroes whole channels with probability p (x[n, c] of [N, C, ...], x[c] of a 3-D [C, H, W]) and
// scales the rest by 1/(1-p) when training; the identity otherwise.
Tensor dropout2d(const Tensor& x, const Dropout2dFuncOptions& options = {});
Tensor dropout2d(const Tensor& x, const Dropout2dFuncOptions& options, Generator& gen);

// Cross-correlation of x [N, C, H, W] with weight [O, C, kh, kw] (tg::Conv2d).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dFuncOptions& options = {});
// The transposed convolution, weight [C, O, kh, kw]: x dilated by the stride (stride - 1 zeros
// between neighbours), padded by dilation * (k - 1) - padding (+ output_padding at the end),
// convolved with the kernel flipped in both spatial dims and its channel dims swapped. Composed of
// recorded ops (Conv2d, Cat, Reshape, IndexSelect), so its gradients are theirs.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight,
                        const ConvTranspose2dFuncOptions& options = {});
Tensor max_pool2d(const Tensor& x, const MaxPool2dFuncOptions& options);
// The mean of each window; padded zeros count unless count_include_pad(false) (then each window
// divides by its count of real elements) or divisor_override(d) (then by d).
Tensor avg_pool2d(const Tensor& x, const AvgPool2dFuncOptions& options);
// Normalises each channel (dim 1) of x [N, C, ...]: with the batch's mean and biased variance
// when training (or without running statistics), updating running_mean and running_var in
// place (running = (1 - momentum) running + momentum batch, the variance unbiased, as PyTorch);
// with the running statistics otherwise. running_mean/var are [C] tensors or both undefined.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const BatchNormFuncOptions& options = {});
// Normalises x [N, C, ...] over each of num_groups groups of C / num_groups channels (biased
// variance), then scales and shifts each channel by weight/bias [C].
Tensor group_norm(const Tensor& x, const GroupNormFuncOptions& options);

// Losses: `input` is differentiated, `target` is not (as in libtorch, whose targets rarely
// require grad). Shapes must match (no broadcasting of the target) except where noted.
Tensor mse_loss(const Tensor& input, const Tensor& target, const MSELossFuncOptions& options = {});
Tensor l1_loss(const Tensor& input, const Tensor& target, const L1LossFuncOptions& options = {});
// 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = input - target); beta 0 is the
// L1 loss.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      const SmoothL1LossFuncOptions& options = {});
// input probabilities in [0, 1]; each log clamped at -100, as PyTorch's.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const BinaryCrossEntropyFuncOptions& options = {});
// input log-probabilities [N, C], target [N] i64 class indices (or ignore_index). With class
// weights w [C]: each row's loss is scaled by w[target] and the mean divides by their sum.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossFuncOptions& options = {});
// input logits [N, C], target [N] i64 class indices.
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     const CrossEntropyFuncOptions& options = {});

}  // namespace functional
}  // namespace nn

// libtorch's torch:: forms of the functional ops that programs call without the namespace
// (torch::dropout(x, p, train), torch::nll_loss(x, y), ...), with its positional arguments.
Tensor dropout(const Tensor& x, double p, bool train);
Tensor nll_loss(const Tensor& input, const Tensor& target);
Tensor cross_entropy_loss(const Tensor& input, const Tensor& target);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = kMean);
Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = kMean);
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, Reduction reduction = kMean,
                      double beta = 1.0);
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target);
// ATen's nll_loss(self, target, weight, reduction, ignore_index); weight [C] or undefined.
Tensor nll_loss(const Tensor& input, const Tensor& target, const Tensor& weight,
                Reduction reduction = kMean, int64_t ignore_index = -100);
Tensor feature_dropout(const Tensor& x, double p, bool train);
// torch::max_pool2d(x, kernel, stride = kernel, padding = 0) and torch::avg_pool2d(...).
Tensor max_pool2d(const Tensor& x, ExpandingArray<2> kernel_size,
                  std::optional<ExpandingArray<2>> stride = std::nullopt,
                  ExpandingArray<2> padding = 0);
Tensor avg_pool2d(const Tensor& x, ExpandingArray<2> kernel_size,
                  std::optional<ExpandingArray<2>> stride = std::nullopt,
                  ExpandingArray<2> padding = 0);
// ATen's batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
// cudnn_enabled); cudnn_enabled is ignored.
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps, bool cudnn_enabled = true);
}  // namespace tg

#endif  // TAPEGRAD_NN_FUNCTIONAL_H_
