// The kinds of elementwise ops and loss reductions, shared by the dispatch (tensor/ops.h) and the
// kernels of every device.
#ifndef TAPEGRAD_TENSOR_OP_KINDS_H_
#define TAPEGRAD_TENSOR_OP_KINDS_H_

namespace tg {

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPow, kMaximum, kMinimum };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe };
enum class UnaryOp {
  kNeg,
  kAbs,
  kExp,
  kLog,
  kSqrt,
  kTanh,
  kSigmoid,
  kRelu,
  kGeluTanh,
  kGelu,
  kErf
};
enum class Reduction { kNone, kMean, kSum };

const char* BinaryOpName(BinaryOp op);
const char* CompareOpName(CompareOp op);
const char* UnaryOpName(UnaryOp op);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_OP_KINDS_H_
