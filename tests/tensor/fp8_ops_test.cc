// The FP8 ops of tensor/ops.h on the CPU (tensor/ops_fp8.cc, tensor/cpu/fp8.cc), with exact
// expectations: Fp8Amax per tiling against a plain loop (edge tiles, NaN skipped, inf, zeros),
// Fp8ScaleFromAmax against amp::ComputeScaleFromAmax, Fp8Cast's bytes against tensor/float8.h's
// scalar casts of x * scale (its transpose and amax too), Fp8Gemm against an f64 GEMM of the
// dequantized inputs within the f32 accumulation bound stated at FpGemmBound, and exactly where
// every partial sum is exact; every refusal with its exact message.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "amp/fp8_recipe.h"
#include "gtest/gtest.h"
#include "tensor/convert.h"
#include "tensor/cpu/thread_governor.h"
#include "tensor/float8.h"
#include "tensor/fp8_scale.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsErrorExactly;

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr Fp8Tiling kTilings[] = {Fp8Tiling::kTensor, Fp8Tiling::k1x128, Fp8Tiling::k128x128};

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

std::vector<uint8_t> Bytes(const RawTensor& t) {
  const RawTensor c = t.contiguous();
  std::vector<uint8_t> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size());
  return out;
}

// Deterministic values over many binades, of both signs (a 64-bit LCG, no library RNG).
std::vector<float> Values(int64_t count, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(count));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t u = static_cast<uint32_t>(s >> 32);
    x = (static_cast<float>(u % 2001) - 1000.0f) / 97.0f *
        std::ldexp(1.0f, static_cast<int>((u >> 12) % 9) - 4);
  }
  return v;
}

// The grid index of element (r, c) of [rows, cols] for `tiling`.
int64_t TileIndex(int64_t r, int64_t c, int64_t rows, int64_t cols, Fp8Tiling tiling) {
  const Fp8Tile tile = Fp8TileOf(rows, cols, tiling), grid = Fp8GridOf(rows, cols, tiling);
  return (r / tile.rows) * grid.cols + c / tile.cols;
}

// The reference amax: fmax (NaN skipped) of |x| per tile, starting at 0.
std::vector<float> ReferenceAmax(const std::vector<float>& x, int64_t rows, int64_t cols,
                                 Fp8Tiling tiling) {
  const Fp8Tile grid = Fp8GridOf(rows, cols, tiling);
  std::vector<float> amax(static_cast<size_t>(grid.rows * grid.cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float& a = amax[TileIndex(r, c, rows, cols, tiling)];
      a = std::fmax(a, std::fabs(x[r * cols + c]));
    }
  }
  return amax;
}

::testing::AssertionResult SameBits(const std::vector<float>& actual,
                                    const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (Bits(actual[i]) != Bits(expected[i])) {
      return ::testing::AssertionFailure()
             << "entry " << i << ": " << actual[i] << " vs expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// x [130, 300] (edge tiles in both dims: 130 = 128 + 2 rows, 300 = 2 * 128 + 44 columns) with
// special values planted: NaNs (one tile all NaN), an inf, a tile of zeros, edge-tile maxima.
std::vector<float> SpecialMatrix() {
  constexpr int64_t kRows = 130, kCols = 300;
  std::vector<float> x = Values(kRows * kCols, 1);
  for (int64_t c = 0; c < 128; ++c) x[5 * kCols + c] = 0.0f;    // 1x128 tile (5, 0): zeros
  for (int64_t c = 128; c < 256; ++c) x[6 * kCols + c] = kNaN;  // 1x128 tile (6, 1): all NaN
  x[7 * kCols + 3] = kNaN;                                      // NaN next to finite values
  x[7 * kCols + 4] = -1000.0f;
  x[9 * kCols + 200] = -kInf;       // inf in tile (9, 1) / (0, 1)
  x[129 * kCols + 299] = -5000.0f;  // the corner edge tile's max
  x[129 * kCols + 10] = 7000.0f;    // an edge row's max
  return x;
}

TEST(Fp8AmaxTest, PerTilingAgainstAPlainLoop) {
  const std::vector<float> values = SpecialMatrix();
  const RawTensor x = RawTensor::FromVector(values, {130, 300});
  for (Fp8Tiling tiling : kTilings) {
    SCOPED_TRACE(Fp8TilingName(tiling));
    const RawTensor amax = Fp8Amax(x, tiling);
    const Fp8Tile grid = Fp8GridOf(130, 300, tiling);
    EXPECT_EQ(amax.shape(), (Shape{grid.rows, grid.cols}));
    EXPECT_EQ(amax.dtype(), kF32);
    const std::vector<float> expected = ReferenceAmax(values, 130, 300, tiling);
    EXPECT_TRUE(SameBits(amax.to_vector<float>(), expected));
    // The same matrix as [2, 65, 300] (leading dims flattened), and as bf16 / f16.
    EXPECT_TRUE(SameBits(Fp8Amax(x.reshape({2, 65, 300}), tiling).to_vector<float>(), expected));
    for (DType d : {kBF16, kF16}) {
      const RawTensor xd = x.to(d);
      EXPECT_TRUE(SameBits(Fp8Amax(xd, tiling).to_vector<float>(),
                           ReferenceAmax(xd.to_vector<float>(), 130, 300, tiling)));
    }
  }
  // The planted values, read off directly.
  const std::vector<float> rows = Fp8Amax(x, Fp8Tiling::k1x128).to_vector<float>();
  EXPECT_EQ(rows[5 * 3 + 0], 0.0f);     // zeros
  EXPECT_EQ(rows[6 * 3 + 1], 0.0f);     // all NaN: skipped, never NaN
  EXPECT_EQ(rows[7 * 3 + 0], 1000.0f);  // NaN skipped, the finite max kept
  EXPECT_EQ(rows[9 * 3 + 1], kInf);
  EXPECT_EQ(rows[129 * 3 + 2], 5000.0f);
  EXPECT_EQ(Fp8Amax(x, Fp8Tiling::kTensor).to_vector<float>(), std::vector<float>{kInf});
  EXPECT_EQ(Fp8Amax(x, Fp8Tiling::k128x128).to_vector<float>()[3], 7000.0f);
  // Block amaxes agree with the host recipe's (amp::ComputeBlockScales).
  const std::vector<float> finite = Values(130 * 300, 2);
  const RawTensor xf = RawTensor::FromVector(finite, {130, 300});
  EXPECT_TRUE(
      SameBits(Fp8Amax(xf, Fp8Tiling::k1x128).to_vector<float>(),
               amp::ComputeBlockScales(finite, 130, 300, amp::Fp8BlockShape::k1x128, 448).amaxes));
  EXPECT_TRUE(SameBits(
      Fp8Amax(xf, Fp8Tiling::k128x128).to_vector<float>(),
      amp::ComputeBlockScales(finite, 130, 300, amp::Fp8BlockShape::k128x128, 448).amaxes));
}

TEST(Fp8AmaxTest, StridedEmptyAndOneDimensionalInputs) {
  const std::vector<float> values = Values(40 * 200, 3);
  const RawTensor xt =
      RawTensor::FromVector(values, {40, 200}).transpose(0, 1);  // [200, 40] strided
  EXPECT_TRUE(SameBits(Fp8Amax(xt, Fp8Tiling::k1x128).to_vector<float>(),
                       Fp8Amax(xt.contiguous(), Fp8Tiling::k1x128).to_vector<float>()));
  // 1-D x is one row.
  const RawTensor v = RawTensor::FromVector<float>({1, -3, 2}, {3});
  EXPECT_EQ(Fp8Amax(v, Fp8Tiling::k1x128).shape(), (Shape{1, 1}));
  EXPECT_EQ(Fp8Amax(v, Fp8Tiling::k1x128).to_vector<float>(), std::vector<float>{3.0f});
  // An empty x has an empty grid (Fp8GridOf): no amax values.
  EXPECT_EQ(Fp8Amax(RawTensor::Zeros({0, 5}), Fp8Tiling::kTensor).shape(), (Shape{0, 1}));
  EXPECT_EQ(Fp8Amax(RawTensor::Zeros({3, 0}), Fp8Tiling::k1x128).shape(), (Shape{3, 0}));
  EXPECT_EQ(Fp8Amax(RawTensor::Zeros({2, 0, 7}), Fp8Tiling::k128x128).shape(), (Shape{0, 1}));
}

TEST(Fp8AmaxTest, SameBitsAtOneAndTwoThreads) {
  const std::vector<float> values = Values(300 * 520, 4);
  const RawTensor x = RawTensor::FromVector(values, {300, 520});
  const RawTensor scale = RawTensor::Full({3, 5}, 3.0);
  const int threads = omp_get_max_threads();
  cpu::SetThreadGovernor(false);  // 2 means 2, on a machine busy with other tests too
  omp_set_num_threads(1);
  const Fp8CastResult one = Fp8Cast(x, scale, Fp8Tiling::k128x128, kF8E4M3, true, true);
  const std::vector<float> amax_one = Fp8Amax(x, Fp8Tiling::kTensor).to_vector<float>();
  omp_set_num_threads(2);
  const Fp8CastResult two = Fp8Cast(x, scale, Fp8Tiling::k128x128, kF8E4M3, true, true);
  EXPECT_EQ(Bytes(one.data), Bytes(two.data));
  EXPECT_EQ(Bytes(one.data_t), Bytes(two.data_t));
  EXPECT_TRUE(SameBits(one.amax.to_vector<float>(), two.amax.to_vector<float>()));
  EXPECT_TRUE(SameBits(amax_one, Fp8Amax(x, Fp8Tiling::kTensor).to_vector<float>()));
  omp_set_num_threads(threads);
  cpu::SetThreadGovernor(true);
}

// ---- Fp8ScaleFromAmax ----

TEST(Fp8ScaleFromAmaxTest, EqualsTheHostRecipeRule) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> amaxes = {0.0f,   kInf,    kNaN,  -kInf,   tiny,   1e-40f,
                                     1e-30f, 0.75f,   1.0f,  3.5f,    448.0f, 1024.0f,
                                     0.001f, 57344.f, 1e30f, 3.4e38f, -2.0f,  0.0009765625f};
  const RawTensor amax = RawTensor::FromVector(amaxes, {2, 9});
  struct Case {
    float fp8_max, epsilon, value_for_inf;
    bool pow2;
  };
  const Case cases[] = {{448, 0, std::numeric_limits<float>::max(), false},
                        {448, 0, std::numeric_limits<float>::max(), true},
                        {57344, 0.001f, 1000.0f, false},
                        {448, 0.5f, 65504.0f, true},
                        {448, 0, 1000.0f, false}};
  for (const Case& c : cases) {
    Fp8ScaleOptions o;
    o.fp8_max = c.fp8_max;
    o.amax_epsilon = c.epsilon;
    o.value_for_inf = c.value_for_inf;
    o.force_pow_2_scales = c.pow2;
    amp::Fp8CurrentScalingOptions ro;
    ro.amax_epsilon = c.epsilon;
    ro.value_for_inf = c.value_for_inf;
    ro.force_pow_2_scales = c.pow2;
    const Fp8Scales s = Fp8ScaleFromAmax(amax, o);
    EXPECT_EQ(s.scale.shape(), (Shape{2, 9}));
    std::vector<float> scale, scale_inv;
    for (float a : amaxes) {
      scale.push_back(amp::ComputeScaleFromAmax(a, c.fp8_max, ro));
      scale_inv.push_back(1.0f / scale.back());
    }
    EXPECT_TRUE(SameBits(s.scale.to_vector<float>(), scale));
    EXPECT_TRUE(SameBits(s.scale_inv.to_vector<float>(), scale_inv));
    // Strided amax: the same values transposed.
    EXPECT_TRUE(
        SameBits(Fp8ScaleFromAmax(amax.transpose(0, 1), o).scale.contiguous().to_vector<float>(),
                 s.scale.transpose(0, 1).contiguous().to_vector<float>()));
  }
  // Read off: 0, inf and NaN amaxes give 1; a tiny amax overflows to value_for_inf; pow2.
  Fp8ScaleOptions o;
  o.value_for_inf = 1000.0f;
  const std::vector<float> s = Fp8ScaleFromAmax(amax, o).scale.to_vector<float>();
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 1.0f);
  EXPECT_EQ(s[4], 1000.0f);
  EXPECT_EQ(s[9], 128.0f);
  o.force_pow_2_scales = true;
  EXPECT_EQ(Fp8ScaleFromAmax(amax, o).scale.to_vector<float>()[7], 512.0f);  // 448/0.75 = 597.3
  // A zero scale (pow2 of a subnormal quotient) has an inf inverse.
  o.fp8_max = 1e-38f;
  o.value_for_inf = 1.0f;
  const Fp8Scales z = Fp8ScaleFromAmax(RawTensor::FromVector<float>({1e30f}, {1}), o);
  EXPECT_EQ(z.scale.to_vector<float>()[0], 0.0f);
  EXPECT_EQ(z.scale_inv.to_vector<float>()[0], kInf);
  // Empty amax: empty results.
  EXPECT_EQ(Fp8ScaleFromAmax(RawTensor::Zeros({0, 1}), Fp8ScaleOptions()).scale.shape(),
            (Shape{0, 1}));
}

TEST(Fp8ScaleFromAmaxTest, RefusesBadOptionsAndAmaxes) {
  const RawTensor amax = RawTensor::Ones({1, 1});
  auto with = [&](float fp8_max, float epsilon, float value_for_inf) {
    Fp8ScaleOptions o;
    o.fp8_max = fp8_max;
    o.amax_epsilon = epsilon;
    o.value_for_inf = value_for_inf;
    return [&amax, o] { Fp8ScaleFromAmax(amax, o); };
  };
  EXPECT_TRUE(ThrowsErrorExactly(with(kInf, 0, 1),
                                 "fp8_scale_from_amax: fp8_max must be finite and > 0, got inf"));
  EXPECT_TRUE(ThrowsErrorExactly(with(0, 0, 1),
                                 "fp8_scale_from_amax: fp8_max must be finite and > 0, got 0"));
  EXPECT_TRUE(ThrowsErrorExactly(with(kNaN, 0, 1),
                                 "fp8_scale_from_amax: fp8_max must be finite and > 0, got nan"));
  EXPECT_TRUE(ThrowsErrorExactly(
      with(448, 0, -1), "fp8_scale_from_amax: value_for_inf must be finite and > 0, got -1"));
  EXPECT_TRUE(ThrowsErrorExactly(
      with(448, 0, kInf), "fp8_scale_from_amax: value_for_inf must be finite and > 0, got inf"));
  EXPECT_TRUE(ThrowsErrorExactly(
      with(448, -0.5f, 1), "fp8_scale_from_amax: amax_epsilon must be finite and >= 0, got -0.5"));
  EXPECT_TRUE(ThrowsErrorExactly(
      with(448, kInf, 1), "fp8_scale_from_amax: amax_epsilon must be finite and >= 0, got inf"));
  EXPECT_TRUE(ThrowsErrorExactly([] { Fp8ScaleFromAmax(RawTensor::Ones({2}, kF64), {}); },
                                 "fp8_scale_from_amax: amax must be f32, got f64"));
  EXPECT_TRUE(ThrowsErrorExactly([] { Fp8ScaleFromAmax(RawTensor(), {}); },
                                 "fp8_scale_from_amax: amax is an undefined tensor"));
}

// ---- Fp8Cast ----

// A scale grid for x [rows, cols] of `tiling`: powers of two and other values, one per tile.
RawTensor ScaleGrid(int64_t rows, int64_t cols, Fp8Tiling tiling, uint64_t seed) {
  const Fp8Tile grid = Fp8GridOf(rows, cols, tiling);
  std::vector<float> s(static_cast<size_t>(grid.rows * grid.cols));
  const std::vector<float> v = Values(static_cast<int64_t>(s.size()), seed);
  for (size_t i = 0; i < s.size(); ++i) s[i] = std::fabs(v[i]) + 0.25f + (i % 3 == 0 ? 9.0f : 0);
  return RawTensor::FromVector(s, {grid.rows, grid.cols});
}

uint8_t CastBits(float v, DType dtype) {
  return dtype == kF8E4M3 ? FloatToE4M3Bits(v) : FloatToE5M2Bits(v);
}

TEST(Fp8CastTest, BytesAreTheScalarCastsOfXTimesScale) {
  std::vector<float> values = SpecialMatrix();
  values[11 * 300 + 7] = 1e-6f;  // subnormal in both formats after scaling
  values[11 * 300 + 8] = 3e4f;   // saturates
  for (DType xd : {kF32, kBF16, kF16}) {
    const RawTensor x = RawTensor::FromVector(values, {130, 300}).to(xd);
    const std::vector<float> xv = x.to_vector<float>();
    for (Fp8Tiling tiling : kTilings) {
      const RawTensor scale = ScaleGrid(130, 300, tiling, 7);
      const std::vector<float> sv = scale.to_vector<float>();
      for (DType dtype : {kF8E4M3, kF8E5M2}) {
        SCOPED_TRACE(std::string(DTypeName(xd)) + " " + Fp8TilingName(tiling) + " " +
                     DTypeName(dtype));
        const Fp8CastResult r = Fp8Cast(x, scale, tiling, dtype, true, true);
        ASSERT_EQ(r.data.shape(), (Shape{130, 300}));
        ASSERT_EQ(r.data.dtype(), dtype);
        ASSERT_EQ(r.data_t.shape(), (Shape{300, 130}));
        std::vector<uint8_t> expected(130 * 300), expected_t(130 * 300);
        for (int64_t i = 0; i < 130; ++i) {
          for (int64_t j = 0; j < 300; ++j) {
            const float s = sv[TileIndex(i, j, 130, 300, tiling)];
            expected[i * 300 + j] = CastBits(xv[i * 300 + j] * s, dtype);
            expected_t[j * 130 + i] = expected[i * 300 + j];
          }
        }
        EXPECT_EQ(Bytes(r.data), expected);
        EXPECT_EQ(Bytes(r.data_t), expected_t);
        EXPECT_TRUE(SameBits(r.amax.to_vector<float>(), ReferenceAmax(xv, 130, 300, tiling)));
        // Without the transpose and the amax: the same data.
        const Fp8CastResult plain = Fp8Cast(x, scale, tiling, dtype);
        EXPECT_FALSE(plain.data_t.defined());
        EXPECT_FALSE(plain.amax.defined());
        EXPECT_EQ(Bytes(plain.data), expected);
      }
    }
  }
}

// The kernel's cast against tensor/float8.h's scalar one over every f16 and bf16 bit pattern
// (every value class: zeros, subnormals of both formats and their halfway points, saturation,
// inf, NaN of both signs) and 2^16 random f32 patterns, times scales 1, 3 and 2^-20.
TEST(Fp8CastTest, EveryF16AndBf16PatternCastsAsTheScalarReference) {
  std::vector<RawTensor> inputs;
  for (DType d : {kF16, kBF16}) {
    RawTensor t = RawTensor::Empty({512, 128}, d);
    auto* bits = static_cast<uint16_t*>(t.raw_data());
    for (uint32_t i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
    inputs.push_back(t);
  }
  RawTensor f32 = RawTensor::Empty({512, 128}, kF32);
  uint64_t state = 99;
  for (int64_t i = 0; i < f32.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = static_cast<uint32_t>(state >> 32);
    std::memcpy(f32.data<float>() + i, &bits, sizeof bits);
  }
  inputs.push_back(f32);
  for (const RawTensor& x : inputs) {
    const std::vector<float> xv = x.to_vector<float>();
    for (float scale : {1.0f, 3.0f, 0x1p-20f}) {
      for (DType dtype : {kF8E4M3, kF8E5M2}) {
        SCOPED_TRACE(std::string(DTypeName(x.dtype())) + " to " + DTypeName(dtype) + " at scale " +
                     std::to_string(scale));
        const std::vector<uint8_t> got =
            Bytes(Fp8Cast(x, RawTensor::Full({1, 1}, scale), Fp8Tiling::kTensor, dtype).data);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < xv.size(); ++i) {
          if (got[i] != CastBits(xv[i] * scale, dtype)) {
            if (first < 0) first = static_cast<int64_t>(i);
            ++bad;
          }
        }
        EXPECT_EQ(bad, 0) << "first at " << first << ": " << xv[first];
      }
    }
  }
}

TEST(Fp8CastTest, LeadingDimsStridesAndEmptyInputs) {
  const std::vector<float> values = Values(2 * 70 * 33, 5);
  const RawTensor x = RawTensor::FromVector(values, {2, 70, 33});
  const RawTensor scale = ScaleGrid(140, 33, Fp8Tiling::k1x128, 3);
  const Fp8CastResult r = Fp8Cast(x, scale, Fp8Tiling::k1x128, kF8E5M2, true);
  EXPECT_EQ(r.data.shape(), (Shape{140, 33}));
  EXPECT_EQ(Bytes(r.data),
            Bytes(Fp8Cast(x.reshape({140, 33}), scale, Fp8Tiling::k1x128, kF8E5M2).data));
  // A strided x (a transposed view) casts as its contiguous copy.
  const RawTensor xt = RawTensor::FromVector(values, {33, 140}).transpose(0, 1);
  EXPECT_EQ(Bytes(Fp8Cast(xt, scale, Fp8Tiling::k1x128, kF8E4M3, true).data_t),
            Bytes(Fp8Cast(xt.contiguous(), scale, Fp8Tiling::k1x128, kF8E4M3, true).data_t));
  // A strided scale is read by value.
  const RawTensor grid = ScaleGrid(140, 33, Fp8Tiling::k1x128, 4);  // [140, 1]
  const RawTensor strided = RawTensor::Zeros({140, 2}).narrow(1, 0, 1);
  strided.copy_(grid);
  EXPECT_EQ(Bytes(Fp8Cast(x, strided, Fp8Tiling::k1x128, kF8E4M3).data),
            Bytes(Fp8Cast(x, grid, Fp8Tiling::k1x128, kF8E4M3).data));
  // Empty x: empty data, transpose and amax (grids [0, 1] and [3, 0]).
  const Fp8CastResult e = Fp8Cast(RawTensor::Zeros({0, 5}), RawTensor::Zeros({0, 1}),
                                  Fp8Tiling::kTensor, kF8E4M3, true, true);
  EXPECT_EQ(e.data.shape(), (Shape{0, 5}));
  EXPECT_EQ(e.data_t.shape(), (Shape{5, 0}));
  EXPECT_EQ(e.amax.shape(), (Shape{0, 1}));
  EXPECT_EQ(Fp8Cast(RawTensor::Zeros({3, 0}), RawTensor::Zeros({3, 0}), Fp8Tiling::k1x128, kF8E5M2)
                .data.shape(),
            (Shape{3, 0}));
}

TEST(Fp8CastTest, RefusesBadInputs) {
  const RawTensor x = RawTensor::Ones({4, 300});
  const RawTensor s = RawTensor::Ones({1, 1});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { Fp8Cast(x.to(kF64), s, Fp8Tiling::kTensor, kF8E4M3); },
      "fp8_cast: x is f64: FP8 casts take f32, bf16 or f16 (cast f64 to f32 first)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x.to(kI32), s, Fp8Tiling::kTensor, kF8E4M3); },
                                 "fp8_cast: x is i32: FP8 casts take f32, bf16 or f16"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x.to(kF8E4M3), s, Fp8Tiling::kTensor, kF8E4M3); },
                                 "fp8_cast: x is f8e4m3: FP8 casts take f32, bf16 or f16"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(RawTensor(), s, Fp8Tiling::kTensor, kF8E4M3); },
                                 "fp8_cast: x is an undefined tensor"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { Fp8Cast(RawTensor::Scalar(1), s, Fp8Tiling::kTensor, kF8E4M3); },
                         "fp8_cast: expected x [..., cols], got a 0-d tensor"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x, s, Fp8Tiling::kTensor, kBF16); },
                                 "fp8_cast: dtype bf16 is not an FP8 dtype (f8e4m3 or f8e5m2)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x, s, Fp8Tiling::k1x128, kF8E4M3); },
                                 "fp8_cast: scale of shape [1, 1] does not match the 1x128 grid "
                                 "[4, 3] of x [4, 300]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Fp8Cast(x.reshape({2, 2, 300}), RawTensor::Ones({4, 3}), Fp8Tiling::k128x128, kF8E4M3);
      },
      "fp8_cast: scale of shape [4, 3] does not match the 128x128 grid [1, 3] of x [2, 2, 300]"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x, s.to(kBF16), Fp8Tiling::kTensor, kF8E4M3); },
                                 "fp8_cast: scale must be f32, got bf16"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Cast(x, RawTensor(), Fp8Tiling::kTensor, kF8E4M3); },
                                 "fp8_cast: scale is an undefined tensor"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Amax(x.to(kF64), Fp8Tiling::kTensor); },
                                 "fp8_amax: x is f64: FP8 casts take f32, bf16 or f16 (cast f64 "
                                 "to f32 first)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Amax(RawTensor::Scalar(2), Fp8Tiling::kTensor); },
                                 "fp8_amax: expected x [..., cols], got a 0-d tensor"));
}

// ---- Fp8Gemm ----

struct Quantized {
  RawTensor data;       // FP8 [rows, k]
  RawTensor scale_inv;  // the tiling's grid
  std::vector<float> decoded;
  std::vector<float> scale_inv_values;
};

// values [rows, k] (times `range`) cast to `dtype` with per-tile scales from their amaxes
// (fp8_max / amax).
Quantized Quantize(int64_t rows, int64_t k, uint64_t seed, DType dtype, Fp8Tiling tiling,
                   float range) {
  const RawTensor x = MulScalar(RawTensor::FromVector(Values(rows * k, seed), {rows, k}), range);
  Fp8ScaleOptions o;
  o.fp8_max = dtype == kF8E4M3 ? 448.0f : 57344.0f;
  const Fp8Scales s = Fp8ScaleFromAmax(Fp8Amax(x, tiling), o);
  Quantized q;
  q.data = Fp8Cast(x, s.scale, tiling, dtype).data;
  q.scale_inv = s.scale_inv;
  q.decoded = q.data.to_vector<float>();
  q.scale_inv_values = s.scale_inv.to_vector<float>();
  return q;
}

struct Reference {
  std::vector<double> value;  // the f64 GEMM of the dequantized inputs, + bias
  std::vector<double> bound;  // the f32 accumulation bound per element (FpGemmBound)
};

// ref[i, j] = sum over k-slices s of (sum_{k in s} A[i, k] B[j, k]) * sa(i, s) * sb(j, s)
// (+ bias[j]) in f64, where each slice is all of k for per-tensor scaling.
// The bound: with u = 2^-24, f32 sums of w exact products carry at most (w - 1) u sum|A B|
// (any order), the scaling (sa * sb, then the product) 2u, the slices' accumulation u per
// slice, and the bias one more rounding: |out - ref| <= (k + 4) u (sum_k |A B| sa sb + |bias|),
// taken 1% wider for second-order terms; a bf16 or f16 out adds its rounding, 2^-8 |ref| + the
// smallest f16 subnormal.
Reference FpGemmReference(const Quantized& a, Fp8Tiling at, const Quantized& b, Fp8Tiling bt,
                          int64_t m, int64_t n, int64_t k, const std::vector<float>& bias,
                          DType out_dtype) {
  Reference r;
  r.value.resize(m * n);
  r.bound.resize(m * n);
  const double u = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, abs_sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double sa = a.scale_inv_values[TileIndex(i, c, m, k, at)];
        const double sb = b.scale_inv_values[TileIndex(j, c, n, k, bt)];
        const double p = static_cast<double>(a.decoded[i * k + c]) * b.decoded[j * k + c];
        // Per-tensor: one scale for all of k. Scaling each product is the same as scaling the
        // slice's sum in exact arithmetic.
        sum += p * sa * sb;
        abs_sum += std::fabs(p * sa * sb);
      }
      const double bj = bias.empty() ? 0.0 : bias[j];
      r.value[i * n + j] = sum + bj;
      double bound = 1.01 * (k + 4) * u * (abs_sum + std::fabs(bj));
      if (out_dtype != kF32) bound += std::ldexp(std::fabs(sum + bj), -8) + std::ldexp(1.0, -24);
      r.bound[i * n + j] = bound;
    }
  }
  return r;
}

struct GemmCase {
  Fp8Tiling at, bt;
  DType ad, bd, out;
  bool bias;
  float range;  // of the inputs' values (f16 sums must stay below 65504)
};

TEST(Fp8GemmTest, EqualsAnF64GemmOfTheDequantizedInputsWithinTheF32Bound) {
  constexpr int64_t m = 130, n = 129, k = 300;
  const GemmCase cases[] = {
      {Fp8Tiling::kTensor, Fp8Tiling::kTensor, kF8E4M3, kF8E4M3, kF32, false, 1},
      {Fp8Tiling::kTensor, Fp8Tiling::kTensor, kF8E4M3, kF8E5M2, kBF16, true, 1},
      {Fp8Tiling::k1x128, Fp8Tiling::k128x128, kF8E4M3, kF8E4M3, kF32, true, 1},
      {Fp8Tiling::k1x128, Fp8Tiling::k1x128, kF8E5M2, kF8E4M3, kF32, false, 1},
      {Fp8Tiling::k128x128, Fp8Tiling::k1x128, kF8E4M3, kF8E5M2, kBF16, true, 1},
      {Fp8Tiling::k128x128, Fp8Tiling::k128x128, kF8E4M3, kF8E4M3, kF16, true, 1.0f / 32},
  };
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(std::string(Fp8TilingName(c.at)) + " x " + Fp8TilingName(c.bt) + " " +
                 DTypeName(c.ad) + " x " + DTypeName(c.bd) + " -> " + DTypeName(c.out));
    const Quantized a = Quantize(m, k, 11, c.ad, c.at, c.range);
    const Quantized b = Quantize(n, k, 12, c.bd, c.bt, c.range);
    std::vector<float> bias;
    RawTensor bias_t;
    if (c.bias) {
      bias_t = RawTensor::FromVector(Values(n, 13), {n}).to(c.out);
      bias = bias_t.to_vector<float>();
    }
    const RawTensor out =
        Fp8Gemm(a.data, a.scale_inv, c.at, b.data, b.scale_inv, c.bt, bias_t, c.out);
    ASSERT_EQ(out.shape(), (Shape{m, n}));
    ASSERT_EQ(out.dtype(), c.out);
    const std::vector<float> got = out.to_vector<float>();
    const Reference ref = FpGemmReference(a, c.at, b, c.bt, m, n, k, bias, c.out);
    int64_t bad = 0;
    double worst = 0;
    for (int64_t e = 0; e < m * n; ++e) {
      const double err = std::fabs(got[e] - ref.value[e]);
      if (!(err <= ref.bound[e])) ++bad;
      worst = std::max(worst, err / ref.bound[e]);
    }
    EXPECT_EQ(bad, 0) << "worst error / bound " << worst;
  }
}

// Small integers times powers of two: every product, partial sum, scaling and bias addition is
// exact in f32, so any summation order gives the exact f64 value.
TEST(Fp8GemmTest, ExactWhereEveryPartialSumIsExact) {
  constexpr int64_t m = 3, n = 2, k = 260;
  std::vector<float> av(m * k), bv(n * k);
  for (int64_t e = 0; e < m * k; ++e) av[e] = static_cast<float>(static_cast<int>(e % 7) - 3);
  for (int64_t e = 0; e < n * k; ++e) bv[e] = static_cast<float>(static_cast<int>(e % 5) - 2) / 2;
  const RawTensor a = RawTensor::FromVector(av, {m, k}).to(kF8E4M3);
  const RawTensor b = RawTensor::FromVector(bv, {n, k}).to(kF8E5M2);
  const RawTensor bias = RawTensor::FromVector<float>({0.5f, -3.0f}, {2});
  // Per-tensor, scale_invs 2 and 0.25.
  std::vector<double> per_tensor(m * n), block(m * n);
  const float sa_block[3][3] = {{1, 2, 4}, {0.5f, 1, 8}, {2, 2, 0.25f}};  // 1x128: [m, 3]
  const float sb_block[1][3] = {{4, 0.5f, 2}};                            // 128x128: [1, 3]
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, bsum = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = static_cast<double>(av[i * k + c]) * bv[j * k + c];
        sum += p;
        bsum += p * sa_block[i][c / 128] * sb_block[0][c / 128];
      }
      per_tensor[i * n + j] = sum * 2 * 0.25 + (j == 0 ? 0.5 : -3.0);
      block[i * n + j] = bsum + (j == 0 ? 0.5 : -3.0);
    }
  }
  const std::vector<float> pt =
      Fp8Gemm(a, RawTensor::Full({1, 1}, 2), Fp8Tiling::kTensor, b, RawTensor::Full({1, 1}, 0.25),
              Fp8Tiling::kTensor, bias, kF32)
          .to_vector<float>();
  std::vector<float> sa_flat, sb_flat;
  for (const auto& row : sa_block) sa_flat.insert(sa_flat.end(), row, row + 3);
  sb_flat.assign(sb_block[0], sb_block[0] + 3);
  const std::vector<float> bl =
      Fp8Gemm(a, RawTensor::FromVector(sa_flat, {3, 3}), Fp8Tiling::k1x128, b,
              RawTensor::FromVector(sb_flat, {1, 3}), Fp8Tiling::k128x128, bias, kF32)
          .to_vector<float>();
  for (int64_t e = 0; e < m * n; ++e) {
    EXPECT_EQ(pt[e], per_tensor[e]) << e;
    EXPECT_EQ(bl[e], block[e]) << e;
  }
  // A strided a (a transposed view) multiplies as its contiguous copy; m or n of 0 gives an
  // empty result.
  const RawTensor at = a.transpose(0, 1).contiguous().transpose(0, 1);
  EXPECT_EQ(Fp8Gemm(at, RawTensor::Full({1, 1}, 2), Fp8Tiling::kTensor, b,
                    RawTensor::Full({1, 1}, 0.25), Fp8Tiling::kTensor, bias, kF32)
                .to_vector<float>(),
            pt);
  EXPECT_EQ(Fp8Gemm(a.narrow(0, 0, 0), RawTensor::Ones({0, 3}), Fp8Tiling::k1x128, b,
                    RawTensor::Ones({1, 3}), Fp8Tiling::k128x128, RawTensor(), kBF16)
                .shape(),
            (Shape{0, 2}));
}

TEST(Fp8GemmTest, RefusesBadInputs) {
  const RawTensor a = RawTensor::Ones({4, 16}).to(kF8E4M3);
  const RawTensor b = RawTensor::Ones({8, 16}).to(kF8E5M2);
  const RawTensor s = RawTensor::Ones({1, 1});
  const Fp8Tiling kT = Fp8Tiling::kTensor;
  auto gemm = [&](const RawTensor& a_, const RawTensor& sa, Fp8Tiling at, const RawTensor& b_,
                  const RawTensor& sb, Fp8Tiling bt, const RawTensor& bias,
                  DType out) { return [=] { Fp8Gemm(a_, sa, at, b_, sb, bt, bias, out); }; };
  EXPECT_TRUE(ThrowsErrorExactly(gemm(RawTensor(), s, kT, b, s, kT, RawTensor(), kF32),
                                 "fp8_gemm: a is an undefined tensor"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, RawTensor(), s, kT, RawTensor(), kF32),
                                 "fp8_gemm: b is an undefined tensor"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a.reshape({2, 2, 16}), s, kT, b, s, kT, RawTensor(), kF32),
                                 "fp8_gemm: a must be 2-D [m, k], got [2, 2, 16]"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b.reshape({128}), s, kT, RawTensor(), kF32),
                                 "fp8_gemm: b must be 2-D [n, k], got [128]"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a.to(kBF16), s, kT, b, s, kT, RawTensor(), kF32),
                                 "fp8_gemm: a is bf16: expected an FP8 dtype (f8e4m3 or f8e5m2)"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b.to(kF32), s, kT, RawTensor(), kF32),
                                 "fp8_gemm: b is f32: expected an FP8 dtype (f8e4m3 or f8e5m2)"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a.to(kF8E5M2), s, kT, b, s, kT, RawTensor(), kF32),
                                 "fp8_gemm: a and b are both f8e5m2: FP8 GEMMs take e4m3 x e4m3, "
                                 "e4m3 x e5m2 or e5m2 x e4m3"));
  EXPECT_TRUE(ThrowsErrorExactly(
      gemm(a, s, kT, RawTensor::Ones({8, 15}).to(kF8E4M3), s, kT, RawTensor(), kF32),
      "fp8_gemm: a [m, k] and b [n, k] differ in k: a [4, 16], b [8, 15]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      gemm(a.narrow(1, 0, 0), s, kT, b.narrow(1, 0, 0), s, kT, RawTensor(), kF32),
      "fp8_gemm: k is 0 (a [4, 0], b [8, 0]): an FP8 GEMM needs k > 0"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b, s, Fp8Tiling::k1x128, RawTensor(), kF32),
                                 "fp8_gemm: the tilings of a (tensor) and b (1x128) disagree "
                                 "along k: both must be tensor, or both block tilings (1x128, "
                                 "128x128)"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b, s, kT, RawTensor(), kF64),
                                 "fp8_gemm: out_dtype is f64: expected f32, bf16 or f16"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b, s, kT, RawTensor(), kF8E4M3),
                                 "fp8_gemm: out_dtype is f8e4m3: expected f32, bf16 or f16"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s.to(kF64), kT, b, s, kT, RawTensor(), kF32),
                                 "fp8_gemm: a_scale_inv must be f32, got f64"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b, RawTensor(), kT, RawTensor(), kF32),
                                 "fp8_gemm: b_scale_inv is an undefined tensor"));
  EXPECT_TRUE(ThrowsErrorExactly(
      gemm(a, s, Fp8Tiling::k1x128, b, RawTensor::Ones({1, 1}), Fp8Tiling::k128x128, RawTensor(),
           kF32),
      "fp8_gemm: a_scale_inv of shape [1, 1] does not match the 1x128 grid [4, 1] of a [4, 16]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      gemm(a, RawTensor::Ones({4, 1}), Fp8Tiling::k1x128, b, RawTensor::Ones({8, 1}),
           Fp8Tiling::k128x128, RawTensor(), kF32),
      "fp8_gemm: b_scale_inv of shape [8, 1] does not match the 128x128 grid [1, 1] of b [8, 16]"));
  EXPECT_TRUE(
      ThrowsErrorExactly(gemm(a, s, kT, b, s, kT, RawTensor::Ones({4}), kF32),
                         "fp8_gemm: bias of shape [4] does not match n = 8 (expected [8])"));
  EXPECT_TRUE(ThrowsErrorExactly(gemm(a, s, kT, b, s, kT, RawTensor::Ones({8}), kBF16),
                                 "fp8_gemm: bias is f32, out_dtype is bf16: they must match"));
}

}  // namespace
}  // namespace tg
