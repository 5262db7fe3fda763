// Elementwise CUDA kernels: Copy, Fill, Binary, BinaryScalar, Compare, Unary and Where, with the
// formulas, integer wrap-around and f16/bf16 rounding of tensor/cpu/elementwise.cc.
//
// Compile time: one kernel per (op family, dtype, layout), with the op chosen by a switch inside
// the kernel (the same op for every thread, so the branch costs a few instructions per element
// of a memory-bound loop); kernels that only move bytes are instantiated per element size.
//
// Results: +, -, *, /, sqrt, max/min, neg/abs/relu and every conversion are IEEE-exact on both
// devices, so they match the CPU bit for bit (the file is built with --fmad=false so that nvcc
// does not fuse a*b+c into an FMA the CPU does not use). exp/log/tanh/erf/pow come from CUDA's
// libdevice, whose last-bit rounding differs from glibc's (a few ulp at most).
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/tensor_args.cuh"
#include "tensor/elementwise_formulas.h"

namespace tg::cuda {
namespace {

// ---- Op definitions (tensor/cpu/elementwise.cc) -----------------------------------------------

// Overloads that pick the f32 or f64 libdevice function.
#define TG_MATH_OVERLOAD(name, f32, f64)                            \
  __device__ __forceinline__ float name(float x) { return f32(x); } \
  __device__ __forceinline__ double name(double x) { return f64(x); }
TG_MATH_OVERLOAD(Exp, expf, exp)
TG_MATH_OVERLOAD(Log, logf, log)
TG_MATH_OVERLOAD(Sqrt, sqrtf, sqrt)
TG_MATH_OVERLOAD(Tanh, tanhf, tanh)
TG_MATH_OVERLOAD(Erf, erff, erf)
TG_MATH_OVERLOAD(Fabs, fabsf, fabs)
#undef TG_MATH_OVERLOAD
__device__ __forceinline__ float Pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double Pow(double a, double b) { return pow(a, b); }

// CUDA's math for the shared formulas (tensor/elementwise_formulas.h): the libdevice functions.
struct DeviceMath {
  template <typename C>
  __device__ static C Pow(C a, C b) {
    return cuda::Pow(a, b);
  }
  template <typename C>
  __device__ static C Fabs(C x) {
    return cuda::Fabs(x);
  }
  template <typename C>
  __device__ static C Exp(C x) {
    return cuda::Exp(x);
  }
  template <typename C>
  __device__ static C Log(C x) {
    return cuda::Log(x);
  }
  template <typename C>
  __device__ static C Sqrt(C x) {
    return cuda::Sqrt(x);
  }
  template <typename C>
  __device__ static C Tanh(C x) {
    return cuda::Tanh(x);
  }
  template <typename C>
  __device__ static C Erf(C x) {
    return cuda::Erf(x);
  }
};

template <typename C>
__device__ __forceinline__ C ApplyBinary(BinaryOp op, C a, C b) {
  return elementwise::ApplyBinary<DeviceMath>(op, a, b);
}

template <typename C>
__device__ __forceinline__ C ApplyUnary(UnaryOp op, C x) {
  return elementwise::ApplyUnary<DeviceMath>(op, x);
}

using elementwise::ApplyCompare;

// ---- Functors (storage types in, storage type out) ----------------------------------------------

template <typename T>
struct BinaryFn {
  BinaryOp op;
  __device__ T operator()(T a, T b) const {
    return ConvertTo<T>(ApplyBinary(op, ToCompute(a), ToCompute(b)));
  }
};

// grad_out * gelu_tanh'(pre), with the operations and order of composed::GeluTanhGrad: with
// u = k (x + c x^3), gelu'(x) = (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2).
template <typename T>
struct GeluTanhBackwardFn {
  __device__ T operator()(T grad_out, T pre) const {
    using C = DeviceCompute<T>;
    const C k = C(0.7978845608028654), c = C(0.044715);
    const C x = ToCompute(pre), x2 = x * x;
    const C t = Tanh((x + (x2 * x) * c) * k);
    const C left = (t + C(1)) * C(0.5);
    const C du = (x2 * (C(3) * c) + C(1)) * k;
    const C right = (x * C(0.5)) * ((-(t * t) + C(1)) * du);
    return ConvertTo<T>(ToCompute(grad_out) * (left + right));
  }
};

template <typename T>
struct BinaryScalarFn {
  BinaryOp op;
  DeviceCompute<T> scalar;
  __device__ T operator()(T a) const { return ConvertTo<T>(ApplyBinary(op, ToCompute(a), scalar)); }
};

template <typename T>
struct UnaryFn {
  UnaryOp op;
  __device__ T operator()(T x) const { return ConvertTo<T>(ApplyUnary(op, ToCompute(x))); }
};

template <typename T>
struct CompareFn {
  CompareOp op;
  __device__ bool operator()(T a, T b) const {
    return ApplyCompare(op, ToCompute(a), ToCompute(b));
  }
};

// AddScaled's a + s b with one rounding (the explicit fused multiply-add; --fmad=false only stops
// nvcc from fusing on its own): s = alpha, or the factor tensor's element (FactorFn).
__device__ __forceinline__ float Fma(float x, float y, float z) { return __fmaf_rn(x, y, z); }
__device__ __forceinline__ double Fma(double x, double y, double z) { return __fma_rn(x, y, z); }
template <typename T>
struct AddScaledFn {
  DeviceCompute<T> alpha;
  __device__ T operator()(T a, T b) const {
    return ConvertTo<T>(Fma(alpha, ToCompute(b), ToCompute(a)));
  }
};
template <typename T>
struct AddScaledFactorFn {
  __device__ T operator()(T a, T b, T s) const {
    return ConvertTo<T>(Fma(ToCompute(s), ToCompute(b), ToCompute(a)));
  }
};
// torch's lerp: fma(s, b - a, base) with base = a (s = w, |w| < 0.5) or b (s = -(1 - w)).
template <typename T>
struct LerpFn {
  DeviceCompute<T> s;
  bool from_b;
  __device__ T operator()(T a, T b) const {
    const DeviceCompute<T> ca = ToCompute(a), cb = ToCompute(b);
    return ConvertTo<T>(Fma(s, cb - ca, from_b ? cb : ca));
  }
};

// SwiGLU with the roundings of Mul(Silu(gate), up) on this device (tensor/kernel_list.inc).
template <typename T>
__device__ __forceinline__ DeviceCompute<T> RoundedTo(DeviceCompute<T> v) {
  return ToCompute(ConvertTo<T>(v));
}
template <typename T>
struct SwigluFn {
  __device__ T operator()(T gate, T up) const {
    const DeviceCompute<T> s = RoundedTo<T>(ApplyUnary(UnaryOp::kSilu, ToCompute(gate)));
    return ConvertTo<T>(s * ToCompute(up));
  }
};

// Its backward: Mul's, then Silu's formula (grad * s (1 + g (1 - s))), each rounded where the
// composed ops round; contiguous tensors, one thread per element.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    SwigluBackwardKernel(T* grad_gate, T* grad_up, const T* grad_out, const T* gate, const T* up,
                         int64_t n) {
  using C = DeviceCompute<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const C x = ToCompute(gate[i]), d = ToCompute(grad_out[i]);
    const C s = RoundedTo<T>(ApplyUnary(UnaryOp::kSigmoid, x));
    const C one_minus = RoundedTo<T>(-s + C(1));
    const C t = RoundedTo<T>(RoundedTo<T>(x * one_minus) + C(1));
    const C silu_grad = RoundedTo<T>(s * t);
    const C grad_silu = RoundedTo<T>(d * ToCompute(up[i]));
    grad_gate[i] = ConvertTo<T>(grad_silu * silu_grad);
    grad_up[i] = ConvertTo<T>(d * RoundedTo<T>(ApplyUnary(UnaryOp::kSilu, x)));
  }
}

// B: the unsigned integer of the element size; the condition is bool or u8 (nonzero = true).
template <typename B>
struct WhereFn {
  __device__ B operator()(uint8_t cond, B a, B b) const { return cond != 0 ? a : b; }
};

template <typename B>
struct FillFn {
  B bits;
  __device__ B operator()() const { return bits; }
};

template <typename B>
struct IdentityFn {
  __device__ B operator()(B v) const { return v; }
};

template <typename Dst, typename Src>
struct ConvertFn {
  __device__ Dst operator()(Src v) const { return ConvertTo<Dst>(v); }
};

// ---- Copy between any two dtypes ----------------------------------------------------------------
// Pairs of floating dtypes (the casts of mixed precision) get typed, vectorised kernels. Every
// other pair goes through one kernel that switches on both dtypes at run time: a value is loaded
// exactly as f32 (f16/bf16/f32), f64, or i64 (integers, bool) and stored with the conversion that
// tg::Convert applies to that source type, so 64 dtype pairs cost one kernel.

struct AnyValue {
  enum Kind : uint8_t { kFloat, kDouble, kInt } kind;
  float f;
  double d;
  int64_t i;
};

__device__ __forceinline__ AnyValue LoadAny(DType dtype, const char* p) {
  AnyValue v{};
  switch (dtype) {
    case DType::kF32:
      v.kind = AnyValue::kFloat;
      v.f = *reinterpret_cast<const float*>(p);
      break;
    case DType::kF16:
      v.kind = AnyValue::kFloat;
      v.f = HalfToFloat(*reinterpret_cast<const __half*>(p));
      break;
    case DType::kBF16:
      v.kind = AnyValue::kFloat;
      v.f = BFloat16ToFloat(*reinterpret_cast<const __nv_bfloat16*>(p));
      break;
    case DType::kF64:
      v.kind = AnyValue::kDouble;
      v.d = *reinterpret_cast<const double*>(p);
      break;
    case DType::kI32:
      v.kind = AnyValue::kInt;
      v.i = *reinterpret_cast<const int32_t*>(p);
      break;
    case DType::kI64:
      v.kind = AnyValue::kInt;
      v.i = *reinterpret_cast<const int64_t*>(p);
      break;
    case DType::kU8:
      v.kind = AnyValue::kInt;
      v.i = *reinterpret_cast<const uint8_t*>(p);
      break;
    case DType::kBool:
      v.kind = AnyValue::kInt;
      v.i = *reinterpret_cast<const uint8_t*>(p) != 0;
      break;
    case DType::kF8E4M3:  // exact in float
      v.kind = AnyValue::kFloat;
      v.f = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(p));
      break;
    case DType::kF8E5M2:
      v.kind = AnyValue::kFloat;
      v.f = static_cast<float>(*reinterpret_cast<const __nv_fp8_e5m2*>(p));
      break;
  }
  return v;
}

// To FP8 with one rounding to nearest even, saturating (__NV_SATFINITE: tensor/float8.h's
// kSatFinite, the host's rule): doubles and integers convert from double directly.
__device__ __forceinline__ void StoreFloat8(char* p, const AnyValue& v,
                                            __nv_fp8_interpretation_t format) {
  __nv_fp8_storage_t out;
  if (v.kind == AnyValue::kFloat) {
    out = __nv_cvt_float_to_fp8(v.f, __NV_SATFINITE, format);
  } else {
    const double d = v.kind == AnyValue::kDouble ? v.d : static_cast<double>(v.i);
    out = __nv_cvt_double_to_fp8(d, __NV_SATFINITE, format);
  }
  *reinterpret_cast<__nv_fp8_storage_t*>(p) = out;
}

template <typename Dst>
__device__ __forceinline__ void StoreAnyAs(char* p, const AnyValue& v) {
  Dst out;
  switch (v.kind) {
    case AnyValue::kFloat:
      out = ConvertTo<Dst>(v.f);
      break;
    case AnyValue::kDouble:
      out = ConvertTo<Dst>(v.d);
      break;
    default:
      out = ConvertTo<Dst>(v.i);
      break;
  }
  *reinterpret_cast<Dst*>(p) = out;
}

__device__ __forceinline__ void StoreAny(DType dtype, char* p, const AnyValue& v) {
  switch (dtype) {
    case DType::kF32:
      return StoreAnyAs<float>(p, v);
    case DType::kF64:
      return StoreAnyAs<double>(p, v);
    case DType::kF16:
      return StoreAnyAs<__half>(p, v);
    case DType::kBF16:
      return StoreAnyAs<__nv_bfloat16>(p, v);
    case DType::kI32:
      return StoreAnyAs<int32_t>(p, v);
    case DType::kI64:
      return StoreAnyAs<int64_t>(p, v);
    case DType::kU8:
      return StoreAnyAs<uint8_t>(p, v);
    case DType::kBool:
      return StoreAnyAs<bool>(p, v);
    case DType::kF8E4M3:
      return StoreFloat8(p, v, __NV_E4M3);
    case DType::kF8E5M2:
      return StoreFloat8(p, v, __NV_E5M2);
  }
}

__global__ void __launch_bounds__(kThreads)
    AnyCopyKernel(int64_t n, DType dst, DType src, StridedArgs<2> args) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[2];
    args.Offsets(i, off);
    StoreAny(dst, args.base[0] + off[0], LoadAny(src, args.base[1] + off[1]));
  }
}

// Calls fn with the device type of a floating dtype; returns false for the others.
template <typename Fn>
bool VisitFloatingIf(DType dtype, Fn&& fn) {
  if (!IsFloating(dtype)) return false;
  VisitDeviceFloating("copy", dtype, fn);
  return true;
}

}  // namespace

void Copy(const RawTensor& dst, const RawTensor& src) {
  TG_CHECK(dst.device().is_cuda() && src.device() == dst.device(), "copy: from ",
           src.device().ToString(), " to ", dst.device().ToString(),
           " (the CUDA copy kernel needs both tensors on one CUDA device)");
  if (dst.numel() == 0) return;
  const DeviceGuard guard(dst.device().index);
  if (dst.dtype() == src.dtype()) {
    if (dst.is_contiguous() && src.is_contiguous() && src.shape() == dst.shape()) {
      if (dst.raw_data() == src.raw_data()) return;
      TG_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(),
                                    static_cast<size_t>(dst.numel()) * dst.element_size(),
                                    cudaMemcpyDeviceToDevice, StreamOf(dst)));
      return;
    }
    VisitBits(dst.element_size(), [&](auto bits) {
      using B = decltype(bits);
      LaunchElementwise<B, B>("copy", dst, {&src}, IdentityFn<B>{});
    });
    return;
  }
  bool typed = false;
  if (IsFloating(src.dtype())) {
    typed = VisitFloatingIf(dst.dtype(), [&](auto dst_tag) {
      VisitDeviceFloating("copy", src.dtype(), [&](auto src_tag) {
        using D = decltype(dst_tag);
        using S = decltype(src_tag);
        if constexpr (!std::is_same_v<D, S>) {
          LaunchElementwise<D, S>("copy", dst, {&src}, ConvertFn<D, S>{});
        }
      });
    });
  }
  if (typed) return;
  const cudaStream_t stream = StreamOf(dst);
  ForEachStridedSlice<2>(
      dst.shape(), {static_cast<char*>(dst.raw_data()), static_cast<char*>(src.raw_data())},
      {BroadcastByteStrides(dst, dst.shape()), BroadcastByteStrides(src, dst.shape())},
      [&](const StridedArgs<2>& args, int64_t count) {
        AnyCopyKernel<<<BlocksFor(count, kThreads), kThreads, 0, stream>>>(count, dst.dtype(),
                                                                           src.dtype(), args);
        TG_CUDA_CHECK_LAUNCH("copy");
      });
}

void Fill(const RawTensor& dst, double value) {
  if (dst.numel() == 0) return;
  const DeviceGuard guard(dst.device().index);
  // The stored bit pattern, converted on the host exactly as the CPU's fill_ does.
  uint64_t bits = 0;
  Visit(dst.dtype(), [&](auto tag) {
    const auto v = Convert<decltype(tag)>(value);
    std::memcpy(&bits, &v, sizeof(v));
  });
  const size_t size = dst.element_size();
  bool same_bytes = true;  // e.g. zero: a memset
  for (size_t k = 1; k < size; ++k) {
    same_bytes = same_bytes && ((bits >> (8 * k)) & 0xff) == (bits & 0xff);
  }
  if (same_bytes && dst.is_contiguous()) {
    TG_CUDA_CHECK(cudaMemsetAsync(dst.raw_data(), static_cast<int>(bits & 0xff),
                                  static_cast<size_t>(dst.numel()) * size, StreamOf(dst)));
    return;
  }
  VisitBits(size, [&](auto tag) {
    using B = decltype(tag);
    LaunchElementwise<B>("fill", dst, {}, FillFn<B>{static_cast<B>(bits)});
  });
}

void Binary(BinaryOp op, const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  const DeviceGuard guard(out.device().index);
  VisitDevice(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(absl::StrCat(BinaryOpName(op), ": not defined for bool tensors"));
    } else {
      LaunchElementwise<T, T, T>(BinaryOpName(op), out, {&a, &b}, BinaryFn<T>{op});
    }
  });
}

void BinaryScalar(BinaryOp op, const RawTensor& out, const RawTensor& x, double scalar) {
  const DeviceGuard guard(out.device().index);
  VisitDevice(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(absl::StrCat(BinaryOpName(op), ": not defined for bool tensors"));
    } else {
      // Rounded on the host exactly as the CPU does (f32 for f16/bf16/f32, i64 for integers).
      const auto s = static_cast<DeviceCompute<T>>(scalar);
      LaunchElementwise<T, T>(BinaryOpName(op), out, {&x}, BinaryScalarFn<T>{op, s});
    }
  });
}

void Compare(CompareOp op, const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  const DeviceGuard guard(out.device().index);
  VisitDevice(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    LaunchElementwise<bool, T, T>(CompareOpName(op), out, {&a, &b}, CompareFn<T>{op});
  });
}

void Unary(UnaryOp op, const RawTensor& out, const RawTensor& x) {
  const DeviceGuard guard(out.device().index);
  VisitDevice(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(absl::StrCat(UnaryOpName(op), ": not defined for bool tensors"));
    } else {
      LaunchElementwise<T, T>(UnaryOpName(op), out, {&x}, UnaryFn<T>{op});
    }
  });
}

void GeluTanhBackward(const RawTensor& grad_in, const RawTensor& grad_out, const RawTensor& pre) {
  const char* op = "gelu_tanh_backward";
  for (const RawTensor* t : {&grad_out, &pre}) {
    TG_CHECK(t->device() == grad_in.device() && t->dtype() == grad_in.dtype() &&
                 t->shape() == grad_in.shape(),
             op, ": grad_out and pre must match grad_in (", ShapeToString(grad_in.shape()), " ",
             DTypeName(grad_in.dtype()), " on ", grad_in.device().ToString(), "), got ",
             ShapeToString(t->shape()), " ", DTypeName(t->dtype()), " on ", t->device().ToString());
  }
  const DeviceGuard guard(grad_in.device().index);
  VisitDeviceFloating(op, grad_in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    LaunchElementwise<T, T, T>(op, grad_in, {&grad_out, &pre}, GeluTanhBackwardFn<T>{});
  });
}

KernelStatus AddScaled(const RawTensor& out, const RawTensor& a, const RawTensor& b, double alpha,
                       const RawTensor& factor, double a_scale) {
  const char* op = "add_scaled";
  // Mixed dtypes and a scaled a: the composed form (b widened, a scaled first).
  if (b.dtype() != out.dtype() || a_scale != 1) return KernelStatus::kNoKernel;
  const DeviceGuard guard(out.device().index);
  VisitDeviceFloating(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (factor.defined()) {
      LaunchElementwise<T, T, T, T>(op, out, {&a, &b, &factor}, AddScaledFactorFn<T>{});
    } else {
      LaunchElementwise<T, T, T>(op, out, {&a, &b},
                                 AddScaledFn<T>{static_cast<DeviceCompute<T>>(alpha)});
    }
  });
  return KernelStatus::kDone;
}

KernelStatus Lerp(const RawTensor& out, const RawTensor& a, const RawTensor& b, double weight) {
  const char* op = "lerp";
  if (a.dtype() != out.dtype()) return KernelStatus::kNoKernel;  // mixed: composed (then cast)
  const DeviceGuard guard(out.device().index);
  VisitDeviceFloating(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = DeviceCompute<T>;
    const C w = static_cast<C>(weight);
    const bool from_b = !(std::abs(w) < C(0.5));
    LaunchElementwise<T, T, T>(op, out, {&a, &b}, LerpFn<T>{from_b ? -(C(1) - w) : w, from_b});
  });
  return KernelStatus::kDone;
}

KernelStatus Swiglu(const RawTensor& out, const RawTensor& gate, const RawTensor& up) {
  const char* op = "swiglu";
  const DeviceGuard guard(out.device().index);
  VisitDeviceFloating(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    LaunchElementwise<T, T, T>(op, out, {&gate, &up}, SwigluFn<T>{});
  });
  return KernelStatus::kDone;
}

KernelStatus SwigluBackward(const RawTensor& grad_gate, const RawTensor& grad_up,
                            const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up) {
  const char* op = "swiglu_backward";
  const int64_t n = gate.numel();
  if (n == 0) return KernelStatus::kDone;
  const DeviceGuard guard(gate.device().index);
  const cudaStream_t stream = StreamOf(gate);
  VisitDeviceFloating(op, gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    SwigluBackwardKernel<T><<<BlocksFor(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(grad_gate.raw_data()), static_cast<T*>(grad_up.raw_data()),
        static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(gate.raw_data()),
        static_cast<const T*>(up.raw_data()), n);
    TG_CUDA_CHECK_LAUNCH("SwigluBackwardKernel");
  });
  return KernelStatus::kDone;
}

void Where(const RawTensor& out, const RawTensor& cond, const RawTensor& a, const RawTensor& b) {
  TG_CHECK(cond.element_size() == 1, "where: the condition must be bool or u8, got ",
           DTypeName(cond.dtype()));
  const DeviceGuard guard(out.device().index);
  VisitBits(out.element_size(), [&](auto tag) {
    using B = decltype(tag);
    LaunchElementwise<B, uint8_t, B, B>("where", out, {&cond, &a, &b}, WhereFn<B>{});
  });
}

}  // namespace tg::cuda
