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
// input log-probabilities [N, C], target [N] i64 class indices (or ignore_index).
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
}  // namespace tg

#endif  // TAPEGRAD_NN_FUNCTIONAL_H_
