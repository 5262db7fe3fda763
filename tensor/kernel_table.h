// The per-device kernel tables: how the ops (tensor/ops_*.cc) reach a device's kernels without
// depending on the device. Each device implements the whole op list (tensor/kernel_list.inc) in its own
// namespace and registers a KernelTable from a static initializer of an alwayslink library, the
// same mechanism as the storage backends of tensor/device_backend.h:
//
//   // tensor/cpu/kernel_table.cc: every entry points at tg::cpu's function of the same name
//   const bool registered = [] {
//     tg::KernelTable table;
//   #define TG_KERNEL(ret, name, params) table.name = &tg::cpu::name;
//   #include "tensor/kernel_list.inc"
//   #undef TG_KERNEL
//     tg::RegisterKernelTable(tg::DeviceType::kCpu, table);
//     return true;
//   }();
//   // tensor/ops_elementwise.cc
//   KernelsFor(out.device()).Binary(op, out, a, b);
//
// A binary without a device's kernels gets a tg::Error that says what to link.
#ifndef TAPEGRAD_TENSOR_KERNEL_TABLE_H_
#define TAPEGRAD_TENSOR_KERNEL_TABLE_H_

#include <cstdint>
#include <vector>

#include "tensor/device.h"
#include "tensor/op_kinds.h"
#include "tensor/optimizer_kernels.h"
#include "tensor/tensor.h"

namespace tg {

// What a fused kernel did: ran, or declined the case (nothing written; the op composes it).
enum class KernelStatus { kDone, kNoKernel };

// One function pointer per entry of the op list.
struct KernelTable {
#define TG_KERNEL(ret, name, params) ret(*name) params = nullptr;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
};

// Installs `table` (copied) for `type`; a later registration replaces it.
void RegisterKernelTable(DeviceType type, const KernelTable& table);
// The kernels of `device`'s type; throws tg::Error "no CUDA kernels in this binary: link
// //tensor/cuda:kernels" when none are registered.
const KernelTable& KernelsFor(Device device);
// Whether `type` has registered kernels.
bool HasKernelTable(DeviceType type);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_KERNEL_TABLE_H_
