// A device's memory side: one backend object per device type with its allocators, copies, fill
// and streams. Its kernels are the other half, registered next to it (tensor/kernel_table.h:
// RegisterKernels, with the preferences the ops ask of the device), so the tensor core, which
// allocates, copies and fills through this header, sees no kernel and no op. Every device, the
// CPU included, registers both from a static initializer of an alwayslink library in its own
// sub-package (tensor/cpu/backend.cc, tensor/cuda/backend.cc); the tensor core (RawTensor::Empty,
// copy_, fill_, to(Device), item()) and the ops (tensor/ops_*.cc) find them there and never
// branch on the device type. A binary without a device's backend gets a tg::Error that says what
// to link. This is the only registry of devices.
//
//   // tensor/cpu/backend.cc
//   const bool registered = [] {
//     tg::RegisterDeviceBackend(new CpuBackend());
//     tg::RegisterKernels(tg::DeviceType::kCpu, MakeKernelTable(), preferences);
//     return true;
//   }();
//   // tensor/ops_elementwise.cc
//   KernelsFor(out.device()).Binary(op, out, a, b);
//   // anywhere
//   tg::GetDeviceBackend(tg::DeviceType::kCuda)->Synchronize(0);
#ifndef TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
#define TAPEGRAD_TENSOR_DEVICE_BACKEND_H_

#include "tensor/device.h"
#include "tensor/storage.h"

namespace tg {

class RawTensor;

class DeviceBackend {
 public:
  explicit DeviceBackend(DeviceType type) : type_(type) {}
  virtual ~DeviceBackend() = default;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  DeviceType type() const { return type_; }

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
};

// Installs `backend` (never destroyed) for backend->type(); a later registration replaces it.
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

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
