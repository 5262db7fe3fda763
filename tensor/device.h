// Where a tensor's memory lives: the CPU, or CUDA device n.
//
//   tg::Device d = tg::Device::Cuda(0);   // d.ToString() == "cuda:0"
#ifndef TAPEGRAD_TENSOR_DEVICE_H_
#define TAPEGRAD_TENSOR_DEVICE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg {

enum class DeviceType { kCpu, kCuda };

// libtorch's names for the device types: tg::Device(tg::kCUDA, 1).
inline constexpr DeviceType kCPU = DeviceType::kCpu;
inline constexpr DeviceType kCUDA = DeviceType::kCuda;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType type, int index = 0) : type(type), index(index) {}  // NOLINT
  // "cpu", "cuda" (device 0) or "cuda:N", as libtorch's Device(std::string); throws tg::Error
  // naming the string otherwise.
  Device(const std::string& spec);                         // NOLINT: implicit, as libtorch's
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Cuda(int index = 0) { return Device{DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const {
    return is_cpu() ? std::string("cpu") : absl::StrCat("cuda:", index);
  }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline Device::Device(const std::string& spec) {
  const std::string cuda = "cuda";
  if (spec == "cpu") return;
  bool ok = spec.compare(0, cuda.size(), cuda) == 0;
  if (ok && spec.size() > cuda.size()) {
    // "cuda:N": N decimal digits, at most 9 of them.
    const std::string n = spec.substr(cuda.size() + 1);
    ok = spec[cuda.size()] == ':' && !n.empty() && n.size() <= 9 &&
         n.find_first_not_of("0123456789") == std::string::npos;
    if (ok) index = std::stoi(n);
  }
  TG_CHECK(ok, "Device: '", spec, "' is not a device (expected cpu, cuda or cuda:N)");
  type = DeviceType::kCuda;
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_H_
