// Checks shared by the op files of tensor/ops.h (ops_elementwise.cc, ops_reduce.cc, ops_matmul.cc,
// ops_nn.cc, ops_index.cc, ops_conv.cc, ops_attention.cc, ops_amp.cc, ops_optimizer.cc,
// ops_fp8.cc), one file per op family. Every op validates (shapes, dtypes, devices), promotes,
// allocates its output, then calls the kernel of the inputs' device (tensor/kernel_table.h). A
// fused op's kernel may decline a case (KernelStatus::kNoKernel): the op then runs the composed
// form (tensor/composed.h), which gives the same result to within rounding order, only slower.
// Private to //tensor:ops.
#ifndef TAPEGRAD_TENSOR_OPS_INTERNAL_H_
#define TAPEGRAD_TENSOR_OPS_INTERNAL_H_

#include <initializer_list>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/kernel_table.h"
#include "tensor/tensor.h"

namespace tg::ops_internal {

inline void CheckDefined(const char* op, const RawTensor& t, const char* what) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// The device all inputs share (no implicit transfers).
inline Device CommonDevice(const char* op, std::initializer_list<const RawTensor*> inputs) {
  const Device d = (*inputs.begin())->device();
  for (const RawTensor* t : inputs) {
    TG_CHECK(t->device() == d, op, ": expected all tensors on one device, got ", d.ToString(),
             " and ", t->device().ToString());
  }
  return d;
}

// Whether a fused kernel declined the case (KernelStatus::kNoKernel): the op then composes it.
inline bool Declined(KernelStatus status) { return status != KernelStatus::kDone; }

inline void CheckFloating(const char* op, DType dtype) {
  TG_CHECK(IsFloating(dtype), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           DTypeName(dtype));
}

// Indices as contiguous i64 (validated dtype).
inline RawTensor IndicesI64(const char* op, const RawTensor& indices) {
  VisitIndex(op, indices.dtype(), [](auto) {});
  return indices.to(kI64).contiguous();
}

}  // namespace tg::ops_internal

#endif  // TAPEGRAD_TENSOR_OPS_INTERNAL_H_
