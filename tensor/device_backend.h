// A device is one backend object: its memory (allocator), copies, fill, streams and its kernel
// table (the kernel list, tensor/kernel_list.inc), plus the preferences the ops ask of it
// (layouts). Every device, the CPU included, registers one from a static initializer of an
// alwayslink library in its own sub-package (tensor/cpu/backend.cc, tensor/cuda/backend.cc); the
// tensor core (RawTensor::Empty, copy_, fill_, to(Device), item()) and the ops (tensor/ops_*.cc)
// find it here and never branch on the device type. A binary without a device's backend gets a
// tg::Error that says what to link. This is the only registry of devices.
//
//   // tensor/cpu/backend.cc
//   const bool registered = [] {
//     tg::RegisterDeviceBackend(new CpuBackend(MakeKernelTable(), preferences));
//     return true;
//   }();
//   // tensor/ops_elementwise.cc
//   KernelsFor(out.device()).Binary(op, out, a, b);
//   // anywhere
//   tg::GetDeviceBackend(tg::DeviceType::kCuda)->Synchronize(0);
#ifndef TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
#define TAPEGRAD_TENSOR_DEVICE_BACKEND_H_

#include <atomic>
#include <vector>

#include "tensor/device.h"
#include "tensor/kernel_table.h"
#include "tensor/storage.h"

namespace tg {

class RawTensor;

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

class DeviceBackend {
 public:
  // `kernels` must have every entry of the kernel list (RegisterDeviceBackend checks).
  DeviceBackend(DeviceType type, const KernelTable& kernels, DevicePreferences preferences);
  virtual ~DeviceBackend() = default;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  DeviceType type() const { return type_; }
  // The device's implementation of the kernel list.
  const KernelTable& kernels() const { return *kernels_.load(std::memory_order_acquire); }
  // Replaces the kernel table (copied; the old one stays valid for threads still reading it).
  // Tests install declining kernels this way.
  void ReplaceKernels(const KernelTable& kernels);
  const DevicePreferences& preferences() const { return preferences_; }

  // How many devices of this type the machine has (0: none usable; the CPU has 1).
  virtual int DeviceCount() = 0;
  // The allocator of device `index`; throws tg::Error naming the device when it does not exist.
  virtual Allocator* allocator(int index) = 0;
  // dst = src converted to dst's dtype. Same shape (the caller broadcasts src; stride 0 may
  // occur), any strides, at least one side on this backend's device type, the other on the
  // CPU (the host) or on this device type.
  virtual void Copy(const RawTensor& dst, const RawTensor& src) = 0;
  // Every element of dst (any strides, no stride-0 dim of size > 1, on this backend's device
  // type) = value.
  virtual void Fill(const RawTensor& dst, double value) = 0;
  // Waits until the work the calling thread enqueued on device `index` has completed.
  virtual void Synchronize(int index) = 0;
  // The native handle of the stream the calling thread enqueues device `index`'s work on (a
  // cudaStream_t for CUDA), for libraries that enqueue work of their own (NCCL); nullptr where
  // work runs when it is called (the CPU).
  virtual void* CurrentStream(int index) = 0;

 private:
  const DeviceType type_;
  std::atomic<const KernelTable*> kernels_;
  const DevicePreferences preferences_;
};

// Installs `backend` (never destroyed) for backend->type(); a later registration replaces it.
// Throws tg::Error "kernel table: no kernel for <name>" when its table misses an entry.
void RegisterDeviceBackend(DeviceBackend* backend);
// Removes the backend of `type` (tests install and remove fakes).
void UnregisterDeviceBackend(DeviceType type);
// The backend of `type`, or nullptr when none is linked.
DeviceBackend* FindDeviceBackend(DeviceType type);
// The backend of `type`; throws tg::Error "no CUDA backend in this binary: link //tensor:devices"
// (or "no CPU backend ...: link //tensor:core") when none is linked.
DeviceBackend* GetDeviceBackend(DeviceType type);

// How many devices of `type` this binary can use: 0 when its backend is not linked.
int DeviceCount(DeviceType type);
// The device types whose backend this binary has, in the order of TG_DEVICE_TYPES (the CPU
// first).
std::vector<DeviceType> RegisteredDeviceTypes();
// Device 0 of every registered type other than the CPU that has one: what a test compares with
// the CPU (the op tables, as ggml's test-backend-ops runs every backend).
std::vector<Device> DevicesToTestAgainstTheCpu();

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
