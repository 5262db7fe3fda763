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
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace tg::cpu {

// The rows' exp runs over blocks of this many values (ExpRow, activation.h).
constexpr int64_t kRowBlock = 256;

// sum over i < n of f(i), in f64: eight interleaved partial sums added in a fixed order, so the
// result is deterministic and the loop vectorises (a single running sum waits on every add).
template <typename F>
double SumF64(int64_t n, F f) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += f(i + l);
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += f(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// SumF64 of the common terms of a row of C (float: the vectorised vec_math.h sums, the same
// bits as SumF64): x[i], x[i] * y[i] (the product in C) and (x[i] - mean)^2 (in f64).
inline double RowSumF64(const float* x, int64_t n) { return SumAsF64(x, n); }
inline double RowSumF64(const double* x, int64_t n) {
  return SumF64(n, [&](int64_t i) { return x[i]; });
}
inline double RowSumProductsF64(const float* x, const float* y, int64_t n) {
  return SumProductsAsF64(x, y, n);
}
inline double RowSumProductsF64(const double* x, const double* y, int64_t n) {
  return SumF64(n, [&](int64_t i) { return x[i] * y[i]; });
}
inline double RowSumSquaredDeviationsF64(const float* x, int64_t n, double mean) {
  return SumSquaredDeviationsF64(x, n, mean);
}
inline double RowSumSquaredDeviationsF64(const double* x, int64_t n, double mean) {
  return SumF64(n, [&](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
}

// Max and log(sum(exp(x - max))) of one row, in compute type C. The exps are summed in f64
// (SumF64's order within each block): an f32 running sum over a long row (50257 classes: a sum
// near 3000, whose ulp exceeds half the terms) drops their low bits and comes out ~5e-5 low.
template <typename C, typename T>
void RowLogSumExp(const T* row, int64_t n, C* max_out, C* log_sum_out) {
  C max = -std::numeric_limits<C>::infinity();  // or the first NaN
  if constexpr (std::is_same_v<T, float> && std::is_same_v<C, float>) {
    max = MaxF32(row, n);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const C v = Widen(row[i]);
      if (std::isnan(v) || v > max) max = v;
      if (std::isnan(max)) break;
    }
  }
  // An all -inf row (or a +inf max) would give inf - inf; shift by 0 instead, as PyTorch does.
  const C shift = std::isinf(max) ? C(0) : max;
  double sum = 0;
  C block[kRowBlock];
  for (int64_t i = 0; i < n; i += kRowBlock) {
    const int64_t len = std::min(kRowBlock, n - i);
    for (int64_t j = 0; j < len; ++j) block[j] = static_cast<C>(Widen(row[i + j])) - shift;
    ExpRow(block, block, len);
    sum += RowSumF64(block, len);
  }
  *max_out = shift;
  *log_sum_out = static_cast<C>(std::log(sum));
}

// Layer norm of one row of n values: mean and biased variance accumulated in f64 (two passes:
// no cancellation from E[x^2] - E[x]^2; SumF64's order), then out = (x - mean) * rstd (* weight)
// (+ bias) in C, rounded once. weight and bias may be null.
template <typename T, typename C = ComputeType<T>>
void LayerNormRow(const T* row, int64_t n, const T* w, const T* b, double eps, T* out, C* mean,
                  C* rstd) {
  double mu, sq;
  if constexpr (std::is_same_v<T, C>) {
    mu = RowSumF64(row, n) / static_cast<double>(n);
    sq = RowSumSquaredDeviationsF64(row, n, mu);
  } else {
    mu = SumF64(n, [&](int64_t i) { return static_cast<double>(Widen(row[i])); }) /
         static_cast<double>(n);
    sq = SumF64(n, [&](int64_t i) {
      const double d = static_cast<double>(Widen(row[i])) - mu;
      return d * d;
    });
  }
  const C m = static_cast<C>(mu);
  const C rs = static_cast<C>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
  *mean = m;
  *rstd = rs;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<C, float>) {
    NormalizeF32(row, n, m, rs, w, b, out);
    return;
  }
  // In blocks of C: the three steps as separate loops (each vectorises), stored with the
  // vectorised conversions.
  C y[kRowBlock], wc[kRowBlock], bc[kRowBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const int64_t len = std::min(kRowBlock, n - i0);
    LoadRow(row + i0, 1, len, y);
    for (int64_t i = 0; i < len; ++i) y[i] = (y[i] - m) * rs;
    if (w) {
      LoadRow(w + i0, 1, len, wc);
      for (int64_t i = 0; i < len; ++i) y[i] *= wc[i];
    }
    if (b) {
      LoadRow(b + i0, 1, len, bc);
      for (int64_t i = 0; i < len; ++i) y[i] += bc[i];
    }
    StoreRow(y, len, out + i0, 1);
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
