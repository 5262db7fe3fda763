#include "tensor/kernel_table.h"

#include <atomic>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "tensor/device_backend.h"
#include "tensor/error.h"

namespace tg {
namespace {

// A device type's kernels and preferences, kept until the process ends (a thread may still be
// reading a replaced one), in a list that stays reachable: a test that swaps tables leaks nothing.
struct Kernels {
  KernelTable table;
  DevicePreferences preferences;
};

// Constant-initialised, so a device's static initializer may register before or after any other
// static initializer of the binary runs.
std::atomic<const Kernels*> registered[kNumDeviceTypes] = {};

size_t Slot(DeviceType type) {
  const auto slot = static_cast<size_t>(type);
  TG_CHECK(slot < kNumDeviceTypes, "kernel table: unknown device type ", slot);
  return slot;
}

const Kernels* Keep(const KernelTable& table, DevicePreferences preferences) {
#define TG_KERNEL(ret, name, params) \
  TG_CHECK(table.name != nullptr, "kernel table: no kernel for ", #name);
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  static std::mutex* mu = new std::mutex;
  static auto* kept = new std::deque<Kernels>;
  std::lock_guard<std::mutex> lock(*mu);
  kept->push_back(Kernels{table, preferences});
  return &kept->back();
}

const Kernels& Get(DeviceType type) {
  const Kernels* k = registered[Slot(type)].load(std::memory_order_acquire);
  TG_CHECK(k != nullptr, "no ", DeviceTypeDisplayName(type), " backend in this binary: link ",
           DeviceTypeLinkTarget(type));
  return *k;
}

}  // namespace

void RegisterKernels(DeviceType type, const KernelTable& kernels, DevicePreferences preferences) {
  registered[Slot(type)].store(Keep(kernels, preferences), std::memory_order_release);
}

void ReplaceKernels(DeviceType type, const KernelTable& kernels) {
  RegisterKernels(type, kernels, Get(type).preferences);
}

void UnregisterKernels(DeviceType type) {
  registered[Slot(type)].store(nullptr, std::memory_order_release);
}

bool HasKernels(DeviceType type) {
  return registered[Slot(type)].load(std::memory_order_acquire) != nullptr;
}

const KernelTable& KernelsFor(Device device) { return Get(device.type).table; }

const DevicePreferences& PreferencesFor(Device device) { return Get(device.type).preferences; }

std::vector<DeviceType> RegisteredDeviceTypes() {
  std::vector<DeviceType> types;
  for (DeviceType type : kAllDeviceTypes) {
    if (FindDeviceBackend(type) != nullptr && HasKernels(type)) types.push_back(type);
  }
  return types;
}

std::vector<Device> DevicesToTestAgainstTheCpu() {
  std::vector<Device> devices;
  for (DeviceType type : RegisteredDeviceTypes()) {
    if (type != DeviceType::kCpu && DeviceCount(type) > 0) devices.push_back(Device(type, 0));
  }
  return devices;
}

}  // namespace tg
