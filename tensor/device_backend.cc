#include "tensor/device_backend.h"

#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

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

// Kept until the process ends, also when replaced (a thread may still be reading the old one),
// in a list that stays reachable: a test that swaps tables leaks nothing.
const KernelTable* KeepTable(const KernelTable& table) {
#define TG_KERNEL(ret, name, params) \
  TG_CHECK(table.name != nullptr, "kernel table: no kernel for ", #name);
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  static std::mutex* mu = new std::mutex;
  static auto* kept = new std::deque<KernelTable>;
  std::lock_guard<std::mutex> lock(*mu);
  kept->push_back(table);
  return &kept->back();
}

}  // namespace

DeviceBackend::DeviceBackend(DeviceType type, const KernelTable& kernels,
                             DevicePreferences preferences)
    : type_(type), kernels_(KeepTable(kernels)), preferences_(preferences) {}

void DeviceBackend::ReplaceKernels(const KernelTable& kernels) {
  kernels_.store(KeepTable(kernels), std::memory_order_release);
}

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
  TG_CHECK(backend != nullptr, "no ", DeviceTypeDisplayName(type),
           " backend in this binary: link ", DeviceTypeLinkTarget(type));
  return backend;
}

std::vector<DeviceType> RegisteredDeviceTypes() {
  std::vector<DeviceType> types;
  for (DeviceType type : kAllDeviceTypes) {
    if (FindDeviceBackend(type) != nullptr) types.push_back(type);
  }
  return types;
}

std::vector<Device> DevicesToTestAgainstTheCpu() {
  std::vector<Device> devices;
  for (DeviceType type : RegisteredDeviceTypes()) {
    if (type == DeviceType::kCpu) continue;
    const int n = DeviceCount(type);
    if (n > 0) devices.push_back(Device(type, 0));
  }
  return devices;
}

int DeviceCount(DeviceType type) {
  DeviceBackend* backend = FindDeviceBackend(type);
  return backend == nullptr ? 0 : backend->DeviceCount();
}

const KernelTable& KernelsFor(Device device) { return GetDeviceBackend(device.type)->kernels(); }

}  // namespace tg
