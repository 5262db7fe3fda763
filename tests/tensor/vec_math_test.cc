// The vectorised float math of tensor/cpu/vec_math.h: accuracy against f64 libm, special values,
// the same result for a value in any position of any length (tails included), and the GELU
// derivative, sigmoid, SiLU and SwiGLU equal bit for bit to the chains of f32 tensor ops they
// stand for.
#include "tensor/cpu/vec_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/float8.h"
#include "tensor/generator.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace tg {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Distance in units in the last place between two finite floats of the same sign region.
int64_t UlpDistance(float a, double exact) {
  const float b = static_cast<float>(exact);
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int32_t>::min() - ib;
  return std::abs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

double GeluTanhRef(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

std::vector<float> Grid(float lo, float hi, int n) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  return x;
}

TEST(VecMath, TanhWithinFourUlpOfLibm) {
  std::vector<float> x = Grid(-20, 20, 40001);
  std::vector<float> y(x.size());
  cpu::TanhF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(UlpDistance(y[i], std::tanh(static_cast<double>(x[i]))), 4)
        << "tanh(" << x[i] << ") = " << y[i] << " on " << cpu::VecMathTarget();
  }
}

TEST(VecMath, ExpWithinOneUlpOfLibm) {
  std::vector<float> x = Grid(-87, 88.5f, 70001);
  std::vector<float> y(x.size());
  cpu::ExpF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(UlpDistance(y[i], std::exp(static_cast<double>(x[i]))), 1)
        << "exp(" << x[i] << ") = " << y[i] << " on " << cpu::VecMathTarget();
  }
}

TEST(VecMath, ExpSpecialValues) {
  const std::vector<float> x = {kNaN, kInf, -kInf, 0.0f, -0.0f, 88.8f, 1000.0f, -104.5f, -1000.0f};
  std::vector<float> y(x.size());
  cpu::ExpF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], kInf);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], 1.0f);
  EXPECT_EQ(y[5], kInf);  // above log(FLT_MAX) = 88.7228
  EXPECT_EQ(y[6], kInf);
  EXPECT_EQ(y[7], 0.0f);
  EXPECT_EQ(y[8], 0.0f);
}

TEST(VecMath, GeluTanhCloseToF64) {
  std::vector<float> x = Grid(-8, 8, 16001);
  std::vector<float> y(x.size());
  cpu::GeluTanhF32(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = GeluTanhRef(x[i]);
    ASSERT_NEAR(y[i], ref, 1e-6 + 4e-7 * std::abs(ref)) << "gelu_tanh(" << x[i] << ")";
  }
}

TEST(VecMath, SpecialValues) {
  const std::vector<float> x = {kNaN, kInf, -kInf, 0.0f, -0.0f, 30.0f, -30.0f};
  std::vector<float> t(x.size()), g(x.size());
  cpu::TanhF32(x.data(), t.data(), 7);
  cpu::GeluTanhF32(x.data(), g.data(), 7);
  EXPECT_TRUE(std::isnan(t[0]));
  EXPECT_EQ(t[1], 1.0f);
  EXPECT_EQ(t[2], -1.0f);
  EXPECT_EQ(t[3], 0.0f);
  EXPECT_TRUE(std::signbit(t[4]));  // tanh(-0) = -0
  EXPECT_EQ(t[5], 1.0f);
  EXPECT_EQ(t[6], -1.0f);
  EXPECT_TRUE(std::isnan(g[0]));
  EXPECT_EQ(g[1], kInf);
  EXPECT_EQ(g[3], 0.0f);
  EXPECT_EQ(g[5], 30.0f);
  EXPECT_EQ(g[6], -0.0f);
}

TEST(VecMath, AValueGetsTheSameResultInEveryPositionAndLength) {
  Generator gen(3);
  const RawTensor r = RandNormal({67}, gen);
  const std::vector<float> x = r.to_vector<float>();
  std::vector<float> whole(x.size());
  cpu::GeluTanhGradF32(x.data(), whole.data(), 67);
  for (int64_t start = 0; start < 20; ++start) {
    for (int64_t len = 1; start + len <= 67; len += 7) {
      std::vector<float> part(len);
      cpu::GeluTanhGradF32(x.data() + start, part.data(), len);
      for (int64_t i = 0; i < len; ++i) {
        ASSERT_EQ(part[i], whole[start + i]) << "start " << start << " length " << len;
      }
    }
  }
  std::vector<float> in_place = x;
  cpu::GeluTanhGradF32(in_place.data(), in_place.data(), 67);
  EXPECT_EQ(in_place, whole);
}

// Bit patterns, every NaN as one pattern: which operand's NaN an x86 instruction passes on
// depends on the order the compiler gives a commutative operation's operands, so a NaN's sign
// is not part of a result.
std::vector<uint32_t> Bits(const std::vector<float>& x) {
  std::vector<uint32_t> bits(x.size());
  std::memcpy(bits.data(), x.data(), x.size() * sizeof(float));
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) bits[i] = 0x7fc00000u;
  }
  return bits;
}

// Sigmoid, SiLU and SwiGLU with its gradients in vectors equal, bit for bit and at every length
// (tails included), the scalar f32 chains of the composed ops: e = exp(-x) by ExpF32, then one
// rounding per operation.
TEST(VecMath, SigmoidSiluAndSwigluAreTheScalarChainsBitForBit) {
  Generator gen(6);
  std::vector<float> g = RandNormal({61}, gen, 0, 6).to_vector<float>();
  const std::vector<float> special = {kNaN,   kInf,  -kInf,  0.0f,   -0.0f,   30.0f,
                                      -30.0f, 88.8f, -88.8f, 1e-30f, -104.0f, 104.0f};
  g.insert(g.end(), special.begin(), special.end());
  const int64_t n = static_cast<int64_t>(g.size());
  const std::vector<float> u = RandNormal({n}, gen).to_vector<float>();
  const std::vector<float> dy = RandNormal({n}, gen).to_vector<float>();
  std::vector<float> e(g.size());
  for (size_t i = 0; i < g.size(); ++i) e[i] = -g[i];
  cpu::ExpF32(e.data(), e.data(), n);
  std::vector<float> sigmoid(g.size()), silu(g.size()), swiglu(g.size()), grad_gate(g.size()),
      grad_up(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const float s = 1.0f / (1.0f + e[i]);
    sigmoid[i] = s;
    silu[i] = g[i] / (1.0f + e[i]);
    swiglu[i] = silu[i] * u[i];
    grad_up[i] = dy[i] * silu[i];
    const float one_minus_s = -s + 1.0f;
    const float gs = g[i] * one_minus_s;
    const float t = s * (gs + 1.0f);
    grad_gate[i] = (dy[i] * u[i]) * t;
  }
  for (int64_t start = 0; start < 9; ++start) {
    for (int64_t len = 1; start + len <= n; len += 5) {
      auto part = [&](const std::vector<float>& v) {
        return Bits({v.begin() + start, v.begin() + start + len});
      };
      std::vector<float> a(len), b(len);
      cpu::SigmoidF32(g.data() + start, a.data(), len);
      ASSERT_EQ(Bits(a), part(sigmoid)) << "sigmoid, start " << start << " length " << len;
      cpu::SiluF32(g.data() + start, a.data(), len);
      ASSERT_EQ(Bits(a), part(silu)) << "silu, start " << start << " length " << len;
      cpu::SwigluF32(g.data() + start, u.data() + start, a.data(), len);
      ASSERT_EQ(Bits(a), part(swiglu)) << "swiglu, start " << start << " length " << len;
      cpu::SwigluGradF32(g.data() + start, u.data() + start, dy.data() + start, a.data(), b.data(),
                         len);
      ASSERT_EQ(Bits(a), part(grad_gate)) << "grad_gate, start " << start << " length " << len;
      ASSERT_EQ(Bits(b), part(grad_up)) << "grad_up, start " << start << " length " << len;
    }
  }
  std::vector<float> in_place = g;
  cpu::SiluF32(in_place.data(), in_place.data(), n);
  EXPECT_EQ(Bits(in_place), Bits(silu));
}

TEST(VecMath, MaxIsTheLargestOrTheFirstNaNAtEveryLengthAndPosition) {
  EXPECT_EQ(cpu::MaxF32(nullptr, 0), -kInf);
  Generator gen(5);
  const std::vector<float> x = RandNormal({70}, gen).to_vector<float>();
  for (int64_t len = 1; len <= 70; ++len) {
    float expected = -kInf;
    for (int64_t i = 0; i < len; ++i) expected = std::max(expected, x[i]);
    ASSERT_EQ(cpu::MaxF32(x.data(), len), expected) << "length " << len;
    // The largest value in any one position, the tail's included.
    for (int64_t at = 0; at < len; ++at) {
      std::vector<float> y(x.begin(), x.begin() + len);
      y[at] = 100.0f;
      ASSERT_EQ(cpu::MaxF32(y.data(), len), 100.0f) << "length " << len << " at " << at;
    }
  }
  // NaNs: the first one, payload and sign kept, wherever the larger values are.
  const float nan_a = -std::nanf("0x123"), nan_b = std::nanf("0x456");
  for (int64_t len : {1, 5, 16, 17, 40}) {
    for (int64_t at = 0; at < len; ++at) {
      std::vector<float> y(x.begin(), x.begin() + len);
      y[at] = nan_a;
      if (at + 1 < len) y[len - 1] = nan_b;
      if (at > 0) y[0] = kInf;
      const float m = cpu::MaxF32(y.data(), len);
      uint32_t got, want;
      std::memcpy(&got, &m, 4);
      std::memcpy(&want, &nan_a, 4);
      ASSERT_EQ(got, want) << "length " << len << " NaN at " << at;
    }
  }
  const std::vector<float> infs = {-kInf, -kInf, -kInf};
  EXPECT_EQ(cpu::MaxF32(infs.data(), 3), -kInf);
}

// The order the f64 row sums promise (tensor/cpu/rows.h SumF64): term i added to partial sum
// i % 8 in the order of i, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
template <typename F>
double EightSums(int64_t n, F term) {
  double s[8] = {};
  for (int64_t i = 0; i < n; ++i) s[i % 8] += term(i);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

TEST(VecMath, F64SumsHaveTheBitsOfTheEightPartialSumsAtEveryLength) {
  Generator gen(6);
  // Values of very different sizes, so that another order of the additions would show.
  std::vector<float> x = RandNormal({131}, gen).to_vector<float>();
  const std::vector<float> y = RandNormal({131}, gen).to_vector<float>();
  for (size_t i = 0; i < x.size(); i += 3) x[i] *= 1e7f;
  for (int64_t n = 0; n <= 131; ++n) {
    ASSERT_EQ(cpu::SumAsF64(x.data(), n), EightSums(n, [&](int64_t i) { return double(x[i]); }))
        << n;
    ASSERT_EQ(cpu::SumProductsAsF64(x.data(), y.data(), n),
              EightSums(n, [&](int64_t i) { return double(x[i] * y[i]); }))
        << n;
    const double mean = 12345.678;
    ASSERT_EQ(cpu::SumSquaredDeviationsF64(x.data(), n, mean), EightSums(n,
                                                                         [&](int64_t i) {
                                                                           const double d =
                                                                               double(x[i]) - mean;
                                                                           return d * d;
                                                                         }))
        << n;
  }
}

// ScaleF32: each element the f32 product x * s (bits compared, NaN payloads kept as the FPU keeps
// them), at every length (tails included); with check_finite, true exactly when some element was
// inf or NaN, wherever it is.
TEST(VecMath, ScaleIsTheF32ProductAndFindsEveryNonFiniteValue) {
  Generator gen(8);
  const std::vector<float> x = RandNormal({70}, gen).to_vector<float>();
  const float s = 0.3183099f;
  auto bits = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
  };
  for (int64_t len = 0; len <= 70; ++len) {
    for (bool check : {false, true}) {
      std::vector<float> y(x.begin(), x.begin() + len);
      ASSERT_FALSE(cpu::ScaleF32(y.data(), len, s, check)) << "length " << len;
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(bits(y[i]), bits(x[i] * s)) << len << " " << i;
    }
    for (int64_t at = 0; at < len; ++at) {
      for (float bad : {kInf, -kInf, std::nanf(""), -std::nanf("0x2a")}) {
        std::vector<float> y(x.begin(), x.begin() + len);
        y[at] = bad;
        ASSERT_TRUE(cpu::ScaleF32(y.data(), len, s, true)) << "length " << len << " at " << at;
        EXPECT_EQ(bits(y[at]), bits(bad * s));
        y[at] = bad;
        ASSERT_FALSE(cpu::ScaleF32(y.data(), len, s, false)) << "not asked to check";
      }
    }
  }
  // A finite value that overflows when scaled is not reported: the check is of the input.
  std::vector<float> big = {3e38f, 1.0f};
  EXPECT_FALSE(cpu::ScaleF32(big.data(), 2, 4.0f, true));
  EXPECT_EQ(big[0], kInf);
}

TEST(VecMath, ColumnSumsAddEachRowInOrderInF64) {
  Generator gen(7);
  const int64_t rows = 37, stride = 75;
  std::vector<float> x = RandNormal({rows * stride}, gen).to_vector<float>();
  for (size_t i = 0; i < x.size(); i += 5) x[i] *= 1e8f;
  for (int64_t cols : {0, 1, 7, 8, 31, 32, 33, 70}) {
    std::vector<double> want(cols, 0.5), got(cols, 0.5);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) want[j] += double(x[r * stride + 3 + j]);
    }
    cpu::AddColumnsToF64(x.data() + 3, rows, stride, cols, got.data());
    EXPECT_EQ(got, want) << cols;
  }
}

TEST(VecMath, LayerNormParamGradsSumF32ProductsPerColumnInRowOrder) {
  Generator gen(9);
  const int64_t rows = 29, stride = 70;
  const std::vector<float> x = RandNormal({rows * stride}, gen).to_vector<float>();
  std::vector<float> g = RandNormal({rows * stride}, gen).to_vector<float>();
  for (size_t i = 0; i < g.size(); i += 7) g[i] *= 1e7f;
  const std::vector<float> mean = RandNormal({rows}, gen).to_vector<float>();
  std::vector<float> rstd = RandNormal({rows}, gen).to_vector<float>();
  for (float& r : rstd) r = std::abs(r) + 0.5f;
  for (int64_t cols : {0, 3, 16, 33, 64}) {
    std::vector<double> gw_want(cols, 0.25), gb_want(cols, -0.5), gw(cols, 0.25), gb(cols, -0.5);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t at = r * stride + 5 + j;
        volatile float xhat = x[at] - mean[r];  // volatile: each f32 operation rounded
        xhat = xhat * rstd[r];
        const float p = g[at] * xhat;
        gw_want[j] += double(p);
        gb_want[j] += double(g[at]);
      }
    }
    cpu::LayerNormParamGradsF32(x.data() + 5, g.data() + 5, rows, stride, cols, mean.data(),
                                rstd.data(), gw.data(), gb.data());
    EXPECT_EQ(gw, gw_want) << cols;
    EXPECT_EQ(gb, gb_want) << cols;
  }
}

TEST(VecMath, NormalizeRoundsEachOperationInLayerNormsOrder) {
  Generator gen(8);
  const std::vector<float> x = RandNormal({45}, gen).to_vector<float>();
  const std::vector<float> w = RandNormal({45}, gen).to_vector<float>();
  const std::vector<float> b = RandNormal({45}, gen).to_vector<float>();
  const float mean = 0.3f, rstd = 1.7f;
  for (int64_t n : {1, 16, 45}) {
    for (int with = 0; with < 4; ++with) {
      const float* wp = (with & 1) ? w.data() : nullptr;
      const float* bp = (with & 2) ? b.data() : nullptr;
      std::vector<float> got(n);
      cpu::NormalizeF32(x.data(), n, mean, rstd, wp, bp, got.data());
      for (int64_t i = 0; i < n; ++i) {
        volatile float v = x[i] - mean;  // volatile: one rounding per operation, no FMA
        v = v * rstd;
        if (wp) v = v * wp[i];
        if (bp) v = v + bp[i];
        ASSERT_EQ(got[i], v) << "n " << n << " i " << i << " with " << with;
      }
    }
  }
}

TEST(VecMath, GeluTanhGradEqualsTheChainOfF32TensorOps) {
  Generator gen(4);
  const RawTensor x = MulScalar(RandNormal({1001}, gen), 3.0);
  const double k = 0.7978845608028654, c = 0.044715;
  const RawTensor x2 = Mul(x, x);
  const RawTensor t = Tanh(MulScalar(Add(x, MulScalar(Mul(x2, x), c)), k));
  const RawTensor left = MulScalar(AddScalar(t, 1), 0.5);
  const RawTensor du = MulScalar(AddScalar(MulScalar(x2, 3 * c), 1), k);
  const RawTensor right = Mul(MulScalar(x, 0.5), Mul(AddScalar(Neg(Mul(t, t)), 1), du));
  const std::vector<float> chain = Add(left, right).to_vector<float>();
  const std::vector<float> xv = x.to_vector<float>();
  std::vector<float> fused(xv.size());
  cpu::GeluTanhGradF32(xv.data(), fused.data(), static_cast<int64_t>(xv.size()));
  for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(fused[i], chain[i]) << "x = " << xv[i];
  // And the elementwise GeluTanh op is GeluTanhF32.
  std::vector<float> y(xv.size());
  cpu::GeluTanhF32(xv.data(), y.data(), static_cast<int64_t>(xv.size()));
  EXPECT_EQ(GeluTanh(x).to_vector<float>(), y);
}

// Every f16 and bf16 bit pattern widens to the scalar conversion's bits, NaN payloads included
// (F16C quiets a signalling NaN; the scalar rule and the CUDA kernels keep its bits, and the
// H200 run of tests/tensor/cuda/elementwise_test caught the difference).
TEST(VecMath, WideningMatchesTheScalarConversionsForEveryPattern) {
  std::vector<uint16_t> bits(65536);
  for (int i = 0; i < 65536; ++i) bits[i] = static_cast<uint16_t>(i);
  std::vector<float> half(65536), bf16(65536);
  cpu::HalfBitsToF32(bits.data(), half.data(), 65536);
  cpu::BFloat16BitsToF32(bits.data(), bf16.data(), 65536);
  for (int i = 0; i < 65536; ++i) {
    ASSERT_EQ(FloatBits(half[i]), FloatBits(HalfBitsToFloat(bits[i]))) << std::hex << i;
    ASSERT_EQ(FloatBits(bf16[i]), FloatBits(BFloat16BitsToFloat(bits[i]))) << std::hex << i;
  }
}

// Rounding to f16/bf16 gives the scalar conversion's bits: ties to even, subnormals, overflow to
// inf, NaNs with their sign and payload (signalling ones too); over the edges and 2^20 random
// f32 patterns (about 2^12 of them NaNs), at every tail length.
TEST(VecMath, RoundingMatchesTheScalarConversions) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          kInf,
                          -kInf,
                          kNaN,
                          -kNaN,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          1.0f + 0x1p-11f,
                          1.0f + 0x1p-10f + 0x1p-11f,
                          0x1p-24f,
                          0x1p-25f,
                          0x1.8p-25f,
                          0x1p-26f,
                          6.0e-8f,
                          3.4e38f,
                          -3.4e38f,
                          1.0f + 0x1p-8f,
                          1.0f + 0x1p-7f + 0x1p-8f,
                          1.17e-38f,
                          1e-45f,
                          BitsToFloat(0x7fa00000u),
                          BitsToFloat(0xff800001u)};
  Generator gen(9);
  for (int i = 0; i < (1 << 20); ++i) x.push_back(BitsToFloat(gen.NextU32()));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> half(n), bf16(n);
  for (int64_t len : {n, int64_t{1}, int64_t{7}, int64_t{23}}) {
    cpu::F32ToHalfBits(x.data(), half.data(), len);
    cpu::F32ToBFloat16Bits(x.data(), bf16.data(), len);
    for (int64_t i = 0; i < len; ++i) {
      ASSERT_EQ(half[i], FloatToHalfBits(x[i])) << std::hex << FloatBits(x[i]);
      ASSERT_EQ(bf16[i], FloatToBFloat16Bits(x[i])) << std::hex << FloatBits(x[i]);
    }
    // The one-pass rounding in place: the bits of the round trip through bf16.
    std::vector<float> rounded(x.begin(), x.begin() + len);
    cpu::RoundToBFloat16F32(rounded.data(), len);
    for (int64_t i = 0; i < len; ++i) {
      ASSERT_EQ(FloatBits(rounded[i]), FloatBits(BFloat16BitsToFloat(FloatToBFloat16Bits(x[i]))))
          << std::hex << FloatBits(x[i]);
    }
  }
  // Blocks of strided rows (an attention head: 16 of every 48 values), both ways.
  const int64_t rows = 1000, cols = 16, stride = 48;
  std::vector<uint16_t> strided(rows * stride, 0xabcd);
  cpu::F32RowsToBFloat16Bits(x.data(), rows, cols, strided.data(), stride);
  std::vector<float> widened(rows * cols);
  cpu::BFloat16BitsRowsToF32(strided.data(), stride, rows, cols, widened.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < stride; ++j) {
      const uint16_t want = j < cols ? FloatToBFloat16Bits(x[r * cols + j]) : 0xabcd;
      ASSERT_EQ(strided[r * stride + j], want) << r << ", " << j;
    }
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_EQ(FloatBits(widened[r * cols + j]),
                FloatBits(BFloat16BitsToFloat(strided[r * stride + j])));
    }
  }
}

}  // namespace
}  // namespace tg

namespace tg::cpu {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The FP8 decode and the scaled cast in vectors give tensor/float8.h's scalar results bit for
// bit: every code of both formats (in vector lanes and in the scalar tail), and a cast of every
// f16-representable float times scales, including 1 (NaN, inf, subnormals and saturation).
TEST(VecMath, Fp8DecodeAndCastMatchTheScalarRules) {
  std::vector<uint8_t> codes(256 + 3);
  for (int i = 0; i < 259; ++i) codes[i] = static_cast<uint8_t>(i % 256);
  std::vector<float> decoded(codes.size());
  for (bool e4m3 : {true, false}) {
    Fp8ToF32(codes.data(), decoded.data(), static_cast<int64_t>(codes.size()), e4m3);
    for (size_t i = 0; i < codes.size(); ++i) {
      const float want = e4m3 ? E4M3BitsToFloat(codes[i]) : E5M2BitsToFloat(codes[i]);
      ASSERT_EQ(Bits(decoded[i]), Bits(want)) << (e4m3 ? "e4m3 " : "e5m2 ") << i;
    }
  }
  std::vector<float> x(65536 + 5);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(Half::FromBits(static_cast<uint16_t>(i % 65536)));
  }
  std::vector<uint8_t> out(x.size());
  for (bool e4m3 : {true, false}) {
    for (float scale : {1.0f, 0.3f, 1024.0f}) {
      ScaleToFp8F32(x.data(), scale, out.data(), static_cast<int64_t>(x.size()), e4m3);
      for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t want = e4m3 ? FloatToE4M3Bits(x[i] * scale) : FloatToE5M2Bits(x[i] * scale);
        ASSERT_EQ(out[i], want) << (e4m3 ? "e4m3 " : "e5m2 ") << "scale " << scale << " i " << i;
      }
    }
  }
}

// SmallGemmF32 against the rule it states: each element the sum over k in order, one fused
// multiply-add per term from 0, then C added -- bit for bit on targets with FMA (std::fma is the
// reference), within rounding on the others. Every transposition, row and column counts around
// the 4-row and 2-vector blocks and their tails, k = 0, and accumulation.
TEST(VecMath, SmallGemmIsEachElementsInOrderSumOfFusedTerms) {
  const std::string target = cpu::VecMathTarget();
  const bool fma = target.rfind("AVX2", 0) == 0 || target.rfind("AVX3", 0) == 0;
  Generator gen(5);
  auto values = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(gen.NextU32() % 2001) / 256.0f - 3.9f;
    return v;
  };
  for (int64_t m : {1, 3, 4, 5, 9}) {
    for (int64_t n : {1, 7, 8, 9, 16, 17, 33, 64, 65}) {
      for (int64_t k : {0, 1, 16, 37}) {
        for (int layout = 0; layout < 8; ++layout) {
          const bool ta = layout & 1, tb = layout & 2, accumulate = layout & 4;
          // Leading dimensions wider than the rows, so that strides are exercised.
          const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
          const std::vector<float> a = values((ta ? k : m) * lda + 1);
          const std::vector<float> b = values((tb ? n : k) * ldb + 1);
          std::vector<float> c = values(m * ldc), want = c;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              float sum = 0;
              for (int64_t p = 0; p < k; ++p) {
                sum = std::fma(ta ? a[p * lda + i] : a[i * lda + p],
                               tb ? b[j * ldb + p] : b[p * ldb + j], sum);
              }
              float& w = want[static_cast<size_t>(i * ldc + j)];
              w = accumulate ? w + sum : sum;
            }
          }
          cpu::SmallGemmF32(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc,
                            accumulate);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(i * ldc + j);
              if (fma || j >= n) {
                // Past column n the row is untouched.
                ASSERT_EQ(FloatBits(c[at]), FloatBits(want[at]))
                    << "m " << m << " n " << n << " k " << k << " layout " << layout << " at (" << i
                    << ", " << j << ") on " << target;
              } else {
                ASSERT_NEAR(c[at], want[at], 1e-4 * (std::abs(want[at]) + k))
                    << "m " << m << " n " << n << " k " << k << " on " << target;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tg::cpu
