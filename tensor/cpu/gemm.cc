#include "tensor/cpu/gemm.h"

#include <immintrin.h>

#include <cstring>

namespace tg::cpu {
namespace {

// vcvtph2ps, eight values at a time, compiled for F16C whatever the build's -march; called only
// where the running CPU has it.
__attribute__((target("avx,f16c"))) void WidenHalfF16c(const Half* p, int64_t count, float* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < count; ++i) out[i] = static_cast<float>(p[i]);
}

// vcvtps2ph with round-to-nearest-even, eight values at a time.
__attribute__((target("avx,f16c"))) void NarrowHalfF16c(const float* p, int64_t count, Half* out) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(p + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < count; ++i) out[i] = Half(p[i]);
}

bool HasF16c() {
  static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return f16c;
}

}  // namespace

void NarrowHalf(const float* p, int64_t count, Half* out) {
  if (HasF16c()) return NarrowHalfF16c(p, count, out);
  for (int64_t i = 0; i < count; ++i) out[i] = Half(p[i]);
}

void NarrowBFloat16(const float* p, int64_t count, BFloat16* out) {
  // FloatToBFloat16Bits without its branch: round to nearest even, except that a NaN keeps its
  // sign and top payload bits (and stays a NaN).
  for (int64_t i = 0; i < count; ++i) {
    uint32_t x;
    std::memcpy(&x, p + i, sizeof(x));
    const uint32_t top = x >> 16;
    const uint32_t rounded = (x + 0x7fffu + (top & 1u)) >> 16;
    const uint32_t nan = top | ((top & 0x7fu) == 0 ? 0x40u : 0u);
    const uint16_t bits =
        static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    out[i] = BFloat16::FromBits(bits);
  }
}

void WidenHalf(const Half* p, int64_t count, float* out) {
  if (HasF16c()) return WidenHalfF16c(p, count, out);
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(p[i]);
}

}  // namespace tg::cpu
