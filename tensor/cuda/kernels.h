// CUDA kernels behind the dispatch in tensor/ops_*.cc: the same list, with the same contracts, as
// tensor/kernel_list.inc (included below), plus Copy and Fill. All tensors are on one
// CUDA device; kernels enqueue on that device's current stream (tensor/cuda/runtime.h) and
// return without synchronising the host, except where a result must reach the host (the count
// that CrossEntropy returns, AnyNonFinite's bool). f16/bf16 load and store in their own format
// and compute in f32; f64 computes in f64. Index range errors are detected on the device and
// reported as tg::Error at the next point the host looks (documented per kernel).
#ifndef TAPEGRAD_TENSOR_CUDA_KERNELS_H_
#define TAPEGRAD_TENSOR_CUDA_KERNELS_H_

#include <vector>

#include "tensor/kernel_table.h"
#include "tensor/op_kinds.h"
#include "tensor/tensor.h"

namespace tg::cuda {

// dst = src converted to dst's dtype; same shape, any strides, both on the same CUDA device.
void Copy(const RawTensor& dst, const RawTensor& src);
// Every element of dst (any strides) = value converted to dst's dtype.
void Fill(const RawTensor& dst, double value);

#define TG_KERNEL(ret, name, params) ret name params;
#include "tensor/kernel_list.inc"  // IWYU pragma: export
#undef TG_KERNEL

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_KERNELS_H_
