// Device-side building blocks shared by tapegrad's CUDA kernels (include from .cu files only).
//
//  - VisitDevice(dtype, fn): the host-side switch from tg::DType to the device storage type
//    (float, double, __half, __nv_bfloat16, int32_t, int64_t, uint8_t, bool).
//  - ToCompute(v) / ConvertTo<T>(v): widen a stored value to the type kernels compute in
//    (DeviceCompute<T>: f32 for f16/bf16/f32, f64 for f64, i64 for integers) and convert back.
//    Every conversion equals tensor/convert.h on the CPU bit for bit, NaN payloads included.
//  - StridedArgs / ForEachStridedSlice: byte offsets of N operands over up to kMaxDims coalesced
//    dims with int64 indexing (sizes and strides travel by value in the kernel arguments).
//  - LaunchElementwise<Out, In...>(name, out, {&in...}, f): out[i] = f(in[i]...) with inputs
//    broadcast to out's shape. Contiguous, 16-byte-aligned operands take a vectorised path (one
//    128-bit access per operand and thread, a scalar tail); anything else the strided path.
//
//   struct AddOne {
//     __device__ float operator()(float x) const { return x + 1.0f; }
//   };
//   tg::cuda::LaunchElementwise<float, float>("add_one", out, {&x}, AddOne{});
//
// Functors are plain structs (trivially copyable, passed by value to the kernel) whose
// operator() takes and returns storage types; they convert with ToCompute/ConvertTo themselves.
#ifndef TAPEGRAD_TENSOR_CUDA_TENSOR_ARGS_CUH_
#define TAPEGRAD_TENSOR_CUDA_TENSOR_ARGS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "tensor/cuda/runtime.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/strided_loop.h"
#include "tensor/tensor.h"

namespace tg::cuda {

// ---- Dtypes ------------------------------------------------------------------------------------

// The device storage types of the reduced floating dtypes, for tg::VisitDTypeAs (tensor/dtype.h,
// the one dtype switch).
struct DeviceStorageTypes {
  using F16 = __half;
  using BF16 = __nv_bfloat16;
};

// Calls fn with a value of the device storage type of `dtype`.
template <typename Fn>
decltype(auto) VisitDevice(DType dtype, Fn&& fn) {
  return VisitDTypeAs<DeviceStorageTypes, DTypeSet::kAll>("", dtype, std::forward<Fn>(fn));
}

// Like VisitDevice, restricted to the floating types; others throw the same message as
// tg::VisitFloating: "<op>: expected a floating dtype (f32, f64, f16, bf16), got i64".
template <typename Fn>
decltype(auto) VisitDeviceFloating(const char* op, DType dtype, Fn&& fn) {
  return VisitDTypeAs<DeviceStorageTypes, DTypeSet::kFloating>(op, dtype, std::forward<Fn>(fn));
}

// Unsigned integer of `bytes` bytes (1, 2, 4, 8): kernels that only move elements (copy, fill,
// where) are instantiated per element size, not per dtype.
template <typename Fn>
decltype(auto) VisitBits(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    default:
      return fn(uint64_t{});
  }
}

template <typename T>
inline constexpr bool kIsReducedFloat =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The type kernels compute in, as tg::ComputeType on the CPU: f32 for f16/bf16/f32, f64 for f64,
// i64 for the integer types, bool for bool.
template <typename T>
using DeviceCompute = std::conditional_t<
    kIsReducedFloat<T> || std::is_same_v<T, float>, float,
    std::conditional_t<std::is_same_v<T, double>, double,
                       std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>>;

// ---- Conversions --------------------------------------------------------------------------------
// The hardware conversions round to nearest even like tensor/half.h and x86 do, but they replace
// a NaN by the canonical NaN, where the CPU keeps its sign and payload. NaNs therefore take the
// CPU's bit rule (one compare; the branch is not taken on finite data), so a copy is bit-exact.

__device__ __forceinline__ float HalfToFloat(__half h) {
  const uint32_t b = __half_as_ushort(h);
  if ((b & 0x7fffu) > 0x7c00u) {
    return __uint_as_float(((b & 0x8000u) << 16) | 0x7f800000u | ((b & 0x3ffu) << 13));
  }
  return __half2float(h);
}

__device__ __forceinline__ __half FloatToHalf(float f) {
  if (f != f) {  // tensor/half.h: sign and the top 10 payload bits; never let it become inf
    const uint32_t x = __float_as_uint(f);
    uint32_t payload = (x >> 13) & 0x3ffu;
    if (payload == 0) payload = 0x200u;
    return __ushort_as_half(static_cast<unsigned short>(((x >> 16) & 0x8000u) | 0x7c00u | payload));
  }
  return __float2half_rn(f);
}

__device__ __forceinline__ float BFloat16ToFloat(__nv_bfloat16 b) {
  return __uint_as_float(static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16);  // exact
}

__device__ __forceinline__ __nv_bfloat16 FloatToBFloat16(float f) {
  if (f != f) {
    uint32_t b = __float_as_uint(f) >> 16;
    if ((b & 0x7fu) == 0) b |= 0x40u;
    return __ushort_as_bfloat16(static_cast<unsigned short>(b));
  }
  return __float2bfloat16_rn(f);
}

// x86's cvtsd2ss / cvtss2sd on NaN: keep the sign and the top payload bits, set the quiet bit.
__device__ __forceinline__ float DoubleToFloat(double d) {
  if (d != d) {
    const uint64_t x = static_cast<uint64_t>(__double_as_longlong(d));
    return __uint_as_float(static_cast<uint32_t>((x >> 32) & 0x80000000u) | 0x7fc00000u |
                           static_cast<uint32_t>((x >> 29) & 0x7fffffu));
  }
  return __double2float_rn(d);
}

__device__ __forceinline__ double FloatToDouble(float f) {
  if (f != f) {
    const uint64_t x = __float_as_uint(f);
    return __longlong_as_double(static_cast<long long>(
        ((x & 0x80000000u) << 32) | 0x7ff8000000000000ull | ((x & 0x7fffffu) << 29)));
  }
  return static_cast<double>(f);
}

// tg::DoubleToFloatRoundToOdd: truncate, then set the lowest bit when inexact, so that f64 ->
// f16/bf16 through f32 rounds once.
__device__ __forceinline__ float DoubleToFloatRoundToOdd(double d) {
  if (d != d) return DoubleToFloat(d);
  const float f = __double2float_rz(d);
  if (static_cast<double>(f) == d) return f;
  return __uint_as_float(__float_as_uint(f) | 1u);
}

// Float -> integer: truncate toward zero, saturate at the type's range, NaN -> 0. The bounds
// of the integer types are exact or round up to a power of two in F, so `>=` saturates exactly
// the values that do not fit.
template <typename Dst, typename F>
__device__ __forceinline__ Dst SaturateToInt(F v) {
  if (v != v) return Dst(0);
  if (v <= static_cast<F>(std::numeric_limits<Dst>::min())) return std::numeric_limits<Dst>::min();
  if (v >= static_cast<F>(std::numeric_limits<Dst>::max())) return std::numeric_limits<Dst>::max();
  return static_cast<Dst>(v);
}

// tg::Convert<Dst>(Src) for device storage and compute types.
template <typename Dst, typename Src>
__device__ __forceinline__ Dst ConvertTo(Src v) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return v;
  } else if constexpr (std::is_same_v<Src, __half>) {
    return ConvertTo<Dst>(HalfToFloat(v));
  } else if constexpr (std::is_same_v<Src, __nv_bfloat16>) {
    return ConvertTo<Dst>(BFloat16ToFloat(v));
  } else if constexpr (std::is_same_v<Dst, bool>) {
    return v != Src(0);
  } else if constexpr (kIsReducedFloat<Dst>) {
    float f;
    if constexpr (std::is_same_v<Src, double>) {
      f = DoubleToFloatRoundToOdd(v);  // one rounding, not two
    } else if constexpr (std::is_same_v<Src, float>) {
      f = v;
    } else {
      f = static_cast<float>(v);  // integers reach f16/bf16 through f32, as on the CPU
    }
    if constexpr (std::is_same_v<Dst, __half>) {
      return FloatToHalf(f);
    } else {
      return FloatToBFloat16(f);
    }
  } else if constexpr (std::is_same_v<Dst, float> && std::is_same_v<Src, double>) {
    return DoubleToFloat(v);
  } else if constexpr (std::is_same_v<Dst, double> && std::is_same_v<Src, float>) {
    return FloatToDouble(v);
  } else if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<Src>) {
    return SaturateToInt<Dst>(v);
  } else if constexpr (std::is_integral_v<Dst> && std::is_integral_v<Src> &&
                       !std::is_same_v<Src, bool>) {
    // Integer narrowing wraps modulo 2^bits (signed overflow would be undefined).
    return static_cast<Dst>(static_cast<std::make_unsigned_t<Dst>>(v));
  } else {
    return static_cast<Dst>(v);  // integer or bool -> f32/f64, bool -> integer
  }
}

template <typename T>
__device__ __forceinline__ DeviceCompute<T> ToCompute(T v) {
  return ConvertTo<DeviceCompute<T>>(v);
}

// ---- Strided offsets ----------------------------------------------------------------------------

inline constexpr int kMaxDims = 6;
inline constexpr int kThreads = 256;  // threads per block of the elementwise kernels

// a / b and a % b; 32-bit division (several times cheaper than the emulated 64-bit one) whenever
// both fit, which is every tensor below 4G elements.
__device__ __forceinline__ int64_t DivMod(int64_t a, int64_t b, int64_t* rem) {
  if (((a | b) >> 32) == 0) {
    const uint32_t q = static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
    *rem = a - static_cast<int64_t>(q) * b;
    return q;
  }
  const int64_t q = a / b;
  *rem = a - q * b;
  return q;
}

// N operands (operand 0 is the output) walked in the row-major order of their common shape.
// Dims are innermost first; strides are in bytes (0 on broadcast dims).
template <int N>
struct StridedArgs {
  char* base[N];
  int ndim;  // >= 1
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][N];

  // Byte offsets of linear element i. The outermost dim needs no division, so a 1-D (e.g.
  // contiguous but misaligned) layout costs one multiply per operand.
  __device__ __forceinline__ void Offsets(int64_t i, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      int64_t index = i;
      if (d + 1 < ndim) i = DivMod(i, sizes[d], &index);
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += index * strides[d][k];
      if (d + 1 >= ndim) break;
    }
  }
};

// Calls launch(const StridedArgs<N>&, int64_t count) for operands of `shape` with the given byte
// strides (from BroadcastByteStrides). Size-1 dims are dropped and neighbouring dims that are
// contiguous for every operand merged, as tg::ForEachRow does; a layout with more than kMaxDims
// dims left is split into one launch per index of its outer dims (rare: it takes 7 dims that do
// not merge). Nothing is called for an empty shape.
template <int N, typename Launch>
void ForEachStridedSlice(const Shape& shape, const std::array<char*, N>& base,
                         const std::array<Shape, N>& byte_strides, Launch&& launch) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  absl::InlinedVector<int64_t, kMaxDims> sizes;  // kept dims, outermost first
  absl::InlinedVector<std::array<int64_t, N>, kMaxDims> strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (int k = 0; k < N; ++k) s[k] = byte_strides[k][d];
    if (!sizes.empty()) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable &= strides.back()[k] == s[k] * shape[d];
      if (mergeable) {
        sizes.back() *= shape[d];
        strides.back() = s;
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(s);
  }
  StridedArgs<N> args{};
  const int kept = static_cast<int>(sizes.size());
  const int inner = std::min(kept, kMaxDims);
  const int outer = kept - inner;
  args.ndim = std::max(inner, 1);
  args.sizes[0] = 1;  // a single element when no dim is kept
  int64_t count = 1;
  for (int d = 0; d < inner; ++d) {
    args.sizes[d] = sizes[kept - 1 - d];
    for (int k = 0; k < N; ++k) args.strides[d][k] = strides[kept - 1 - d][k];
    count *= args.sizes[d];
  }
  absl::InlinedVector<int64_t, kMaxDims> index(outer, 0);
  while (true) {
    for (int k = 0; k < N; ++k) {
      int64_t offset = 0;
      for (int d = 0; d < outer; ++d) offset += index[d] * strides[d][k];
      args.base[k] = base[k] + offset;
    }
    launch(static_cast<const StridedArgs<N>&>(args), count);
    int d = outer - 1;  // odometer over the outer dims
    while (d >= 0 && ++index[d] == sizes[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

// ---- Elementwise kernels ------------------------------------------------------------------------

// kVec elements of T in one aligned access (16 bytes: 8 x f16/bf16, 4 x f32, 2 x f64).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Elements per vector access: 16 bytes of the widest operand.
template <typename... T>
constexpr int VecWidth() {
  return static_cast<int>(16 / std::max({sizeof(T)...}));
}

template <int N>
struct Pointers {
  char* p[N];
  uint32_t scalars = 0;  // bit k: operand k is one element broadcast to every position
};

template <typename Out, int kVec, typename F, typename... V>
__device__ __forceinline__ Vec<Out, kVec> MapVec(const F& f, const V&... in) {
  Vec<Out, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.v[k] = f(in.v[k]...);
  return out;
}

// One element (at byte offsets off) or one vector (at element index i) of out = f(in...).
template <typename Out, typename... In>
struct ElementwiseStep {
  template <typename F, size_t... I>
  static __device__ __forceinline__ void Scalar(const F& f, char* const* p, const int64_t* off,
                                                std::index_sequence<I...>) {
    *reinterpret_cast<Out*>(p[0] + off[0]) =
        f(*reinterpret_cast<const In*>(p[I + 1] + off[I + 1])...);
  }
  template <int kVec, typename F, size_t... I>
  static __device__ __forceinline__ void VectorAt(const F& f, char* const* p, const int64_t* off,
                                                  std::index_sequence<I...>) {
    *reinterpret_cast<Vec<Out, kVec>*>(p[0] + off[0]) =
        MapVec<Out, kVec>(f, *reinterpret_cast<const Vec<In, kVec>*>(p[I + 1] + off[I + 1])...);
  }
  // Inputs whose bit is set in `scalars` are one element, repeated across the vector.
  template <int kVec, typename F, size_t... I>
  static __device__ __forceinline__ void Vector(const F& f, char* const* p, int64_t i,
                                                uint32_t scalars, std::index_sequence<I...>) {
    *reinterpret_cast<Vec<Out, kVec>*>(p[0] + i * static_cast<int64_t>(sizeof(Out))) =
        MapVec<Out, kVec>(f, Load<In, kVec>(p[I + 1], i, (scalars >> (I + 1)) & 1u)...);
  }
  template <typename T, int kVec>
  static __device__ __forceinline__ Vec<T, kVec> Load(const char* p, int64_t i, bool scalar) {
    if (scalar) {
      Vec<T, kVec> v;
      const T x = *reinterpret_cast<const T*>(p);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v.v[k] = x;
      return v;
    }
    return *reinterpret_cast<const Vec<T, kVec>*>(p + i * static_cast<int64_t>(sizeof(T)));
  }
};

// Contiguous operands of n elements (and one-element inputs broadcast to all of them, the bits
// of p.scalars): vectors first, then the n % kVec tail one by one.
template <int kVec, typename Out, typename F, typename... In>
__global__ void __launch_bounds__(kThreads)
    ContiguousElementwiseKernel(int64_t n, F f, Pointers<1 + sizeof...(In)> p) {
  using Step = ElementwiseStep<Out, In...>;
  constexpr int64_t kSizes[] = {static_cast<int64_t>(sizeof(Out)),
                                static_cast<int64_t>(sizeof(In))...};
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / kVec;
  for (int64_t v = first; v < vectors; v += step) {
    Step::template Vector<kVec>(f, p.p, v * kVec, p.scalars, std::index_sequence_for<In...>{});
  }
  for (int64_t i = vectors * kVec + first; i < n; i += step) {
    int64_t off[1 + sizeof...(In)];
#pragma unroll
    for (int k = 0; k <= static_cast<int>(sizeof...(In)); ++k) {
      off[k] = (p.scalars >> k) & 1u ? 0 : i * kSizes[k];
    }
    Step::Scalar(f, p.p, off, std::index_sequence_for<In...>{});
  }
}

template <typename Out, typename F, typename... In>
__global__ void __launch_bounds__(kThreads)
    StridedElementwiseKernel(int64_t n, F f, StridedArgs<1 + sizeof...(In)> args) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[1 + sizeof...(In)];
    args.Offsets(i, off);
    ElementwiseStep<Out, In...>::Scalar(f, args.base, off, std::index_sequence_for<In...>{});
  }
}

// Strided operands whose innermost dim is contiguous for all of them (a permuted or sliced copy,
// a padded row stride): kVec elements per thread, one offset computation and one 16-byte access
// per operand. vectors = count / kVec; LaunchElementwise checks the alignment this needs.
template <int kVec, typename Out, typename F, typename... In>
__global__ void __launch_bounds__(kThreads)
    StridedVectorElementwiseKernel(int64_t vectors, F f, StridedArgs<1 + sizeof...(In)> args) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += step) {
    int64_t off[1 + sizeof...(In)];
    args.Offsets(v * kVec, off);
    ElementwiseStep<Out, In...>::template VectorAt<kVec>(f, args.base, off,
                                                         std::index_sequence_for<In...>{});
  }
}

inline bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The current stream of t's device, where kernels writing t enqueue.
inline cudaStream_t StreamOf(const RawTensor& t) { return CurrentStream(t.device().index); }

// out[i] = f(in[i]...) for every element of out (any strides); each input has the storage type
// in In... and broadcasts to out's shape. Enqueues on out's device's current stream; `name`
// labels launch errors. The caller makes out's device current.
template <typename Out, typename... In, typename F>
void LaunchElementwise(const char* name, const RawTensor& out,
                       const std::array<const RawTensor*, sizeof...(In)>& in, const F& f) {
  constexpr int N = 1 + sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  const cudaStream_t stream = StreamOf(out);
  std::array<char*, N> base;
  base[0] = static_cast<char*>(out.raw_data());
  for (size_t k = 0; k < in.size(); ++k) base[k + 1] = static_cast<char*>(in[k]->raw_data());

  constexpr int kVec = VecWidth<Out, In...>();
  constexpr std::array<size_t, N> kSizes = {sizeof(Out), sizeof(In)...};
  // Vectors where out is contiguous and each input is too (of out's shape) or is one element
  // (a 0-d tensor or any broadcast of one value, e.g. a loss gradient scaling [N, C] logits).
  Pointers<N> p;
  bool vectorise = out.is_contiguous();
  for (size_t k = 0; k < in.size(); ++k) {
    if (in[k]->numel() == 1 && n > 1) {
      p.scalars |= 1u << (k + 1);
    } else {
      vectorise = vectorise && in[k]->is_contiguous() && in[k]->shape() == out.shape();
    }
  }
  for (int k = 0; k < N; ++k) {
    vectorise = vectorise && ((p.scalars >> k) & 1u || IsAligned(base[k], kSizes[k] * kVec));
  }
  if (vectorise) {
    for (int k = 0; k < N; ++k) p.p[k] = base[k];
    ContiguousElementwiseKernel<kVec, Out, F, In...>
        <<<BlocksFor((n + kVec - 1) / kVec, kThreads), kThreads, 0, stream>>>(n, f, p);
    TG_CUDA_CHECK_LAUNCH(name);
    return;
  }
  std::array<Shape, N> strides;
  strides[0] = BroadcastByteStrides(out, out.shape());
  for (size_t k = 0; k < in.size(); ++k) strides[k + 1] = BroadcastByteStrides(*in[k], out.shape());
  // Whole vectors along the innermost dim: unit stride for every operand, a multiple of kVec
  // elements, and every base pointer and outer stride a multiple of the vector's bytes.
  auto vectors_fit = [&](const StridedArgs<N>& args) {
    if (args.sizes[0] % kVec != 0) return false;
    for (int k = 0; k < N; ++k) {
      const int64_t bytes = static_cast<int64_t>(kSizes[k]) * kVec;
      if (args.strides[0][k] != static_cast<int64_t>(kSizes[k]) ||
          !IsAligned(args.base[k], bytes)) {
        return false;
      }
      for (int d = 1; d < args.ndim; ++d) {
        if (args.strides[d][k] % bytes != 0) return false;
      }
    }
    return true;
  };
  ForEachStridedSlice<N>(
      out.shape(), base, strides, [&](const StridedArgs<N>& args, int64_t count) {
        if (vectors_fit(args)) {
          const int64_t vectors = count / kVec;
          StridedVectorElementwiseKernel<kVec, Out, F, In...>
              <<<BlocksFor(vectors, kThreads), kThreads, 0, stream>>>(vectors, f, args);
        } else {
          StridedElementwiseKernel<Out, F, In...>
              <<<BlocksFor(count, kThreads), kThreads, 0, stream>>>(count, f, args);
        }
        TG_CUDA_CHECK_LAUNCH(name);
      });
}

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_TENSOR_ARGS_CUH_
