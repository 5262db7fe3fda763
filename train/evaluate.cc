#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
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

ClassifierEval EvaluateClassifier(nn::Module& model, const RawTensor& images,
                                  const RawTensor& labels, const ForwardPrecision& precision,
                                  Device device) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t n = images.size(0), chunk = 1000;
  CrossEntropyEval loss(precision);
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t len = std::min(chunk, n - start);
    RawTensor x = images.narrow(0, start, len).to(device, precision.dtype);
    RawTensor y = labels.narrow(0, start, len);
    const Tensor logits = loss.Add([&] { return model(Tensor(x)); }, y.to(device));
    std::vector<int64_t> predicted = Argmax(logits.data(), 1).to_vector<int64_t>();
    std::vector<int64_t> truth = y.to_vector<int64_t>();
    for (int64_t i = 0; i < len; ++i) correct += predicted[i] == truth[i];
  }
  model.train();
  return {loss.mean(), static_cast<double>(correct) / n};
}

}  // namespace tg::train
