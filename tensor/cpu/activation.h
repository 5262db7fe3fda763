// exp, tanh, tanh-GELU and its derivative, sigmoid and SiLU over rows of values in the compute
// type C (float or double), shared by the elementwise kernels (UnaryOp::kExp, kTanh, kGeluTanh,
// kSigmoid, kSilu), the softmax and
// cross-entropy rows (rows.h), attention (fused_attention.cc) and the fused Linear kernels
// (fused_linear.cc), so that a fused kernel rounds exactly like the composed ops it replaces
// (a fused Linear + GELU like GeluTanh(Matmul + bias)). float rows go through the vectorised forms
// of vec_math.h; double rows through the scalar forms below (libm's tanh), the exact references of
// gradchecks.
//
//   GeluTanhRow(x, y, n);       // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   GeluTanhGradRow(x, dy, n);  // dy = d y / d x
#ifndef TAPEGRAD_TENSOR_CPU_ACTIVATION_H_
#define TAPEGRAD_TENSOR_CPU_ACTIVATION_H_

#include <cmath>
#include <cstdint>

#include "tensor/cpu/vec_math.h"

namespace tg::cpu {

inline double GeluTanh(double x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2), u = k (x + c x^3), with the
// operations and order of composed::GeluTanhGrad (tensor/composed.cc).
inline double GeluTanhGrad(double x) {
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2 / pi)
  const double x2 = x * x;
  const double t = std::tanh((x + (x2 * x) * c) * k);
  const double left = (t + 1) * 0.5;
  const double du = (x2 * (3 * c) + 1) * k;
  const double right = (x * 0.5) * ((-(t * t) + 1) * du);
  return left + right;
}

inline void ExpRow(const float* x, float* y, int64_t n) { ExpF32(x, y, n); }
inline void TanhRow(const float* x, float* y, int64_t n) { TanhF32(x, y, n); }
inline void GeluTanhRow(const float* x, float* y, int64_t n) { GeluTanhF32(x, y, n); }
inline void GeluTanhGradRow(const float* x, float* y, int64_t n) { GeluTanhGradF32(x, y, n); }

inline void ExpRow(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// sigmoid(x) = 1 / (1 + exp(-x)) and silu(x) = x / (1 + exp(-x)) (the formulas of
// tensor/elementwise_formulas.h) with ExpRow's exp, in blocks; y may be x. (For float rows the
// vectorised forms below compute the same operations.)
template <bool kSilu, typename C>
void SigmoidOrSiluRow(const C* x, C* y, int64_t n) {
  constexpr int64_t kChunk = 256;
  C e[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    for (int64_t j = 0; j < len; ++j) e[j] = -x[i + j];
    ExpRow(e, e, len);
    for (int64_t j = 0; j < len; ++j) y[i + j] = (kSilu ? x[i + j] : C(1)) / (C(1) + e[j]);
  }
}
// float rows in vectors (vec_math.h: the same operations, so the same bits).
inline void SigmoidRow(const float* x, float* y, int64_t n) { SigmoidF32(x, y, n); }
inline void SiluRow(const float* x, float* y, int64_t n) { SiluF32(x, y, n); }
inline void SigmoidRow(const double* x, double* y, int64_t n) { SigmoidOrSiluRow<false>(x, y, n); }
inline void SiluRow(const double* x, double* y, int64_t n) { SigmoidOrSiluRow<true>(x, y, n); }
inline void TanhRow(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}
inline void GeluTanhRow(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = GeluTanh(x[i]);
}
inline void GeluTanhGradRow(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = GeluTanhGrad(x[i]);
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_ACTIVATION_H_
