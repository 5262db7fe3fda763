// Where a tensor's memory lives: the CPU, or device n of another device type.
//
//   tg::Device d = tg::Device::Cuda(0);           // d.ToString() == "cuda:0"
//   tg::Device e("cuda:1");                        // throws tg::Error for a bad string
//   std::optional<tg::Device> f = tg::Device::Parse(flag);   // std::nullopt for a bad one
//
// The device types are one list, TG_DEVICE_TYPES below: the enum, the names a Device is written
// and parsed with, the names messages and type strings give, and the Bazel target that links the
// type's backend are all expanded from it. A new device type is one line there plus a backend
// that registers itself (tensor/device_backend.h); the op tables then run it against the CPU
// (tests/tensor:op_table_test, tests/autograd:op_table_devices_test) without a line of their own.
#ifndef TAPEGRAD_TENSOR_DEVICE_H_
#define TAPEGRAD_TENSOR_DEVICE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg {

//   X(enumerator, name, display name, the Bazel target that links its backend)
#define TG_DEVICE_TYPES(X)               \
  X(kCpu, "cpu", "CPU", "//tensor:core") \
  X(kCuda, "cuda", "CUDA", "//tensor:devices")

#define TG_DEVICE_TYPE_ENUMERATOR(e, name, display, target) e,
enum class DeviceType { TG_DEVICE_TYPES(TG_DEVICE_TYPE_ENUMERATOR) };
#undef TG_DEVICE_TYPE_ENUMERATOR
#define TG_DEVICE_TYPE_VALUE(e, name, display, target) DeviceType::e,
inline constexpr DeviceType kAllDeviceTypes[] = {TG_DEVICE_TYPES(TG_DEVICE_TYPE_VALUE)};
#undef TG_DEVICE_TYPE_VALUE
inline constexpr size_t kNumDeviceTypes = sizeof(kAllDeviceTypes) / sizeof(kAllDeviceTypes[0]);

namespace device_internal {
struct DeviceTypeInfo {
  const char* name;     // "cuda": Device strings, "cuda:1"
  const char* display;  // "CUDA": messages, type strings ("CUDAFloatType")
  const char* target;   // "//tensor:devices": what a binary links for the backend
};
#define TG_DEVICE_TYPE_INFO(e, name, display, target) DeviceTypeInfo{name, display, target},
inline constexpr DeviceTypeInfo kDeviceTypeInfo[] = {TG_DEVICE_TYPES(TG_DEVICE_TYPE_INFO)};
#undef TG_DEVICE_TYPE_INFO
inline const DeviceTypeInfo& InfoOf(DeviceType type) {
  const auto i = static_cast<size_t>(type);
  TG_CHECK(i < kNumDeviceTypes, "Device: unknown device type ", i);
  return kDeviceTypeInfo[i];
}
}  // namespace device_internal

// "cpu", "cuda"; "CPU", "CUDA"; "//tensor:core", "//tensor:devices".
inline const char* DeviceTypeName(DeviceType type) { return device_internal::InfoOf(type).name; }
inline const char* DeviceTypeDisplayName(DeviceType type) {
  return device_internal::InfoOf(type).display;
}
inline const char* DeviceTypeLinkTarget(DeviceType type) {
  return device_internal::InfoOf(type).target;
}

// libtorch's names for the device types: tg::Device(tg::kCUDA, 1).
inline constexpr DeviceType kCPU = DeviceType::kCpu;
inline constexpr DeviceType kCUDA = DeviceType::kCuda;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType type, int index = 0) : type(type), index(index) {}  // NOLINT
  // What Parse accepts, as libtorch's Device(std::string); throws tg::Error naming the string
  // otherwise.
  Device(const std::string& spec);                         // NOLINT: implicit, as libtorch's
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  // "cpu", or a device type's name with an optional ":N" (N: 0 to 999999999, decimal digits
  // only; the CPU has the one device 0): "cuda" (device 0), "cuda:1", "cpu:0". std::nullopt for
  // anything else. Whether the device exists is the backend's to say (DeviceCount).
  static std::optional<Device> Parse(std::string_view spec);
  // The strings Parse accepts, for messages: "cpu, cuda or cuda:N".
  static std::string Specs();

  static Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static Device Cuda(int index = 0) { return Device{DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  // "cpu" (the CPU's one device), else "<name>:<index>" ("cuda:0").
  std::string ToString() const {
    return is_cpu() ? std::string(DeviceTypeName(type))
                    : absl::StrCat(DeviceTypeName(type), ":", index);
  }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline std::optional<Device> Device::Parse(std::string_view spec) {
  for (DeviceType type : kAllDeviceTypes) {
    const std::string_view name = DeviceTypeName(type);
    if (spec.substr(0, name.size()) != name) continue;
    const std::string_view rest = spec.substr(name.size());
    if (rest.empty()) return Device(type, 0);
    if (rest[0] != ':') continue;  // another type's name may start with this one
    const std::string_view digits = rest.substr(1);
    int index = 0;
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string_view::npos ||
        !absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &index)) {
      return std::nullopt;
    }
    if (type == DeviceType::kCpu && index != 0) return std::nullopt;
    return Device(type, index);
  }
  return std::nullopt;
}

inline std::string Device::Specs() {
  std::string out = DeviceTypeName(DeviceType::kCpu);
  for (size_t i = 1; i < kNumDeviceTypes; ++i) {
    const char* name = DeviceTypeName(kAllDeviceTypes[i]);
    absl::StrAppend(&out, ", ", name, i + 1 == kNumDeviceTypes ? " or " : ", ", name, ":N");
  }
  return out;
}

inline Device::Device(const std::string& spec) {
  const std::optional<Device> parsed = Parse(spec);
  TG_CHECK(parsed.has_value(), "Device: '", spec, "' is not a device (expected ", Specs(), ")");
  *this = *parsed;
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_DEVICE_H_
