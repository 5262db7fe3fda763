#include "tensor/device_backend.h"

#include <atomic>

#include "tensor/error.h"

namespace tg {
namespace {

// Constant-initialised, so a backend's static initializer may register before or after any
// other static initializer of the binary runs.
constexpr int kNumDeviceTypes = 2;
std::atomic<DeviceBackend*> backends[kNumDeviceTypes] = {};

int Slot(DeviceType type) {
  const int slot = static_cast<int>(type);
  TG_CHECK(slot >= 0 && slot < kNumDeviceTypes, "device backend: unknown device type ", slot);
  return slot;
}

}  // namespace

void RegisterDeviceBackend(DeviceType type, DeviceBackend* backend) {
  backends[Slot(type)].store(backend, std::memory_order_release);
}

DeviceBackend* FindDeviceBackend(DeviceType type) {
  return backends[Slot(type)].load(std::memory_order_acquire);
}

DeviceBackend* GetDeviceBackend(DeviceType type) {
  DeviceBackend* backend = FindDeviceBackend(type);
  if (backend != nullptr) return backend;
  TG_CHECK(type != DeviceType::kCuda, "no CUDA backend in this binary: link //tensor/cuda:backend");
  throw Error("no backend for the CPU: the CPU is built into the tensor core");
}

}  // namespace tg
