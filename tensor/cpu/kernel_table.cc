// Registers the CPU's kernel table: every entry of the op list points at tg::cpu's function of
// the same name (a missing one does not link).
#include "tensor/cpu/kernels.h"
#include "tensor/kernel_table.h"

namespace tg::cpu {
namespace {

const bool registered = [] {
  KernelTable table;
#define TG_KERNEL(ret, name, params) table.name = &name;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  RegisterKernelTable(DeviceType::kCpu, table);
  return true;
}();

}  // namespace
}  // namespace tg::cpu
