#include "tensor/generator.h"

#include <cmath>

namespace tg {

std::array<uint32_t, 4> Generator::Philox(uint64_t counter, uint64_t key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  std::array<uint32_t, 4> c = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                               0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
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

Tensor RandUniform(const Shape& shape, Generator& gen, double low, double high, DType dtype) {
  TG_CHECK(low <= high, "rand_uniform: low ", low, " is greater than high ", high);
  TG_CHECK(IsFloating(dtype), "rand_uniform: expected a floating dtype, got ", DTypeName(dtype));
  Tensor t = Tensor::Empty(shape, kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = dtype == kF64 ? gen.NextUniformDouble() : gen.NextUniform();
    p[i] = low + (high - low) * u;
  }
  return t.to(dtype);
}

Tensor RandNormal(const Shape& shape, Generator& gen, double mean, double stddev, DType dtype) {
  TG_CHECK(stddev >= 0, "rand_normal: stddev must be non-negative, got ", stddev);
  TG_CHECK(IsFloating(dtype), "rand_normal: expected a floating dtype, got ", DTypeName(dtype));
  Tensor t = Tensor::Empty(shape, kF64);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = mean + stddev * gen.NextNormal();
  return t.to(dtype);
}

}  // namespace tg
