// The kinds of elementwise ops, loss reductions and window ops, shared by the dispatch
// (tensor/ops.h) and the kernels of every device.
#ifndef TAPEGRAD_TENSOR_OP_KINDS_H_
#define TAPEGRAD_TENSOR_OP_KINDS_H_

#include <cstdint>

namespace tg {

// Each kind list is written once, as (enumerator, name): the enum, its kAll array (which the
// tensor op table runs, so a kind without a formula or a row fails there) and its name
// (BinaryOpName, ... in op_kinds.cc) are expanded from it.
//
// kReluBackward(grad, y): 0 where y <= 0, else grad (PyTorch's threshold_backward at 0: a NaN y
// passes the gradient, and a NaN gradient where y <= 0 gives 0). kGeluTanhBackward(grad, x):
// grad * d gelu_tanh(x) / dx in the compute dtype, rounded once (floating inputs only).
#define TG_BINARY_OPS(X)            \
  X(kAdd, "add")                    \
  X(kSub, "sub")                    \
  X(kMul, "mul")                    \
  X(kDiv, "div")                    \
  X(kPow, "pow")                    \
  X(kMaximum, "maximum")            \
  X(kMinimum, "minimum")            \
  X(kReluBackward, "relu_backward") \
  X(kGeluTanhBackward, "gelu_tanh_backward")
#define TG_COMPARE_OPS(X) \
  X(kEq, "eq")            \
  X(kNe, "ne")            \
  X(kLt, "lt")            \
  X(kLe, "le")            \
  X(kGt, "gt")            \
  X(kGe, "ge")
// kSilu: x * sigmoid(x).
#define TG_UNARY_OPS(X)     \
  X(kNeg, "neg")            \
  X(kAbs, "abs")            \
  X(kExp, "exp")            \
  X(kLog, "log")            \
  X(kSqrt, "sqrt")          \
  X(kTanh, "tanh")          \
  X(kSigmoid, "sigmoid")    \
  X(kRelu, "relu")          \
  X(kGeluTanh, "gelu_tanh") \
  X(kGelu, "gelu")          \
  X(kErf, "erf")            \
  X(kSilu, "silu")
#define TG_OP_KIND_ENUMERATOR(name, text) name,
enum class BinaryOp { TG_BINARY_OPS(TG_OP_KIND_ENUMERATOR) };
enum class CompareOp { TG_COMPARE_OPS(TG_OP_KIND_ENUMERATOR) };
enum class UnaryOp { TG_UNARY_OPS(TG_OP_KIND_ENUMERATOR) };
#undef TG_OP_KIND_ENUMERATOR
#define TG_BINARY_OP_VALUE(name, text) BinaryOp::name,
#define TG_COMPARE_OP_VALUE(name, text) CompareOp::name,
#define TG_UNARY_OP_VALUE(name, text) UnaryOp::name,
inline constexpr BinaryOp kAllBinaryOps[] = {TG_BINARY_OPS(TG_BINARY_OP_VALUE)};
inline constexpr CompareOp kAllCompareOps[] = {TG_COMPARE_OPS(TG_COMPARE_OP_VALUE)};
inline constexpr UnaryOp kAllUnaryOps[] = {TG_UNARY_OPS(TG_UNARY_OP_VALUE)};
#undef TG_BINARY_OP_VALUE
#undef TG_COMPARE_OP_VALUE
#undef TG_UNARY_OP_VALUE
// None/Mean/Sum: libtorch's spellings (tg::Reduction::Sum, as at::Reduction::Sum).
enum class Reduction { kNone, kMean, kSum, None = kNone, Mean = kMean, Sum = kSum };
// The activation a Linear applies to its pre-activation: none, or GELU in its tanh form
// (GeluTanh), the form cuBLASLt's epilogue computes.
enum class Activation { kNone, kGeluTanh };

const char* BinaryOpName(BinaryOp op);
const char* CompareOpName(CompareOp op);
const char* UnaryOpName(UnaryOp op);

// The sizes of one 2-D window op over [N, C, H, W] (convolution, pooling), validated by the
// dispatch (for pooling o == c and dilation 1).
struct Window2d {
  int64_t n, c, h, w;  // input
  int64_t o, kh, kw;   // output channels, kernel
  int64_t oh, ow;      // output plane
  int64_t sh, sw;      // stride
  int64_t ph, pw;      // padding
  int64_t dh, dw;      // dilation
};

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_OP_KINDS_H_
