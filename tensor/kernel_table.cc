#include "tensor/kernel_table.h"

#include <atomic>
#include <deque>
#include <mutex>

#include "tensor/error.h"

namespace tg {
namespace {

// Constant-initialised (as the backends of device_backend.cc), so a device's static initializer
// may register before or after any other static initializer of the binary runs.
constexpr int kNumDeviceTypes = 2;
std::atomic<const KernelTable*> tables[kNumDeviceTypes] = {};

int Slot(DeviceType type) {
  const int slot = static_cast<int>(type);
  TG_CHECK(slot >= 0 && slot < kNumDeviceTypes, "kernel table: unknown device type ", slot);
  return slot;
}

}  // namespace

void RegisterKernelTable(DeviceType type, const KernelTable& table) {
#define TG_KERNEL(ret, name, params) \
  TG_CHECK(table.name != nullptr, "kernel table: no kernel for ", #name);
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  // Kept until the process ends, also when replaced (a thread may still be reading the old one),
  // in a list that stays reachable: a test that swaps tables leaks nothing.
  static std::mutex* mu = new std::mutex;
  static auto* registered = new std::deque<KernelTable>;
  std::lock_guard<std::mutex> lock(*mu);
  registered->push_back(table);
  tables[Slot(type)].store(&registered->back(), std::memory_order_release);
}

bool HasKernelTable(DeviceType type) {
  return tables[Slot(type)].load(std::memory_order_acquire) != nullptr;
}

const KernelTable& KernelsFor(Device device) {
  const KernelTable* table = tables[Slot(device.type)].load(std::memory_order_acquire);
  if (table != nullptr) return *table;
  TG_CHECK(device.type != DeviceType::kCuda,
           "no CUDA kernels in this binary: link //tensor/cuda:kernels");
  throw Error("no CPU kernels in this binary: link //tensor/cpu:kernels");
}

}  // namespace tg
