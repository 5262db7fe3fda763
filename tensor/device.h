// Where a tensor's memory lives: the CPU, or CUDA device n.
//
//   tg::Device d = tg::Device::Cuda(0);   // d.ToString() == "cuda:0"
#ifndef TAPEGRAD_TENSOR_DEVICE_H_
#define TAPEGRAD_TENSOR_DEVICE_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace tg {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

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

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_H_
