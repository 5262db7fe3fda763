#include "train/evaluate.h"

#include <cmath>

#include "nn/loss.h"
#include "tensor/ops.h"
#include "train/train_step.h"

namespace tg::train {

Tensor CrossEntropyEval::Add(const std::function<Tensor()>& forward, const RawTensor& targets) {
  PrecisionScope precision(precision_, /*update_fp8=*/false);
  Tensor logits = forward();
  // Per-row losses (f32 under autocast, f64 for f64 logits), summed in f64 where they live: one
  // host read per batch, as before.
  nn::CrossEntropyOptions rows;
  rows.reduction = Reduction::kNone;
  const RawTensor losses = nn::CrossEntropyLoss(logits, targets, rows).data();
  total_ += Sum(losses.to(kF64)).item();
  rows_ += losses.numel();
  return logits;
}

double CrossEntropyEval::mean() const {
  return rows_ > 0 ? total_ / static_cast<double>(rows_) : NAN;
}

}  // namespace tg::train
