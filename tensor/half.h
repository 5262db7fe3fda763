// f16 (IEEE binary16) and bf16 (bfloat16) storage types with bit-exact conversions.
//
// float -> half/bf16 rounds to nearest, ties to even, exactly as IEEE 754 and the GPU do:
// subnormals are produced, values from 65520 up overflow f16 to inf, -0 stays -0. NaN stays NaN
// with its sign and the top bits of its payload (the quiet bit is set only when the kept payload
// would otherwise be zero), so every one of the 65,536 bit patterns round-trips through float.
// Arithmetic on these types converts to float, computes, and rounds back.
//
//   tg::Half h(65519.0f);        // h.bits == 0x7bff (65504)
//   float f = tg::Half(1e-8f);   // 0.0f: below half the smallest subnormal
#ifndef TAPEGRAD_TENSOR_HALF_H_
#define TAPEGRAD_TENSOR_HALF_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tg {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    uint16_t payload = static_cast<uint16_t>((abs >> 13) & 0x3ffu);
    if (payload == 0) payload = 0x200u;  // keep it a NaN
    return sign | 0x7c00u | payload;
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  const uint32_t exponent = abs >> 23;
  if (exponent < 113) {               // |f| < 2^-14: the result is subnormal or zero
    if (exponent < 102) return sign;  // |f| < 2^-25 rounds to zero
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24: units of 2^-24
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);  // a carry gives the smallest normal: correct
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even without a
  // branch: add just under half, plus one more when the kept lowest bit is odd. A carry moves
  // into the exponent, which is the correct result (up to 0x7bff; 65520 and above were handled).
  const uint32_t rebiased = abs - (112u << 23);
  return sign | static_cast<uint16_t>((rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13);
}

inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  return BitsToFloat(sign | FloatBits(static_cast<float>(mantissa) * 0x1.0p-24f));
}

inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload bits
    uint16_t b = static_cast<uint16_t>(x >> 16);
    if ((b & 0x7fu) == 0) b |= 0x40u;
    return b;
  }
  const uint32_t rounding_bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding_bias) >> 16);
}

// Rounds a double to float toward zero and sets the lowest bit when that was inexact ("round to
// odd"). Rounding the result to f16/bf16 then equals rounding the double directly, because float
// carries more than twice their precision plus two bits; f64 -> f16/bf16 thus rounds once.
inline float DoubleToFloatRoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (d != d || static_cast<double>(f) == d) return f;  // NaN or exact
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return BitsToFloat(FloatBits(f) | 1u);
}

inline float BFloat16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// 2-byte IEEE half. Converts implicitly to float (exact) and explicitly from float (rounds).
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(FloatToHalfBits(f)) {}
  static Half FromBits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
  operator float() const { return HalfBitsToFloat(bits); }
};

// 2-byte bfloat16 (the top half of a float). Same conversion rules as Half.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(FloatToBFloat16Bits(f)) {}
  static BFloat16 FromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  operator float() const { return BFloat16BitsToFloat(bits); }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "2-byte storage types");

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_HALF_H_
