// The elementwise formulas of the kernel list (Binary, BinaryScalar, Unary, Compare of
// tensor/kernel_list.inc) in the compute type C, defined once for every device: the CPU's kernels
// (tensor/cpu/elementwise.cc) and CUDA's (tensor/cuda/elementwise.cu) both call these
// (TG_HOST_DEVICE), so a formula cannot differ between them. The math functions come from `Math`,
// the device's own (the host's std:: functions, CUDA's libdevice ones), which is where their
// roundings may differ; everything else (NaN propagation of maximum/minimum, ReLU of NaN, integer
// wrap-around, the GELU constants) is this file.
//
//   float y = tg::elementwise::ApplyUnary<tg::elementwise::HostMath>(tg::UnaryOp::kGelu, 0.5f);
#ifndef TAPEGRAD_TENSOR_ELEMENTWISE_FORMULAS_H_
#define TAPEGRAD_TENSOR_ELEMENTWISE_FORMULAS_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/host_device.h"
#include "tensor/op_kinds.h"

namespace tg::elementwise {

// Integer arithmetic wraps modulo 2^64 instead of overflowing (signed overflow is undefined).
TG_HOST_DEVICE inline int64_t WrapAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
TG_HOST_DEVICE inline int64_t WrapSub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
TG_HOST_DEVICE inline int64_t WrapMul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Math: Pow(a, b), Fabs, Exp, Log, Sqrt, Tanh, Erf for float and double.
template <typename Math, typename C>
TG_HOST_DEVICE inline C ApplyBinary(BinaryOp op, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case BinaryOp::kAdd:
        return a + b;
      case BinaryOp::kSub:
        return a - b;
      case BinaryOp::kMul:
        return a * b;
      case BinaryOp::kDiv:
        return a / b;
      case BinaryOp::kPow:
        return Math::Pow(a, b);
      case BinaryOp::kMaximum:  // NaN in either input gives that NaN (the first one's if both)
        return a != a ? a : b != b ? b : (a > b ? a : b);
      case BinaryOp::kMinimum:
        return a != a ? a : b != b ? b : (a < b ? a : b);
      case BinaryOp::kReluBackward:
        return b <= C(0) ? C(0) : a;
      case BinaryOp::kGeluTanhBackward: {
        // a * dy/dx at x = b for y = x/2 (1 + tanh u), u = k (x + c x^3):
        // dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) k (1 + 3 c x^2), with the operations and
        // order of composed::GeluTanhGrad (tensor/composed.cc) and the CPU's GeluTanhGrad rows.
        const C k = C(0.7978845608028654), c = C(0.044715);
        const C x2 = b * b;
        const C t = Math::Tanh((b + (x2 * b) * c) * k);
        const C left = (t + C(1)) * C(0.5);
        const C du = (x2 * (C(3) * c) + C(1)) * k;
        const C right = (b * C(0.5)) * ((-(t * t) + C(1)) * du);
        return a * (left + right);
      }
    }
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return WrapAdd(a, b);
      case BinaryOp::kSub:
        return WrapSub(a, b);
      case BinaryOp::kMul:
        return WrapMul(a, b);
      case BinaryOp::kMaximum:
        return a > b ? a : b;
      case BinaryOp::kMinimum:
        return a < b ? a : b;
      case BinaryOp::kReluBackward:
        return b <= 0 ? 0 : a;
      default:
        break;  // div and pow are rejected for integers by the dispatch
    }
  }
  return C(0);
}

template <typename Math, typename C>
TG_HOST_DEVICE inline C ApplyUnary(UnaryOp op, C x) {
  if constexpr (std::is_floating_point_v<C>) {
    constexpr C kSqrt2OverPi = C(0.7978845608028654);
    constexpr C kInvSqrt2 = C(0.7071067811865476);
    switch (op) {
      case UnaryOp::kNeg:
        return -x;
      case UnaryOp::kAbs:
        return Math::Fabs(x);
      case UnaryOp::kExp:
        return Math::Exp(x);
      case UnaryOp::kLog:
        return Math::Log(x);
      case UnaryOp::kSqrt:
        return Math::Sqrt(x);
      case UnaryOp::kTanh:
        return Math::Tanh(x);
      case UnaryOp::kSigmoid:
        return C(1) / (C(1) + Math::Exp(-x));
      case UnaryOp::kRelu:
        return x > C(0) ? x : (x != x ? x : C(0));
      case UnaryOp::kGeluTanh:
        return C(0.5) * x * (C(1) + Math::Tanh(kSqrt2OverPi * (x + C(0.044715) * x * x * x)));
      case UnaryOp::kGelu:
        return C(0.5) * x * (C(1) + Math::Erf(x * kInvSqrt2));
      case UnaryOp::kErf:
        return Math::Erf(x);
      case UnaryOp::kSilu:
        return x / (C(1) + Math::Exp(-x));  // x * sigmoid(x); -0 for x -> -inf, as PyTorch
    }
  } else {
    switch (op) {
      case UnaryOp::kNeg:
        return WrapSub(0, x);
      case UnaryOp::kAbs:
        return x < 0 ? WrapSub(0, x) : x;
      case UnaryOp::kRelu:
        return x > 0 ? x : 0;
      default:
        break;  // floating-only ops are rejected by the dispatch
    }
  }
  return C(0);
}

template <typename C>
TG_HOST_DEVICE inline bool ApplyCompare(CompareOp op, C a, C b) {
  switch (op) {
    case CompareOp::kEq:
      return a == b;
    case CompareOp::kNe:
      return a != b;
    case CompareOp::kLt:
      return a < b;
    case CompareOp::kLe:
      return a <= b;
    case CompareOp::kGt:
      return a > b;
    case CompareOp::kGe:
      return a >= b;
  }
  return false;
}

// The host's math (the C library's, what the CPU kernels and their tests use); CUDA passes its
// libdevice functions instead (tensor/cuda/elementwise.cu).
struct HostMath {
  template <typename C>
  static C Pow(C a, C b) {
    return std::pow(a, b);
  }
  template <typename C>
  static C Fabs(C x) {
    return std::fabs(x);
  }
  template <typename C>
  static C Exp(C x) {
    return std::exp(x);
  }
  template <typename C>
  static C Log(C x) {
    return std::log(x);
  }
  template <typename C>
  static C Sqrt(C x) {
    return std::sqrt(x);
  }
  template <typename C>
  static C Tanh(C x) {
    return std::tanh(x);
  }
  template <typename C>
  static C Erf(C x) {
    return std::erf(x);
  }
};

}  // namespace tg::elementwise

#endif  // TAPEGRAD_TENSOR_ELEMENTWISE_FORMULAS_H_
