// The kinds of elementwise ops, loss reductions and window ops, shared by the dispatch
// (tensor/ops.h) and the kernels of every device.
#ifndef TAPEGRAD_TENSOR_OP_KINDS_H_
#define TAPEGRAD_TENSOR_OP_KINDS_H_

#include <cstdint>

namespace tg {

// kReluBackward(grad, y): 0 where y <= 0, else grad (PyTorch's threshold_backward at 0: a NaN y
// passes the gradient, and a NaN gradient where y <= 0 gives 0). kGeluTanhBackward(grad, x):
// grad * d gelu_tanh(x) / dx in the compute dtype, rounded once (floating inputs only).
enum class BinaryOp {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  kReluBackward,
  kGeluTanhBackward
};
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe };
// The unary kinds, written once: the enum and kAllUnaryOps (which the tensor op table runs, so a
// kind without a formula or a row fails there) both expand this list. kSilu: x * sigmoid(x).
#define TG_UNARY_OPS(X) \
  X(kNeg)               \
  X(kAbs)               \
  X(kExp)               \
  X(kLog)               \
  X(kSqrt)              \
  X(kTanh)              \
  X(kSigmoid)           \
  X(kRelu)              \
  X(kGeluTanh)          \
  X(kGelu)              \
  X(kErf)               \
  X(kSilu)
#define TG_UNARY_OP_ENUMERATOR(name) name,
enum class UnaryOp { TG_UNARY_OPS(TG_UNARY_OP_ENUMERATOR) };
#undef TG_UNARY_OP_ENUMERATOR
#define TG_UNARY_OP_VALUE(name) UnaryOp::name,
inline constexpr UnaryOp kAllUnaryOps[] = {TG_UNARY_OPS(TG_UNARY_OP_VALUE)};
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
