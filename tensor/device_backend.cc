#include "tensor/device_backend.h"

#include <atomic>
#include <cstddef>

#include "tensor/error.h"

namespace tg {
namespace {

// Constant-initialised, so a backend's static initializer may register before or after any
// other static initializer of the binary runs.
std::atomic<DeviceBackend*> backends[kNumDeviceTypes] = {};

size_t Slot(DeviceType type) {
  const auto slot = static_cast<size_t>(type);
  TG_CHECK(slot < kNumDeviceTypes, "device backend: unknown device type ", slot);
  return slot;
}

}  // namespace

void RegisterDeviceBackend(DeviceBackend* backend) {
  TG_CHECK(backend != nullptr, "device backend: null backend");
  backends[Slot(backend->type())].store(backend, std::memory_order_release);
}

void UnregisterDeviceBackend(DeviceType type) {
  backends[Slot(type)].store(nullptr, std::memory_order_release);
}

DeviceBackend* FindDeviceBackend(DeviceType type) {
  return backends[Slot(type)].load(std::memory_order_acquire);
}

DeviceBackend* GetDeviceBackend(DeviceType type) {
  DeviceBackend* backend = FindDeviceBackend(type);
  TG_CHECK(backend != nullptr, "no ", DeviceTypeDisplayName(type), " backend in this binary: link ",
           DeviceTypeLinkTarget(type));
  return backend;
}

int DeviceCount(DeviceType type) {
  DeviceBackend* backend = FindDeviceBackend(type);
  return backend == nullptr ? 0 : backend->DeviceCount();
}

}  // namespace tg
