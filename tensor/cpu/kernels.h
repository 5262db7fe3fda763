// CPU kernels behind the dispatch in tensor/ops_*.cc: the list and contracts of
// tensor/kernel_list.inc, implemented in tensor/cpu/*.cc (indexing in index.cc, convolution and
// pooling in conv.cc, GEMM through OpenBLAS and oneDNN in matmul.cc, FP8 casts and GEMM in
// fp8.cc; oneDNN helpers in dnnl.h).
#ifndef TAPEGRAD_TENSOR_CPU_KERNELS_H_
#define TAPEGRAD_TENSOR_CPU_KERNELS_H_

#include <vector>

#include "tensor/kernel_table.h"
#include "tensor/op_kinds.h"
#include "tensor/tensor.h"

namespace tg::cpu {

#define TG_KERNEL(ret, name, params) ret name params;
#include "tensor/kernel_list.inc"  // IWYU pragma: export
#undef TG_KERNEL

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_KERNELS_H_
