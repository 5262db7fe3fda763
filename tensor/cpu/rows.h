// Row routines of the CPU's neural-network kernels, shared by the plain kernels (nn.cc: softmax,
// layer norm, cross-entropy and its backward) and the fused ones (fused.cc: add + layer norm,
// softmax + cross-entropy), so that a fused kernel computes each row with the very same
// arithmetic and its results are bit-identical to the composition of the plain kernels.
// Internal to tensor/cpu. C is the compute type (float for f16/bf16/f32, double for f64) and T
// the storage type of a row.
//
//   C shift, log_sum;
//   RowLogSumExp<C>(row, n, &shift, &log_sum);   // log(sum(exp(row))) = shift + log_sum
//   LayerNormRow(row, n, weight, bias, eps, out_row, &mean[r], &rstd[r]);
#ifndef TAPEGRAD_TENSOR_CPU_ROWS_H_
#define TAPEGRAD_TENSOR_CPU_ROWS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace tg::cpu {

// The rows' exp runs over blocks of this many values (ExpRow, activation.h).
constexpr int64_t kRowBlock = 256;

// Max and log(sum(exp(x - max))) of one row, in compute type C.
template <typename C, typename T>
void RowLogSumExp(const T* row, int64_t n, C* max_out, C* log_sum_out) {
  C max = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const C v = Widen(row[i]);
    if (std::isnan(v) || v > max) max = v;
    if (std::isnan(max)) break;
  }
  // An all -inf row (or a +inf max) would give inf - inf; shift by 0 instead, as PyTorch does.
  const C shift = std::isinf(max) ? C(0) : max;
  C sum = 0;
  C block[kRowBlock];
  for (int64_t i = 0; i < n; i += kRowBlock) {
    const int64_t len = std::min(kRowBlock, n - i);
    for (int64_t j = 0; j < len; ++j) block[j] = static_cast<C>(Widen(row[i + j])) - shift;
    ExpRow(block, block, len);
    for (int64_t j = 0; j < len; ++j) sum += block[j];
  }
  *max_out = shift;
  *log_sum_out = std::log(sum);
}

// Layer norm of one row of n values: mean and biased variance accumulated in f64 (two passes:
// no cancellation from E[x^2] - E[x]^2), then out = (x - mean) * rstd (* weight) (+ bias) in C,
// rounded once. weight and bias may be null.
template <typename T, typename C = ComputeType<T>>
void LayerNormRow(const T* row, int64_t n, const T* w, const T* b, double eps, T* out, C* mean,
                  C* rstd) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(Widen(row[i]));
  const double mu = sum / static_cast<double>(n);
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(Widen(row[i])) - mu;
    sq += d * d;
  }
  const C m = static_cast<C>(mu);
  const C rs = static_cast<C>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
  *mean = m;
  *rstd = rs;
  for (int64_t i = 0; i < n; ++i) {
    C y = (static_cast<C>(Widen(row[i])) - m) * rs;
    if (w) y *= static_cast<C>(Widen(w[i]));
    if (b) y += static_cast<C>(Widen(b[i]));
    out[i] = Convert<T>(y);
  }
}

// Throws "<op>: target 7 at position 2 is out of range for 5 classes" unless 0 <= target <
// classes (the caller skips ignore_index rows first).
inline void CheckTarget(const char* op, int64_t target, int64_t position, int64_t classes) {
  TG_CHECK(target >= 0 && target < classes, op, ": target ", target, " at position ", position,
           " is out of range for ", classes, " classes");
}

// -log_softmax(row)[target] from the row's RowLogSumExp.
template <typename C, typename T>
C CrossEntropyRowLoss(const T* row, int64_t target, C shift, C log_sum) {
  // log_sum - (x[t] - shift): x[t] - shift first, as in the softmax, so that large logits (1000)
  // do not cost the loss its precision.
  return log_sum - (static_cast<C>(Widen(row[target])) - shift);
}

// grad[i] = (softmax(row)[i] - (i == target)) * scale, from the row's RowLogSumExp.
template <typename C, typename T>
void CrossEntropyGradRow(const T* row, int64_t classes, int64_t target, C shift, C log_sum,
                         C scale, T* grad) {
  C p[kRowBlock];
  for (int64_t i = 0; i < classes; i += kRowBlock) {
    const int64_t len = std::min(kRowBlock, classes - i);
    for (int64_t j = 0; j < len; ++j) p[j] = static_cast<C>(Widen(row[i + j])) - shift - log_sum;
    ExpRow(p, p, len);
    for (int64_t j = 0; j < len; ++j) {
      grad[i + j] = Convert<T>((p[j] - (i + j == target ? C(1) : C(0))) * scale);
    }
  }
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_ROWS_H_
