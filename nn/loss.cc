#include "nn/loss.h"

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

Tensor CrossEntropyLoss(const Tensor& logits, const RawTensor& targets,
                        const CrossEntropyOptions& options) {
  TG_CHECK(logits.dim() >= 1, "CrossEntropyLoss: logits must have a class dim, got ",
           ShapeToString(logits.shape()));
  const double eps = options.label_smoothing;
  TG_CHECK(eps >= 0 && eps <= 1, "CrossEntropyLoss: label_smoothing must be in [0, 1], got ", eps);
  const int64_t classes = logits.size(-1);
  TG_CHECK(classes > 0, "CrossEntropyLoss: logits ", ShapeToString(logits.shape()),
           " have an empty class dim");
  const int64_t rows = logits.numel() / classes;
  TG_CHECK(targets.numel() == rows, "CrossEntropyLoss: targets ", ShapeToString(targets.shape()),
           " do not match the ", rows, " rows of logits ", ShapeToString(logits.shape()));
  Tensor flat = logits.dim() == 2 ? logits : Reshape(logits, {rows, classes});
  RawTensor flat_targets = targets.dim() == 1 ? targets : targets.reshape({rows});
  if (eps == 0) {
    if (options.fused) {
      return FusedCrossEntropy(flat, flat_targets, options.ignore_index, options.reduction);
    }
    return CrossEntropy(flat, flat_targets, options.ignore_index, options.reduction);
  }

  // Per-row pieces, then one reduction over the rows that are not ignored.
  Tensor nll = CrossEntropy(flat, flat_targets, options.ignore_index, Reduction::kNone);  // [N]
  Tensor smooth = MulScalar(Mean(LogSoftmax(flat), {-1}), -1.0);  // [N] mean_c(-log p)
  RawTensor keep = Ne(flat_targets, RawTensor::Full({}, static_cast<double>(options.ignore_index),
                                                    flat_targets.dtype(), flat_targets.device()))
                       .to(smooth.dtype());  // [N] 1 for rows that count
  Tensor per_row = Add(MulScalar(nll, 1 - eps), MulScalar(Mul(smooth, Tensor(keep)), eps));
  switch (options.reduction) {
    case Reduction::kNone:
      return per_row;
    case Reduction::kSum:
      return Sum(per_row);
    case Reduction::kMean:
      break;
  }
  // Divided by the count on the tensor's device (no host read, so no device sync on CUDA); NaN
  // when every row is ignored, like the unsmoothed mean (0 / 0).
  return Div(Sum(per_row), Tensor(tg::Sum(keep)));
}

Tensor MseLoss(const Tensor& prediction, const RawTensor& target, Reduction reduction) {
  TG_CHECK(prediction.shape() == target.shape(), "MseLoss: prediction ",
           ShapeToString(prediction.shape()), " and target ", ShapeToString(target.shape()),
           " differ in shape");
  // On PyTorch's autocast f32 list: squares of f16 values overflow above 256.
  bool low = prediction.dtype() == kF16 || prediction.dtype() == kBF16;
  Tensor pred = low && amp::AutocastEnabled() ? Cast(prediction, kF32) : prediction;
  Tensor diff = Sub(pred, Tensor(target));
  Tensor sq = Mul(diff, diff);
  switch (reduction) {
    case Reduction::kNone:
      return sq;
    case Reduction::kSum:
      return Sum(sq);
    case Reduction::kMean:
      break;
  }
  return Mean(sq);
}

}  // namespace nn
}  // namespace tg
