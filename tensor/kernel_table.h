// A device's kernels: its kernel table (one function pointer per entry of the kernel list,
// tensor/kernel_list.inc, each pointing at the device's function of the same name) and the
// preferences the ops ask of it. The device registers them next to its memory backend
// (tensor/device_backend.h), from the same static initializer; the ops (tensor/ops_*.cc) reach
// them through KernelsFor and PreferencesFor without depending on the device. The tensor core's
// memory side (allocation, copies, fill) never includes this header.
//
//   // tensor/cpu/backend.cc: every entry points at tg::cpu's function of the same name
//   tg::KernelTable table;
//   #define TG_KERNEL(ret, name, params) table.name = &tg::cpu::name;
//   #include "tensor/kernel_list.inc"
//   #undef TG_KERNEL
//   tg::RegisterKernels(tg::DeviceType::kCpu, table, preferences);
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

// How a device wants the ops to lay out what they allocate for its kernels. Asked by the ops
// (tensor/ops_*.cc) instead of branching on the device, so a new device states its choice.
struct DevicePreferences {
  // The memory order of the [B, H, T, D] tensors attention allocates (its output and the q/k/v
  // gradients). kHeadsMajor: contiguous [B, H, T, D]. kTokensMajor: memory [B, T, H, D] (a
  // permuted view, as PyTorch's CPU flash attention lays out its output), so that merging the
  // heads back into [B, T, H * D] is a view rather than a copy.
  enum class AttentionLayout { kHeadsMajor, kTokensMajor };
  AttentionLayout attention_layout = AttentionLayout::kHeadsMajor;
  // Whether the attention backward kernel is given grad_out contiguous (a copy when it is not);
  // false: the kernel reads any strides.
  bool attention_grad_out_contiguous = true;
};

// Installs the kernels and preferences of `type` (the table is copied and kept until the process
// ends, so a thread still reading a replaced one is safe); a later call replaces them. Throws
// tg::Error "kernel table: no kernel for <name>" when the table misses an entry.
void RegisterKernels(DeviceType type, const KernelTable& kernels, DevicePreferences preferences);
// Replaces the kernel table of `type`, keeping its preferences (tests install declining kernels
// this way); `type` must have kernels.
void ReplaceKernels(DeviceType type, const KernelTable& kernels);
// Removes the kernels of `type` (tests install and remove fakes).
void UnregisterKernels(DeviceType type);
// Whether `type` has kernels in this binary.
bool HasKernels(DeviceType type);

// The kernels and preferences of `device`'s type; throw tg::Error "no CUDA backend in this
// binary: link //tensor:devices" when none are registered.
const KernelTable& KernelsFor(Device device);
const DevicePreferences& PreferencesFor(Device device);

// The device types whose memory backend and kernels this binary has, in the order of
// TG_DEVICE_TYPES (the CPU first).
std::vector<DeviceType> RegisteredDeviceTypes();
// Device 0 of every registered type other than the CPU that has one: what a test compares with
// the CPU (the op tables, as ggml's test-backend-ops runs every backend).
std::vector<Device> DevicesToTestAgainstTheCpu();

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_KERNEL_TABLE_H_
