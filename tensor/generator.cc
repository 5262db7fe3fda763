#include "tensor/generator.h"

#include <cmath>

#include "tensor/philox.h"

namespace tg {

std::array<uint32_t, 4> Generator::Philox(uint64_t counter, uint64_t key) {
  const PhiloxBlock b = Philox4x32(counter, key);
  return {b.v[0], b.v[1], b.v[2], b.v[3]};
}

Generator::State Generator::Reserve(uint64_t draws) {
  const State start = state_;
  state_.offset += draws;
  return start;
}

uint32_t Generator::NextU32() {
  // Block offset/4 gives four values; recomputing a block costs ~40 multiplies, which keeps the
  // state two integers instead of a cached block.
  const uint64_t offset = state_.offset++;
  return Philox(offset / 4, state_.seed)[offset % 4];
}

float Generator::NextUniform() { return static_cast<float>(NextU32() >> 8) * 0x1.0p-24f; }

double Generator::NextUniformDouble() {
  const uint64_t hi = NextU32() >> 5, lo = NextU32() >> 6;  // 27 + 26 bits
  return static_cast<double>((hi << 26) | lo) * 0x1.0p-53;
}

double Generator::NextNormal() {
  const double u1 = 1.0 - NextUniformDouble();  // (0, 1]: log stays finite
  const double u2 = NextUniformDouble();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

RawTensor RandUniform(const Shape& shape, Generator& gen, double low, double high, DType dtype) {
  TG_CHECK(low <= high, "rand_uniform: low ", low, " is greater than high ", high);
  TG_CHECK(IsFloating(dtype), "rand_uniform: expected a floating dtype, got ", DTypeName(dtype));
  RawTensor t = RawTensor::Empty(shape, kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = dtype == kF64 ? gen.NextUniformDouble() : gen.NextUniform();
    p[i] = low + (high - low) * u;
  }
  return t.to(dtype);
}

RawTensor RandNormal(const Shape& shape, Generator& gen, double mean, double stddev, DType dtype) {
  TG_CHECK(stddev >= 0, "rand_normal: stddev must be non-negative, got ", stddev);
  TG_CHECK(IsFloating(dtype), "rand_normal: expected a floating dtype, got ", DTypeName(dtype));
  RawTensor t = RawTensor::Empty(shape, kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = mean + stddev * gen.NextNormal();
  return t.to(dtype);
}

}  // namespace tg
