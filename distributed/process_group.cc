#include "distributed/process_group.h"

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg::dist {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

std::string ProcessGroup::Describe(const char* op) const {
  return absl::StrCat(op, " on group '", name_, "' (rank ", rank_, " of ", size_, ", ",
                      backend(), ")");
}

void ProcessGroup::CheckTensor(const char* op, const char* arg, const RawTensor& t) const {
  TG_CHECK(t.defined(), Describe(op), ": ", arg, " is undefined");
  TG_CHECK(t.device() == device_, Describe(op), ": ", arg, " is on ", t.device().ToString(),
           ", the group's tensors must be on ", device_.ToString());
  TG_CHECK(t.is_contiguous(), Describe(op), ": ", arg, " of shape ", ShapeToString(t.shape()),
           " must be contiguous");
  const DType d = t.dtype();
  TG_CHECK(d == kF32 || d == kF64 || d == kF16 || d == kBF16 || d == kI32 || d == kI64,
           Describe(op), ": ", arg, " has unsupported dtype ", DTypeName(d),
           " (f32, f64, f16, bf16, i32, i64)");
}

void ProcessGroup::CheckReduceOp(const char* op, const RawTensor& t, ReduceOp reduce) const {
  TG_CHECK(reduce != ReduceOp::kAvg || IsFloating(t.dtype()), Describe(op),
           ": ReduceOp avg needs a floating dtype, got ", DTypeName(t.dtype()));
}

void ProcessGroup::CheckChunks(const char* op, const char* big_arg, const RawTensor& big,
                               const char* small_arg, const RawTensor& small) const {
  TG_CHECK(big.dtype() == small.dtype(), Describe(op), ": ", big_arg, " has dtype ",
           DTypeName(big.dtype()), " but ", small_arg, " has dtype ", DTypeName(small.dtype()));
  TG_CHECK(big.numel() == small.numel() * size_, Describe(op), ": ", big_arg, " must hold ",
           size_, " x ", small.numel(), " = ", small.numel() * size_, " elements (", small_arg,
           " has shape ", ShapeToString(small.shape()), "), got ", big.numel(), " (shape ",
           ShapeToString(big.shape()), ")");
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw Error(std::string(status.message()));
}

}  // namespace tg::dist
