// The device-backend registry: how the tensor core reaches a device other than the CPU without
// depending on it. A backend (the CUDA one is //tensor/cuda:backend) registers itself from a
// static initializer of an alwayslink library; Tensor::Empty, copy_, fill_, to(Device) and
// item() find it here. A binary without the backend gets a tg::Error that says what to link.
//
//   // tensor/cuda/backend.cc
//   const bool registered = [] {
//     tg::RegisterDeviceBackend(tg::DeviceType::kCuda, new CudaBackend());
//     return true;
//   }();
//   // anywhere
//   tg::GetDeviceBackend(tg::DeviceType::kCuda)->Synchronize(0);
#ifndef TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
#define TAPEGRAD_TENSOR_DEVICE_BACKEND_H_

#include "tensor/device.h"
#include "tensor/storage.h"

namespace tg {

class Tensor;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // The allocator of device `index`; throws tg::Error naming the device when it does not exist.
  virtual Allocator* allocator(int index) = 0;
  // dst = src converted to dst's dtype. Same shape (the caller broadcasts src; stride 0 may
  // occur), any strides, at least one side on this backend's device type, the other on the
  // CPU or on this device type.
  virtual void Copy(const Tensor& dst, const Tensor& src) = 0;
  // Every element of dst (any strides, on this backend's device type) = value.
  virtual void Fill(const Tensor& dst, double value) = 0;
  // Waits until the work the calling thread enqueued on device `index` has completed.
  virtual void Synchronize(int index) = 0;
};

// Installs `backend` (never destroyed) for `type`; a later registration replaces it, and
// nullptr removes it (tests install fakes this way).
void RegisterDeviceBackend(DeviceType type, DeviceBackend* backend);
// The backend of `type`, or nullptr when none is linked.
DeviceBackend* FindDeviceBackend(DeviceType type);
// The backend of `type`; throws tg::Error "no CUDA backend in this binary: link
// //tensor/cuda:backend" when none is linked.
DeviceBackend* GetDeviceBackend(DeviceType type);

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_BACKEND_H_
