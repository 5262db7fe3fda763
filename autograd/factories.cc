#include "autograd/factories.h"

#include <cmath>
#include <numeric>

#include "autograd/ops.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"

namespace tg {
namespace {

Shape ToShape(IntArrayRef dims) { return Shape(dims.begin(), dims.end()); }

}  // namespace

Generator& DefaultGenerator() {
  static Generator* const generator = new Generator(0);
  return *generator;
}

void manual_seed(uint64_t seed) { DefaultGenerator().set_seed(seed); }

// In place through CopyInPlace, so the in-place rules and the version counter are copy_'s; the
// draws are made in f32 (f64 for an f64 tensor) and converted once.
const Tensor& Tensor::uniform_(double from, double to) const {
  TG_CHECK(IsFloating(dtype()), "uniform_: needs a floating tensor, got ", DTypeName(dtype()));
  TG_CHECK(from <= to, "uniform_: from (", from, ") must not exceed to (", to, ")");
  const DType draw = dtype() == kF64 ? kF64 : kF32;
  return CopyInPlace(*this,
                     Tensor(RandUniform(shape(), DefaultGenerator(), from, to, draw).to(device())));
}
const Tensor& Tensor::normal_(double mean, double std) const {
  TG_CHECK(IsFloating(dtype()), "normal_: needs a floating tensor, got ", DTypeName(dtype()));
  TG_CHECK(std >= 0, "normal_: std must be non-negative, got ", std);
  const DType draw = dtype() == kF64 ? kF64 : kF32;
  return CopyInPlace(*this,
                     Tensor(RandNormal(shape(), DefaultGenerator(), mean, std, draw).to(device())));
}

Tensor MakeFactoryResult(const RawTensor& data, const TensorOptions& options) {
  RawTensor out = data.to(options.device(), options.dtype());
  TG_CHECK(!options.requires_grad() || IsFloating(out.dtype()),
           "requires_grad: only floating tensors can require grad, not ", DTypeName(out.dtype()));
  return Tensor(out, options.requires_grad());
}

Tensor empty(IntArrayRef shape, const TensorOptions& options) {
  return Tensor(RawTensor::Empty(ToShape(shape), options.dtype(), options.device()),
                options.requires_grad());
}
Tensor zeros(IntArrayRef shape, const TensorOptions& options) { return full(shape, 0, options); }
Tensor ones(IntArrayRef shape, const TensorOptions& options) { return full(shape, 1, options); }
Tensor full(IntArrayRef shape, double value, const TensorOptions& options) {
  TG_CHECK(!options.requires_grad() || IsFloating(options.dtype()),
           "requires_grad: only floating tensors can require grad, not ",
           DTypeName(options.dtype()));
  return Tensor(RawTensor::Full(ToShape(shape), value, options.dtype(), options.device()),
                options.requires_grad());
}
Tensor eye(int64_t n, const TensorOptions& options) {
  TG_CHECK(n >= 0, "eye: n must be non-negative, got ", n);
  std::vector<double> values(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i * n + i)] = 1;
  return TensorOfValues(values, Shape{n, n}, kF32, options);
}

Tensor randn(IntArrayRef shape, const TensorOptions& options) {
  return randn(shape, DefaultGenerator(), options);
}
Tensor randn(IntArrayRef shape, Generator& gen, const TensorOptions& options) {
  TG_CHECK(IsFloating(options.dtype()), "randn: needs a floating dtype, got ",
           DTypeName(options.dtype()));
  return MakeFactoryResult(RandNormal(ToShape(shape), gen, 0, 1, options.dtype()), options);
}
Tensor rand(IntArrayRef shape, const TensorOptions& options) {
  return rand(shape, DefaultGenerator(), options);
}
Tensor rand(IntArrayRef shape, Generator& gen, const TensorOptions& options) {
  TG_CHECK(IsFloating(options.dtype()), "rand: needs a floating dtype, got ",
           DTypeName(options.dtype()));
  return MakeFactoryResult(RandUniform(ToShape(shape), gen, 0, 1, options.dtype()), options);
}
Tensor randint(int64_t high, IntArrayRef shape, const TensorOptions& options) {
  return randint(0, high, shape, DefaultGenerator(), options);
}
Tensor randint(int64_t low, int64_t high, IntArrayRef shape, const TensorOptions& options) {
  return randint(low, high, shape, DefaultGenerator(), options);
}
Tensor randint(int64_t low, int64_t high, IntArrayRef shape, Generator& gen,
               const TensorOptions& options) {
  TG_CHECK(low < high, "randint: low (", low, ") must be below high (", high, ")");
  const Shape s = ToShape(shape);
  std::vector<int64_t> values(static_cast<size_t>(NumElements(s)));
  const uint64_t range = static_cast<uint64_t>(high - low);
  for (int64_t& v : values) {
    // 64 random bits, reduced modulo the range (the bias is below 2^-32 for ranges below 2^32).
    const uint64_t bits = (static_cast<uint64_t>(gen.NextU32()) << 32) | gen.NextU32();
    v = low + static_cast<int64_t>(bits % range);
  }
  const TensorOptions o = options.has_dtype() ? options : options.dtype(kI64);
  return MakeFactoryResult(RawTensor::FromVector(values, s), o);
}
Tensor randperm(int64_t n, const TensorOptions& options) {
  return randperm(n, DefaultGenerator(), options);
}
Tensor randperm(int64_t n, Generator& gen, const TensorOptions& options) {
  TG_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  std::vector<int64_t> values(static_cast<size_t>(n));
  std::iota(values.begin(), values.end(), 0);
  // Fisher-Yates from the last element down, one draw per swap.
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bits = (static_cast<uint64_t>(gen.NextU32()) << 32) | gen.NextU32();
    std::swap(values[static_cast<size_t>(i)],
              values[static_cast<size_t>(bits % static_cast<uint64_t>(i + 1))]);
  }
  const TensorOptions o = options.has_dtype() ? options : options.dtype(kI64);
  return MakeFactoryResult(RawTensor::FromVector(values, {n}), o);
}

namespace {
TensorOptions Like(const Tensor& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }
}  // namespace

Tensor zeros_like(const Tensor& t, const TensorOptions& options) {
  return zeros(t.sizes(), options);
}
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), Like(t)); }
Tensor ones_like(const Tensor& t, const TensorOptions& options) { return ones(t.sizes(), options); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), Like(t)); }
Tensor empty_like(const Tensor& t) { return empty(t.sizes(), Like(t)); }
Tensor full_like(const Tensor& t, double value) { return full(t.sizes(), value, Like(t)); }
Tensor randn_like(const Tensor& t) { return randn(t.sizes(), Like(t)); }
Tensor rand_like(const Tensor& t) { return rand(t.sizes(), Like(t)); }

Tensor ArangeOf(double start, double end, double step, bool integral,
                const TensorOptions& options) {
  TG_CHECK(step != 0, "arange: step must be nonzero");
  TG_CHECK(std::isfinite(start) && std::isfinite(end), "arange: bounds must be finite");
  // The values are made in f64: integers are exact only up to 2^53.
  TG_CHECK(!integral || (std::fabs(start) <= 0x1p53 && std::fabs(end) <= 0x1p53),
           "arange: integer bounds beyond 2^53 (", start, ", ", end, ") are not supported");
  const TensorOptions o = options.has_dtype() ? options : options.dtype(integral ? kI64 : kF32);
  // RawTensor::Arange in f64 (exact for integers), then the options' dtype.
  return MakeFactoryResult(RawTensor::Arange(start, end, step, kF64), o);
}

Tensor TensorOfValues(const std::vector<double>& values, const Shape& shape, DType dtype,
                      const TensorOptions& options) {
  const TensorOptions o = options.has_dtype() ? options : options.dtype(dtype);
  return MakeFactoryResult(RawTensor::FromVector(values, shape), o);
}
Tensor TensorOfValues(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                      const TensorOptions& options) {
  const TensorOptions o = options.has_dtype() ? options : options.dtype(dtype);
  return MakeFactoryResult(RawTensor::FromVector(values, shape), o);
}

namespace cuda {
bool is_available() { return device_count() > 0; }
int64_t device_count() { return DeviceCount(DeviceType::kCuda); }
}  // namespace cuda

}  // namespace tg
