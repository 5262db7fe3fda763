// Registers the CUDA kernel table: every entry of the op list points at tg::cuda's function of
// the same name (a missing one does not link).
#include "tensor/cuda/amp_kernels.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_fused.h"
#include "tensor/kernel_table.h"

namespace tg::cuda {
namespace {

const bool registered = [] {
  KernelTable table;
#define TG_KERNEL(ret, name, params) table.name = &name;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  RegisterKernelTable(DeviceType::kCuda, table);
  return true;
}();

}  // namespace
}  // namespace tg::cuda
