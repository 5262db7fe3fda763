// f16 / bf16 conversions (tensor/half.h): bit-exact IEEE round-to-nearest-even, checked
// exhaustively where the space is small (all 2^16 patterns, every midpoint between adjacent
// values) and by sampling the 2^32 float patterns against two independent references: GCC's
// _Float16 conversion and a double-precision nearbyint() rounding written here.
#include "tensor/half.h"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace tg {
namespace {

constexpr int kMaxReported = 10;  // failures printed per exhaustive loop

bool IsHalfNaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsBF16NaN(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of an f16 bit pattern from the IEEE definition (independent of half.h).
double RefHalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000u) ? -v : v;
}

// Correctly rounded (nearest, ties to even) value of finite `x` in a binary format with
// `precision` significand bits and minimum normal exponent `min_exp`; values above `max_finite`
// become inf. Computed in double: the scaling by a power of two is exact and nearbyint() rounds
// ties to even in the default rounding mode.
float RefRound(float x, int precision, int min_exp, double max_finite) {
  if (x == 0) return x;  // keeps the sign of zero
  const double ax = std::fabs(static_cast<double>(x));
  const int quantum_exp = std::max(std::ilogb(ax), min_exp) - (precision - 1);
  double v = std::ldexp(std::nearbyint(std::ldexp(ax, -quantum_exp)), quantum_exp);
  if (v > max_finite) v = std::numeric_limits<double>::infinity();
  return static_cast<float>(std::copysign(v, static_cast<double>(x)));
}

float RefRoundToHalf(float x) { return RefRound(x, 11, -14, 65504.0); }
float RefRoundToBFloat16(float x) {
  return RefRound(x, 8, -126, static_cast<double>(BitsToFloat(0x7f7f0000u)));
}

// ---------------------------------------------------------------------------------------------
// Round trips and decoding of every bit pattern.

TEST(HalfTest, AllHalfPatternsRoundTripThroughFloat) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const uint16_t back = FloatToHalfBits(HalfBitsToFloat(h));
    if (back != h && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "0x" << i << " -> " << HalfBitsToFloat(h) << " -> 0x" << back;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(HalfTest, HalfBitsToFloatMatchesIeeeDefinition) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfBitsToFloat(h);
    const double ref = RefHalfValue(h);
    bool ok;
    if (std::isnan(ref)) {
      // NaN: sign kept, payload shifted into the top of the float mantissa.
      const uint32_t expected = (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u |
                                (static_cast<uint32_t>(h & 0x3ffu) << 13);
      ok = std::isnan(f) && FloatBits(f) == expected;
    } else {
      ok = static_cast<double>(f) == ref && std::signbit(f) == std::signbit(ref);
    }
    if (!ok && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "0x" << i << " decodes to " << f << ", expected " << ref;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(BFloat16Test, AllBFloat16PatternsRoundTripThroughFloat) {
  int failures = 0;
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = BFloat16BitsToFloat(b);
    EXPECT_EQ(FloatBits(f), i << 16);  // bf16 is the top half of a float
    const uint16_t back = FloatToBFloat16Bits(f);
    if (back != b && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "0x" << i << " -> 0x" << back;
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---------------------------------------------------------------------------------------------
// Every rounding decision between adjacent finite values.

// For adjacent finite patterns lo and lo+1 (same sign), the float midpoint rounds to the even
// pattern and the floats just below / above it round to the nearer neighbour.
template <typename ToBits, typename FromBits>
int CheckMidpoints(uint32_t last_lo, ToBits to_bits, FromBits from_bits, const char* name) {
  int failures = 0;
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t lo = 0; lo <= last_lo; ++lo) {
      const uint16_t a_bits = static_cast<uint16_t>(lo | sign);
      const uint16_t b_bits = static_cast<uint16_t>((lo + 1) | sign);
      const float a = from_bits(a_bits), b = from_bits(b_bits);
      const float mid = a + (b - a) / 2;  // (a + b) / 2 would overflow near the top
      // The midpoint must be exact in float for the test to mean anything.
      if (static_cast<double>(mid) * 2 != static_cast<double>(a) + static_cast<double>(b)) {
        ADD_FAILURE() << name << ": inexact midpoint at 0x" << std::hex << lo;
        return failures + 1;
      }
      const uint16_t even = (lo & 1u) ? b_bits : a_bits;
      const uint16_t got_mid = to_bits(mid);
      const uint16_t got_below = to_bits(std::nextafter(mid, a));
      const uint16_t got_above = to_bits(std::nextafter(mid, b));
      if ((got_mid != even || got_below != a_bits || got_above != b_bits) &&
          ++failures <= kMaxReported) {
        ADD_FAILURE() << name << std::hex << ": between 0x" << a_bits << " and 0x" << b_bits
                      << " midpoint -> 0x" << got_mid << " (want 0x" << even << "), below -> 0x"
                      << got_below << ", above -> 0x" << got_above;
      }
    }
  }
  return failures;
}

TEST(HalfTest, EveryMidpointRoundsToEvenAndNeighboursToNearest) {
  // Pairs (0x0000, 0x0001) ... (0x7bfe, 0x7bff), both signs.
  EXPECT_EQ(CheckMidpoints(0x7bfeu, FloatToHalfBits, HalfBitsToFloat, "f16"), 0);
}

TEST(BFloat16Test, EveryMidpointRoundsToEvenAndNeighboursToNearest) {
  // Pairs (0x0000, 0x0001) ... (0x7f7e, 0x7f7f), both signs; includes the subnormals.
  EXPECT_EQ(CheckMidpoints(0x7f7eu, FloatToBFloat16Bits, BFloat16BitsToFloat, "bf16"), 0);
}

// ---------------------------------------------------------------------------------------------
// Boundary values with exact bits.

TEST(HalfTest, OverflowBoundary) {
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bffu);
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7bffu);
  EXPECT_EQ(FloatToHalfBits(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00u);  // the midpoint to 2^16 rounds to inf
  EXPECT_EQ(FloatToHalfBits(65536.0f), 0x7c00u);
  EXPECT_EQ(FloatToHalfBits(1e6f), 0x7c00u);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(FloatToHalfBits(-65504.0f), 0xfbffu);
  EXPECT_EQ(FloatToHalfBits(std::nextafter(-65520.0f, 0.0f)), 0xfbffu);
  EXPECT_EQ(FloatToHalfBits(-65520.0f), 0xfc00u);
  EXPECT_EQ(FloatToHalfBits(-1e6f), 0xfc00u);
}

TEST(HalfTest, SubnormalAndUnderflowBoundary) {
  const float two_m24 = std::ldexp(1.0f, -24), two_m25 = std::ldexp(1.0f, -25);
  EXPECT_EQ(FloatToHalfBits(two_m24), 0x0001u);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(two_m25), 0x0000u);  // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(FloatToHalfBits(-two_m25), 0x8000u);
  EXPECT_EQ(FloatToHalfBits(std::nextafter(two_m25, 1.0f)), 0x0001u);
  EXPECT_EQ(FloatToHalfBits(std::nextafter(two_m25, 0.0f)), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(3 * two_m25), 0x0002u);  // tie between 1 and 2: even is 2
  EXPECT_EQ(FloatToHalfBits(5 * two_m25), 0x0002u);  // tie between 2 and 3: even is 2
  EXPECT_EQ(FloatToHalfBits(1e-8f), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -14)), 0x0400u);  // smallest normal
  const float largest_subnormal = 1023 * two_m24;
  EXPECT_EQ(FloatToHalfBits(largest_subnormal), 0x03ffu);
  EXPECT_EQ(HalfBitsToFloat(0x03ffu), largest_subnormal);
  // Rounding up out of the subnormals carries into the smallest normal.
  EXPECT_EQ(FloatToHalfBits(std::nextafter(largest_subnormal + two_m25, 1.0f)), 0x0400u);
  EXPECT_EQ(FloatToHalfBits(largest_subnormal + two_m25), 0x0400u);  // tie, 0x3ff odd
  EXPECT_EQ(HalfBitsToFloat(0x0001u), two_m24);
  EXPECT_EQ(HalfBitsToFloat(0x8001u), -two_m24);
}

TEST(HalfTest, OrdinaryValues) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00u);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000u);
  EXPECT_EQ(FloatToHalfBits(0.5f), 0x3800u);
  EXPECT_EQ(FloatToHalfBits(0.1f), 0x2e66u);  // 0.0999755859375
  EXPECT_EQ(FloatToHalfBits(3.14159265f), 0x4248u);
  EXPECT_EQ(FloatToHalfBits(2049.0f), 0x6800u);  // tie between 2048 and 2050: even is 2048
  EXPECT_EQ(FloatToHalfBits(2051.0f), 0x6802u);  // tie between 2050 and 2052: even is 2052
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);      // tie: down to even
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);  // tie: up to even
  EXPECT_EQ(HalfBitsToFloat(0x3555u), 0.333251953125f);
}

TEST(HalfTest, ZerosInfinitiesAndNaNs) {
  EXPECT_EQ(FloatToHalfBits(0.0f), 0x0000u);
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(HalfBitsToFloat(0x8000u)));
  EXPECT_EQ(HalfBitsToFloat(0x8000u), 0.0f);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToHalfBits(inf), 0x7c00u);
  EXPECT_EQ(FloatToHalfBits(-inf), 0xfc00u);
  EXPECT_EQ(HalfBitsToFloat(0x7c00u), inf);
  EXPECT_EQ(HalfBitsToFloat(0xfc00u), -inf);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(nan)));
  EXPECT_EQ(FloatToHalfBits(nan) & 0x8000u, 0u);
  EXPECT_TRUE(IsHalfNaN(FloatToHalfBits(-nan)));
  EXPECT_EQ(FloatToHalfBits(-nan) & 0x8000u, 0x8000u);
  // The documented rule: sign and the top 10 payload bits are kept; the quiet bit is set only
  // when the kept payload would be zero.
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0x7fc00000u)), 0x7e00u);
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0xffc00000u)), 0xfe00u);
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0x7fa00000u)), 0x7d00u);  // signalling, payload kept
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0x7f800001u)), 0x7e00u);  // payload below f16 bits
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0xff801fffu)), 0xfe00u);
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0x7fffe000u)), 0x7fffu);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7c01u)));
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0xfe00u)));
  EXPECT_TRUE(std::signbit(HalfBitsToFloat(0xfe00u)));
}

TEST(HalfTest, HalfStruct) {
  EXPECT_EQ(Half(65519.0f).bits, 0x7bffu);
  EXPECT_EQ(static_cast<float>(Half(1e-8f)), 0.0f);
  EXPECT_EQ(static_cast<float>(Half::FromBits(0x3c00u)), 1.0f);
  EXPECT_EQ(Half().bits, 0u);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80u);
  EXPECT_EQ(static_cast<float>(BFloat16::FromBits(0xc040u)), -3.0f);
  EXPECT_EQ(BFloat16().bits, 0u);
}

TEST(BFloat16Test, BoundaryValues) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80u);
  EXPECT_EQ(FloatToBFloat16Bits(1.00390625f), 0x3f80u);  // 1 + 2^-8: tie, 0x3f80 is even
  EXPECT_EQ(FloatToBFloat16Bits(1.01171875f), 0x3f82u);  // 1 + 3*2^-8: tie, 0x3f81 odd -> up
  EXPECT_EQ(FloatToBFloat16Bits(std::nextafter(1.00390625f, 2.0f)), 0x3f81u);
  EXPECT_EQ(FloatToBFloat16Bits(std::nextafter(1.01171875f, 0.0f)), 0x3f81u);
  EXPECT_EQ(FloatToBFloat16Bits(-1.01171875f), 0xbf82u);
  EXPECT_EQ(FloatToBFloat16Bits(3.14159265f), 0x4049u);
  // Overflow: the largest float rounds past the largest bf16 (0x7f7f) to inf.
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7f7fffffu)), 0x7f80u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7f7f8000u)), 0x7f80u);  // tie, 0x7f7f odd
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0xff7fffffu)), 0xff80u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBFloat16Bits(inf), 0x7f80u);
  EXPECT_EQ(FloatToBFloat16Bits(-inf), 0xff80u);
  EXPECT_EQ(FloatToBFloat16Bits(0.0f), 0x0000u);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(BFloat16BitsToFloat(0x8000u)));
}

TEST(BFloat16Test, FloatSubnormalsAreRoundedNotFlushed) {
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x00000001u)), 0x0000u);  // below half a bf16 ulp
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x00008000u)), 0x0000u);  // tie, 0 even
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x00008001u)), 0x0001u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x00018000u)), 0x0002u);  // tie, 1 odd -> 2
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x00010000u)), 0x0001u);  // exact subnormal
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x80010000u)), 0x8001u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x80008000u)), 0x8000u);  // -tie -> -0
  // The largest float subnormal rounds up into the smallest normal.
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x007fffffu)), 0x0080u);
  // Decoding keeps bf16 subnormals (no flush to zero).
  EXPECT_EQ(BFloat16BitsToFloat(0x0001u), std::ldexp(1.0f, -133));
  EXPECT_EQ(BFloat16BitsToFloat(0x007fu), 127 * std::ldexp(1.0f, -133));
}

TEST(BFloat16Test, NaNKeepsSignAndTopPayload) {
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::quiet_NaN()), 0x7fc0u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0xffc00000u)), 0xffc0u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7fc00001u)), 0x7fc0u);  // truncated, not rounded
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7fffffffu)), 0x7fffu);  // would overflow if rounded
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0xffa12345u)), 0xffa1u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7f812345u)), 0x7f81u);
  // Payload entirely in the discarded half: the quiet bit keeps it a NaN.
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0x7f800001u)), 0x7fc0u);
  EXPECT_EQ(FloatToBFloat16Bits(BitsToFloat(0xff80ffffu)), 0xffc0u);
  for (uint32_t low : {0x1u, 0x7fffu, 0x8000u, 0xffffu}) {
    for (uint32_t high : {0x7f80u, 0xff80u, 0x7f81u, 0xffffu}) {
      const uint16_t b = FloatToBFloat16Bits(BitsToFloat((high << 16) | low));
      EXPECT_TRUE(IsBF16NaN(b)) << std::hex << high << " " << low;
      EXPECT_EQ(b & 0x8000u, high & 0x8000u);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sampled cross-checks over the whole float space.

constexpr uint32_t kStride = 431;  // prime: ~10^7 samples spread over all exponents

#if defined(__FLT16_MAX__)
uint16_t GccHalfBits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}
#endif

TEST(HalfTest, MatchesGccFloat16OnSampledFloats) {
#if !defined(__FLT16_MAX__)
  GTEST_SKIP() << "this compiler has no _Float16";
#else
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int failures = 0;
  int64_t nans = 0, samples = 0;
  for (uint64_t i = 0; i * kStride <= 0xffffffffull; ++i) {
    const uint32_t bits = static_cast<uint32_t>(i * kStride);
    const float f = BitsToFloat(bits);
    const uint16_t got = FloatToHalfBits(f);
    const uint16_t want = GccHalfBits(f);
    ++samples;
    bool ok;
    if (std::isnan(f)) {
      ++nans;
      ok = IsHalfNaN(got) && IsHalfNaN(want);  // payload conventions may differ
    } else {
      ok = got == want;
    }
    if (!ok && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "float 0x" << bits << " (" << f << "): got 0x" << got
                    << ", _Float16 gives 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(samples, 9'000'000);
  EXPECT_GT(nans, 10'000);  // the NaN region was sampled
#endif
}

TEST(HalfTest, DecodingMatchesGccFloat16ForAllPatterns) {
#if !defined(__FLT16_MAX__)
  GTEST_SKIP() << "this compiler has no _Float16";
#else
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    _Float16 h;
    std::memcpy(&h, &bits, sizeof(h));
    const float want = static_cast<float>(h);
    const float got = HalfBitsToFloat(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << i;
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(want)) << std::hex << i;
    }
  }
#endif
}

TEST(HalfTest, MatchesNearbyintReferenceOnSampledFloats) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int failures = 0;
  for (uint64_t i = 0; i * 1009 <= 0xffffffffull; ++i) {
    const uint32_t bits = static_cast<uint32_t>(i * 1009);
    const float f = BitsToFloat(bits);
    if (std::isnan(f)) continue;
    const float got = HalfBitsToFloat(FloatToHalfBits(f));
    const float want = RefRoundToHalf(f);
    if (FloatBits(got) != FloatBits(want) && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "float 0x" << bits << ": got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(BFloat16Test, MatchesNearbyintReferenceOnSampledFloats) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int failures = 0;
  int64_t nans = 0;
  for (uint64_t i = 0; i * 1009 <= 0xffffffffull; ++i) {
    const uint32_t bits = static_cast<uint32_t>(i * 1009);
    const float f = BitsToFloat(bits);
    const uint16_t got_bits = FloatToBFloat16Bits(f);
    if (std::isnan(f)) {
      ++nans;
      if (!IsBF16NaN(got_bits) || (got_bits & 0x8000u) != ((bits >> 16) & 0x8000u)) {
        if (++failures <= kMaxReported) ADD_FAILURE() << std::hex << "NaN 0x" << bits;
      }
      continue;
    }
    const float got = BFloat16BitsToFloat(got_bits);
    const float want = RefRoundToBFloat16(f);
    if (FloatBits(got) != FloatBits(want) && ++failures <= kMaxReported) {
      ADD_FAILURE() << std::hex << "float 0x" << bits << ": got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(nans, 1000);
}

// The reference itself, on values whose answer is known, so that agreeing with it means
// something.
TEST(HalfTest, ReferenceRoundingSanity) {
  EXPECT_EQ(RefRoundToHalf(65519.0f), 65504.0f);
  EXPECT_EQ(RefRoundToHalf(65520.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(RefRoundToHalf(std::ldexp(1.0f, -25)), 0.0f);
  EXPECT_EQ(RefRoundToHalf(3 * std::ldexp(1.0f, -25)), std::ldexp(1.0f, -23));
  EXPECT_TRUE(std::signbit(RefRoundToHalf(-1e-9f)));
  EXPECT_EQ(RefRoundToBFloat16(1.01171875f), 1.015625f);
  EXPECT_EQ(RefRoundToBFloat16(BitsToFloat(0x00018000u)), BitsToFloat(0x00020000u));
}

}  // namespace
}  // namespace tg
