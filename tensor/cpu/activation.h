// The scalar tanh-GELU and its derivative, shared by the elementwise kernel (UnaryOp::kGeluTanh)
// and the fused Linear kernels (tensor/cpu/fused_linear.cc), so that a fused Linear + GELU
// rounds exactly like GeluTanh(Matmul + bias) does.
//
//   const float y = GeluTanh(x);        // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   const float dy = GeluTanhGrad(x);   // d y / d x
#ifndef TAPEGRAD_TENSOR_CPU_ACTIVATION_H_
#define TAPEGRAD_TENSOR_CPU_ACTIVATION_H_

#include <cmath>

namespace tg::cpu {

// gelu_tanh(x) in the compute type C (float or double).
template <typename C>
inline C GeluTanh(C x) {
  constexpr C kSqrt2OverPi = C(0.7978845608028654);
  return C(0.5) * x * (C(1) + std::tanh(kSqrt2OverPi * (x + C(0.044715) * x * x * x)));
}

// d gelu_tanh(x) / dx = (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2), u = k (x + c x^3),
// evaluated in C with the operations, constants and order of composed::GeluTanhGrad
// (tensor/composed.cc: each op of that chain rounds to C, as each expression here does), so the
// fused backward matches the composed one bit for bit in f32 and f64.
template <typename C>
inline C GeluTanhGrad(C x) {
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2 / pi)
  const C x2 = x * x;
  const C t = std::tanh((x + (x2 * x) * static_cast<C>(c)) * static_cast<C>(k));
  const C left = (t + C(1)) * C(0.5);
  const C du = (x2 * static_cast<C>(3 * c) + C(1)) * static_cast<C>(k);
  const C right = (x * C(0.5)) * ((-(t * t) + C(1)) * du);
  return left + right;
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_ACTIVATION_H_
