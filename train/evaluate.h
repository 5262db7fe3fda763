// Evaluation losses of the training binaries (train_gpt's validation loss, train_mnist's test
// loss), computed as a PyTorch user computes them under autocast:
//
//   with torch.autocast(device, dtype):                                # --precision=f16|bf16
//       logits = model(x)
//       total += F.cross_entropy(logits, y, reduction="sum").item()    # f32: autocast's policy
//
//   tg::train::CrossEntropyEval eval(dtype);
//   for (...) eval.Add([&] { return model(Tensor(x)); }, y);
//   double mean = eval.mean();   // nats per row
//
// The forward and the loss both run inside PrecisionScope(dtype), so cross-entropy reads f16/bf16
// logits as f32 (autocast casts the inputs of losses to f32). Each row's loss is an f32 value;
// the rows and the batches are summed in f64 and divided once. A loss taken of the logits after
// the scope closed would be computed in the logits' dtype: an f16 sum is inf once it passes 65504
// (64 x 128 GPT-2 tokens at the initial 10.8 nats), and bf16 keeps 8 significant bits.
#ifndef TAPEGRAD_TRAIN_EVALUATE_H_
#define TAPEGRAD_TRAIN_EVALUATE_H_

#include <cstdint>
#include <functional>

#include "autograd/variable.h"
#include "nn/module.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"
#include "train/train_step.h"

namespace tg::train {

class CrossEntropyEval {
 public:
  // The run's precision (f32: no autocast; an FP8 run's casts leave its scales as they are).
  explicit CrossEntropyEval(const ForwardPrecision& precision) : precision_(precision) {}

  // Runs `forward` under PrecisionScope(precision, /*update_fp8=*/false) and adds the cross-entropy of each row of its
  // logits [..., C] against `targets` [...] (i32/i64 class ids, on the logits' device), in f32 or
  // wider, to the f64 total. Returns the logits (for an accuracy). The caller sets eval mode and
  // no_grad.
  Tensor Add(const std::function<Tensor()>& forward, const RawTensor& targets);

  double total() const { return total_; }  // summed loss of every row added
  int64_t rows() const { return rows_; }
  double mean() const;  // total() / rows(); NaN before any row

 private:
  ForwardPrecision precision_;
  double total_ = 0;
  int64_t rows_ = 0;
};

// Loss and accuracy of a classifier over a whole split (`images` [N, ...] and `labels` [N] on the
// CPU), in chunks of 1000 rows converted to the run's dtype and `device`, in eval mode and without
// recording; the loss under the run's autocast (CrossEntropyEval), the accuracy the fraction of
// rows whose argmax is the label. The model is back in training mode afterwards.
struct ClassifierEval {
  double loss = 0;
  double accuracy = 0;
};
ClassifierEval EvaluateClassifier(nn::Module& model, const RawTensor& images,
                                  const RawTensor& labels, const ForwardPrecision& precision,
                                  Device device);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_EVALUATE_H_
