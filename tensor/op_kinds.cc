#include "tensor/op_kinds.h"

#include <cstddef>

namespace tg {
namespace {

#define TG_OP_KIND_NAME(name, text) text,
constexpr const char* kBinaryOpNames[] = {TG_BINARY_OPS(TG_OP_KIND_NAME)};
constexpr const char* kCompareOpNames[] = {TG_COMPARE_OPS(TG_OP_KIND_NAME)};
constexpr const char* kUnaryOpNames[] = {TG_UNARY_OPS(TG_OP_KIND_NAME)};
#undef TG_OP_KIND_NAME

// The name of op in names, or fallback for a value outside the enum (a cast from a bad int).
template <typename Op, std::size_t N>
const char* KindName(Op op, const char* const (&names)[N], const char* fallback) {
  const auto i = static_cast<std::size_t>(op);
  return i < N ? names[i] : fallback;
}

}  // namespace

const char* BinaryOpName(BinaryOp op) { return KindName(op, kBinaryOpNames, "binary"); }
const char* CompareOpName(CompareOp op) { return KindName(op, kCompareOpNames, "compare"); }
const char* UnaryOpName(UnaryOp op) { return KindName(op, kUnaryOpNames, "unary"); }

}  // namespace tg
