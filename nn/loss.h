// Losses: cross-entropy with ignore_index and label smoothing, and mean squared error (PyTorch's
// torch.nn.functional semantics). Computed in f32 under autocast.
//
//   tg::Tensor loss = tg::nn::CrossEntropyLoss(logits, targets, {.label_smoothing = 0.1});
//   tg::Tensor mse = tg::nn::MseLoss(prediction, target);
#ifndef TAPEGRAD_NN_LOSS_H_
#define TAPEGRAD_NN_LOSS_H_

#include <cstdint>

#include "autograd/variable.h"
#include "tensor/op_kinds.h"

namespace tg {
namespace nn {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  // eps: the target distribution is (1 - eps) one-hot + eps / C uniform, so
  // loss_i = (1 - eps) * nll_i + eps * mean_c(-log p_ic); ignored rows count for nothing.
  double label_smoothing = 0;
  Reduction reduction = Reduction::kMean;  // mean over the rows that are not ignored
  // Without label smoothing: the loss and its gradient in one pass (tg::FusedCrossEntropy: no
  // host synchronisation, d loss / d logits kept instead of the logits), which has no second
  // derivative. false: the composed, twice-differentiable tg::CrossEntropy.
  bool fused = true;
};

// logits [..., C], targets [...] i32/i64 (leading dims flattened into rows).
Tensor CrossEntropyLoss(const Tensor& logits, const RawTensor& targets,
                        const CrossEntropyOptions& options = {});

// The same with the targets as a tg::Tensor (their data: targets are never differentiated).
inline Tensor CrossEntropyLoss(const Tensor& logits, const Tensor& targets,
                               const CrossEntropyOptions& options = {}) {
  return CrossEntropyLoss(logits, targets.data(), options);
}

// (prediction - target)^2, reduced; target is not differentiated.
Tensor MseLoss(const Tensor& prediction, const RawTensor& target,
               Reduction reduction = Reduction::kMean);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_LOSS_H_
