// libtorch's factories and options (torch::zeros, torch::randn, torch::TensorOptions, ...),
// giving tg::Tensor handles: `tg::zeros({2, 3}, tg::kFloat32)`,
// `tg::randn({4}, tg::TensorOptions().dtype(tg::kBFloat16).requires_grad(true))`,
// `tg::tensor({1.0, 2.0})`, `tg::arange(10)`.
//
// Random factories without a generator draw from the process's default generator, which
// `tg::manual_seed(s)` restarts (libtorch's default CPU generator). It is one shared stream: a
// program that draws from several threads at once passes its own tg::Generator to each.
// Every factory takes a tg::Generator& where libtorch takes an optional generator.
#ifndef TAPEGRAD_AUTOGRAD_FACTORIES_H_
#define TAPEGRAD_AUTOGRAD_FACTORIES_H_

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include "autograd/variable.h"
#include "tensor/generator.h"

namespace tg {

// The dtype, device and requires_grad of a new tensor (f32 on the CPU without history by
// default). A DType or a Device converts to options, as in libtorch.
class TensorOptions {
 public:
  TensorOptions() = default;
  TensorOptions(DType dtype) : dtype_(dtype) {}              // NOLINT: implicit, as libtorch's
  TensorOptions(Device device) : device_(device) {}          // NOLINT
  TensorOptions(DeviceType type) : device_(Device(type)) {}  // NOLINT

  TensorOptions dtype(DType dtype) const {
    TensorOptions o = *this;
    o.dtype_ = dtype;
    return o;
  }
  TensorOptions device(Device device) const {
    TensorOptions o = *this;
    o.device_ = device;
    return o;
  }
  TensorOptions device(DeviceType type, int index) const { return device(Device(type, index)); }
  TensorOptions requires_grad(bool requires_grad) const {
    TensorOptions o = *this;
    o.requires_grad_ = requires_grad;
    return o;
  }

  DType dtype() const { return dtype_.value_or(kF32); }
  Device device() const { return device_; }
  bool requires_grad() const { return requires_grad_; }
  bool has_dtype() const { return dtype_.has_value(); }

 private:
  std::optional<DType> dtype_;
  Device device_;
  bool requires_grad_ = false;
};

inline TensorOptions dtype(DType dtype) { return TensorOptions().dtype(dtype); }
inline TensorOptions device(Device device) { return TensorOptions().device(device); }
inline TensorOptions requires_grad(bool requires_grad = true) {
  return TensorOptions().requires_grad(requires_grad);
}

// The process's default generator and its seed (libtorch's torch::manual_seed).
Generator& DefaultGenerator();
void manual_seed(uint64_t seed);

// A leaf holding `data` converted to the options' dtype and device, requiring grad if asked.
Tensor MakeFactoryResult(const RawTensor& data, const TensorOptions& options);

Tensor empty(IntArrayRef shape, const TensorOptions& options = {});
Tensor zeros(IntArrayRef shape, const TensorOptions& options = {});
Tensor ones(IntArrayRef shape, const TensorOptions& options = {});
Tensor full(IntArrayRef shape, double value, const TensorOptions& options = {});
Tensor eye(int64_t n, const TensorOptions& options = {});
// Standard normal and uniform [0, 1) values, drawn in row-major order (f16/bf16 drawn in f32 and
// rounded).
Tensor randn(IntArrayRef shape, const TensorOptions& options = {});
Tensor randn(IntArrayRef shape, Generator& gen, const TensorOptions& options = {});
Tensor rand(IntArrayRef shape, const TensorOptions& options = {});
Tensor rand(IntArrayRef shape, Generator& gen, const TensorOptions& options = {});
// Integers uniform in [low, high), i64 unless the options say otherwise.
Tensor randint(int64_t high, IntArrayRef shape, const TensorOptions& options = {});
Tensor randint(int64_t low, int64_t high, IntArrayRef shape, const TensorOptions& options = {});
Tensor randint(int64_t low, int64_t high, IntArrayRef shape, Generator& gen,
               const TensorOptions& options = {});
// A random permutation of 0..n-1 (i64).
Tensor randperm(int64_t n, const TensorOptions& options = {});
Tensor randperm(int64_t n, Generator& gen, const TensorOptions& options = {});

Tensor zeros_like(const Tensor& t, const TensorOptions& options);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t, const TensorOptions& options);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
Tensor randn_like(const Tensor& t);
Tensor rand_like(const Tensor& t);

// [start, end) by step; i64 when every bound is an integer type, else f32 (libtorch's default
// dtype), unless the options name one.
Tensor ArangeOf(double start, double end, double step, bool integral, const TensorOptions& options);
template <typename E, typename = std::enable_if_t<std::is_arithmetic_v<E>>>
Tensor arange(E end, const TensorOptions& options = {}) {
  return ArangeOf(0, static_cast<double>(end), 1, std::is_integral_v<E>, options);
}
template <typename S, typename E,
          typename = std::enable_if_t<std::is_arithmetic_v<S> && std::is_arithmetic_v<E>>>
Tensor arange(S start, E end, const TensorOptions& options = {}) {
  return ArangeOf(static_cast<double>(start), static_cast<double>(end), 1,
                  std::is_integral_v<S> && std::is_integral_v<E>, options);
}
template <typename S, typename E, typename P,
          typename = std::enable_if_t<std::is_arithmetic_v<S> && std::is_arithmetic_v<E> &&
                                      std::is_arithmetic_v<P>>>
Tensor arange(S start, E end, P step, const TensorOptions& options = {}) {
  return ArangeOf(static_cast<double>(start), static_cast<double>(end), static_cast<double>(step),
                  std::is_integral_v<S> && std::is_integral_v<E> && std::is_integral_v<P>, options);
}

// tg::tensor({1.0, 2.0}) (f32), tg::tensor({1, 2}) (i64), tg::tensor({true, false}) (bool),
// tg::tensor({{1.0, 2.0}, {3.0, 4.0}}) (2-d), or a std::vector; the options' dtype wins.
template <typename T>
constexpr DType DefaultDTypeOfValues() {
  if constexpr (std::is_same_v<T, bool>) {
    return kBool;
  } else if constexpr (std::is_integral_v<T>) {
    return kI64;
  } else {
    return kF32;
  }
}
// The values as a tensor of `shape`: integers through i64 and the rest through f64, so that every
// i64 value is exact (also beyond 2^53).
Tensor TensorOfValues(const std::vector<double>& values, const Shape& shape, DType dtype,
                      const TensorOptions& options);
Tensor TensorOfValues(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                      const TensorOptions& options);
template <typename T>
using ValueStorageOf =
    std::conditional_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int64_t, double>;
template <typename T>
Tensor tensor(const std::vector<T>& values, const TensorOptions& options = {}) {
  return TensorOfValues(std::vector<ValueStorageOf<T>>(values.begin(), values.end()),
                        {static_cast<int64_t>(values.size())}, DefaultDTypeOfValues<T>(),
                        options);
}
template <typename T>
Tensor tensor(std::initializer_list<T> values, const TensorOptions& options = {}) {
  return tensor(std::vector<T>(values), options);
}
template <typename T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows,
              const TensorOptions& options = {}) {
  std::vector<ValueStorageOf<T>> values;
  const int64_t cols = rows.size() == 0 ? 0 : static_cast<int64_t>(rows.begin()->size());
  for (const auto& row : rows) {
    TG_CHECK(static_cast<int64_t>(row.size()) == cols, "tensor: rows of different lengths (",
             row.size(), " and ", cols, ")");
    values.insert(values.end(), row.begin(), row.end());
  }
  return TensorOfValues(values, {static_cast<int64_t>(rows.size()), cols},
                        DefaultDTypeOfValues<T>(), options);
}
// A 0-d tensor from one number.
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
Tensor scalar_tensor(T value, const TensorOptions& options = {}) {
  return TensorOfValues(std::vector<ValueStorageOf<T>>{static_cast<ValueStorageOf<T>>(value)},
                        {}, DefaultDTypeOfValues<T>(), options);
}

namespace cuda {
// Whether a CUDA device can be used (the CUDA backend is linked and a device exists), and how
// many.
bool is_available();
int64_t device_count();
}  // namespace cuda

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_FACTORIES_H_
