// float8 storage types (e4m3fn and e5m2) with bit-exact conversions, as tensor/half.h does for
// f16/bf16: the storage types of the tensor core's kF8E4M3 and kF8E5M2 (tensor/dtype.h). Header only.
//
//   e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities: 0x7f/0xff are NaN, the
//           largest finite value is 448 (0x7e), the smallest subnormal 2^-9.
//   e5m2:   1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: 0x7c is inf, 0x7d..0x7f
//           NaN, the largest finite value is 57344 (0x7b), the smallest subnormal 2^-16.
//
// float -> float8 rounds to nearest, ties to even; subnormals are produced and the sign of zero
// (and of values that round to zero) is kept. f16/bf16 convert through float, which is exact.
// The rules follow CUDA's __nv_cvt_float_to_fp8 (cuda_fp8.hpp), the cast Transformer Engine uses
// (its fp8e4m3/fp8e5m2 are __nv_fp8_e4m3/__nv_fp8_e5m2, whose float constructor passes
// __NV_SATFINITE):
//   kSatFinite (the default, TE's casts): a finite value whose rounding would exceed the largest
//     finite value becomes +-max, and so does +-inf (cuda_fp8.hpp tests NaN with `absx >
//     DP_INF_BITS`, so inf takes the overflow branch). Overflow starts where rounding to nearest
//     even with an unbounded exponent leaves the format: above 464 for e4m3fn (464 itself is the
//     tie between 448 and 480 and goes to 448's even mantissa), from 61440 for e5m2 (the tie
//     between 57344 and 65536 goes up, 57344's mantissa being odd).
//   kNoSat (__NV_NOSAT): the same values become NaN (0x7f | sign) for e4m3fn and inf
//     (0x7c | sign) for e5m2.
//   NaN, in both modes and formats, becomes 0x7f with the sign CLEARED: the host path of
//     __nv_cvt_float_to_fp8 first replaces any NaN by the canonical 0x7fffffff (the sm_89+
//     instruction it uses on the GPU, cvt.rn.satfinite.e4m3x2/e5m2x2.f32, is documented to give
//     the canonical NaN 0x7f as well).
// torch (`.to(torch.float8_e4m3fn / float8_e5m2)`, checked with torch 2.15 on CPU over every f16
// and bf16 input by tests/tensor/float8_reference.py --check-torch) is neither mode for both
// formats: its e4m3fn cast saturates (overflow and +-inf -> +-448, = kSatFinite; older torch
// releases gave NaN there) while its e5m2 cast does not (-> +-inf, = kNoSat), and it keeps the sign
// of a NaN (-NaN -> 0xff) because it ORs the input's sign into every result. Everything else,
// rounding and subnormals included, is bit-identical.
//
// float8 -> float is exact. NaN codes decode to a quiet float NaN with the code's sign and
// mantissa bits at the top of the float payload, so the decoded NaN shows which code it was; it
// converts back to 0x7f (see above), so only the non-NaN codes round-trip bit for bit.
//
//   tg::Float8E4M3 a(500.0f);                           // a.bits == 0x7e (448, saturated)
//   tg::FloatToE4M3Bits(500.0f, tg::Fp8Saturation::kNoSat);  // 0x7f (NaN)
#ifndef TAPEGRAD_TENSOR_FLOAT8_H_
#define TAPEGRAD_TENSOR_FLOAT8_H_

#include <cstdint>

#include "tensor/half.h"

namespace tg {

enum class Fp8Saturation { kSatFinite, kNoSat };

namespace float8_internal {

// Rounds float bits to a float8 format with `kExpBits` exponent and `kManBits` mantissa bits.
// `overflow_from` is the smallest |f| (as float bits) that leaves the format; `max_code`,
// `overflow_code` the results for saturation and for no saturation (without the sign).
template <int kExpBits, int kManBits>
inline uint8_t FloatToFloat8Bits(float f, uint32_t overflow_from, uint8_t max_code,
                                 uint8_t overflow_code, Fp8Saturation saturation) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr uint32_t kMinNormalExponent = 127 - kBias + 1;  // float exponent field of 2^(1-bias)
  constexpr int kDropped = 23 - kManBits;                   // float mantissa bits rounded off
  const uint32_t x = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7fu;  // NaN: canonical, sign cleared (as CUDA)
  if (abs >= overflow_from) {           // includes inf
    return sign | (saturation == Fp8Saturation::kSatFinite ? max_code : overflow_code);
  }
  const uint32_t exponent = abs >> 23;
  if (exponent < kMinNormalExponent) {
    // Subnormal or zero: count in units of the smallest subnormal, 2^(1 - bias - kManBits).
    // Float subnormals (exponent 0) are far below half of it and take the early return.
    const uint32_t shift = kMinNormalExponent + kDropped - exponent;
    if (shift > 24) return sign;  // below half the smallest subnormal: rounds to 0
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint8_t>(result);  // a carry gives the smallest normal: correct
  }
  // Rebias the exponent and round the dropped bits to nearest even, as FloatToHalfBits does; a
  // carry into the exponent is the correct result (overflow was handled above).
  const uint32_t rebiased = abs - ((127u - kBias) << 23);
  const uint32_t rounded =
      (rebiased + ((1u << (kDropped - 1)) - 1) + ((rebiased >> kDropped) & 1u)) >> kDropped;
  return sign | static_cast<uint8_t>(rounded);
}

template <int kExpBits, int kManBits>
inline float Float8BitsToFloat(uint8_t b, bool is_nan, bool is_inf) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exponent = (b >> kManBits) & ((1u << kExpBits) - 1);
  const uint32_t mantissa = b & ((1u << kManBits) - 1);
  if (is_nan) return BitsToFloat(sign | 0x7fc00000u | (mantissa << (23 - kManBits)));
  if (is_inf) return BitsToFloat(sign | 0x7f800000u);
  if (exponent != 0) {
    return BitsToFloat(sign | ((exponent + 127 - kBias) << 23) | (mantissa << (23 - kManBits)));
  }
  // Zero or subnormal: mantissa * 2^(1 - bias - kManBits), exact in float.
  const float magnitude =
      static_cast<float>(mantissa) * BitsToFloat((128u - kBias - kManBits) << 23);
  return BitsToFloat(sign | FloatBits(magnitude));
}

}  // namespace float8_internal

// 464 = 448 + half an ulp (a tie that rounds down to 448); everything above overflows.
inline uint8_t FloatToE4M3Bits(float f, Fp8Saturation saturation = Fp8Saturation::kSatFinite) {
  return float8_internal::FloatToFloat8Bits<4, 3>(f, 0x43e80001u, 0x7eu, 0x7fu, saturation);
}

// 61440 = 57344 + half an ulp (a tie that rounds up, out of the format); it and above overflow.
inline uint8_t FloatToE5M2Bits(float f, Fp8Saturation saturation = Fp8Saturation::kSatFinite) {
  return float8_internal::FloatToFloat8Bits<5, 2>(f, 0x47700000u, 0x7bu, 0x7cu, saturation);
}

inline float E4M3BitsToFloat(uint8_t b) {
  return float8_internal::Float8BitsToFloat<4, 3>(b, (b & 0x7fu) == 0x7fu, false);
}

inline float E5M2BitsToFloat(uint8_t b) {
  return float8_internal::Float8BitsToFloat<5, 2>(b, (b & 0x7fu) > 0x7cu, (b & 0x7fu) == 0x7cu);
}

// 1-byte float8 e4m3fn. Converts implicitly to float (exact) and explicitly from float (rounds,
// saturating as Transformer Engine's casts do).
struct Float8E4M3 {
  uint8_t bits = 0;
  Float8E4M3() = default;
  explicit Float8E4M3(float f, Fp8Saturation saturation = Fp8Saturation::kSatFinite)
      : bits(FloatToE4M3Bits(f, saturation)) {}
  static Float8E4M3 FromBits(uint8_t b) {
    Float8E4M3 h;
    h.bits = b;
    return h;
  }
  operator float() const { return E4M3BitsToFloat(bits); }
};

// 1-byte float8 e5m2. Same conversion rules as Float8E4M3.
struct Float8E5M2 {
  uint8_t bits = 0;
  Float8E5M2() = default;
  explicit Float8E5M2(float f, Fp8Saturation saturation = Fp8Saturation::kSatFinite)
      : bits(FloatToE5M2Bits(f, saturation)) {}
  static Float8E5M2 FromBits(uint8_t b) {
    Float8E5M2 h;
    h.bits = b;
    return h;
  }
  operator float() const { return E5M2BitsToFloat(bits); }
};

static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1, "1-byte storage types");

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_FLOAT8_H_
