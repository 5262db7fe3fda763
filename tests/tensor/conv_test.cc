// Tests of Conv2d / Conv2dBackward / MaxPool2d / MaxPool2dBackward (tensor/ops.h).
//
// Convolution is checked against a direct six-loop f64 reference (forward, and the three
// gradients) over strides, paddings, dilations, non-square kernels, batches, with and without
// bias, including a batch large enough to be split into several im2col chunks; plus exact values
// of tiny hand-computed cases. Max pooling is checked against a reference loop (values and
// indices exactly), with ties (first maximum), padding (never selected), -inf and NaN windows.
//
// Tolerances: f64 1e-12 and f32 1e-5 relative to the largest reference magnitude. f16/bf16
// accumulate in f32 and round once, so their conv results must be the f32 results of the same
// (rounded) inputs rounded once to the low dtype, up to one unit in the last place of the low
// type: bf16 runs oneDNN's own bf16 kernels, whose f32 sums may be added in another order than
// the f32 kernel's (f16 computes on f32 copies through the f32 kernel, so it is bit for bit);
// grad_bias (summed in f64) must be within one unit in the last place of the low type. Against the f64 reference the low types are
// within 2^-10 (f16) and 2^-7 (bf16) of the largest magnitude. Pooling selects elements, so it is
// exact in every dtype.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

#define EXPECT_ERROR_CONTAINS(stmt, text) \
  EXPECT_TRUE(::tg::testing::ThrowsError([&] { (void)(stmt); }, text))

std::vector<double> Values(const RawTensor& t) { return t.to_vector<double>(); }

// ---- The direct reference --------------------------------------------------------------------

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Conv2dParams p;
  bool bias;
  std::string Name() const {
    return absl::StrCat("x [", n, ", ", c, ", ", h, ", ", w, "] w [", o, ", ", c, ", ", kh, ", ",
                        kw, "] stride ", ShapeToString(p.stride), " padding ",
                        ShapeToString(p.padding), " dilation ", ShapeToString(p.dilation),
                        bias ? " bias" : " no bias");
  }
  int64_t OutH() const {
    return (h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1) / p.stride[0] + 1;
  }
  int64_t OutW() const {
    return (w + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1) / p.stride[1] + 1;
  }
};

struct RefConv {
  std::vector<double> out, grad_input, grad_weight, grad_bias;
};

// Forward and, for the output gradient g, all three gradients, by direct summation in f64.
RefConv Reference(const ConvCase& k, const std::vector<double>& x, const std::vector<double>& w,
                  const std::vector<double>& b, const std::vector<double>& g) {
  const int64_t oh = k.OutH(), ow = k.OutW();
  RefConv r;
  r.out.assign(static_cast<size_t>(k.n * k.o * oh * ow), 0.0);
  r.grad_input.assign(x.size(), 0.0);
  r.grad_weight.assign(w.size(), 0.0);
  r.grad_bias.assign(static_cast<size_t>(k.o), 0.0);
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t o = 0; o < k.o; ++o) {
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          const size_t out_i = static_cast<size_t>(((n * k.o + o) * oh + oy) * ow + ox);
          double sum = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
          const double gv = g.empty() ? 0.0 : g[out_i];
          r.grad_bias[static_cast<size_t>(o)] += gv;
          for (int64_t c = 0; c < k.c; ++c) {
            for (int64_t i = 0; i < k.kh; ++i) {
              for (int64_t j = 0; j < k.kw; ++j) {
                const int64_t iy = oy * k.p.stride[0] - k.p.padding[0] + i * k.p.dilation[0];
                const int64_t ix = ox * k.p.stride[1] - k.p.padding[1] + j * k.p.dilation[1];
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const size_t xi = static_cast<size_t>(((n * k.c + c) * k.h + iy) * k.w + ix);
                const size_t wi = static_cast<size_t>(((o * k.c + c) * k.kh + i) * k.kw + j);
                sum += x[xi] * w[wi];
                r.grad_input[xi] += w[wi] * gv;
                r.grad_weight[wi] += x[xi] * gv;
              }
            }
          }
          r.out[out_i] = sum;
        }
      }
    }
  }
  return r;
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& ref, double rel,
                 const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 0;
  for (double v : ref) scale = std::max(scale, std::abs(v));
  const double tol = rel * scale + 1e-300;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - ref[i]) <= tol) && ++failures <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << ref[i]
                    << " (tolerance " << tol << ")";
    }
  }
}

// Values within one unit in the last place (of a type with `bits` fraction bits) of each other.
void ExpectWithinUlp(const std::vector<double>& got, const std::vector<double>& ref, int bits,
                     const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double big = std::max(std::abs(got[i]), std::abs(ref[i]));
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(big, 1e-30)) - bits);
    if (!(std::abs(got[i] - ref[i]) <= ulp) && ++failures <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << ref[i]
                    << " within one ulp (" << ulp << ")";
    }
  }
}

// Bitwise-equal values (NaN equal to NaN).
void ExpectSame(const std::vector<double>& got, const std::vector<double>& ref,
                const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));
    if (!same && ++failures <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << ref[i];
    }
  }
}

struct ConvInputs {
  RawTensor x, w, b, g;  // f64
};

ConvInputs MakeInputs(const ConvCase& k, uint64_t seed) {
  Generator gen(seed);
  ConvInputs in;
  in.x = RandUniform({k.n, k.c, k.h, k.w}, gen, -1, 1, kF64);
  in.w = RandUniform({k.o, k.c, k.kh, k.kw}, gen, -1, 1, kF64);
  if (k.bias) in.b = RandUniform({k.o}, gen, -1, 1, kF64);
  in.g = RandUniform({k.n, k.o, k.OutH(), k.OutW()}, gen, -1, 1, kF64);
  return in;
}

std::vector<ConvCase> Cases() {
  auto params = [](std::array<int64_t, 2> s, std::array<int64_t, 2> p, std::array<int64_t, 2> d) {
    Conv2dParams r;
    r.stride = s;
    r.padding = p;
    r.dilation = d;
    return r;
  };
  return {
      {2, 3, 7, 6, 4, 3, 3, params({1, 1}, {0, 0}, {1, 1}), true},
      {2, 3, 7, 6, 4, 3, 3, params({1, 1}, {1, 1}, {1, 1}), true},
      {3, 2, 9, 8, 5, 3, 2, params({2, 2}, {1, 0}, {1, 1}), true},   // non-square kernel
      {1, 2, 8, 9, 3, 2, 3, params({2, 1}, {2, 2}, {1, 1}), false},  // padding 2, no bias
      {2, 2, 9, 9, 3, 3, 3, params({1, 2}, {1, 2}, {2, 2}), true},   // dilation 2
      {2, 3, 10, 7, 2, 2, 3, params({2, 2}, {2, 1}, {2, 1}), false},
      {2, 1, 5, 5, 2, 5, 5, params({1, 1}, {0, 0}, {1, 1}), true},  // kernel = input: 1 x 1 out
      {2, 4, 6, 6, 3, 1, 1, params({1, 1}, {0, 0}, {1, 1}), true},  // 1 x 1 kernel
      {1, 1, 4, 5, 1, 3, 3, params({3, 3}, {2, 2}, {2, 1}), false},
      {4, 1, 6, 6, 2, 3, 3, params({1, 1}, {1, 1}, {1, 1}), true},  // one input channel
      {3, 2, 5, 1, 2, 3, 1, params({1, 1}, {1, 0}, {1, 1}), true},  // width 1
      // C*kh*kw > 32: one GEMM per chunk of images instead of one per image.
      {3, 5, 7, 6, 4, 3, 3, params({2, 1}, {1, 2}, {1, 2}), true},
      {2, 8, 6, 5, 3, 2, 3, params({1, 2}, {0, 1}, {2, 1}), false},
      {2, 40, 3, 3, 2, 1, 1, params({1, 1}, {0, 0}, {1, 1}), true},
  };
}

void CheckAgainstReference(const ConvCase& k, uint64_t seed) {
  SCOPED_TRACE(k.Name());
  const ConvInputs in = MakeInputs(k, seed);
  const RefConv ref = Reference(k, Values(in.x), Values(in.w),
                                k.bias ? Values(in.b) : std::vector<double>(), Values(in.g));
  for (DType dtype : {kF64, kF32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const double rel = dtype == kF64 ? 1e-12 : 1e-5;
    const RawTensor x = in.x.to(dtype), w = in.w.to(dtype), g = in.g.to(dtype);
    const RawTensor b = k.bias ? in.b.to(dtype) : RawTensor();
    const RawTensor out = Conv2d(x, w, b, k.p);
    ASSERT_EQ(out.shape(), (Shape{k.n, k.o, k.OutH(), k.OutW()}));
    EXPECT_EQ(out.dtype(), dtype);
    ExpectClose(Values(out), ref.out, rel, "output");
    const Conv2dGrads grads = Conv2dBackward(g, x, w, k.p);
    ASSERT_EQ(grads.grad_input.shape(), x.shape());
    ASSERT_EQ(grads.grad_weight.shape(), w.shape());
    ASSERT_EQ(grads.grad_bias.shape(), (Shape{k.o}));
    EXPECT_EQ(grads.grad_input.dtype(), dtype);
    ExpectClose(Values(grads.grad_input), ref.grad_input, rel, "grad_input");
    ExpectClose(Values(grads.grad_weight), ref.grad_weight, rel, "grad_weight");
    ExpectClose(Values(grads.grad_bias), ref.grad_bias, rel, "grad_bias");
  }
}

// ---- Convolution -----------------------------------------------------------------------------

TEST(Conv2d, MatchesDirectReferenceForwardAndBackward) {
  uint64_t seed = 10;
  for (const ConvCase& k : Cases()) CheckAgainstReference(k, ++seed);
}

TEST(Conv2d, BatchSplitIntoSeveralIm2colChunksMatchesReference) {
  // 16 * 3 * 3 * 32 * 32 = 147456 patch elements per image: the 2^20-element im2col budget holds
  // 7 images, so 30 images take five GEMMs, the last one narrower.
  Conv2dParams p;
  p.padding = {1, 1};
  CheckAgainstReference({30, 16, 32, 32, 4, 3, 3, p, true}, 77);
}

TEST(Conv2d, HandComputedValues) {
  const RawTensor x = RawTensor::FromVector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const RawTensor w = RawTensor::FromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2});
  const RawTensor b = RawTensor::FromVector<double>({0.5}, {1});
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const RawTensor xd = x.to(dtype), wd = w.to(dtype), bd = b.to(dtype);
    const RawTensor out = Conv2d(xd, wd, bd);
    EXPECT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_EQ(Values(out), (std::vector<double>{37.5, 47.5, 67.5, 77.5}));
    const Conv2dGrads grads = Conv2dBackward(RawTensor::Ones({1, 1, 2, 2}, dtype), xd, wd, {});
    EXPECT_EQ(Values(grads.grad_input), (std::vector<double>{1, 3, 2, 4, 10, 6, 3, 7, 4}));
    EXPECT_EQ(Values(grads.grad_weight), (std::vector<double>{12, 16, 24, 28}));
    EXPECT_EQ(Values(grads.grad_bias), (std::vector<double>{4}));

    // Padding 1, stride 2: the windows start at (-1, -1), (-1, 1), (1, -1) and (1, 1).
    Conv2dParams p;
    p.stride = {2, 2};
    p.padding = {1, 1};
    EXPECT_EQ(Values(Conv2d(xd, wd, RawTensor(), p)), (std::vector<double>{4, 18, 36, 77}));
    const RawTensor g = RawTensor::FromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2}, dtype);
    const Conv2dGrads padded = Conv2dBackward(g, xd, wd, p, true, true, false);
    // x[0][0] meets w[1][1] in window 0; x[0][1], x[0][2] meet w[1][0], w[1][1] in window 1, ...
    EXPECT_EQ(Values(padded.grad_input), (std::vector<double>{4, 6, 8, 6, 4, 8, 12, 12, 16}));
    // w[0][0] sees x[1][1] (window 3); w[1][1] sees x[0][0], x[0][2], x[2][0], x[2][2].
    EXPECT_EQ(Values(padded.grad_weight), (std::vector<double>{20, 36, 36, 64}));
    EXPECT_FALSE(padded.grad_bias.defined());
  }
}

TEST(Conv2d, OnlyTheRequestedGradientsAreComputed) {
  const ConvCase k{2, 3, 6, 5, 2, 3, 2, {}, true};
  const ConvInputs in = MakeInputs(k, 5);
  const Conv2dGrads all = Conv2dBackward(in.g, in.x, in.w, k.p);
  const Conv2dGrads input_only = Conv2dBackward(in.g, in.x, in.w, k.p, true, false, false);
  EXPECT_TRUE(input_only.grad_input.defined());
  EXPECT_FALSE(input_only.grad_weight.defined());
  EXPECT_FALSE(input_only.grad_bias.defined());
  EXPECT_EQ(Values(input_only.grad_input), Values(all.grad_input));
  const Conv2dGrads weight_only = Conv2dBackward(in.g, in.x, in.w, k.p, false, true, false);
  EXPECT_FALSE(weight_only.grad_input.defined());
  EXPECT_EQ(Values(weight_only.grad_weight), Values(all.grad_weight));
  const Conv2dGrads bias_only = Conv2dBackward(in.g, in.x, in.w, k.p, false, false, true);
  EXPECT_EQ(Values(bias_only.grad_bias), Values(all.grad_bias));
  const Conv2dGrads none = Conv2dBackward(in.g, in.x, in.w, k.p, false, false, false);
  EXPECT_FALSE(none.grad_input.defined() || none.grad_weight.defined() || none.grad_bias.defined());
}

TEST(Conv2d, NonContiguousInputsGiveTheSameNumbers) {
  const ConvCase k{2, 3, 6, 5, 4, 3, 2, {}, true};
  const ConvInputs in = MakeInputs(k, 6);
  // The same values through transposed storage: [N, C, W, H] transposed back to [N, C, H, W].
  const RawTensor xt = in.x.transpose(2, 3).contiguous().transpose(2, 3);
  const RawTensor wt = in.w.transpose(0, 1).contiguous().transpose(0, 1);
  const RawTensor gt = in.g.transpose(0, 1).contiguous().transpose(0, 1);
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_EQ(Values(Conv2d(xt, wt, in.b, k.p)), Values(Conv2d(in.x, in.w, in.b, k.p)));
  const Conv2dGrads a = Conv2dBackward(gt, xt, wt, k.p), r = Conv2dBackward(in.g, in.x, in.w, k.p);
  EXPECT_EQ(Values(a.grad_input), Values(r.grad_input));
  EXPECT_EQ(Values(a.grad_weight), Values(r.grad_weight));
  EXPECT_EQ(Values(a.grad_bias), Values(r.grad_bias));
}

TEST(Conv2d, EmptyBatchAndNoOutputChannels) {
  const RawTensor x = RawTensor::Zeros({0, 2, 5, 5}, kF32), w = RawTensor::Ones({3, 2, 3, 3}, kF32);
  EXPECT_EQ(Conv2d(x, w).shape(), (Shape{0, 3, 3, 3}));
  const Conv2dGrads g = Conv2dBackward(RawTensor::Zeros({0, 3, 3, 3}), x, w, {});
  EXPECT_EQ(g.grad_input.shape(), x.shape());
  EXPECT_EQ(Values(g.grad_weight), std::vector<double>(54, 0.0));
  EXPECT_EQ(Values(g.grad_bias), std::vector<double>(3, 0.0));
  // No input channels: the output is the bias.
  const RawTensor x0 = RawTensor::Zeros({2, 0, 4, 4}), w0 = RawTensor::Zeros({3, 0, 2, 2});
  const RawTensor b0 = RawTensor::FromVector<float>({1, 2, 3}, {3});
  const RawTensor out0 = Conv2d(x0, w0, b0);
  EXPECT_EQ(out0.shape(), (Shape{2, 3, 3, 3}));
  EXPECT_EQ(Values(tg::Sum(out0, {0, 2, 3})), (std::vector<double>{18, 36, 54}));
  const Conv2dGrads gb0 = Conv2dBackward(RawTensor::Ones({2, 3, 3, 3}), x0, w0, {});
  EXPECT_EQ(gb0.grad_input.numel(), 0);
  EXPECT_EQ(gb0.grad_weight.numel(), 0);
  EXPECT_EQ(Values(gb0.grad_bias), (std::vector<double>{18, 18, 18}));
  const RawTensor x1 = RawTensor::Ones({1, 2, 4, 4});
  EXPECT_EQ(Conv2d(x1, RawTensor::Zeros({0, 2, 3, 3})).shape(), (Shape{1, 0, 2, 2}));
  const Conv2dGrads g0 =
      Conv2dBackward(RawTensor::Zeros({1, 0, 2, 2}), x1, RawTensor::Zeros({0, 2, 3, 3}), {});
  EXPECT_EQ(Values(g0.grad_input), std::vector<double>(32, 0.0));
}

TEST(Conv2d, LowPrecisionEqualsTheF32ResultRoundedOnce) {
  uint64_t seed = 40;
  for (const ConvCase& k : Cases()) {
    const ConvInputs in = MakeInputs(k, ++seed);
    const RefConv ref64 = Reference(k, Values(in.x), Values(in.w),
                                    k.bias ? Values(in.b) : std::vector<double>(), Values(in.g));
    for (DType dtype : {kF16, kBF16}) {
      SCOPED_TRACE(k.Name() + " " + DTypeName(dtype));
      const RawTensor x = in.x.to(dtype), w = in.w.to(dtype), g = in.g.to(dtype);
      const RawTensor b = k.bias ? in.b.to(dtype) : RawTensor();
      auto f32 = [](const RawTensor& t) { return t.defined() ? t.to(kF32) : RawTensor(); };
      const RawTensor out = Conv2d(x, w, b, k.p);
      EXPECT_EQ(out.dtype(), dtype);
      const RawTensor out32 = Conv2d(f32(x), f32(w), f32(b), k.p);
      const int bits = dtype == kF16 ? 10 : 7;
      auto expect_rounded = [&](const RawTensor& low, const RawTensor& wide, const char* what) {
        if (dtype == kF16) {
          ExpectSame(Values(low), Values(wide.to(dtype)), what);
        } else {
          ExpectWithinUlp(Values(low), Values(wide.to(dtype)), bits, what);
        }
      };
      expect_rounded(out, out32, "output vs f32");
      const Conv2dGrads low = Conv2dBackward(g, x, w, k.p);
      const Conv2dGrads r32 = Conv2dBackward(f32(g), f32(x), f32(w), k.p);
      EXPECT_EQ(low.grad_input.dtype(), dtype);
      EXPECT_EQ(low.grad_weight.dtype(), dtype);
      EXPECT_EQ(low.grad_bias.dtype(), dtype);
      expect_rounded(low.grad_input, r32.grad_input, "grad_input vs f32");
      expect_rounded(low.grad_weight, r32.grad_weight, "grad_weight vs f32");
      // grad_bias is summed in f64 from the low-precision gradient: one ulp of the low type.
      const std::vector<double> gb = Values(low.grad_bias), gb32 = Values(r32.grad_bias);
      const double ulp = dtype == kF16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
      for (size_t i = 0; i < gb.size(); ++i) {
        EXPECT_LE(std::abs(gb[i] - gb32[i]), ulp * std::max(1.0, std::abs(gb32[i]))) << i;
      }
      // Against the f64 reference of the unrounded inputs: the documented tolerance.
      const double rel = dtype == kF16 ? std::ldexp(1.0, -10) * 4 : std::ldexp(1.0, -7) * 4;
      ExpectClose(Values(out), ref64.out, rel, "output vs f64");
      ExpectClose(Values(low.grad_input), ref64.grad_input, rel, "grad_input vs f64");
      ExpectClose(Values(low.grad_weight), ref64.grad_weight, rel, "grad_weight vs f64");
    }
  }
}

// Shapes that oneDNN runs with its blocked layouts (tensor/cpu/conv.cc): 16 and more channels
// (the CNN's 1 -> 32 and 32 -> 64), stride 2 with a last row and column no window reads (a
// negative right padding for oneDNN), dilation, 1 x 1, in every dtype against the f64 reference
// of the same (rounded) inputs. f64 takes the im2col + GEMM fallback (exact to 1e-12). The low
// types allow one rounding of the result (2^-8 relative for bf16, 2^-11 for f16, of the largest
// magnitude) plus 3e-4 for the f32 sums of up to 784 terms.
TEST(Conv2d, ChannelBlockedShapesInEveryDtypeMatchReference) {
  auto params = [](std::array<int64_t, 2> s, std::array<int64_t, 2> p, std::array<int64_t, 2> d) {
    Conv2dParams r;
    r.stride = s;
    r.padding = p;
    r.dilation = d;
    return r;
  };
  const std::vector<ConvCase> cases = {
      {4, 1, 28, 28, 32, 3, 3, params({1, 1}, {1, 1}, {1, 1}), true},
      {4, 32, 14, 14, 64, 3, 3, params({1, 1}, {1, 1}, {1, 1}), true},
      {3, 16, 15, 14, 32, 3, 3, params({2, 2}, {0, 0}, {1, 1}), false},
      {2, 24, 11, 12, 16, 3, 2, params({1, 2}, {2, 1}, {2, 1}), true},
      {5, 16, 8, 8, 48, 1, 1, params({1, 1}, {0, 0}, {1, 1}), true},
  };
  uint64_t seed = 90;
  for (const ConvCase& k : cases) {
    const ConvInputs in = MakeInputs(k, ++seed);
    for (DType dtype : {kF64, kF32, kBF16, kF16}) {
      SCOPED_TRACE(k.Name() + " " + DTypeName(dtype));
      const RawTensor x = in.x.to(dtype), w = in.w.to(dtype), g = in.g.to(dtype);
      const RawTensor b = k.bias ? in.b.to(dtype) : RawTensor();
      const RefConv ref = Reference(k, Values(x), Values(w),
                                    k.bias ? Values(b) : std::vector<double>(), Values(g));
      const double rel = dtype == kF64    ? 1e-12
                         : dtype == kF32  ? 1e-5
                         : dtype == kBF16 ? std::ldexp(1.0, -8) + 3e-4
                                          : std::ldexp(1.0, -11) + 3e-4;
      const RawTensor out = Conv2d(x, w, b, k.p);
      EXPECT_EQ(out.dtype(), dtype);
      ExpectClose(Values(out), ref.out, rel, "output");
      const Conv2dGrads grads = Conv2dBackward(g, x, w, k.p);
      ExpectClose(Values(grads.grad_input), ref.grad_input, rel, "grad_input");
      ExpectClose(Values(grads.grad_weight), ref.grad_weight, rel, "grad_weight");
      ExpectClose(Values(grads.grad_bias), ref.grad_bias, rel, "grad_bias");
      // The same thread count gives the same bits, call after call.
      ExpectSame(Values(Conv2d(x, w, b, k.p)), Values(out), "output, second call");
      const Conv2dGrads again = Conv2dBackward(g, x, w, k.p);
      ExpectSame(Values(again.grad_input), Values(grads.grad_input), "grad_input, second call");
      ExpectSame(Values(again.grad_weight), Values(grads.grad_weight), "grad_weight, second call");
      // Each gradient alone is the one computed with the others.
      const Conv2dGrads input_only = Conv2dBackward(g, x, w, k.p, true, false, false);
      ExpectSame(Values(input_only.grad_input), Values(grads.grad_input), "grad_input alone");
      const Conv2dGrads weight_only = Conv2dBackward(g, x, w, k.p, false, true, false);
      ExpectSame(Values(weight_only.grad_weight), Values(grads.grad_weight), "grad_weight alone");
    }
  }
}

TEST(Conv2d, Errors) {
  const RawTensor x = RawTensor::Zeros({2, 3, 5, 5}), w = RawTensor::Zeros({4, 3, 3, 3});
  EXPECT_ERROR_CONTAINS(Conv2d(RawTensor::Zeros({3, 5, 5}), w),
                        "conv2d: expected input [N, C, H, W], got shape [3, 5, 5]");
  EXPECT_ERROR_CONTAINS(Conv2d(x, RawTensor::Zeros({4, 3, 3})),
                        "conv2d: expected weight [O, C, kh, kw], got shape [4, 3, 3]");
  EXPECT_ERROR_CONTAINS(
      Conv2d(x, RawTensor::Zeros({4, 2, 3, 3})),
      "conv2d: input [2, 3, 5, 5] has 3 channels but weight [4, 2, 3, 3] expects 2");
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor::Zeros({3})),
                        "conv2d: bias of shape [3] does not match weight [4, 3, 3, 3] "
                        "(expected [4])");
  EXPECT_ERROR_CONTAINS(Conv2d(x, w.to(kF16)),
                        "conv2d: weight dtype f16 differs from input dtype f32");
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor::Zeros({4}, kF64)),
                        "conv2d: bias dtype f64 differs from input dtype f32");
  EXPECT_ERROR_CONTAINS(Conv2d(x.to(kI64), w.to(kI64)),
                        "conv2d: expected a floating dtype (f32, f64, f16, bf16), got i64");
  EXPECT_ERROR_CONTAINS(Conv2d(x, RawTensor::Zeros({4, 3, 6, 3})),
                        "conv2d: weight [4, 3, 6, 3] (kernel [6, 3]) is larger than the padded "
                        "input (input [2, 3, 5, 5], padding [0, 0])");
  Conv2dParams dilated;
  dilated.dilation = {3, 1};
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor(), dilated),
                        "conv2d: weight [4, 3, 3, 3] (kernel [3, 3]) is larger than the padded "
                        "input (input [2, 3, 5, 5], padding [0, 0], dilation [3, 1])");
  dilated.padding = {1, 0};  // 5 + 2 = 7 = 3 * 2 + 1: fits
  EXPECT_EQ(Conv2d(x, w, RawTensor(), dilated).shape(), (Shape{2, 4, 1, 3}));
  Conv2dParams bad;
  bad.stride = {0, 1};
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor(), bad),
                        "conv2d: stride must be positive, got [0, 1]");
  bad = {};
  bad.padding = {0, -1};
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor(), bad),
                        "conv2d: padding must be non-negative, got [0, -1]");
  bad = {};
  bad.dilation = {1, 0};
  EXPECT_ERROR_CONTAINS(Conv2d(x, w, RawTensor(), bad),
                        "conv2d: dilation must be positive, got [1, 0]");
  EXPECT_ERROR_CONTAINS(Conv2d(x, RawTensor::Zeros({4, 3, 0, 3})),
                        "conv2d: weight [4, 3, 0, 3] has an empty kernel");
  EXPECT_ERROR_CONTAINS(Conv2d(RawTensor(), w), "conv2d: the input is an undefined tensor");

  const RawTensor g = RawTensor::Zeros({2, 4, 3, 3});
  EXPECT_ERROR_CONTAINS(Conv2dBackward(RawTensor::Zeros({2, 4, 3, 2}), x, w, {}),
                        "conv2d_backward: gradient of shape [2, 4, 3, 2] does not match the "
                        "output shape [2, 4, 3, 3] of input [2, 3, 5, 5] and weight [4, 3, 3, 3]");
  EXPECT_ERROR_CONTAINS(Conv2dBackward(g.to(kF64), x, w, {}),
                        "conv2d_backward: gradient dtype f64 differs from input dtype f32");
  EXPECT_ERROR_CONTAINS(Conv2dBackward(g, x, RawTensor::Zeros({4, 2, 3, 3}), {}),
                        "conv2d_backward: input [2, 3, 5, 5] has 3 channels but weight "
                        "[4, 2, 3, 3] expects 2");
}

// ---- Max pooling -----------------------------------------------------------------------------

struct PoolRef {
  std::vector<double> out;
  std::vector<int64_t> indices;
};

// PyTorch's CPU rule: first strict maximum, every NaN replaces it; padding never selected.
PoolRef ReferencePool(const std::vector<double>& x, const Shape& s, std::array<int64_t, 2> k,
                      std::array<int64_t, 2> st, std::array<int64_t, 2> pad) {
  const int64_t oh = (s[2] + 2 * pad[0] - k[0]) / st[0] + 1;
  const int64_t ow = (s[3] + 2 * pad[1] - k[1]) / st[1] + 1;
  PoolRef r;
  for (int64_t p = 0; p < s[0] * s[1]; ++p) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        double best = -kInf;
        int64_t best_i = -1;
        for (int64_t i = 0; i < k[0]; ++i) {
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t y = oy * st[0] - pad[0] + i, xx = ox * st[1] - pad[1] + j;
            if (y < 0 || y >= s[2] || xx < 0 || xx >= s[3]) continue;
            const double v = x[static_cast<size_t>(p * s[2] * s[3] + y * s[3] + xx)];
            if (best_i < 0) best_i = y * s[3] + xx;
            if (v > best || std::isnan(v)) {
              best = v;
              best_i = y * s[3] + xx;
            }
          }
        }
        r.out.push_back(x[static_cast<size_t>(p * s[2] * s[3] + best_i)]);
        r.indices.push_back(best_i);
      }
    }
  }
  return r;
}

TEST(MaxPool2d, ValuesAndIndicesByHand) {
  const RawTensor x =
      RawTensor::FromVector<double>({1, 3, 2, 4, 5, 7, 6, 8, 9, 2, 1, 0, 3, 4, 5, 6}, {1, 1, 4, 4});
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const MaxPool2dResult r = MaxPool2d(x.to(dtype), {2, 2}, {2, 2});
    EXPECT_EQ(r.output.dtype(), dtype);
    EXPECT_EQ(r.indices.dtype(), kI64);
    EXPECT_EQ(r.output.shape(), (Shape{1, 1, 2, 2}));
    EXPECT_EQ(Values(r.output), (std::vector<double>{7, 8, 9, 6}));
    EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{5, 7, 8, 15}));
    const RawTensor g = RawTensor::FromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2}, dtype);
    EXPECT_EQ(Values(MaxPool2dBackward(g, r.indices, x.shape())),
              (std::vector<double>{0, 0, 0, 0, 0, 1, 0, 2, 3, 0, 0, 0, 0, 0, 0, 4}));
  }
}

TEST(MaxPool2d, TiesPickTheFirstMaximum) {
  const RawTensor x = RawTensor::FromVector<double>({5, 5, 1, 1, 5, 2, 1, 1}, {1, 1, 2, 4});
  const MaxPool2dResult r = MaxPool2d(x, {2, 2}, {2, 2});
  EXPECT_EQ(Values(r.output), (std::vector<double>{5, 1}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  // The gradient goes to the first maximum only.
  EXPECT_EQ(Values(MaxPool2dBackward(RawTensor::Ones({1, 1, 1, 2}, kF64), r.indices, x.shape())),
            (std::vector<double>{1, 0, 1, 0, 0, 0, 0, 0}));
}

TEST(MaxPool2d, PaddingIsNeverSelected) {
  // All negative: a zero padding would win; -inf padding does not.
  const RawTensor x =
      RawTensor::FromVector<double>({-1, -2, -3, -4, -5, -6, -7, -8, -9}, {1, 1, 3, 3});
  const MaxPool2dResult r = MaxPool2d(x, {3, 3}, {2, 2}, {1, 1});
  EXPECT_EQ(Values(r.output), (std::vector<double>{-1, -2, -4, -5}));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 3, 4}));
  // Overlapping windows: x[0][0] is no window's max except the first; x[1][1] (-5) the last.
  const RawTensor g = RawTensor::FromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2});
  EXPECT_EQ(Values(MaxPool2dBackward(g, r.indices, x.shape())),
            (std::vector<double>{1, 2, 0, 3, 4, 0, 0, 0, 0}));
}

TEST(MaxPool2d, OverlappingWindowsAccumulateTheGradient) {
  // The centre 9 is the max of all four 2 x 2 windows of stride 1.
  const RawTensor x = RawTensor::FromVector<double>({1, 2, 3, 4, 9, 5, 6, 7, 8}, {1, 1, 3, 3});
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const MaxPool2dResult r = MaxPool2d(x.to(dtype), {2, 2}, {1, 1});
    EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{4, 4, 4, 4}));
    // 0.1 + 0.2 + 0.3 + 0.4 in f32, rounded once to the low dtype.
    const RawTensor g = RawTensor::FromVector<double>({0.1, 0.2, 0.3, 0.4}, {1, 1, 2, 2}, dtype);
    const std::vector<double> gv = Values(g);
    const RawTensor grad = MaxPool2dBackward(g, r.indices, x.shape());
    EXPECT_EQ(grad.dtype(), dtype);
    double expected = gv[0] + gv[1] + gv[2] + gv[3];
    if (dtype != kF64) {
      float sum = 0;
      for (double v : gv) sum += static_cast<float>(v);
      expected = Values(RawTensor::Scalar(sum, kF32).to(dtype))[0];
    }
    EXPECT_EQ(Values(grad), (std::vector<double>{0, 0, 0, 0, expected, 0, 0, 0, 0}));
  }
}

TEST(MaxPool2d, InfinitiesAndNaN) {
  // An all -inf window selects its first element; a NaN is always selected, the last one when
  // there are several (PyTorch's CPU kernel).
  const RawTensor x = RawTensor::FromVector<double>(
      {-kInf, -kInf, 1, kNaN, -kInf, -kInf, 2, 3, kNaN, 1, kInf, 4, 2, kNaN, 5, kNaN},
      {1, 1, 4, 4});
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const MaxPool2dResult r = MaxPool2d(x.to(dtype), {2, 2}, {2, 2});
    ExpectSame(Values(r.output), {-kInf, kNaN, kNaN, kNaN}, "output");
    EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 13, 15}));
  }
}

TEST(MaxPool2d, MatchesReferenceOnRandomInputs) {
  struct PoolCase {
    Shape shape;
    std::array<int64_t, 2> k, s, p;
  };
  const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}}, {{2, 2, 7, 9}, {3, 3}, {2, 2}, {1, 1}},
      {{1, 3, 6, 5}, {3, 2}, {1, 1}, {1, 0}}, {{3, 1, 9, 4}, {2, 3}, {3, 1}, {0, 1}},
      {{1, 2, 5, 5}, {5, 5}, {1, 1}, {2, 2}}, {{2, 2, 4, 6}, {1, 1}, {2, 3}, {0, 0}},
  };
  Generator gen(3);
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.shape) + " kernel " + ShapeToString(c.k) + " stride " +
                 ShapeToString(c.s) + " padding " + ShapeToString(c.p));
    // Values on a coarse grid, so that ties occur and are exact in every dtype.
    std::vector<double> v = Values(RandUniform(c.shape, gen, -8, 8, kF64));
    for (double& e : v) e = std::floor(e);
    const RawTensor x = RawTensor::FromVector<double>(v, c.shape);
    const PoolRef ref = ReferencePool(v, c.shape, c.k, c.s, c.p);
    const RawTensor g =
        RandUniform(Shape{c.shape[0], c.shape[1], (c.shape[2] + 2 * c.p[0] - c.k[0]) / c.s[0] + 1,
                          (c.shape[3] + 2 * c.p[1] - c.k[1]) / c.s[1] + 1},
                    gen, -1, 1, kF64);
    std::vector<double> ref_grad(v.size(), 0.0);
    const std::vector<double> gv = Values(g);
    const int64_t plane = c.shape[2] * c.shape[3], out_plane = g.size(2) * g.size(3);
    for (size_t i = 0; i < gv.size(); ++i) {
      ref_grad[static_cast<size_t>(static_cast<int64_t>(i) / out_plane * plane + ref.indices[i])] +=
          gv[i];
    }
    for (DType dtype : {kF64, kF32, kF16, kBF16}) {
      SCOPED_TRACE(DTypeName(dtype));
      const MaxPool2dResult r = MaxPool2d(x.to(dtype), c.k, c.s, c.p);
      EXPECT_EQ(Values(r.output), ref.out);
      EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.indices);
    }
    ExpectClose(Values(MaxPool2dBackward(g, MaxPool2d(x, c.k, c.s, c.p).indices, c.shape)),
                ref_grad, 1e-15, "gradient");
  }
}

// The 2 x 2 windows without padding (one path of the kernel) at every stride, with NaNs at
// random places and ties, and the general path beside them, in every dtype: values (NaN or
// not), indices and the gradient exactly as the reference.
TEST(MaxPool2d, TwoByTwoAndGeneralWindowsWithNaNAndTies) {
  struct PoolCase {
    Shape shape;
    std::array<int64_t, 2> k, s, p;
  };
  const std::vector<PoolCase> cases = {
      {{2, 3, 28, 28}, {2, 2}, {2, 2}, {0, 0}}, {{3, 2, 9, 7}, {2, 2}, {2, 2}, {0, 0}},
      {{2, 2, 9, 8}, {2, 2}, {1, 1}, {0, 0}},   {{2, 2, 10, 11}, {2, 2}, {3, 2}, {0, 0}},
      {{2, 2, 9, 9}, {2, 2}, {2, 2}, {1, 1}},   {{2, 3, 12, 10}, {3, 3}, {2, 2}, {1, 1}},
      // Rows of 35 windows: whole vectors and a tail on every x86 target (4, 8 or 16 lanes).
      {{1, 2, 6, 71}, {2, 2}, {2, 2}, {0, 0}},
  };
  Generator gen(8);
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(ShapeToString(c.shape) + " kernel " + ShapeToString(c.k) + " stride " +
                 ShapeToString(c.s) + " padding " + ShapeToString(c.p));
    std::vector<double> v = Values(RandUniform(c.shape, gen, -4, 4, kF64));
    const std::vector<double> u = Values(RandUniform(c.shape, gen, 0, 1, kF64));
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = u[i] < 0.03 ? kNaN : std::floor(v[i]);  // coarse grid: ties, exact in every dtype
    }
    const RawTensor x = RawTensor::FromVector<double>(v, c.shape);
    const PoolRef ref = ReferencePool(v, c.shape, c.k, c.s, c.p);
    const int64_t oh = (c.shape[2] + 2 * c.p[0] - c.k[0]) / c.s[0] + 1;
    const int64_t ow = (c.shape[3] + 2 * c.p[1] - c.k[1]) / c.s[1] + 1;
    // Gradients on a grid of halves: the sums of overlapping windows are exact in every dtype.
    std::vector<double> gv = Values(RandUniform({c.shape[0], c.shape[1], oh, ow}, gen, -8, 8, kF64));
    for (double& e : gv) e = std::floor(e) / 2;
    const int64_t plane = c.shape[2] * c.shape[3], out_plane = oh * ow;
    std::vector<double> ref_grad(v.size(), 0.0);
    for (size_t i = 0; i < gv.size(); ++i) {
      ref_grad[static_cast<size_t>(static_cast<int64_t>(i) / out_plane * plane + ref.indices[i])] +=
          gv[i];
    }
    for (DType dtype : {kF64, kF32, kF16, kBF16}) {
      SCOPED_TRACE(DTypeName(dtype));
      const MaxPool2dResult r = MaxPool2d(x.to(dtype), c.k, c.s, c.p);
      ExpectSame(Values(r.output), ref.out, "output");
      EXPECT_EQ(r.indices.to_vector<int64_t>(), ref.indices);
      const RawTensor g = RawTensor::FromVector<double>(gv, r.indices.shape(), dtype);
      EXPECT_EQ(Values(MaxPool2dBackward(g, r.indices, c.shape)), ref_grad);
    }
  }
}

TEST(MaxPool2d, NonContiguousInput) {
  Generator gen(4);
  const RawTensor x = RandUniform({2, 3, 6, 5}, gen, -1, 1, kF64);
  const RawTensor xt = x.transpose(2, 3).contiguous().transpose(2, 3);
  const MaxPool2dResult a = MaxPool2d(xt, {2, 2}, {2, 1}, {1, 1});
  const MaxPool2dResult b = MaxPool2d(x, {2, 2}, {2, 1}, {1, 1});
  EXPECT_EQ(Values(a.output), Values(b.output));
  EXPECT_EQ(a.indices.to_vector<int64_t>(), b.indices.to_vector<int64_t>());
}

TEST(MaxPool2d, Errors) {
  const RawTensor x = RawTensor::Zeros({2, 3, 5, 5});
  EXPECT_ERROR_CONTAINS(MaxPool2d(RawTensor::Zeros({3, 5, 5}), {2, 2}, {2, 2}),
                        "max_pool2d: expected input [N, C, H, W], got shape [3, 5, 5]");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x, {0, 2}, {2, 2}),
                        "max_pool2d: kernel size must be positive, got [0, 2]");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x, {2, 2}, {2, 0}),
                        "max_pool2d: stride must be positive, got [2, 0]");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x, {2, 2}, {2, 2}, {-1, 0}),
                        "max_pool2d: padding must be non-negative, got [-1, 0]");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x, {3, 3}, {1, 1}, {2, 1}),
                        "max_pool2d: padding [2, 1] must be at most half the kernel size [3, 3]");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x, {6, 2}, {1, 1}),
                        "max_pool2d: kernel [6, 2] is larger than the padded input (input "
                        "[2, 3, 5, 5], padding [0, 0])");
  EXPECT_ERROR_CONTAINS(MaxPool2d(x.to(kI32), {2, 2}, {2, 2}),
                        "max_pool2d: expected a floating dtype (f32, f64, f16, bf16), got i32");

  const MaxPool2dResult r = MaxPool2d(x, {2, 2}, {2, 2});
  const RawTensor g = RawTensor::Zeros({2, 3, 2, 2});
  EXPECT_ERROR_CONTAINS(MaxPool2dBackward(g, r.indices.to(kI32), x.shape()),
                        "max_pool2d_backward: expected i64 indices, got i32");
  EXPECT_ERROR_CONTAINS(MaxPool2dBackward(RawTensor::Zeros({2, 3, 2, 1}), r.indices, x.shape()),
                        "max_pool2d_backward: gradient of shape [2, 3, 2, 1] and indices of "
                        "shape [2, 3, 2, 2] must be one [N, C, Ho, Wo] shape");
  EXPECT_ERROR_CONTAINS(MaxPool2dBackward(g, r.indices, {2, 4, 5, 5}),
                        "max_pool2d_backward: input shape [2, 4, 5, 5] does not match gradient "
                        "of shape [2, 3, 2, 2] (expected [2, 3, H, W])");
  EXPECT_ERROR_CONTAINS(MaxPool2dBackward(g, r.indices, {2, 3, 2, 2}),
                        "max_pool2d_backward: index 10 at position 2 is out of range for an input "
                        "plane of 2 x 2 elements");
  EXPECT_ERROR_CONTAINS(MaxPool2dBackward(g, RawTensor::Full({2, 3, 2, 2}, -1, kI64), x.shape()),
                        "max_pool2d_backward: index -1 at position 0 is out of range");
}

}  // namespace
}  // namespace tg
