#include "tensor/dtype.h"

namespace tg {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "unknown";
}

bool IsFloating(DType dtype) {
  return dtype == kF32 || dtype == kF64 || dtype == kF16 || dtype == kBF16;
}

bool IsIntegral(DType dtype) { return !IsFloating(dtype); }

namespace {

// Rank in the promotion lattice; floating types are handled separately.
int IntegralRank(DType d) {
  switch (d) {
    case DType::kBool:
      return 0;
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 2;
    default:
      return 3;  // i64
  }
}

}  // namespace

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  const bool fa = IsFloating(a), fb = IsFloating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if (a == kF64 || b == kF64) return kF64;
    return kF32;  // f32 with a 2-byte type, or f16 with bf16
  }
  return IntegralRank(a) >= IntegralRank(b) ? a : b;
}

}  // namespace tg
