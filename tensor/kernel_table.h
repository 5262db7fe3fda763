// A device's kernel table: one function pointer per entry of the kernel list (tensor/kernel_list.inc),
// each pointing at the device's function of the same name. It is part of the device's backend
// (tensor/device_backend.h), which registers it; the ops (tensor/ops_*.cc) reach it through
// KernelsFor without depending on the device:
//
//   // tensor/cpu/backend.cc: every entry points at tg::cpu's function of the same name
//   tg::KernelTable table;
//   #define TG_KERNEL(ret, name, params) table.name = &tg::cpu::name;
//   #include "tensor/kernel_list.inc"
//   #undef TG_KERNEL
//   // tensor/ops_elementwise.cc
//   KernelsFor(out.device()).Binary(op, out, a, b);
#ifndef TAPEGRAD_TENSOR_KERNEL_TABLE_H_
#define TAPEGRAD_TENSOR_KERNEL_TABLE_H_

#include <cstdint>
#include <vector>

#include "tensor/device.h"
#include "tensor/fp8_scale.h"
#include "tensor/op_kinds.h"
#include "tensor/optimizer_kernels.h"
#include "tensor/tensor.h"

namespace tg {

// What a fused kernel did: ran, or declined the case (nothing written; the op composes it).
enum class KernelStatus { kDone, kNoKernel };

// One function pointer per entry of the kernel list.
struct KernelTable {
#define TG_KERNEL(ret, name, params) ret(*name) params = nullptr;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
};

// The kernels of `device`'s backend (GetDeviceBackend(device.type)->kernels()); throws tg::Error
// "no CUDA backend in this binary: link //tensor:devices" when none is registered.
const KernelTable& KernelsFor(Device device);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_KERNEL_TABLE_H_
