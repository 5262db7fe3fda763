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
    case DType::kF8E4M3:
      return "f8e4m3";
    case DType::kF8E5M2:
      return "f8e5m2";
  }
  return "unknown";
}

bool IsFloating(DType dtype) {
  return dtype == kF32 || dtype == kF64 || dtype == kF16 || dtype == kBF16;
}

bool IsIntegral(DType dtype) {
  return dtype == kI32 || dtype == kI64 || dtype == kU8 || dtype == kBool;
}

bool IsFloat8(DType dtype) { return dtype == kF8E4M3 || dtype == kF8E5M2; }

std::string Float8NotComputedMessage(const char* op, DType dtype) {
  return absl::StrCat(op, *op != '\0' ? ": " : "", DTypeName(dtype),
                      " is an FP8 storage dtype: only copies, casts and the FP8 ops take it (cast "
                      "it to a compute dtype first)");
}

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
  if (IsFloat8(a) || IsFloat8(b)) {
    throw Error(absl::StrCat("PromoteTypes: ", DTypeName(a), " with ", DTypeName(b),
                             ": FP8 dtypes do not promote (cast first)"));
  }
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
