// Generator (tensor/generator.h): Philox4x32-10 against Random123's known answers, the
// (seed, offset) stream and its save/restore, and the RandUniform / RandNormal factories.
#include "tensor/generator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/half.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsErrorExactly;
using U4 = std::array<uint32_t, 4>;

// Philox4x32-10 written from the Random123 definition for a full 128-bit counter: each round
// multiplies c0 by 0xD2511F53 and c2 by 0xCD9E8D57 and mixes in the key; the key is bumped by the
// Weyl constants before every round but the first.
U4 ReferencePhilox(U4 c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

TEST(PhiloxTest, RandomKnownAnswerCounterZeroKeyZero) {
  EXPECT_EQ(Generator::Philox(0, 0), (U4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(PhiloxTest, ReferenceMatchesAllRandom123KnownAnswers) {
  // Random123 tests/kat_vectors, philox4x32 with 10 rounds.
  EXPECT_EQ(ReferencePhilox({0, 0, 0, 0}, {0, 0}),
            (U4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(ReferencePhilox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                            {0xffffffffu, 0xffffffffu}),
            (U4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(ReferencePhilox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                            {0xa4093822u, 0x299f31d0u}),
            (U4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(PhiloxTest, MatchesReferenceForManyCountersAndKeys) {
  // Generator::Philox puts the 64-bit counter in words 0 (low) and 1 (high) and the 64-bit key
  // in key words 0 (low) and 1 (high); counter words 2 and 3 are zero.
  uint64_t x = 0x0123456789abcdefull;
  for (int i = 0; i < 2000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // any spread of values will do
    const uint64_t counter = i < 1000 ? static_cast<uint64_t>(i) : x;
    const uint64_t key = i % 3 == 0 ? 42 : (x >> 7) ^ (x << 29);
    const U4 want = ReferencePhilox(
        {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u},
        {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)});
    ASSERT_EQ(Generator::Philox(counter, key), want) << "counter " << counter << " key " << key;
  }
}

// ---------------------------------------------------------------------------------------------
// The stream

TEST(GeneratorTest, StreamIsPhiloxBlocksInOrder) {
  Generator gen(1234);
  const U4 b0 = Generator::Philox(0, 1234), b1 = Generator::Philox(1, 1234);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gen.NextU32(), b0[i]) << i;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gen.NextU32(), b1[i]) << i;
  EXPECT_EQ(gen.state().offset, 8u);
  EXPECT_EQ(gen.state().seed, 1234u);
  Generator zero;
  EXPECT_EQ(zero.NextU32(), 0x6627e8d5u);
  EXPECT_EQ(zero.NextU32(), 0xe169c58du);
}

TEST(GeneratorTest, SameSeedSameStreamDifferentSeedDifferentStream) {
  Generator a(7), b(7), c(8);
  std::vector<uint32_t> va, vb, vc;
  for (int i = 0; i < 1000; ++i) {
    va.push_back(a.NextU32());
    vb.push_back(b.NextU32());
    vc.push_back(c.NextU32());
  }
  EXPECT_EQ(va, vb);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += va[i] == vc[i];
  EXPECT_LE(equal, 1);
  // Every distribution draws from the same stream.
  Generator d(7), e(7);
  EXPECT_EQ(d.NextUniform(), e.NextUniform());
  EXPECT_EQ(d.NextNormal(), e.NextNormal());
  EXPECT_EQ(d.NextUniformDouble(), e.NextUniformDouble());
}

TEST(GeneratorTest, StateRestoresExactlyMidBlock) {
  Generator gen(99);
  for (int i = 0; i < 3; ++i) gen.NextU32();  // offset 3: in the middle of block 0
  const Generator::State saved = gen.state();
  EXPECT_EQ(saved.seed, 99u);
  EXPECT_EQ(saved.offset, 3u);
  std::vector<uint32_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(gen.NextU32());
  EXPECT_EQ(first[0], Generator::Philox(0, 99)[3]);
  EXPECT_EQ(first[1], Generator::Philox(1, 99)[0]);
  gen.set_state(saved);
  EXPECT_TRUE(gen.state() == saved);
  std::vector<uint32_t> second;
  for (int i = 0; i < 10; ++i) second.push_back(gen.NextU32());
  EXPECT_EQ(first, second);

  // Restoring into another generator reproduces the same values, including through the
  // distributions (NextNormal uses four draws: offsets stay aligned).
  Generator other(5);
  other.set_state(saved);
  gen.set_state(saved);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(other.NextNormal(), gen.NextNormal());
  EXPECT_EQ(gen.state().offset, 3u + 20u);
  EXPECT_FALSE(gen.state() == saved);
}

TEST(GeneratorTest, SetSeedRestarts) {
  Generator gen(3);
  const uint32_t first = gen.NextU32();
  for (int i = 0; i < 17; ++i) gen.NextU32();
  gen.set_seed(3);
  EXPECT_TRUE(gen.state() == (Generator::State{3, 0}));
  EXPECT_EQ(gen.NextU32(), first);
  gen.set_seed(11);
  Generator fresh(11);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(gen.NextU32(), fresh.NextU32());
}

TEST(GeneratorTest, NextUniformIsTop24BitsInZeroOne) {
  Generator gen(2024), raw(2024);
  double sum = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = gen.NextUniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    EXPECT_EQ(u, static_cast<float>(raw.NextU32() >> 8) / 16777216.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_EQ(gen.state().offset, static_cast<uint64_t>(n));
}

TEST(GeneratorTest, NextUniformDoubleUses53Bits) {
  Generator gen(5), raw(5);
  for (int i = 0; i < 10000; ++i) {
    const double u = gen.NextUniformDouble();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const uint64_t hi = raw.NextU32() >> 5, lo = raw.NextU32() >> 6;
    EXPECT_EQ(u, static_cast<double>((hi << 26) | lo) / 9007199254740992.0);
  }
  EXPECT_EQ(gen.state().offset, 20000u);
}

TEST(GeneratorTest, NextNormalMoments) {
  Generator gen(17);
  const int n = 100000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double z = gen.NextNormal();
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_sq / n - mean * mean), 1.0, 0.02);
  EXPECT_EQ(gen.state().offset, 4u * n);
}

// ---------------------------------------------------------------------------------------------
// RawTensor factories

TEST(RandTest, RandNormalMeanAndStd) {
  Generator gen(0);
  const RawTensor t = RandNormal({100000}, gen);
  EXPECT_EQ(t.dtype(), kF32);
  EXPECT_EQ(t.shape(), Shape{100000});
  const std::vector<double> v = t.to_vector<double>();
  double sum = 0, sum_sq = 0;
  for (double x : v) {
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / v.size();
  const double stddev = std::sqrt(sum_sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(stddev, 1.0, 0.02);
  EXPECT_EQ(gen.state().offset, 400000u);

  // Shifted and scaled: the same draws, transformed.
  Generator again(0);
  const std::vector<double> w = RandNormal({100}, again, 3.0, 2.0, kF64).to_vector<double>();
  Generator raw(0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(w[i], 3.0 + 2.0 * raw.NextNormal()) << i;
}

TEST(RandTest, RandNormalValuesAreTheStreamRoundedToDtype) {
  Generator a(77), b(77);
  const RawTensor t = RandNormal({2, 3}, a, 0.5, 0.1);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  const std::vector<float> v = t.to_vector<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], static_cast<float>(0.5 + 0.1 * b.NextNormal()));
}

TEST(RandTest, RandNormalReducedDtypes) {
  Generator a(8), b(8);
  const RawTensor h = RandNormal({1000}, a, 0, 1, kF16);
  EXPECT_EQ(h.dtype(), kF16);
  EXPECT_EQ(h.storage()->nbytes(), 2000u);
  // f16 output == the f64 stream converted (bit for bit).
  const RawTensor ref = RandNormal({1000}, b, 0, 1, kF64).to(kF16);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(h.data<Half>()[i].bits, ref.data<Half>()[i].bits) << i;
  }
  EXPECT_TRUE(a.state() == b.state());
  Generator c(8);
  const RawTensor bf = RandNormal({10}, c, 0, 1, kBF16);
  EXPECT_EQ(bf.dtype(), kBF16);
  // Standard normal draws are tiny in f16 terms: every value is finite and non-degenerate.
  double sum_abs = 0;
  for (float x : h.to_vector<float>()) {
    ASSERT_TRUE(std::isfinite(x));
    sum_abs += std::fabs(x);
  }
  EXPECT_NEAR(sum_abs / 1000, std::sqrt(2 / M_PI), 0.06);
}

TEST(RandTest, RandNormalZeroStddevIsTheMean) {
  Generator gen(1);
  EXPECT_EQ(RandNormal({4}, gen, 2.5, 0.0).to_vector<float>(), std::vector<float>(4, 2.5f));
}

TEST(RandTest, RandNormalErrors) {
  Generator gen(1);
  EXPECT_TRUE(ThrowsErrorExactly([&] { RandNormal({2}, gen, 0, -1); },
                                 "rand_normal: stddev must be non-negative, got -1"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { RandNormal({2}, gen, 0, 1, kI64); },
                                 "rand_normal: expected a floating dtype, got i64"));
  EXPECT_EQ(gen.state().offset, 0u);  // a rejected call draws nothing
}

TEST(RandTest, RandUniformRange) {
  Generator gen(31), raw(31);
  const RawTensor t = RandUniform({10000}, gen, -2, 3);
  EXPECT_EQ(t.dtype(), kF32);
  const std::vector<float> v = t.to_vector<float>();
  float lo = 10, hi = -10;
  for (int i = 0; i < 10000; ++i) {
    ASSERT_GE(v[i], -2.0f);
    ASSERT_LT(v[i], 3.0f);
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    // f32 draws one 24-bit uniform per element.
    EXPECT_EQ(v[i], static_cast<float>(-2.0 + 5.0 * raw.NextUniform())) << i;
  }
  EXPECT_LT(lo, -1.99f);
  EXPECT_GT(hi, 2.99f);
  EXPECT_EQ(gen.state().offset, 10000u);

  // f64 draws a 53-bit uniform (two 32-bit values) per element.
  Generator g64(31), raw64(31);
  const std::vector<double> d = RandUniform({100}, g64, 0, 1, kF64).to_vector<double>();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(d[i], raw64.NextUniformDouble()) << i;
  EXPECT_EQ(g64.state().offset, 200u);

  Generator g16(4);
  const RawTensor h = RandUniform({3, 3}, g16, 1, 2, kF16);
  EXPECT_EQ(h.dtype(), kF16);
  for (float x : h.to_vector<float>()) {
    EXPECT_GE(x, 1.0f);
    EXPECT_LE(x, 2.0f);  // rounding to f16 may reach the upper bound
  }
  Generator same(4);
  EXPECT_EQ(RandUniform({2}, same, 5, 5).to_vector<float>(), std::vector<float>(2, 5.0f));
}

TEST(RandTest, RandUniformErrors) {
  Generator gen(1);
  EXPECT_TRUE(ThrowsErrorExactly([&] { RandUniform({2}, gen, 3, 1); },
                                 "rand_uniform: low 3 is greater than high 1"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { RandUniform({2}, gen, 0, 1, kI32); },
                                 "rand_uniform: expected a floating dtype, got i32"));
  EXPECT_EQ(gen.state().offset, 0u);
}

}  // namespace
}  // namespace tg
