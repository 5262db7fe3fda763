// Dtypes (tensor/dtype.h) and value conversion between element types (tensor/convert.h).
#include "tensor/dtype.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "gtest/gtest.h"
#include "tensor/convert.h"
#include "tensor/half.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsErrorExactly;

constexpr DType kAll[] = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool};

TEST(DTypeTest, ElementSize) {
  EXPECT_EQ(ElementSize(kF32), 4u);
  EXPECT_EQ(ElementSize(kF64), 8u);
  EXPECT_EQ(ElementSize(kF16), 2u);
  EXPECT_EQ(ElementSize(kBF16), 2u);
  EXPECT_EQ(ElementSize(kI32), 4u);
  EXPECT_EQ(ElementSize(kI64), 8u);
  EXPECT_EQ(ElementSize(kU8), 1u);
  EXPECT_EQ(ElementSize(kBool), 1u);
  // Agrees with the storage type Visit hands out.
  for (DType d : kAll) {
    EXPECT_EQ(ElementSize(d), Visit(d, [](auto tag) { return sizeof(tag); })) << DTypeName(d);
  }
}

TEST(DTypeTest, Names) {
  EXPECT_STREQ(DTypeName(kF32), "f32");
  EXPECT_STREQ(DTypeName(kF64), "f64");
  EXPECT_STREQ(DTypeName(kF16), "f16");
  EXPECT_STREQ(DTypeName(kBF16), "bf16");
  EXPECT_STREQ(DTypeName(kI32), "i32");
  EXPECT_STREQ(DTypeName(kI64), "i64");
  EXPECT_STREQ(DTypeName(kU8), "u8");
  EXPECT_STREQ(DTypeName(kBool), "bool");
}

TEST(DTypeTest, FloatingAndIntegral) {
  for (DType d : {kF32, kF64, kF16, kBF16}) {
    EXPECT_TRUE(IsFloating(d)) << DTypeName(d);
    EXPECT_FALSE(IsIntegral(d)) << DTypeName(d);
  }
  for (DType d : {kI32, kI64, kU8, kBool}) {
    EXPECT_FALSE(IsFloating(d)) << DTypeName(d);
    EXPECT_TRUE(IsIntegral(d)) << DTypeName(d);
  }
}

TEST(DTypeTest, PromoteTypesNamedCases) {
  EXPECT_EQ(PromoteTypes(kF16, kBF16), kF32);
  EXPECT_EQ(PromoteTypes(kBF16, kF16), kF32);
  EXPECT_EQ(PromoteTypes(kI64, kF16), kF16);
  EXPECT_EQ(PromoteTypes(kF16, kI64), kF16);
  EXPECT_EQ(PromoteTypes(kBool, kU8), kU8);
  EXPECT_EQ(PromoteTypes(kU8, kBool), kU8);
  EXPECT_EQ(PromoteTypes(kI32, kBF16), kBF16);
  EXPECT_EQ(PromoteTypes(kF32, kF16), kF32);
  EXPECT_EQ(PromoteTypes(kU8, kI32), kI32);
  EXPECT_EQ(PromoteTypes(kI32, kI64), kI64);
  for (DType d : kAll) EXPECT_EQ(PromoteTypes(kF64, d), kF64) << DTypeName(d);
}

TEST(DTypeTest, PromoteTypesFullTableIsPyTorchsAndSymmetric) {
  // Rows and columns in the order of kAll: f32 f64 f16 bf16 i32 i64 u8 bool.
  const DType table[8][8] = {
      {kF32, kF64, kF32, kF32, kF32, kF32, kF32, kF32},
      {kF64, kF64, kF64, kF64, kF64, kF64, kF64, kF64},
      {kF32, kF64, kF16, kF32, kF16, kF16, kF16, kF16},
      {kF32, kF64, kF32, kBF16, kBF16, kBF16, kBF16, kBF16},
      {kF32, kF64, kF16, kBF16, kI32, kI64, kI32, kI32},
      {kF32, kF64, kF16, kBF16, kI64, kI64, kI64, kI64},
      {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kU8},
      {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool},
  };
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(PromoteTypes(kAll[i], kAll[j]), table[i][j])
          << DTypeName(kAll[i]) << " + " << DTypeName(kAll[j]);
      EXPECT_EQ(PromoteTypes(kAll[i], kAll[j]), PromoteTypes(kAll[j], kAll[i]));
    }
  }
}

TEST(DTypeTest, VisitHandsOutTheStorageType) {
  EXPECT_EQ(Visit(kF16, [](auto t) { return sizeof(t); }), 2u);
  EXPECT_EQ(Visit(kF16, [](auto t) { return DTypeOf<decltype(t)>(); }), kF16);
  for (DType d : kAll) {
    EXPECT_EQ(Visit(d, [](auto t) { return DTypeOf<decltype(t)>(); }), d) << DTypeName(d);
  }
}

TEST(DTypeTest, VisitFloatingAndIndexErrors) {
  for (DType d : {kF32, kF64, kF16, kBF16}) {
    EXPECT_EQ(VisitFloating("op", d, [](auto t) { return DTypeOf<decltype(t)>(); }), d);
  }
  EXPECT_TRUE(ThrowsErrorExactly([] { VisitFloating("myop", kI64, [](auto) {}); },
                                 "myop: expected a floating dtype (f32, f64, f16, bf16), got i64"));
  EXPECT_TRUE(
      ThrowsErrorExactly([] { VisitFloating("myop", kBool, [](auto) {}); },
                         "myop: expected a floating dtype (f32, f64, f16, bf16), got bool"));
  EXPECT_EQ(VisitIndex("op", kI32, [](auto t) { return DTypeOf<decltype(t)>(); }), kI32);
  EXPECT_EQ(VisitIndex("op", kI64, [](auto t) { return DTypeOf<decltype(t)>(); }), kI64);
  EXPECT_TRUE(ThrowsErrorExactly([] { VisitIndex("gather", kF32, [](auto) {}); },
                                 "gather: expected an index dtype (i32 or i64), got f32"));
  EXPECT_TRUE(ThrowsErrorExactly([] { VisitIndex("gather", kU8, [](auto) {}); },
                                 "gather: expected an index dtype (i32 or i64), got u8"));
}

// The one dtype switch (VisitDTypeAs) with another side's storage types: what CUDA's VisitDevice
// and VisitDeviceFloating are, checked here without CUDA (16-bit stand-ins for __half and
// __nv_bfloat16).
struct StandInTypes {
  using F16 = uint16_t;
  using BF16 = int16_t;
};

TEST(DTypeTest, VisitDTypeAsTakesTheReducedTypesOfTheSide) {
  const auto name = [](auto tag) -> std::string {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, uint16_t>) return "f16 stand-in";
    if constexpr (std::is_same_v<T, int16_t>) return "bf16 stand-in";
    if constexpr (std::is_same_v<T, float>) return "float";
    return std::to_string(sizeof(T));
  };
  EXPECT_EQ((VisitDTypeAs<StandInTypes, DTypeSet::kAll>("", kF16, name)), "f16 stand-in");
  EXPECT_EQ((VisitDTypeAs<StandInTypes, DTypeSet::kFloating>("op", kBF16, name)), "bf16 stand-in");
  EXPECT_EQ((VisitDTypeAs<StandInTypes, DTypeSet::kAll>("", kF32, name)), "float");
  // Every dtype reaches a type of its element size, on either side.
  for (const DType d : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) {
    EXPECT_EQ(
        (VisitDTypeAs<StandInTypes, DTypeSet::kAll>("", d, [](auto tag) { return sizeof(tag); })),
        ElementSize(d))
        << DTypeName(d);
    EXPECT_EQ(Visit(d, [](auto tag) { return sizeof(tag); }), ElementSize(d)) << DTypeName(d);
  }
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { VisitDTypeAs<StandInTypes, DTypeSet::kFloating>("fused_adam", kI64, name); },
      "fused_adam: expected a floating dtype (f32, f64, f16, bf16), got i64"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { VisitDTypeAs<StandInTypes, DTypeSet::kFloating>("fused_adam", kBool, name); },
      "fused_adam: expected a floating dtype (f32, f64, f16, bf16), got bool"));
}

TEST(DTypeTest, ComputeTypes) {
  static_assert(std::is_same_v<ComputeType<float>, float>);
  static_assert(std::is_same_v<ComputeType<Half>, float>);
  static_assert(std::is_same_v<ComputeType<BFloat16>, float>);
  static_assert(std::is_same_v<ComputeType<double>, double>);
  static_assert(std::is_same_v<ComputeType<int32_t>, int64_t>);
  static_assert(std::is_same_v<ComputeType<int64_t>, int64_t>);
  static_assert(std::is_same_v<ComputeType<uint8_t>, int64_t>);
  static_assert(std::is_same_v<ComputeType<bool>, bool>);
  EXPECT_EQ(Widen(Half(1.5f)), 1.5f);
  EXPECT_TRUE((std::is_same_v<decltype(Widen(Half())), float>));
  EXPECT_TRUE((std::is_same_v<decltype(Widen(BFloat16())), float>));
  EXPECT_TRUE((std::is_same_v<decltype(Widen(uint8_t{})), int64_t>));
  EXPECT_TRUE((std::is_same_v<decltype(Widen(true)), bool>));
  EXPECT_EQ(Widen(uint8_t{200}), 200);
}

// ---------------------------------------------------------------------------------------------
// Convert<Dst>(Src)

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

TEST(ConvertTest, NaNToIntegerIsZero) {
  EXPECT_EQ(Convert<int32_t>(kNaN), 0);
  EXPECT_EQ(Convert<int64_t>(kNaN), 0);
  EXPECT_EQ(Convert<uint8_t>(kNaN), 0);
  EXPECT_EQ(Convert<int32_t>(static_cast<float>(kNaN)), 0);
  EXPECT_EQ(Convert<int64_t>(static_cast<float>(-kNaN)), 0);
  EXPECT_EQ(Convert<int32_t>(Half::FromBits(0x7e00u)), 0);
  EXPECT_EQ(Convert<int64_t>(BFloat16::FromBits(0xffc0u)), 0);
}

TEST(ConvertTest, FloatToIntegerSaturates) {
  EXPECT_EQ(Convert<int32_t>(1e30), kI32Max);
  EXPECT_EQ(Convert<int32_t>(-1e30), kI32Min);
  EXPECT_EQ(Convert<int32_t>(1e30f), kI32Max);
  EXPECT_EQ(Convert<int32_t>(-1e30f), kI32Min);
  EXPECT_EQ(Convert<int32_t>(kInf), kI32Max);
  EXPECT_EQ(Convert<int32_t>(-kInf), kI32Min);
  EXPECT_EQ(Convert<int32_t>(2147483647.0), kI32Max);
  EXPECT_EQ(Convert<int32_t>(2147483648.0), kI32Max);
  EXPECT_EQ(Convert<int32_t>(2147483646.75), 2147483646);
  EXPECT_EQ(Convert<int32_t>(-2147483648.0), kI32Min);
  EXPECT_EQ(Convert<int32_t>(-2147483647.5), -2147483647);
  EXPECT_EQ(Convert<int64_t>(1e19), kI64Max);
  EXPECT_EQ(Convert<int64_t>(-1e19), kI64Min);
  EXPECT_EQ(Convert<int64_t>(9223372036854775808.0), kI64Max);  // 2^63
  EXPECT_EQ(Convert<int64_t>(-9223372036854775808.0), kI64Min);
  EXPECT_EQ(Convert<int64_t>(9223372036854774784.0), 9223372036854774784LL);  // 2^63 - 1024
  EXPECT_EQ(Convert<int64_t>(1e30f), kI64Max);
  EXPECT_EQ(Convert<uint8_t>(300.0), 255);
  EXPECT_EQ(Convert<uint8_t>(-5.0), 0);
  EXPECT_EQ(Convert<uint8_t>(255.9f), 255);
  EXPECT_EQ(Convert<int32_t>(Half::FromBits(0x7c00u)), kI32Max);  // +inf
  EXPECT_EQ(Convert<int64_t>(Half::FromBits(0xfc00u)), kI64Min);  // -inf
  EXPECT_EQ(Convert<int32_t>(Half(65504.0f)), 65504);
  EXPECT_EQ(Convert<int32_t>(BFloat16::FromBits(0x7f7fu)), kI32Max);
}

TEST(ConvertTest, FloatToIntegerTruncatesTowardZero) {
  EXPECT_EQ(Convert<int32_t>(-3.7), -3);
  EXPECT_EQ(Convert<int32_t>(3.7), 3);
  EXPECT_EQ(Convert<int64_t>(-3.7f), -3);
  EXPECT_EQ(Convert<int32_t>(-0.9), 0);
  EXPECT_EQ(Convert<uint8_t>(7.99), 7);
  EXPECT_EQ(Convert<uint8_t>(-0.5), 0);
  EXPECT_EQ(Convert<int32_t>(Half(-2.5f)), -2);
  EXPECT_EQ(Convert<int64_t>(BFloat16(100.6f)), 100);  // bf16(100.6) == 100.5
}

TEST(ConvertTest, AnythingToBoolIsNonZero) {
  EXPECT_TRUE(Convert<bool>(2.0));
  EXPECT_TRUE(Convert<bool>(2));
  EXPECT_TRUE(Convert<bool>(-0.5f));
  EXPECT_TRUE(Convert<bool>(int64_t{1} << 40));  // not truncated to the low bits
  EXPECT_TRUE(Convert<bool>(uint8_t{0x80}));
  EXPECT_TRUE(Convert<bool>(1e-30));
  EXPECT_TRUE(Convert<bool>(kNaN));
  EXPECT_TRUE(Convert<bool>(Half::FromBits(0x0001u)));
  EXPECT_FALSE(Convert<bool>(0.0));
  EXPECT_FALSE(Convert<bool>(-0.0));
  EXPECT_FALSE(Convert<bool>(0));
  EXPECT_FALSE(Convert<bool>(Half::FromBits(0x8000u)));
  EXPECT_FALSE(Convert<bool>(BFloat16()));
}

TEST(ConvertTest, IntegerNarrowingWraps) {
  EXPECT_EQ(Convert<int32_t>(int64_t{0x100000005LL}), 5);
  EXPECT_EQ(Convert<int32_t>(int64_t{1} << 31), kI32Min);
  EXPECT_EQ(Convert<int32_t>(int64_t{-1}), -1);
  EXPECT_EQ(Convert<int32_t>(int64_t{0xFFFFFFFFLL}), -1);
  EXPECT_EQ(Convert<uint8_t>(int64_t{300}), 44);
  EXPECT_EQ(Convert<uint8_t>(int64_t{-1}), 255);
  EXPECT_EQ(Convert<uint8_t>(int32_t{-256}), 0);
  EXPECT_EQ(Convert<uint8_t>(int32_t{257}), 1);
  // Widening keeps the value (u8 is not sign-extended).
  EXPECT_EQ(Convert<int32_t>(uint8_t{255}), 255);
  EXPECT_EQ(Convert<int64_t>(int32_t{-7}), -7);
  EXPECT_EQ(Convert<int64_t>(true), 1);
  EXPECT_EQ(Convert<uint8_t>(false), 0);
}

TEST(ConvertTest, ToReducedFloatRoundsToNearestEven) {
  EXPECT_EQ(Convert<Half>(65519.0f).bits, 0x7bffu);
  EXPECT_EQ(Convert<Half>(65520.0f).bits, 0x7c00u);
  EXPECT_EQ(Convert<Half>(65519.0).bits, 0x7bffu);
  EXPECT_EQ(Convert<Half>(int64_t{65520}).bits, 0x7c00u);
  EXPECT_EQ(Convert<Half>(int32_t{2049}).bits, 0x6800u);
  EXPECT_EQ(Convert<Half>(int64_t{-3}).bits, 0xc200u);
  EXPECT_EQ(Convert<Half>(true).bits, 0x3c00u);
  EXPECT_EQ(Convert<Half>(uint8_t{255}).bits, 0x5bf8u);
  EXPECT_EQ(Convert<BFloat16>(1.01171875f).bits, 0x3f82u);
  EXPECT_EQ(Convert<BFloat16>(int32_t{257}).bits, 0x4380u);  // tie 256/258 -> 256
  EXPECT_EQ(Convert<BFloat16>(int32_t{259}).bits, 0x4382u);  // tie 258/260 -> 260
  EXPECT_EQ(Convert<Half>(-0.0).bits, 0x8000u);
  // Between the reduced types: exact where representable, rounded otherwise.
  EXPECT_EQ(Convert<BFloat16>(Half(1.5f)).bits, 0x3fc0u);
  EXPECT_EQ(Convert<Half>(BFloat16::FromBits(0x7f7fu)).bits, 0x7c00u);
  EXPECT_EQ(Convert<Half>(BFloat16(1.0f / 3)).bits, 0x3558u);  // bf16 0.333984375, exact in f16
}

TEST(ConvertTest, DoubleToReducedFloatRoundsOnce) {
  // Through float these would round twice: 65519.9999999 -> 65520.0f -> inf, and
  // 1 + 2^-11 + 2^-40 -> 1 + 2^-11 (a tie) -> 1.
  EXPECT_EQ(Convert<Half>(65519.9999999).bits, 0x7bffu);
  EXPECT_EQ(Convert<Half>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)).bits, 0x3c01u);
  EXPECT_EQ(Convert<Half>(1.0 + std::ldexp(1.0, -11)).bits, 0x3c00u);  // a true tie: even
  EXPECT_EQ(Convert<BFloat16>(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30)).bits, 0x3f81u);
  EXPECT_EQ(Convert<BFloat16>(1.0 + std::ldexp(1.0, -8)).bits, 0x3f80u);
  EXPECT_EQ(Convert<Half>(1e300).bits, 0x7c00u);
  EXPECT_EQ(Convert<Half>(-1e-300).bits, 0x8000u);
  EXPECT_EQ(Convert<BFloat16>(1e300).bits, 0x7f80u);
  EXPECT_TRUE(std::isnan(static_cast<float>(Convert<Half>(kNaN))));
  // Every f16 value and every midpoint between neighbours, given as double, rounds like the
  // float path (where float is exact, the two must agree). 0x7bff's upper neighbour is inf.
  for (uint32_t h = 0; h < 0x7bffu; ++h) {
    const double lo = HalfBitsToFloat(static_cast<uint16_t>(h));
    const double hi = HalfBitsToFloat(static_cast<uint16_t>(h + 1));
    ASSERT_EQ(Convert<Half>(lo).bits, h);
    const double mid = (lo + hi) / 2;
    ASSERT_EQ(Convert<Half>(mid).bits, FloatToHalfBits(static_cast<float>(mid))) << h;
    ASSERT_EQ(Convert<Half>(std::nextafter(mid, 0.0)).bits, h) << h;
    ASSERT_EQ(Convert<Half>(std::nextafter(mid, 1e9)).bits, h + 1) << h;
  }
}

TEST(ConvertTest, FromReducedFloatIsExact) {
  EXPECT_EQ(Convert<float>(Half::FromBits(0x0001u)), std::ldexp(1.0f, -24));
  EXPECT_EQ(Convert<double>(Half::FromBits(0x7bffu)), 65504.0);
  EXPECT_EQ(Convert<double>(BFloat16::FromBits(0x3f81u)), 1.0078125);
  EXPECT_TRUE(std::isinf(Convert<double>(Half::FromBits(0xfc00u))));
  EXPECT_TRUE(std::isnan(Convert<float>(BFloat16::FromBits(0x7fc1u))));
}

TEST(ConvertTest, BetweenFloatTypes) {
  EXPECT_EQ(Convert<float>(1e300), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Convert<double>(0.1f), static_cast<double>(0.1f));
  EXPECT_EQ(Convert<float>(int64_t{16777217}), 16777216.0f);  // RNE at 2^24
  EXPECT_EQ(Convert<double>(uint8_t{200}), 200.0);
  EXPECT_EQ(Convert<float>(true), 1.0f);
}

}  // namespace
}  // namespace tg
