// Element types of tapegrad tensors and the rules that combine them.
//
//   tg::DType t = tg::PromoteTypes(tg::kF16, tg::kBF16);   // kF32
//   size_t bytes = tg::ElementSize(tg::kBF16);             // 2
//
// Visit(dtype, fn) calls fn with a value of the C++ storage type (float, double, Half, BFloat16,
// int32_t, int64_t, uint8_t, bool); kernels use it to instantiate one loop per dtype.
//
// The two FP8 dtypes (f8e4m3: e4m3fn, no infinities, max 448; f8e5m2: max 57344; tensor/float8.h)
// are storage dtypes, as in Transformer Engine and torch: copies and casts (to(), copy_(), item(),
// printing), safetensors and the FP8 ops (tg::Fp8Amax, tg::Fp8Cast, tg::Fp8Gemm) take them;
// arithmetic does not (Visit and VisitFloating throw "<op>: f8e4m3 is an FP8 storage dtype ...",
// and PromoteTypes refuses to mix them), so no kernel is instantiated for them by accident and no
// op computes in 8 bits. They are neither IsFloating (the compute types) nor IsIntegral;
// IsFloat8 names them. Casting to them rounds to nearest even and saturates (tensor/float8.h).
#ifndef TAPEGRAD_TENSOR_DTYPE_H_
#define TAPEGRAD_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "tensor/error.h"
#include "tensor/float8.h"
#include "tensor/half.h"

namespace tg {

enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool, kF8E4M3, kF8E5M2 };

inline constexpr DType kF32 = DType::kF32;
inline constexpr DType kF64 = DType::kF64;
inline constexpr DType kF16 = DType::kF16;
inline constexpr DType kBF16 = DType::kBF16;
inline constexpr DType kI32 = DType::kI32;
inline constexpr DType kI64 = DType::kI64;
inline constexpr DType kU8 = DType::kU8;
inline constexpr DType kBool = DType::kBool;
inline constexpr DType kF8E4M3 = DType::kF8E4M3;
inline constexpr DType kF8E5M2 = DType::kF8E5M2;
// libtorch's names (torch::kFloat32, torch::kLong, ...).
inline constexpr DType kFloat32 = kF32, kFloat = kF32, kFloat64 = kF64, kDouble = kF64,
                       kFloat16 = kF16, kHalf = kF16, kBFloat16 = kBF16, kInt32 = kI32, kInt = kI32,
                       kInt64 = kI64, kLong = kI64, kUInt8 = kU8, kByte = kU8,
                       kFloat8_e4m3fn = kF8E4M3, kFloat8_e5m2 = kF8E5M2;

inline size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU8:
    case DType::kBool:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 1;
}
// "f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool", "f8e4m3", "f8e5m2".
const char* DTypeName(DType dtype);
// The floating compute types: f32, f64, f16, bf16 (not the FP8 storage types).
bool IsFloating(DType dtype);
// Integer types, bool included.
bool IsIntegral(DType dtype);
// f8e4m3 and f8e5m2.
bool IsFloat8(DType dtype);
// PyTorch's promotion lattice: bool < u8 < i32 < i64 < floating; f16 with bf16 gives f32;
// f64 wins over every other type. An FP8 dtype promotes only with itself; with any other dtype
// it throws tg::Error "PromoteTypes: f8e4m3 with f32: FP8 dtypes do not promote (cast first)"
// (torch refuses the same).
DType PromoteTypes(DType a, DType b);

// The C++ storage type of each dtype, and the type kernels compute in: float for f16/bf16/f32,
// double for f64, int64_t for the integer types, bool for bool.
template <typename T>
struct ComputeTypeOf {
  using type = int64_t;
};
template <>
struct ComputeTypeOf<float> {
  using type = float;
};
template <>
struct ComputeTypeOf<Half> {
  using type = float;
};
template <>
struct ComputeTypeOf<BFloat16> {
  using type = float;
};
template <>
struct ComputeTypeOf<double> {
  using type = double;
};
template <>
struct ComputeTypeOf<bool> {
  using type = bool;
};
template <typename T>
using ComputeType = typename ComputeTypeOf<T>::type;

// The storage types of the reduced floating dtypes on one side: the host's (Half, BFloat16) here;
// CUDA's (__half, __nv_bfloat16) in tensor/cuda/tensor_args.cuh.
struct HostStorageTypes {
  using F16 = Half;
  using BF16 = BFloat16;
  using F8E4M3 = Float8E4M3;
  using F8E5M2 = Float8E5M2;
};

// Which dtypes a visitor accepts: every compute dtype, the floating ones, or every dtype with the
// FP8 storage types (copies and casts); the others throw naming the op.
enum class DTypeSet { kAll, kFloating, kStorage };

// The message for an FP8 dtype reaching an op that computes: "<op>: f8e4m3 is an FP8 storage
// dtype: only copies, casts and the FP8 ops take it (cast it to a compute dtype first)".
std::string Float8NotComputedMessage(const char* op, DType dtype);

// The one dtype switch of the code base: calls fn with a value of `dtype`'s storage type, the
// reduced floating types taken from `StorageTypes`. Visit, VisitFloating and CUDA's VisitDevice*
// are this with their storage types and set; a new dtype is added here once.
template <typename StorageTypes, DTypeSet kSet, typename Fn>
decltype(auto) VisitDTypeAs(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF64:
      return fn(double{});
    case DType::kF16:
      return fn(typename StorageTypes::F16{});
    case DType::kBF16:
      return fn(typename StorageTypes::BF16{});
    case DType::kI32:
      if constexpr (kSet != DTypeSet::kFloating) return fn(int32_t{});
      break;
    case DType::kI64:
      if constexpr (kSet != DTypeSet::kFloating) return fn(int64_t{});
      break;
    case DType::kU8:
      if constexpr (kSet != DTypeSet::kFloating) return fn(uint8_t{});
      break;
    case DType::kBool:
      if constexpr (kSet != DTypeSet::kFloating) return fn(bool{});
      break;
    case DType::kF8E4M3:
      if constexpr (kSet == DTypeSet::kStorage) return fn(typename StorageTypes::F8E4M3{});
      throw Error(Float8NotComputedMessage(op, dtype));
    case DType::kF8E5M2:
      if constexpr (kSet == DTypeSet::kStorage) return fn(typename StorageTypes::F8E5M2{});
      throw Error(Float8NotComputedMessage(op, dtype));
  }
  if constexpr (kSet == DTypeSet::kFloating) {
    throw Error(absl::StrCat(op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
                             DTypeName(dtype)));
  }
  throw Error("unknown dtype");
}

template <typename Fn>
decltype(auto) Visit(DType dtype, Fn&& fn) {
  return VisitDTypeAs<HostStorageTypes, DTypeSet::kAll>("", dtype, std::forward<Fn>(fn));
}

// Like Visit, with the FP8 storage types too (Float8E4M3, Float8E5M2): for code that only moves
// or converts elements (copies, casts, item()).
template <typename Fn>
decltype(auto) VisitStorage(DType dtype, Fn&& fn) {
  return VisitDTypeAs<HostStorageTypes, DTypeSet::kStorage>("", dtype, std::forward<Fn>(fn));
}

// Like Visit, restricted to the floating types; any other dtype throws
// "<op>: expected a floating dtype (f32, f64, f16, bf16), got i64".
template <typename Fn>
decltype(auto) VisitFloating(const char* op, DType dtype, Fn&& fn) {
  return VisitDTypeAs<HostStorageTypes, DTypeSet::kFloating>(op, dtype, std::forward<Fn>(fn));
}

// Integer dtypes used as indices (i32, i64); anything else throws naming the op.
template <typename Fn>
decltype(auto) VisitIndex(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kI32:
      return fn(int32_t{});
    case DType::kI64:
      return fn(int64_t{});
    default:
      throw Error(
          absl::StrCat(op, ": expected an index dtype (i32 or i64), got ", DTypeName(dtype)));
  }
}

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return kF64;
}
template <>
constexpr DType DTypeOf<Half>() {
  return kF16;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return kBF16;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return kI64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return kU8;
}
template <>
constexpr DType DTypeOf<bool>() {
  return kBool;
}
template <>
constexpr DType DTypeOf<Float8E4M3>() {
  return kF8E4M3;
}
template <>
constexpr DType DTypeOf<Float8E5M2>() {
  return kF8E5M2;
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DTYPE_H_
