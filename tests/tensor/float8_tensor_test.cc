// The FP8 dtypes in the tensor core (tensor/dtype.h): kF8E4M3 and kF8E5M2 are storage dtypes.
// Casts to them through to()/copy_() give, element for element, the scalar conversions of
// tensor/float8.h (themselves checked bit for bit against tests/tensor/float8_reference.py in
// float8_test) from every f16 and bf16 bit pattern, from f64 with one rounding, and through
// strided views; casts from them are exact. Arithmetic refuses them with a message that says why.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/convert.h"
#include "tensor/dtype.h"
#include "tensor/float8.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsErrorExactly;

std::vector<uint8_t> Bytes(const RawTensor& t) {
  const RawTensor c = t.contiguous();
  std::vector<uint8_t> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

// Every 16-bit pattern, as an f16 or bf16 tensor [65536].
RawTensor AllPatterns(DType dtype) {
  RawTensor t = RawTensor::Empty({65536}, dtype);
  auto* bits = static_cast<uint16_t*>(t.raw_data());
  for (uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  return t;
}

float PatternValue(DType dtype, uint16_t bits) {
  return dtype == kF16 ? static_cast<float>(Half::FromBits(bits))
                       : static_cast<float>(BFloat16::FromBits(bits));
}

TEST(Float8TensorTest, DTypeFacts) {
  EXPECT_STREQ(DTypeName(kF8E4M3), "f8e4m3");
  EXPECT_STREQ(DTypeName(kF8E5M2), "f8e5m2");
  for (DType d : {kF8E4M3, kF8E5M2}) {
    EXPECT_EQ(ElementSize(d), 1u);
    EXPECT_TRUE(IsFloat8(d));
    EXPECT_FALSE(IsFloating(d));
    EXPECT_FALSE(IsIntegral(d));
    EXPECT_EQ(VisitStorage(d, [](auto tag) { return DTypeOf<decltype(tag)>(); }), d);
    EXPECT_EQ(PromoteTypes(d, d), d);
  }
  for (DType d : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) EXPECT_FALSE(IsFloat8(d));
  EXPECT_TRUE(ThrowsErrorExactly([] { PromoteTypes(kF8E4M3, kF32); },
                                 "PromoteTypes: f8e4m3 with f32: FP8 dtypes do not promote "
                                 "(cast first)"));
  EXPECT_TRUE(ThrowsErrorExactly([] { PromoteTypes(kBF16, kF8E5M2); },
                                 "PromoteTypes: bf16 with f8e5m2: FP8 dtypes do not promote "
                                 "(cast first)"));
  EXPECT_TRUE(ThrowsErrorExactly([] { PromoteTypes(kF8E4M3, kF8E5M2); },
                                 "PromoteTypes: f8e4m3 with f8e5m2: FP8 dtypes do not promote "
                                 "(cast first)"));
}

TEST(Float8TensorTest, ComputeVisitorsRefuseFp8) {
  EXPECT_TRUE(ThrowsErrorExactly([] { Visit(kF8E4M3, [](auto) {}); },
                                 "f8e4m3 is an FP8 storage dtype: only copies, casts and the FP8 "
                                 "ops take it (cast it to a compute dtype first)"));
  EXPECT_TRUE(ThrowsErrorExactly([] { VisitFloating("softmax", kF8E5M2, [](auto) {}); },
                                 "softmax: f8e5m2 is an FP8 storage dtype: only copies, casts and "
                                 "the FP8 ops take it (cast it to a compute dtype first)"));
  // An op on FP8 tensors reaches a kernel's visitor and throws, computing nothing.
  const RawTensor a = RawTensor::FromVector<float>({1, 2}, {2}).to(kF8E4M3);
  EXPECT_TRUE(ThrowsErrorExactly([&] { Add(a, a); },
                                 "add: f8e4m3 is an FP8 storage dtype: only copies, casts and the "
                                 "FP8 ops take it (cast it to a compute dtype first)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { MulScalar(a, 2); },
                                 "mul: f8e4m3 is an FP8 storage dtype: only copies, casts and the "
                                 "FP8 ops take it (cast it to a compute dtype first)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Exp(a); },
                                 "exp: f8e4m3 is an FP8 storage dtype: only copies, casts and the "
                                 "FP8 ops take it (cast it to a compute dtype first)"));
}

// to(f8) of every f16 and bf16 pattern equals the scalar conversion (kSatFinite), and the way
// back is exact.
TEST(Float8TensorTest, CastsFromEveryF16AndBf16PatternMatchTheScalarRule) {
  for (DType source : {kF16, kBF16}) {
    const RawTensor x = AllPatterns(source);
    for (DType target : {kF8E4M3, kF8E5M2}) {
      const RawTensor q = x.to(target);
      ASSERT_EQ(q.dtype(), target);
      const std::vector<uint8_t> got = Bytes(q);
      int failures = 0;
      for (uint32_t i = 0; i < 65536 && failures < 10; ++i) {
        const float v = PatternValue(source, static_cast<uint16_t>(i));
        const uint8_t want = target == kF8E4M3 ? FloatToE4M3Bits(v) : FloatToE5M2Bits(v);
        if (got[i] != want) {
          ++failures;
          ADD_FAILURE() << DTypeName(source) << " 0x" << std::hex << i << " -> "
                        << DTypeName(target) << ": got 0x" << int(got[i]) << ", want 0x"
                        << int(want);
        }
      }
      // Decoding is exact: f32 values equal the scalar decode of each code (NaN codes give NaN).
      const std::vector<float> back = q.to_vector<float>();
      for (uint32_t i = 0; i < 65536; i += 97) {
        const float want = target == kF8E4M3 ? E4M3BitsToFloat(got[i]) : E5M2BitsToFloat(got[i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(back[i]));
        } else {
          EXPECT_EQ(back[i], want) << i;
        }
      }
    }
  }
}

// Special values and saturation through the tensor cast (TE's __NV_SATFINITE rule), from f32.
TEST(Float8TensorTest, SaturatesAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const RawTensor x = RawTensor::FromVector<float>(
      {464.0f, 464.01f, 500.0f, -inf, inf, -0.0f, std::nanf(""), 61440.0f, 57344.0f}, {9});
  EXPECT_EQ(Bytes(x.to(kF8E4M3)),
            (std::vector<uint8_t>{0x7e, 0x7e, 0x7e, 0xfe, 0x7e, 0x80, 0x7f, 0x7e, 0x7e}));
  EXPECT_EQ(Bytes(x.to(kF8E5M2)),
            (std::vector<uint8_t>{0x5f, 0x5f, 0x60, 0xfb, 0x7b, 0x80, 0x7f, 0x7b, 0x7b}));
}

// f64 -> f8 rounds once: 1.0625 + 2^-40 is above the e4m3 tie 1.0625 (between 1 and 1.125) and
// rounds up to 1.125, where rounding to f32 first would land on the tie and go to even (1.0).
TEST(Float8TensorTest, FromF64RoundsOnce) {
  const double above_tie = 1.0625 + std::ldexp(1.0, -40);
  ASSERT_EQ(static_cast<float>(above_tie), 1.0625f);  // the double rounding this avoids
  const RawTensor x = RawTensor::FromVector<double>({above_tie, -above_tie, 1.0625}, {3});
  EXPECT_EQ(Bytes(x.to(kF8E4M3)), (std::vector<uint8_t>{0x39, 0xb9, 0x38}));
  EXPECT_EQ(Convert<Float8E4M3>(above_tie).bits, 0x39);
  // Integers convert through the same single rounding: 17 is the e4m3 tie between 16 and 18.
  const RawTensor i = RawTensor::FromVector<int64_t>({17, 19, 1000, -1000}, {4});
  EXPECT_EQ(i.to(kF8E4M3).to_vector<double>(), (std::vector<double>{16, 20, 448, -448}));
}

TEST(Float8TensorTest, StridedCopiesItemAndPrinting) {
  const RawTensor x = RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const RawTensor q = x.to(kF8E5M2);
  // A transposed view copied into a contiguous FP8 tensor, and FP8 to FP8 of the other format.
  const RawTensor t = q.transpose(0, 1).contiguous();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(q.to(kF8E4M3).to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  RawTensor dst = RawTensor::Empty({3, 2}, kF8E4M3);
  dst.copy_(x.transpose(0, 1));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(RawTensor::FromVector<float>({0.3f}, {}).to(kF8E4M3).item(), 0.3125);
  EXPECT_EQ(q.ToString(), "tensor([[1, 2, 3], [4, 5, 6]], f8e5m2, shape=[2, 3])");
}

}  // namespace
}  // namespace tg
