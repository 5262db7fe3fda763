// Tests of the fused ops of tensor/ops.h on the CPU: Linear (+ GELU) and LinearBackward,
// ScaledDotProductAttention and its backward, LayerNormBackward and CrossEntropyWithGrad.
//
// Forward values are checked against straightforward f64 loops over the inputs' values (after
// rounding to their dtype), backward values in f64 against central finite differences of the
// forward op, and the f32/f16/bf16 gradients against the f64 op on the same values. The error
// text for bad shapes, dtypes and devices is pinned exactly. tests/tensor/op_table_test.cc
// compares the CUDA implementations with these.
//
// Tolerances, relative to the largest reference magnitude of the output (products and sums
// cancel, so an element's error follows the magnitudes summed into it, not its own value):
// f64 1e-12 (a few roundings of 2^-53); f32 1e-5 (f32 accumulation over at most a few dozen
// terms); f16 and bf16 results are the f32 computation rounded once (half an ulp: 2^-11 and
// 2^-8 relative) plus, where the op rounds an intermediate to the dtype (attention's
// probabilities, the pre-activation gradient of Linear), that intermediate's half ulp again.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/composed.h"
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

#define EXPECT_ERROR(stmt, text) \
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly([&] { (void)(stmt); }, text))

const std::vector<DType> kFloatTypes = {kF64, kF32, kF16, kBF16};

// ---- Comparing with references ----------------------------------------------------------------

struct Tol {
  double rtol;  // of each element's own reference value
  double atol;  // of the largest reference magnitude of the output (at least 1)
};

// One rounding of the f32 (f64) computation to the output dtype.
Tol OutputTol(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return {1e-12, 1e-12};
    case DType::kF32:
      return {1e-5, 1e-5};
    case DType::kF16:
      return {1e-3, 1e-3};  // half an ulp is 2^-11 relative; 2^-10 with the f32 error
    default:
      return {8e-3, 8e-3};  // bf16: half an ulp is 2^-8
  }
}

// Two roundings to the dtype in sequence (an intermediate and the output).
Tol TwoRoundingsTol(DType dtype) {
  const Tol t = OutputTol(dtype);
  return {2 * t.rtol, 2 * t.atol};
}

void ExpectClose(const RawTensor& got, const std::vector<double>& want, Tol tol,
                 const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  const std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size()) << what;
  double scale = 1;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double bound = tol.rtol * std::abs(want[i]) + tol.atol * scale;
    if (!(std::abs(g[i] - want[i]) <= bound) && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << g[i] << ", want " << want[i] << " (bound "
                    << bound << ")";
    }
  }
}

void ExpectClose(const RawTensor& got, const RawTensor& want, Tol tol, const std::string& what) {
  ASSERT_TRUE(want.defined()) << what;
  EXPECT_EQ(got.shape(), want.shape()) << what;
  ExpectClose(got, want.to_vector<double>(), tol, what);
}

std::string Name(const char* what, DType dtype) {
  return std::string(what) + " " + DTypeName(dtype);
}

// ---- f64 references ---------------------------------------------------------------------------

double GeluTanhRef(double x) {
  const double k = 0.7978845608028654;  // sqrt(2 / pi)
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// pre [m, n] = x [m, k] w^T + b, out = act(pre).
struct LinearRef {
  std::vector<double> out, pre;
};
LinearRef LinearReference(const std::vector<double>& x, const std::vector<double>& w,
                          const std::vector<double>& b, int64_t m, int64_t k, int64_t n,
                          bool gelu) {
  LinearRef r;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = b.empty() ? 0 : b[j];
      for (int64_t l = 0; l < k; ++l) s += x[i * k + l] * w[j * k + l];
      r.pre.push_back(s);
      r.out.push_back(gelu ? GeluTanhRef(s) : s);
    }
  }
  return r;
}

// out [B, H, Tq, D] and the log-sum-exp stats [B, H, Tq] of softmax(scale q k^T + mask) v.
struct AttentionRef {
  std::vector<double> out, lse;
};
AttentionRef AttentionReference(const RawTensor& q, const RawTensor& k, const RawTensor& v,
                                bool causal, double scale) {
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(),
                            vv = v.to_vector<double>();
  const int64_t bh = q.size(0) * q.size(1), tq = q.size(2), tk = k.size(2), d = q.size(3);
  AttentionRef r;
  for (int64_t z = 0; z < bh; ++z) {
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> s(static_cast<size_t>(tk));
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qv[(z * tq + i) * d + c] * kv[(z * tk + j) * d + c];
        s[j] = causal && j > i ? -std::numeric_limits<double>::infinity() : scale * dot;
        max = std::max(max, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < tk; ++j) sum += std::exp(s[j] - max);
      const double lse = max + std::log(sum);
      r.lse.push_back(lse);
      for (int64_t c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = 0; j < tk; ++j) o += std::exp(s[j] - lse) * vv[(z * tk + j) * d + c];
        r.out.push_back(o);
      }
    }
  }
  return r;
}

// Sum of a .* b over all elements, in f64.
double Dot(const RawTensor& a, const RawTensor& b) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  EXPECT_EQ(av.size(), bv.size());
  double s = 0;
  for (size_t i = 0; i < av.size(); ++i) s += av[i] * bv[i];
  return s;
}

// Central differences of loss() with respect to every element of `param` (a contiguous f64
// tensor that loss() reads).
std::vector<double> NumericGrad(const RawTensor& param, const std::function<double()>& loss) {
  EXPECT_TRUE(param.dtype() == kF64 && param.is_contiguous());
  double* p = param.data<double>();
  const double h = 1e-6;
  std::vector<double> grad(static_cast<size_t>(param.numel()));
  for (int64_t i = 0; i < param.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

// Finite differences in f64 carry h^2 truncation and eps/h cancellation: ~1e-9 of the scale.
constexpr Tol kFiniteDifferenceTol = {1e-6, 1e-7};

RawTensor Randn(const Shape& shape, Generator& gen, DType dtype = kF64, double stddev = 1) {
  return RandNormal(shape, gen, 0, stddev, dtype);
}

// ---- Linear -----------------------------------------------------------------------------------

TEST(LinearTest, MatchesTheReferenceInEveryDtype) {
  Generator gen(1);
  for (DType dtype : kFloatTypes) {
    for (bool gelu : {false, true}) {
      for (bool with_bias : {false, true}) {
        // x [2, 3, 5] (m = 6 rows), weight [4, 5]: n is not a multiple of 8 (CUDA pads aux).
        const RawTensor x = Randn({2, 3, 5}, gen, dtype);
        const RawTensor w = Randn({4, 5}, gen, dtype, 0.5);
        const RawTensor b = with_bias ? Randn({4}, gen, dtype) : RawTensor();
        const Activation act = gelu ? Activation::kGeluTanh : Activation::kNone;
        const LinearResult r = Linear(x, w, b, act);
        const LinearRef ref = LinearReference(
            x.to_vector<double>(), w.to_vector<double>(),
            with_bias ? b.to_vector<double>() : std::vector<double>(), 6, 5, 4, gelu);
        const std::string what = Name(gelu ? "gelu" : "none", dtype) + (with_bias ? " bias" : "");
        EXPECT_EQ(r.output.shape(), (Shape{2, 3, 4})) << what;
        EXPECT_EQ(r.output.dtype(), dtype) << what;
        ExpectClose(r.output, ref.out, OutputTol(dtype), "output " + what);
        EXPECT_EQ(r.pre_activation.defined(), gelu) << what;
        if (gelu) {
          EXPECT_EQ(r.pre_activation.shape(), (Shape{2, 3, 4})) << what;
          ExpectClose(r.pre_activation, ref.pre, OutputTol(dtype), "pre " + what);
        }
      }
    }
  }
}

TEST(LinearTest, GeluReadsTheUnroundedPreActivation) {
  // f16: gelu(pre) rounded once, not gelu(round(pre)). pre = 1.5 + 2^-10 + 2^-12 is not an f16
  // value (it rounds to 1.5 + 2^-10), and the two orders give different f16 outputs.
  const RawTensor x = RawTensor::FromVector<double>({1.5}, {1, 1}).to(kF16);
  const RawTensor w = RawTensor::FromVector<double>({1.0}, {1, 1}).to(kF16);
  const RawTensor b = RawTensor::FromVector<double>({0.0009765625 + 0.000244140625}, {1}).to(kF16);
  const LinearResult r = Linear(x, w, b, Activation::kGeluTanh);
  const double pre = 1.5 + b.item();
  const auto to_f16 = [](double v) { return RawTensor::Scalar(v, kF64).to(kF16).item(); };
  ASSERT_NE(to_f16(GeluTanhRef(pre)), to_f16(GeluTanhRef(to_f16(pre))));
  EXPECT_EQ(r.output.item(), to_f16(GeluTanhRef(pre)));
  EXPECT_EQ(r.pre_activation.item(), to_f16(pre));
}

TEST(LinearTest, NonContiguousInputsAndWeights) {
  Generator gen(2);
  const RawTensor x_base = Randn({5, 6}, gen, kF32);            // x = its transpose [6, 5]
  const RawTensor w_base = Randn({5, 4}, gen, kF32);            // weight = its transpose [4, 5]
  const RawTensor b = Randn({8}, gen, kF32).slice(0, 0, 8, 2);  // stepped bias [4]
  const RawTensor x = x_base.transpose(0, 1), w = w_base.transpose(0, 1);
  const LinearResult r = Linear(x, w, b, Activation::kGeluTanh);
  const LinearRef ref = LinearReference(x.to_vector<double>(), w.to_vector<double>(),
                                        b.to_vector<double>(), 6, 5, 4, true);
  ExpectClose(r.output, ref.out, OutputTol(kF32), "output");
  ExpectClose(r.pre_activation, ref.pre, OutputTol(kF32), "pre");
}

TEST(LinearTest, EmptyInputsAndAnEmptyReduction) {
  const RawTensor w = RawTensor::Ones({3, 2});
  const LinearResult r = Linear(RawTensor::Zeros({0, 2}), w, RawTensor::Ones({3}));
  EXPECT_EQ(r.output.shape(), (Shape{0, 3}));
  // in_features == 0: the product is empty and the output is the bias.
  const LinearResult e =
      Linear(RawTensor::Zeros({2, 0}), RawTensor::Zeros({3, 0}), RawTensor::Full({3}, 2.0));
  EXPECT_EQ(e.output.to_vector<double>(), std::vector<double>(6, 2.0));
}

TEST(LinearBackwardTest, MatchesFiniteDifferencesInF64) {
  Generator gen(3);
  for (bool gelu : {false, true}) {
    const Activation act = gelu ? Activation::kGeluTanh : Activation::kNone;
    const RawTensor x = Randn({2, 3, 5}, gen), w = Randn({4, 5}, gen, kF64, 0.5);
    const RawTensor b = Randn({4}, gen), go = Randn({2, 3, 4}, gen);
    const auto loss = [&] { return Dot(go, Linear(x, w, b, act).output); };
    const LinearResult fwd = Linear(x, w, b, act);
    const LinearGrads g = LinearBackward(go, x, w, fwd.pre_activation, act);
    const std::string what = gelu ? " gelu" : " none";
    EXPECT_EQ(g.grad_input.shape(), x.shape());
    ExpectClose(g.grad_input, NumericGrad(x, loss), kFiniteDifferenceTol, "grad_input" + what);
    ExpectClose(g.grad_weight, NumericGrad(w, loss), kFiniteDifferenceTol, "grad_weight" + what);
    ExpectClose(g.grad_bias, NumericGrad(b, loss), kFiniteDifferenceTol, "grad_bias" + what);
  }
}

TEST(LinearBackwardTest, LowPrecisionMatchesF64OnTheSameValues) {
  Generator gen(4);
  for (DType dtype : {kF32, kF16, kBF16}) {
    for (bool gelu : {false, true}) {
      const Activation act = gelu ? Activation::kGeluTanh : Activation::kNone;
      const RawTensor x = Randn({6, 5}, gen, dtype), w = Randn({4, 5}, gen, dtype, 0.5);
      const RawTensor b = Randn({4}, gen, dtype), go = Randn({6, 4}, gen, dtype);
      const LinearResult fwd = Linear(x, w, b, act);
      const LinearGrads g = LinearBackward(go, x, w, fwd.pre_activation, act);
      // The reference: the f64 op on the same (rounded) values, from the f64 pre-activation.
      const LinearResult fwd64 = Linear(x.to(kF64), w.to(kF64), b.to(kF64), act);
      const LinearGrads want =
          LinearBackward(go.to(kF64), x.to(kF64), w.to(kF64), fwd64.pre_activation, act);
      const std::string what = Name(gelu ? "gelu" : "none", dtype);
      // g is rounded to the dtype before the products, and each product rounds once.
      const Tol tol = TwoRoundingsTol(dtype);
      EXPECT_EQ(g.grad_input.dtype(), dtype);
      ExpectClose(g.grad_input, want.grad_input, tol, "grad_input " + what);
      ExpectClose(g.grad_weight, want.grad_weight, tol, "grad_weight " + what);
      ExpectClose(g.grad_bias, want.grad_bias, tol, "grad_bias " + what);
    }
  }
}

TEST(LinearBackwardTest, OnlyTheRequestedGradients) {
  Generator gen(5);
  const RawTensor x = Randn({3, 2}, gen), w = Randn({4, 2}, gen), go = Randn({3, 4}, gen);
  const LinearGrads none =
      LinearBackward(go, x, w, RawTensor(), Activation::kNone, false, false, false);
  EXPECT_FALSE(none.grad_input.defined() || none.grad_weight.defined() || none.grad_bias.defined());
  const LinearGrads bias_only =
      LinearBackward(go, x, w, RawTensor(), Activation::kNone, false, false, true);
  EXPECT_FALSE(bias_only.grad_input.defined() || bias_only.grad_weight.defined());
  ExpectClose(bias_only.grad_bias, Sum(go, {0}), OutputTol(kF64), "grad_bias");
}

// ---- Scaled dot-product attention ---------------------------------------------------------------

struct AttentionCase {
  int64_t b, h, tq, tk, d;
  bool causal;
};
const AttentionCase kAttentionCases[] = {
    {2, 3, 5, 5, 4, false}, {2, 3, 5, 5, 4, true}, {1, 2, 3, 6, 8, false}, {1, 1, 1, 1, 2, true}};

TEST(AttentionTest, MatchesTheReferenceInEveryDtype) {
  Generator gen(6);
  for (DType dtype : kFloatTypes) {
    for (const AttentionCase& c : kAttentionCases) {
      const RawTensor q = Randn({c.b, c.h, c.tq, c.d}, gen, dtype);
      const RawTensor k = Randn({c.b, c.h, c.tk, c.d}, gen, dtype);
      const RawTensor v = Randn({c.b, c.h, c.tk, c.d}, gen, dtype);
      const double scale = 1 / std::sqrt(static_cast<double>(c.d));
      const AttentionResult r = ScaledDotProductAttention(q, k, v, c.causal, scale);
      const AttentionRef ref = AttentionReference(q, k, v, c.causal, scale);
      const std::string what =
          Name(c.causal ? "causal" : "full", dtype) + " tq " + std::to_string(c.tq);
      EXPECT_EQ(r.output.shape(), q.shape()) << what;
      EXPECT_EQ(r.output.dtype(), dtype) << what;
      EXPECT_EQ(r.stats.shape(), (Shape{c.b, c.h, c.tq})) << what;
      EXPECT_EQ(r.stats.dtype(), dtype == kF64 ? kF64 : kF32) << what;
      // The probabilities are rounded to the dtype before they multiply v.
      ExpectClose(r.output, ref.out, TwoRoundingsTol(dtype), "output " + what);
      ExpectClose(r.stats, ref.lse, OutputTol(dtype == kF64 ? kF64 : kF32), "stats " + what);
    }
  }
}

TEST(AttentionTest, IsStableForLargeScores) {
  // Scores of +-1e4 overflow exp() unless the maximum is subtracted first.
  const RawTensor q = RawTensor::FromVector<double>({100, 0, -100, 0}, {1, 1, 2, 2}).to(kF32);
  const RawTensor k = RawTensor::FromVector<double>({100, 0, 99, 0}, {1, 1, 2, 2}).to(kF32);
  const RawTensor v = RawTensor::FromVector<double>({1, 2, 3, 4}, {1, 1, 2, 2}).to(kF32);
  const AttentionResult r = ScaledDotProductAttention(q, k, v, false, 1.0);
  const AttentionRef ref = AttentionReference(q, k, v, false, 1.0);
  ExpectClose(r.output, ref.out, OutputTol(kF32), "output");
  ExpectClose(r.stats, ref.lse, OutputTol(kF32), "stats");
}

TEST(AttentionTest, NonContiguousHeads) {
  // Heads sliced out of a [B, T, 3, H, D] projection, as a transformer block does.
  Generator gen(7);
  const RawTensor qkv = Randn({2, 4, 3, 2, 8}, gen, kF32);
  const RawTensor q = qkv.select(2, 0).permute({0, 2, 1, 3});
  const RawTensor k = qkv.select(2, 1).permute({0, 2, 1, 3});
  const RawTensor v = qkv.select(2, 2).permute({0, 2, 1, 3});
  ASSERT_FALSE(q.is_contiguous());
  const AttentionResult r = ScaledDotProductAttention(q, k, v, true, 0.25);
  const AttentionRef ref = AttentionReference(q, k, v, true, 0.25);
  ExpectClose(r.output, ref.out, OutputTol(kF32), "output");
  const AttentionGrads g = ScaledDotProductAttentionBackward(RawTensor::Ones(q.shape()), q, k, v,
                                                             r.output, r.stats, true, 0.25);
  const AttentionGrads want = ScaledDotProductAttentionBackward(
      RawTensor::Ones(q.shape(), kF64), q.to(kF64), k.to(kF64), v.to(kF64),
      ScaledDotProductAttention(q.to(kF64), k.to(kF64), v.to(kF64), true, 0.25).output,
      ScaledDotProductAttention(q.to(kF64), k.to(kF64), v.to(kF64), true, 0.25).stats, true, 0.25);
  ExpectClose(g.grad_q, want.grad_q, TwoRoundingsTol(kF32), "grad_q");
  ExpectClose(g.grad_k, want.grad_k, TwoRoundingsTol(kF32), "grad_k");
  ExpectClose(g.grad_v, want.grad_v, TwoRoundingsTol(kF32), "grad_v");
}

TEST(AttentionBackwardTest, MatchesFiniteDifferencesInF64) {
  Generator gen(8);
  for (const AttentionCase& c : kAttentionCases) {
    const RawTensor q = Randn({c.b, c.h, c.tq, c.d}, gen), k = Randn({c.b, c.h, c.tk, c.d}, gen);
    const RawTensor v = Randn({c.b, c.h, c.tk, c.d}, gen), go = Randn({c.b, c.h, c.tq, c.d}, gen);
    const double scale = 0.7;
    const auto loss = [&] {
      return Dot(go, ScaledDotProductAttention(q, k, v, c.causal, scale).output);
    };
    const AttentionResult fwd = ScaledDotProductAttention(q, k, v, c.causal, scale);
    const AttentionGrads g =
        ScaledDotProductAttentionBackward(go, q, k, v, fwd.output, fwd.stats, c.causal, scale);
    const std::string what = std::string(c.causal ? " causal" : " full") + " tq " +
                             std::to_string(c.tq) + " tk " + std::to_string(c.tk);
    ExpectClose(g.grad_q, NumericGrad(q, loss), kFiniteDifferenceTol, "grad_q" + what);
    ExpectClose(g.grad_k, NumericGrad(k, loss), kFiniteDifferenceTol, "grad_k" + what);
    ExpectClose(g.grad_v, NumericGrad(v, loss), kFiniteDifferenceTol, "grad_v" + what);
  }
}

TEST(AttentionBackwardTest, LowPrecisionMatchesF64OnTheSameValues) {
  Generator gen(9);
  for (DType dtype : {kF32, kF16, kBF16}) {
    for (bool causal : {false, true}) {
      const RawTensor q = Randn({2, 2, 6, 8}, gen, dtype), k = Randn({2, 2, 6, 8}, gen, dtype);
      const RawTensor v = Randn({2, 2, 6, 8}, gen, dtype), go = Randn({2, 2, 6, 8}, gen, dtype);
      const AttentionResult fwd = ScaledDotProductAttention(q, k, v, causal, 0.35);
      const AttentionGrads g =
          ScaledDotProductAttentionBackward(go, q, k, v, fwd.output, fwd.stats, causal, 0.35);
      const RawTensor q64 = q.to(kF64), k64 = k.to(kF64), v64 = v.to(kF64);
      const AttentionResult fwd64 = ScaledDotProductAttention(q64, k64, v64, causal, 0.35);
      const AttentionGrads want = ScaledDotProductAttentionBackward(
          go.to(kF64), q64, k64, v64, fwd64.output, fwd64.stats, causal, 0.35);
      const std::string what = Name(causal ? "causal" : "full", dtype);
      // p and ds are rounded to the dtype before their products, and the forward's output
      // (rounded) enters delta: up to three roundings.
      const Tol tol = {3 * OutputTol(dtype).rtol, 3 * OutputTol(dtype).atol};
      ExpectClose(g.grad_q, want.grad_q, tol, "grad_q " + what);
      ExpectClose(g.grad_k, want.grad_k, tol, "grad_k " + what);
      ExpectClose(g.grad_v, want.grad_v, tol, "grad_v " + what);
    }
  }
}

// Grouped-query attention (4 query heads on 2 key/value heads) has the bits of attention over the
// repeated heads, forward and backward (the repeated heads' gradients summed as Sum sums them).
TEST(AttentionTest, GroupedQueryHeadsAreTheRepeatedHeadsBits) {
  Generator gen(34);
  for (DType dtype : {kF32, kF64, kBF16}) {
    for (bool causal : {true, false}) {
      const RawTensor q = Randn({2, 4, 6, 8}, gen, dtype), k = Randn({2, 2, 6, 8}, gen, dtype),
                      v = Randn({2, 2, 6, 8}, gen, dtype), dy = Randn({2, 4, 6, 8}, gen, dtype);
      auto repeat = [](const RawTensor& x) {
        return x.unsqueeze(2).expand({2, 2, 2, 6, 8}).reshape({2, 4, 6, 8});
      };
      const AttentionResult g = ScaledDotProductAttention(q, k, v, causal, 0.3);
      const AttentionResult r = ScaledDotProductAttention(q, repeat(k), repeat(v), causal, 0.3);
      EXPECT_EQ(g.output.to_vector<double>(), r.output.to_vector<double>());
      const AttentionGrads gg =
          ScaledDotProductAttentionBackward(dy, q, k, v, g.output, g.stats, causal, 0.3);
      const AttentionGrads rg = ScaledDotProductAttentionBackward(dy, q, repeat(k), repeat(v),
                                                                  r.output, r.stats, causal, 0.3);
      EXPECT_EQ(gg.grad_q.to_vector<double>(), rg.grad_q.to_vector<double>());
      EXPECT_EQ(gg.grad_k.shape(), k.shape());
      EXPECT_EQ(gg.grad_k.to_vector<double>(),
                Sum(rg.grad_k.reshape({2, 2, 2, 6, 8}), {2}).to_vector<double>());
      EXPECT_EQ(gg.grad_v.to_vector<double>(),
                Sum(rg.grad_v.reshape({2, 2, 2, 6, 8}), {2}).to_vector<double>());
    }
  }
}

TEST(AttentionTest, EmptyQueries) {
  const AttentionResult r =
      ScaledDotProductAttention(RawTensor::Zeros({1, 2, 0, 4}), RawTensor::Zeros({1, 2, 3, 4}),
                                RawTensor::Zeros({1, 2, 3, 4}), false, 1.0);
  EXPECT_EQ(r.output.shape(), (Shape{1, 2, 0, 4}));
  EXPECT_EQ(r.stats.shape(), (Shape{1, 2, 0}));
  const AttentionGrads g = ScaledDotProductAttentionBackward(
      r.output, RawTensor::Zeros({1, 2, 0, 4}), RawTensor::Ones({1, 2, 3, 4}),
      RawTensor::Ones({1, 2, 3, 4}), r.output, r.stats, false, 1.0);
  EXPECT_EQ(g.grad_k.to_vector<double>(), std::vector<double>(24, 0.0));
  EXPECT_EQ(g.grad_v.shape(), (Shape{1, 2, 3, 4}));
}

// ---- Layer norm backward ------------------------------------------------------------------------

TEST(LayerNormBackwardTest, MatchesFiniteDifferencesInF64) {
  Generator gen(10);
  for (bool affine : {false, true}) {
    const RawTensor x = Randn({2, 3, 6}, gen, kF64, 2.0), go = Randn({2, 3, 6}, gen);
    const RawTensor w = affine ? Randn({6}, gen) : RawTensor(), b = Randn({6}, gen);
    const auto loss = [&] { return Dot(go, LayerNorm(x, w, b, 1e-5).output); };
    const LayerNormResult fwd = LayerNorm(x, w, b, 1e-5);
    const LayerNormGrads g = LayerNormBackward(go, x, fwd.mean, fwd.rstd, w);
    const std::string what = affine ? " affine" : " plain";
    EXPECT_EQ(g.grad_input.shape(), x.shape());
    ExpectClose(g.grad_input, NumericGrad(x, loss), kFiniteDifferenceTol, "grad_input" + what);
    ExpectClose(g.grad_bias, NumericGrad(b, loss), kFiniteDifferenceTol, "grad_bias" + what);
    if (affine) {
      ExpectClose(g.grad_weight, NumericGrad(w, loss), kFiniteDifferenceTol, "grad_weight");
    } else {
      // The weight gradient of an affine layer norm at weight 1: sum of go * xhat.
      const RawTensor ones = RawTensor::Ones({6}, kF64);
      const auto loss_w = [&] { return Dot(go, LayerNorm(x, ones, b, 1e-5).output); };
      ExpectClose(g.grad_weight, NumericGrad(ones, loss_w), kFiniteDifferenceTol, "grad_weight");
    }
  }
}

TEST(LayerNormBackwardTest, LowPrecisionMatchesF64OnTheSameValues) {
  Generator gen(11);
  for (DType dtype : {kF32, kF16, kBF16}) {
    const RawTensor x = Randn({4, 16}, gen, dtype), go = Randn({4, 16}, gen, dtype);
    const RawTensor w = Randn({16}, gen, dtype);
    const LayerNormResult fwd = LayerNorm(x, w, RawTensor(), 1e-5);
    const LayerNormGrads g = LayerNormBackward(go, x, fwd.mean, fwd.rstd, w);
    // The reference reads the same f32 statistics, widened.
    const LayerNormGrads want = LayerNormBackward(go.to(kF64), x.to(kF64), fwd.mean.to(kF64),
                                                  fwd.rstd.to(kF64), w.to(kF64));
    EXPECT_EQ(g.grad_input.dtype(), dtype);
    ExpectClose(g.grad_input, want.grad_input, OutputTol(dtype), Name("grad_input", dtype));
    ExpectClose(g.grad_weight, want.grad_weight, OutputTol(dtype), Name("grad_weight", dtype));
    ExpectClose(g.grad_bias, want.grad_bias, OutputTol(dtype), Name("grad_bias", dtype));
  }
}

TEST(LayerNormBackwardTest, WeightAndBiasGradientsOnlyWhenAsked) {
  const RawTensor x = RawTensor::FromVector<double>({1, 2, 4, 8}, {2, 2});
  const LayerNormResult fwd = LayerNorm(x, RawTensor(), RawTensor());
  const LayerNormGrads g = LayerNormBackward(RawTensor::Ones({2, 2}, kF64), x, fwd.mean, fwd.rstd,
                                             RawTensor(), /*need_weight_bias=*/false);
  EXPECT_FALSE(g.grad_weight.defined() || g.grad_bias.defined());
  // A constant upstream gradient has no component across a normalised row.
  ExpectClose(g.grad_input, std::vector<double>(4, 0.0), OutputTol(kF64), "grad_input");
}

// ---- LlamaRMSNorm -------------------------------------------------------------------------------

TEST(LlamaRmsNormTest, TheKernelMatchesTheComposedOpsAndFiniteDifferences) {
  Generator gen(12);
  // f64: the kernel's gradients against finite differences of its own forward.
  const RawTensor x = Randn({2, 3, 6}, gen, kF64, 2.0), go = Randn({2, 3, 6}, gen);
  const RawTensor w = Randn({6}, gen);
  const auto loss = [&] { return Dot(go, LlamaRmsNorm(x, w, 1e-6).output); };
  const LlamaRmsNormResult fwd = LlamaRmsNorm(x, w, 1e-6);
  const LlamaRmsNormGrads g = LlamaRmsNormBackward(go, x, fwd.rstd, w);
  ExpectClose(g.grad_input, NumericGrad(x, loss), kFiniteDifferenceTol, "grad_input");
  ExpectClose(g.grad_weight, NumericGrad(w, loss), kFiniteDifferenceTol, "grad_weight");
  // Every dtype: the CPU kernel (a weight of x's dtype) against the composed ops on the same
  // values; the sums differ in order only, so f32 agrees to a few ulps and f16/bf16 to one
  // rounding of their own.
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    const RawTensor xd = Randn({5, 33}, gen, dtype, 2.0), gd = Randn({5, 33}, gen, dtype);
    const RawTensor wd = Randn({33}, gen, dtype);
    const LlamaRmsNormResult kernel = LlamaRmsNorm(xd, wd, 1e-5);
    const LlamaRmsNormResult composed = composed::LlamaRmsNorm(xd, wd, 1e-5);
    EXPECT_EQ(kernel.output.dtype(), dtype);
    ExpectClose(kernel.output, composed.output, OutputTol(dtype), Name("output", dtype));
    ExpectClose(kernel.rstd, composed.rstd, OutputTol(dtype), Name("rstd", dtype));
    const LlamaRmsNormGrads kg = LlamaRmsNormBackward(gd, xd, kernel.rstd, wd);
    const LlamaRmsNormGrads cg = composed::LlamaRmsNormBackward(gd, xd, kernel.rstd, wd, true);
    ExpectClose(kg.grad_input, cg.grad_input, OutputTol(dtype), Name("grad_input", dtype));
    ExpectClose(kg.grad_weight, cg.grad_weight, OutputTol(dtype), Name("grad_weight", dtype));
  }
  // An f32 weight on bf16 input (autocast's case) gives f32, through the composed ops.
  const RawTensor xb = Randn({3, 8}, gen, kBF16), wf = Randn({8}, gen, kF32);
  EXPECT_EQ(LlamaRmsNorm(xb, wf, 1e-5).output.dtype(), kF32);
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { LlamaRmsNorm(xb, Randn({7}, gen, kF32), 1e-5); },
      "llama_rms_norm: weight of shape [7] does not match the last dim of the input of shape "
      "[3, 8]"));
}

TEST(RotaryEmbeddingTest, TheKernelHasTheComposedOpsBits) {
  Generator gen(13);
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    const RawTensor x = Randn({2, 5, 3, 8}, gen, dtype, 2.0).transpose(1, 2);  // [2, 3, 5, 8]
    const RawTensor cos = Randn({5, 8}, gen, dtype), sin = Randn({5, 8}, gen, dtype);
    const RawTensor g = Randn({2, 3, 5, 8}, gen, dtype);
    EXPECT_EQ(RotaryEmbedding(x, cos, sin).to_vector<double>(),
              composed::RotaryEmbedding(x, cos, sin).to_vector<double>())
        << DTypeName(dtype);
    EXPECT_EQ(RotaryEmbeddingBackward(g, cos, sin).to_vector<double>(),
              composed::RotaryEmbeddingBackward(g, cos, sin).to_vector<double>())
        << DTypeName(dtype);
  }
  // The rotation: x = (1, 2, 3, 4) at angle pi/2 (cos 0, sin 1) is rotate_half(x) = (-3, -4, 1, 2).
  const RawTensor x = RawTensor::FromVector<float>({1, 2, 3, 4}, {1, 4});
  EXPECT_EQ(
      RotaryEmbedding(x, RawTensor::Zeros({1, 4}), RawTensor::Ones({1, 4})).to_vector<float>(),
      (std::vector<float>{-3, -4, 1, 2}));
}

// ---- Cross-entropy with its gradient ------------------------------------------------------------

TEST(CrossEntropyWithGradTest, EqualsCrossEntropyAndItsBackward) {
  Generator gen(12);
  const RawTensor targets = RawTensor::FromVector<int64_t>({2, -100, 0, 4, 1}, {5});
  for (DType dtype : kFloatTypes) {
    for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      const RawTensor logits = Randn({5, 6}, gen, dtype, 3.0);
      const CrossEntropyResult r = CrossEntropyWithGrad(logits, targets, -100, reduction, 0.25);
      const RawTensor loss = CrossEntropy(logits, targets, -100, reduction);
      const RawTensor grad_loss = reduction == Reduction::kNone ? RawTensor::Full({5}, 0.25, kF64)
                                                                : RawTensor::Scalar(0.25, kF64);
      const RawTensor grad = CrossEntropyBackward(logits, targets, grad_loss, -100, reduction);
      EXPECT_EQ(r.loss.shape(), loss.shape());
      EXPECT_EQ(r.loss.to_vector<double>(), loss.to_vector<double>()) << DTypeName(dtype);
      EXPECT_EQ(r.grad_logits.to_vector<double>(), grad.to_vector<double>()) << DTypeName(dtype);
    }
  }
}

TEST(CrossEntropyWithGradTest, GradientMatchesFiniteDifferencesInF64) {
  Generator gen(13);
  const RawTensor targets = RawTensor::FromVector<int32_t>({3, 0, -1, 2}, {4});
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    const RawTensor logits = Randn({4, 5}, gen);
    const double grad_scale = 1024;  // a loss scale
    const auto loss = [&] {
      const RawTensor l = CrossEntropy(logits, targets, -1, reduction);
      return grad_scale * Sum(l).item();
    };
    const CrossEntropyResult r = CrossEntropyWithGrad(logits, targets, -1, reduction, grad_scale);
    ExpectClose(r.grad_logits, NumericGrad(logits, loss), kFiniteDifferenceTol,
                "grad_logits reduction " + std::to_string(static_cast<int>(reduction)));
    // The ignored row has no gradient.
    const std::vector<double> g = r.grad_logits.to_vector<double>();
    for (int i = 10; i < 15; ++i) EXPECT_EQ(g[i], 0.0);
  }
}

TEST(CrossEntropyWithGradTest, AllRowsIgnored) {
  const CrossEntropyResult r = CrossEntropyWithGrad(
      RawTensor::Ones({2, 3}), RawTensor::FromVector<int64_t>({-100, -100}, {2}), -100);
  EXPECT_TRUE(std::isnan(r.loss.item()));  // 0 / 0, as in PyTorch
  EXPECT_EQ(r.grad_logits.to_vector<double>(), std::vector<double>(6, 0.0));
}

// The mean's divisor is counted where the targets live (no host read on CUDA) and divides the
// loss gradient once in f64: exactly the sum's gradient for grad_loss / count.
TEST(CrossEntropyBackwardTest, MeanDividesTheLossGradientByTheCountOnce) {
  Generator gen(14);
  const RawTensor targets = RawTensor::FromVector<int32_t>({1, 7, 0, 7, 2, 3, 7}, {7});
  for (DType dtype : kFloatTypes) {
    const RawTensor logits = Randn({7, 4}, gen, dtype, 2.0);
    for (double g : {1.0, 0.1, -3.0, 65536.0}) {
      const RawTensor mean = CrossEntropyBackward(logits, targets, RawTensor::Scalar(g, dtype), 7);
      const double g_rounded = RawTensor::Scalar(g, dtype).item();
      const RawTensor sum = CrossEntropyBackward(
          logits, targets, RawTensor::Scalar(g_rounded / 4, kF64), 7, Reduction::kSum);
      EXPECT_EQ(mean.dtype(), dtype);
      EXPECT_EQ(mean.to_vector<double>(), sum.to_vector<double>()) << Name("g", dtype) << " " << g;
    }
  }
  // Every row ignored: zero rows (the 1 / 0 scale never reaches a row).
  const RawTensor all_ignored =
      CrossEntropyBackward(RawTensor::Ones({2, 3}), RawTensor::FromVector<int32_t>({7, 7}, {2}),
                           RawTensor::Scalar(1), 7);
  EXPECT_EQ(all_ignored.to_vector<double>(), std::vector<double>(6, 0.0));
}

// ---- Errors -----------------------------------------------------------------------------------

// A CPU buffer that calls itself cuda:0: enough to build a tensor whose device differs from the
// CPU's (the ops must reject the mix before any kernel reads it).
class ForeignDeviceAllocator final : public Allocator {
 public:
  void* Allocate(size_t nbytes) override { return std::malloc(nbytes == 0 ? 1 : nbytes); }
  void Deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::Cuda(0); }
};

RawTensor OnForeignDevice(const Shape& shape, DType dtype = kF32) {
  static ForeignDeviceAllocator* allocator = new ForeignDeviceAllocator;
  auto storage = std::make_shared<Storage>(
      static_cast<size_t>(NumElements(shape)) * ElementSize(dtype), allocator);
  return RawTensor(storage, shape, ContiguousStrides(shape), 0, dtype);
}

TEST(FusedOpErrorsTest, Linear) {
  const RawTensor x = RawTensor::Zeros({2, 3}), w = RawTensor::Zeros({4, 3});
  EXPECT_ERROR(Linear(x, RawTensor::Zeros({4, 5}), RawTensor()),
               "linear: input of shape [2, 3] and weight of shape [4, 5] do not match (expected "
               "weight [out_features, 3])");
  EXPECT_ERROR(Linear(x, RawTensor::Zeros({3}), RawTensor()),
               "linear: input of shape [2, 3] and weight of shape [3] do not match (expected "
               "weight [out_features, 3])");
  EXPECT_ERROR(Linear(x, w.to(kF16), RawTensor()),
               "linear: weight dtype f16 differs from input dtype f32");
  EXPECT_ERROR(Linear(x, w, RawTensor::Zeros({3})),
               "linear: bias of shape [3] does not match weight of shape [4, 3] (expected [4])");
  EXPECT_ERROR(Linear(x, w, RawTensor::Zeros({4}, kF64)),
               "linear: bias dtype f64 differs from input dtype f32");
  EXPECT_ERROR(Linear(RawTensor::Scalar(1), w, RawTensor()),
               "linear: expected input [..., in_features], got a 0-d tensor");
  EXPECT_ERROR(Linear(x.to(kI64), w.to(kI64), RawTensor()),
               "linear: expected a floating dtype (f32, f64, f16, bf16), got i64");
  EXPECT_ERROR(Linear(RawTensor(), w, RawTensor()), "linear: the input is an undefined tensor");
  EXPECT_ERROR(Linear(x, OnForeignDevice({4, 3}), RawTensor()),
               "linear: expected all tensors on one device, got cpu and cuda:0");
  EXPECT_ERROR(Linear(x, w, OnForeignDevice({4})),
               "linear: expected all tensors on one device, got cpu and cuda:0");
}

TEST(FusedOpErrorsTest, LinearBackward) {
  const RawTensor x = RawTensor::Zeros({2, 3}), w = RawTensor::Zeros({4, 3}),
                  go = RawTensor::Zeros({2, 4});
  EXPECT_ERROR(LinearBackward(RawTensor::Zeros({2, 3}), x, w, RawTensor(), Activation::kNone),
               "linear_backward: gradient of shape [2, 3] does not match the output shape [2, 4] "
               "of input [2, 3] and weight [4, 3]");
  EXPECT_ERROR(LinearBackward(go.to(kBF16), x, w, RawTensor(), Activation::kNone),
               "linear_backward: gradient dtype bf16 differs from input dtype f32");
  EXPECT_ERROR(LinearBackward(go, x, w, RawTensor(), Activation::kGeluTanh),
               "linear_backward: the pre-activation is an undefined tensor");
  EXPECT_ERROR(LinearBackward(go, x, w, RawTensor::Zeros({2, 4}, kF16), Activation::kGeluTanh),
               "linear_backward: pre-activation [2, 4] f16 does not match the output [2, 4] f32");
  EXPECT_ERROR(LinearBackward(OnForeignDevice({2, 4}), x, w, RawTensor(), Activation::kNone),
               "linear_backward: expected all tensors on one device, got cpu and cuda:0");
}

TEST(FusedOpErrorsTest, Attention) {
  const RawTensor q = RawTensor::Zeros({1, 2, 3, 4}), k = RawTensor::Zeros({1, 2, 5, 4});
  EXPECT_ERROR(ScaledDotProductAttention(RawTensor::Zeros({2, 3, 4}), k, k, false, 1),
               "scaled_dot_product_attention: expected q, k and v as [B, H, T, D], got [2, 3, 4], "
               "[1, 2, 5, 4] and [1, 2, 5, 4]");
  EXPECT_ERROR(ScaledDotProductAttention(q, k, RawTensor::Zeros({1, 2, 5, 8}), false, 1),
               "scaled_dot_product_attention: q [1, 2, 3, 4], k [1, 2, 5, 4] and v [1, 2, 5, 8] "
               "do not match (expected k and v [1, Hkv, Tk, 4] with Hkv dividing 2)");
  EXPECT_ERROR(ScaledDotProductAttention(q, RawTensor::Zeros({1, 3, 5, 4}),
                                         RawTensor::Zeros({1, 3, 5, 4}), false, 1),
               "scaled_dot_product_attention: q [1, 2, 3, 4], k [1, 3, 5, 4] and v [1, 3, 5, 4] "
               "do not match (expected k and v [1, Hkv, Tk, 4] with Hkv dividing 2)");
  EXPECT_ERROR(ScaledDotProductAttention(q, k, k, true, 1),
               "scaled_dot_product_attention: causal attention needs as many queries as keys, got "
               "3 and 5");
  EXPECT_ERROR(ScaledDotProductAttention(q, k.to(kF16), k, false, 1),
               "scaled_dot_product_attention: q, k and v dtypes f32, f16 and f32 differ");
  EXPECT_ERROR(ScaledDotProductAttention(q, RawTensor::Zeros({1, 2, 0, 4}),
                                         RawTensor::Zeros({1, 2, 0, 4}), false, 1),
               "scaled_dot_product_attention: 3 queries attend to no keys (k is [1, 2, 0, 4])");
  EXPECT_ERROR(ScaledDotProductAttention(q, k, k, false, std::numeric_limits<double>::infinity()),
               "scaled_dot_product_attention: scale inf is not finite");
  EXPECT_ERROR(ScaledDotProductAttention(q, OnForeignDevice({1, 2, 5, 4}), k, false, 1),
               "scaled_dot_product_attention: expected all tensors on one device, got cpu and "
               "cuda:0");
}

TEST(FusedOpErrorsTest, AttentionBackward) {
  const RawTensor q = RawTensor::Zeros({1, 2, 3, 4}), k = RawTensor::Zeros({1, 2, 5, 4});
  const RawTensor stats = RawTensor::Zeros({1, 2, 3});
  EXPECT_ERROR(
      ScaledDotProductAttentionBackward(RawTensor::Zeros({1, 2, 3, 5}), q, k, k, q, stats, false,
                                        1),
      "scaled_dot_product_attention_backward: gradient of shape [1, 2, 3, 5] does not match q of "
      "shape [1, 2, 3, 4]");
  EXPECT_ERROR(ScaledDotProductAttentionBackward(q, q, k, k, q.to(kF64), stats, false, 1),
               "scaled_dot_product_attention_backward: output dtype f64 differs from q dtype f32");
  EXPECT_ERROR(ScaledDotProductAttentionBackward(q, q, k, k, q, stats.to(kF64), false, 1),
               "scaled_dot_product_attention_backward: stats [1, 2, 3] f64 do not match [1, 2, 3] "
               "f32 (as the forward returns them)");
  EXPECT_ERROR(
      ScaledDotProductAttentionBackward(q, q, k, k, q, RawTensor::Zeros({1, 2, 3, 1}), false, 1),
      "scaled_dot_product_attention_backward: stats [1, 2, 3, 1] f32 do not match "
      "[1, 2, 3] f32 (as the forward returns them)");
  EXPECT_ERROR(ScaledDotProductAttentionBackward(q, q, k, k, q, RawTensor(), false, 1),
               "scaled_dot_product_attention_backward: stats is an undefined tensor");
  EXPECT_ERROR(
      ScaledDotProductAttentionBackward(OnForeignDevice({1, 2, 3, 4}), q, k, k, q, stats, false, 1),
      "scaled_dot_product_attention_backward: expected all tensors on one device, got "
      "cpu and cuda:0");
}

// Scores of one head that no machine can hold (2^23 queries and keys: 2^46 f32 = 256 TiB): the
// per-thread scratch, allocated inside the parallel region over the heads (2 here), fails with
// the CPU allocator's out-of-memory error on the calling thread, not std::bad_alloc (which ended
// train_gpt --block_size=100000 in std::terminate).
TEST(FusedOpErrorsTest, AttentionScratchOutOfMemoryIsTheAllocatorsError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts the process on an allocation beyond its maximum (even "
                  "with allocator_may_return_null=1, operator new reports it as fatal) instead of "
                  "throwing std::bad_alloc; the plain build runs this test";
#endif
  const RawTensor q = RawTensor::Zeros({2, 1, int64_t{1} << 23, 1});
  EXPECT_ERROR(ScaledDotProductAttention(q, q, q, false, 1),
               "CPU allocator: out of memory allocating 281474976710656 bytes (a kernel's scratch "
               "buffer)");
}

TEST(FusedOpErrorsTest, LayerNormBackward) {
  const RawTensor x = RawTensor::Zeros({2, 3}), mean = RawTensor::Zeros({2});
  EXPECT_ERROR(LayerNormBackward(RawTensor::Zeros({3, 2}), x, mean, mean, RawTensor()),
               "layer_norm_backward: gradient of shape [3, 2] does not match input of shape "
               "[2, 3]");
  EXPECT_ERROR(LayerNormBackward(x.to(kF16), x, mean, mean, RawTensor()),
               "layer_norm_backward: gradient dtype f16 differs from input dtype f32");
  EXPECT_ERROR(LayerNormBackward(x, x, RawTensor::Zeros({3}), mean, RawTensor()),
               "layer_norm_backward: mean [3] f32 does not match input of shape [2, 3] (expected "
               "[2] f32)");
  EXPECT_ERROR(LayerNormBackward(x.to(kF64), x.to(kF64), mean.to(kF64), mean, RawTensor()),
               "layer_norm_backward: rstd [2] f32 does not match input of shape [2, 3] (expected "
               "[2] f64)");
  EXPECT_ERROR(LayerNormBackward(x, x, mean, mean, RawTensor::Zeros({2})),
               "layer_norm_backward: weight of shape [2] does not match the last dim of input "
               "[2, 3]");
  EXPECT_ERROR(LayerNormBackward(x, x, mean, mean, RawTensor::Zeros({3}, kBF16)),
               "layer_norm_backward: weight dtype bf16 differs from input dtype f32");
  EXPECT_ERROR(LayerNormBackward(x, x, OnForeignDevice({2}), mean, RawTensor()),
               "layer_norm_backward: expected all tensors on one device, got cpu and cuda:0");
}

TEST(FusedOpErrorsTest, CrossEntropyWithGrad) {
  const RawTensor logits = RawTensor::Zeros({2, 3});
  EXPECT_ERROR(CrossEntropyWithGrad(logits, RawTensor::Zeros({3}, kI64)),
               "cross_entropy_with_grad: targets of shape [3] do not match logits of shape "
               "[2, 3] (expected [2])");
  EXPECT_ERROR(CrossEntropyWithGrad(logits, RawTensor::Zeros({2}, kF32)),
               "cross_entropy_with_grad: expected an index dtype (i32 or i64), got f32");
  EXPECT_ERROR(CrossEntropyWithGrad(RawTensor::Zeros({2}), RawTensor::Zeros({2}, kI64)),
               "cross_entropy_with_grad: expected logits [N, C], got [2]");
  EXPECT_ERROR(CrossEntropyWithGrad(logits, OnForeignDevice({2}, kI64)),
               "cross_entropy_with_grad: expected all tensors on one device, got cpu and cuda:0");
}

TEST(FusedOpErrorsTest, CrossEntropyBackwardGradientDevice) {
  // The row scales come from grad_loss; on another device the logits' kernel could not read them.
  const RawTensor logits = RawTensor::Zeros({2, 3}), targets = RawTensor::Zeros({2}, kI64);
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    EXPECT_ERROR(CrossEntropyBackward(logits, targets, OnForeignDevice({}), -100, reduction),
                 "cross_entropy_backward: expected all tensors on one device, got cpu and cuda:0");
  }
  EXPECT_ERROR(CrossEntropyBackward(logits, targets, OnForeignDevice({2}), -100, Reduction::kNone),
               "cross_entropy_backward: expected all tensors on one device, got cpu and cuda:0");
}

}  // namespace
// ---- AddScaled and Lerp
// --------------------------------------------------------------------------

// One rounding: equal to std::fma in the compute dtype (f32 for f16/bf16, then rounded once), on
// values where a product and a sum rounded apart differ; torch's lerp on both sides of w = 0.5.
TEST(AddScaledTest, RoundsOnceAsAFusedMultiplyAdd) {
  Generator gen(31);
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    const RawTensor a = Randn({1000}, gen, dtype), b = Randn({1000}, gen, dtype);
    const double alpha = 0.1;
    const std::vector<double> got = AddScaled(a, b, alpha).to_vector<double>();
    const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
    int twice = 0;
    for (size_t i = 0; i < va.size(); ++i) {
      double want = 0, apart = 0;
      if (dtype == kF64) {
        want = std::fma(alpha, vb[i], va[i]);
        apart = va[i] + alpha * vb[i];
      } else {
        const float s = static_cast<float>(alpha);
        const float fa = static_cast<float>(va[i]), fb = static_cast<float>(vb[i]);
        want = RawTensor::Scalar(std::fma(s, fb, fa), kF32).to(dtype).item();
        apart = RawTensor::Scalar(fa + s * fb, kF32).to(dtype).item();
      }
      EXPECT_EQ(got[i], want) << DTypeName(dtype) << " [" << i << "]";
      twice += apart != want;
    }
    if (dtype == kF32 || dtype == kF64) {
      EXPECT_GT(twice, 0) << DTypeName(dtype);  // not vacuous
    }
  }
  // A strided input is taken as its values.
  const RawTensor m = Randn({4, 6}, gen, kF32);
  EXPECT_EQ(AddScaled(m.transpose(0, 1), m.transpose(0, 1), 2.0).to_vector<double>(),
            AddScaled(m.transpose(0, 1).contiguous(), m.transpose(0, 1).contiguous(), 2.0)
                .to_vector<double>());
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { AddScaled(Randn({3}, gen, kF32), Randn({3}, gen, kF64), 1.0); },
      "add_scaled: expected a second input of the first's shape and of its dtype or a narrower "
      "one, got f32 [3] and f64 [3]"));
}

// A narrower b is widened exactly in the same pass (torch's f32 add of a bf16 tensor): the bits
// of b.to(a's dtype) added, out of place and in place, on sizes split over threads and blocks.
// b of a dtype that does not promote to a's is refused.
TEST(AddScaledTest, ANarrowerSecondInputIsWidenedExactly) {
  Generator gen(36);
  const auto values = [](const RawTensor& t) { return t.to_vector<double>(); };
  for (const auto& [wide, narrow] : std::vector<std::pair<DType, DType>>{
           {kF32, kBF16}, {kF32, kF16}, {kF64, kF32}, {kF64, kBF16}}) {
    for (int64_t n : {int64_t{7}, int64_t{70001}}) {
      const RawTensor a = Randn({n}, gen, wide), b = Randn({n}, gen, narrow);
      const std::vector<double> want = values(AddScaled(a, b.to(wide), -0.37));
      const RawTensor got = AddScaled(a, b, -0.37);
      EXPECT_EQ(got.dtype(), wide);
      EXPECT_EQ(values(got), want) << DTypeName(wide) << " + " << DTypeName(narrow) << " " << n;
      const RawTensor self = a.clone();
      AddScaledInPlace(self, b, -0.37);
      EXPECT_EQ(values(self), want) << DTypeName(wide) << " += " << DTypeName(narrow) << " " << n;
    }
  }
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { AddScaled(Randn({3}, gen, kF16), Randn({3}, gen, kBF16), 1.0); },
      "add_scaled: expected a second input of the first's shape and of its dtype or a narrower "
      "one, got f16 [3] and bf16 [3]"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { AddScaledInPlace(Randn({3}, gen, kF32), Randn({2}, gen, kBF16), 1.0); },
      "add_scaled_: expected a second input of the first's shape and of its dtype or a narrower "
      "one, got f32 [3] and bf16 [2]"));
}

// torch's CPU addcmul: fma(round(value * t1), t2, self), one rounding after the product's; f32
// and f64, and f16/bf16 computed so in f32 and rounded once.
TEST(AddcmulTest, RoundsTheScaledFactorThenOnce) {
  Generator gen(32);
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    const RawTensor s = Randn({1000}, gen, dtype), t1 = Randn({1000}, gen, dtype),
                    t2 = Randn({1000}, gen, dtype);
    const double value = 0.001;
    const std::vector<double> got = Addcmul(s, t1, t2, value).to_vector<double>();
    const std::vector<double> vs = s.to_vector<double>(), v1 = t1.to_vector<double>(),
                              v2 = t2.to_vector<double>();
    int twice = 0;
    for (size_t i = 0; i < vs.size(); ++i) {
      double want = 0, apart = 0;
      if (dtype == kF64) {
        want = std::fma(value * v1[i], v2[i], vs[i]);
        apart = vs[i] + (value * v1[i]) * v2[i];
      } else {
        const float scaled = static_cast<float>(value) * static_cast<float>(v1[i]);
        const float f2 = static_cast<float>(v2[i]), fs = static_cast<float>(vs[i]);
        want = RawTensor::Scalar(std::fma(scaled, f2, fs), kF32).to(dtype).item();
        apart = RawTensor::Scalar(fs + scaled * f2, kF32).to(dtype).item();
      }
      EXPECT_EQ(got[i], want) << DTypeName(dtype) << " [" << i << "]";
      twice += apart != want;
    }
    if (dtype == kF32 || dtype == kF64) {
      EXPECT_GT(twice, 0) << DTypeName(dtype);  // not vacuous
    }
  }
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { Addcmul(Randn({3}, gen, kF32), Randn({3}, gen, kF32), Randn({2}, gen, kF32), 1.0); },
      "addcmul: expected inputs of one dtype and shape, got f32 [3] and f32 [2]"));
}

// ---- Swiglu
// ---------------------------------------------------------------------------------------

// The fused forward and backward give the bits of the composed tensor ops they replace (Silu then
// Mul; Mul's backward then Silu's), on sizes split over several threads and blocks.
TEST(SwigluTest, FusedKernelsAreTheComposedOpsBits) {
  Generator gen(33);
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (int64_t n : {int64_t{7}, int64_t{70001}}) {
      const RawTensor g = RandNormal({n}, gen, 0, 3, dtype), u = Randn({n}, gen, dtype),
                      dy = Randn({n}, gen, dtype);
      EXPECT_EQ(Swiglu(g, u).to_vector<double>(), Mul(Silu(g), u).to_vector<double>())
          << DTypeName(dtype) << " " << n;
      const SwigluGrads grads = SwigluBackward(dy, g, u);
      const RawTensor s = Sigmoid(g);
      const RawTensor silu_grad = Mul(s, AddScalar(Mul(g, AddScalar(Neg(s), 1)), 1));
      EXPECT_EQ(grads.grad_gate.to_vector<double>(), Mul(Mul(dy, u), silu_grad).to_vector<double>())
          << DTypeName(dtype) << " " << n;
      EXPECT_EQ(grads.grad_up.to_vector<double>(), Mul(dy, Silu(g)).to_vector<double>())
          << DTypeName(dtype) << " " << n;
    }
  }
  // Mixed dtypes promote; shapes must match.
  const RawTensor g16 = Randn({4}, gen, kBF16), u32 = Randn({4}, gen, kF32);
  EXPECT_EQ(Swiglu(g16, u32).dtype(), kF32);
  EXPECT_EQ(SwigluBackward(Randn({4}, gen, kF32), g16, u32).grad_gate.dtype(), kBF16);
  EXPECT_TRUE(
      testing::ThrowsErrorExactly([&] { Swiglu(Randn({3}, gen, kF32), Randn({2}, gen, kF32)); },
                                  "swiglu: expected inputs of one shape, got [3] and [2]"));
}

TEST(LerpTest, IsTorchsLerp) {
  // torch.lerp(a, b, w) on f32 values, printed by torch 2.15 (CPU):
  //   torch.lerp(torch.tensor([0.1, -2.5, 3.0]), torch.tensor([1.7, 0.3, -1.1]), w)
  const RawTensor a = RawTensor::FromVector<float>({0.1f, -2.5f, 3.0f}, {3});
  const RawTensor b = RawTensor::FromVector<float>({1.7f, 0.3f, -1.1f}, {3});
  const auto f32 = [](const RawTensor& t) { return t.to_vector<float>(); };
  // w = 0.05 (a + w (b - a)) and w = 0.95 (b - (b - a) (1 - w)).
  EXPECT_EQ(f32(Lerp(a, b, 0.05)),
            (std::vector<float>{0.18000000715255737f, -2.359999895095825f, 2.7950000762939453f}));
  EXPECT_EQ(f32(Lerp(a, b, 0.95)),
            (std::vector<float>{1.6200000047683716f, 0.15999998152256012f, -0.8949999809265137f}));
}

// The kernel against the formula in the compute type (f32 for f16/bf16, one rounding at the end)
// with std::fma, on both sides of |w| = 0.5 and on sizes split over several threads and blocks;
// rounding b - a to bf16 first (what the composed form did before it widened) is not the same.
TEST(LerpTest, OneFusedMultiplyAddOfTheDifferenceInTheComputeType) {
  Generator gen(34);
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (int64_t n : {int64_t{7}, int64_t{70001}}) {
      const RawTensor a = Randn({n}, gen, dtype), b = Randn({n}, gen, dtype);
      const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
      for (double w : {0.05, -0.3, 0.5, 0.95, 1.7, -2.0}) {
        const std::vector<double> got = Lerp(a, b, w).to_vector<double>();
        int narrow_differs = 0;
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          double want = 0;
          if (dtype == kF64) {
            const double d = vb[k] - va[k];
            want = std::abs(w) < 0.5 ? std::fma(w, d, va[k]) : std::fma(-(1 - w), d, vb[k]);
          } else {
            const float fw = static_cast<float>(w), fa = static_cast<float>(va[k]),
                        fb = static_cast<float>(vb[k]), d = fb - fa;
            const float r = std::abs(fw) < 0.5f ? std::fma(fw, d, fa) : std::fma(-(1 - fw), d, fb);
            want = RawTensor::Scalar(r, kF32).to(dtype).item();
            const float dn = static_cast<float>(RawTensor::Scalar(d, kF32).to(dtype).item());
            const float rn =
                std::abs(fw) < 0.5f ? std::fma(fw, dn, fa) : std::fma(-(1 - fw), dn, fb);
            narrow_differs += RawTensor::Scalar(rn, kF32).to(dtype).item() != want;
          }
          ASSERT_EQ(got[k], want) << DTypeName(dtype) << " n=" << n << " w=" << w << " [" << i
                                  << "]";
        }
        if (dtype == kBF16 && n > 7) {
          EXPECT_GT(narrow_differs, 0) << w;  // not vacuous
        }
      }
    }
  }
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { Lerp(Randn({3}, gen, kF32), Randn({3}, gen, kF32), std::nan("")); },
      "lerp: weight must be finite, got nan"));
}

// With a scale of self: the bits of MulScalarInPlace then AddScaledInPlace (torch's
// self.mul_(k).add_(b, alpha=alpha)), for each dtype, a narrower b, and b being self itself (which
// must see self scaled).
TEST(AddScaledTest, InPlaceWithAScaleOfSelfIsTheTwoPassesBits) {
  Generator gen(38);
  const auto values = [](const RawTensor& t) { return t.to_vector<double>(); };
  for (const auto& [dtype, b_dtype] : std::vector<std::pair<DType, DType>>{
           {kF32, kF32}, {kF32, kBF16}, {kF64, kF64}, {kBF16, kBF16}, {kF16, kF16}}) {
    for (int64_t n : {int64_t{7}, int64_t{70001}}) {
      const RawTensor a = Randn({n}, gen, dtype), b = Randn({n}, gen, b_dtype);
      const RawTensor want = a.clone();
      MulScalarInPlace({want}, 0.998);
      AddScaledInPlace(want, b, -0.02);
      const RawTensor got = a.clone();
      AddScaledInPlace(got, b, -0.02, 0.998);
      EXPECT_EQ(values(got), values(want))
          << DTypeName(dtype) << " " << DTypeName(b_dtype) << " " << n;
    }
  }
  const RawTensor a = Randn({1000}, gen, kF32);
  const RawTensor want = a.clone();
  MulScalarInPlace({want}, 0.5);
  AddScaledInPlace(want, want, 3.0);
  const RawTensor got = a.clone();
  AddScaledInPlace(got, got, 3.0, 0.5);
  EXPECT_EQ(values(got), values(want));
  EXPECT_EQ(values(got), values(MulScalar(a, 2.0)));  // (a / 2) + 3 (a / 2), exact
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { AddScaledInPlace(Randn({3}, gen, kF32), Randn({3}, gen, kF32), 1.0, INFINITY); },
      "add_scaled_: self_scale must be finite, got inf"));
}

// In another dtype: the bits of Lerp(a, b, w).to(dtype) (in one pass from f32 to bf16 or f16 and
// from f64 to f32: one rounding), on both sides of |w| = 0.5 and on sizes split over threads and
// blocks; a bf16 lerp is rounded to bf16 before it is widened.
TEST(LerpTest, ToAnotherDTypeIsTheLerpRoundedOnce) {
  Generator gen(37);
  for (const auto& [from, to] : std::vector<std::pair<DType, DType>>{
           {kF32, kBF16}, {kF32, kF16}, {kF64, kF32}, {kBF16, kF32}, {kF32, kF32}}) {
    for (int64_t n : {int64_t{7}, int64_t{70001}}) {
      const RawTensor a = Randn({n}, gen, from), b = Randn({n}, gen, from);
      for (double w : {0.05, 0.95}) {
        const RawTensor got = Lerp(a, b, w, to);
        EXPECT_EQ(got.dtype(), to);
        EXPECT_EQ(got.to_vector<double>(), Lerp(a, b, w).to(to).to_vector<double>())
            << DTypeName(from) << " -> " << DTypeName(to) << " n=" << n << " w=" << w;
      }
    }
  }
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { Lerp(Randn({3}, gen, kF32), Randn({3}, gen, kF32), 0.5, kI64); },
      "lerp: expected a floating dtype (f32, f64, f16, bf16), got i64"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { Lerp(Randn({3}, gen, kF32), Randn({3}, gen, kF32), 0.5, kF8E4M3); },
      "lerp: expected a floating dtype (f32, f64, f16, bf16), got f8e4m3"));
}

// In place: the out-of-place op's bits, for a contiguous self (one pass), a strided one, the
// other input being self itself, and a shifted view of self's own storage (which one pass
// would read after writing).
TEST(LerpTest, InPlaceFormsGiveTheOutOfPlaceBits) {
  Generator gen(35);
  const auto values = [](const RawTensor& t) { return t.to_vector<double>(); };
  for (DType dtype : {kF32, kF64, kBF16}) {
    const RawTensor a = Randn({5, 40001}, gen, dtype), b = Randn({5, 40001}, gen, dtype);
    for (double w : {0.1, 0.9}) {
      RawTensor self = a.clone();
      LerpInPlace(self, b, w);
      EXPECT_EQ(values(self), values(Lerp(a, b, w))) << DTypeName(dtype) << " w=" << w;
    }
    RawTensor self = a.clone();
    AddScaledInPlace(self, b, -0.37);
    EXPECT_EQ(values(self), values(AddScaled(a, b, -0.37))) << DTypeName(dtype);
    const RawTensor same = a.clone();
    LerpInPlace(same, same, 0.3);
    EXPECT_EQ(values(same), values(a)) << DTypeName(dtype);
  }
  const RawTensor m = Randn({6, 4}, gen, kF32), e = Randn({4, 6}, gen, kF32);
  const RawTensor strided = m.clone().transpose(0, 1);
  LerpInPlace(strided, e, 0.2);
  EXPECT_EQ(values(strided), values(Lerp(m.transpose(0, 1), e, 0.2)));
  const RawTensor buf = Randn({101}, gen, kF32);
  const RawTensor head = buf.narrow(0, 0, 100), tail = buf.narrow(0, 1, 100);
  const RawTensor want = AddScaled(head.clone(), tail.clone(), 0.5);
  AddScaledInPlace(head, tail, 0.5);
  EXPECT_EQ(values(head), values(want));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { LerpInPlace(Randn({3}, gen, kF32), Randn({2}, gen, kF32), 0.5); },
      "lerp_: expected inputs of one dtype and shape, got f32 [3] and f32 [2]"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { AddScaledInPlace(Randn({3}, gen, kF32), Randn({3}, gen, kF64), 0.5); },
      "add_scaled_: expected a second input of the first's shape and of its dtype or a narrower "
      "one, got f32 [3] and f64 [3]"));
}

// ---- NewtonSchulz ------------------------------------------------------------------------------

// Muon's iteration in plain f64 loops over one matrix [m, n], row-major.
std::vector<double> NewtonSchulzReference(std::vector<double> x, int64_t m, int64_t n, double a,
                                          double b, double c, int steps, double eps) {
  double sum = 0;
  for (double v : x) sum += v * v;
  const double norm = std::max(std::sqrt(sum), eps);
  for (double& v : x) v /= norm;
  auto product = [](const std::vector<double>& p, const std::vector<double>& q, int64_t rows,
                    int64_t inner, int64_t cols, bool q_transposed) {
    std::vector<double> r(static_cast<size_t>(rows * cols), 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        double s = 0;
        for (int64_t k = 0; k < inner; ++k) {
          s += p[i * inner + k] * (q_transposed ? q[j * inner + k] : q[k * cols + j]);
        }
        r[i * cols + j] = s;
      }
    }
    return r;
  };
  for (int step = 0; step < steps; ++step) {
    const std::vector<double> g = product(x, x, m, n, m, true);
    const std::vector<double> gg = product(g, g, m, m, m, false);
    std::vector<double> u(g.size());
    for (size_t i = 0; i < u.size(); ++i) u[i] = b * g[i] + c * gg[i];
    const std::vector<double> ux = product(u, x, m, m, n, false);
    for (size_t i = 0; i < x.size(); ++i) x[i] = a * x[i] + ux[i];
  }
  return x;
}

constexpr double kNsA = 3.4445, kNsB = -4.775, kNsC = 2.0315;  // torch.optim.Muon's

// Shapes across the kernel's 64-row blocks: one block, a partial last block, a square matrix.
// Partial last blocks of rows (130 = 64 + 64 + 2) and of columns (1100 = 512 + 512 + 76).
const std::vector<Shape> kNewtonSchulzShapes = {
    {2, 5, 9}, {3, 130, 200}, {1, 70, 70}, {2, 20, 1100}};

TEST(NewtonSchulzTest, F64MatchesPlainLoops) {
  Generator gen(21);
  for (const Shape& shape : kNewtonSchulzShapes) {
    const RawTensor x = Randn(shape, gen, kF64);
    const RawTensor got = NewtonSchulz(x, kNsA, kNsB, kNsC, 5, 1e-7);
    EXPECT_EQ(got.shape(), shape);
    const int64_t mn = shape[1] * shape[2];
    const std::vector<double> all = x.to_vector<double>();
    std::vector<double> want;
    for (int64_t i = 0; i < shape[0]; ++i) {
      const std::vector<double> one = NewtonSchulzReference(
          std::vector<double>(all.begin() + i * mn, all.begin() + (i + 1) * mn), shape[1], shape[2],
          kNsA, kNsB, kNsC, 5, 1e-7);
      want.insert(want.end(), one.begin(), one.end());
    }
    ExpectClose(got, want, OutputTol(kF64), "f64 " + ShapeToString(shape));
  }
}

// The CPU kernel against the composed ops: the same formula with the products summed by other
// libraries (oneDNN or OpenBLAS in blocks, against OpenBLAS's batched products) in other orders,
// and the norm's f64 sum in another order. Normalised (no step) and after one step, f32 agrees to
// a few ulps and f16/bf16 to one rounding of their own; five steps compound: a 16-bit element
// whose one-step values straddle a rounding boundary moves the next step's products by its ulp.
TEST(NewtonSchulzTest, TheKernelMatchesTheComposedOps) {
  Generator gen(22);
  for (DType dtype : {kF64, kF32, kF16, kBF16}) {
    for (const Shape& shape : kNewtonSchulzShapes) {
      const RawTensor x = Randn(shape, gen, dtype);
      const std::string what = Name(ShapeToString(shape).c_str(), dtype);
      for (int steps : {0, 1, 5}) {
        const RawTensor got = NewtonSchulz(x, kNsA, kNsB, kNsC, steps, 1e-7);
        EXPECT_EQ(got.dtype(), dtype);
        const Tol tol = steps <= 1 ? OutputTol(dtype) : TwoRoundingsTol(dtype);
        ExpectClose(got, composed::NewtonSchulz(x, kNsA, kNsB, kNsC, steps, 1e-7), tol,
                    what + " steps " + std::to_string(steps));
      }
    }
  }
}

// A batch gives each matrix the bits of its call alone; eps floors the norm; misuse is refused.
TEST(NewtonSchulzTest, BatchMembersAreIndependentAndMisuseIsRefused) {
  Generator gen(23);
  const RawTensor x = Randn({3, 130, 200}, gen, kBF16);
  const RawTensor batch = NewtonSchulz(x, kNsA, kNsB, kNsC, 5, 1e-7);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(batch.select(0, i).to_vector<double>(),
              NewtonSchulz(x.narrow(0, i, 1), kNsA, kNsB, kNsC, 5, 1e-7).to_vector<double>())
        << "matrix " << i;
  }
  // A zero matrix divided by eps stays zero (no NaN).
  const RawTensor zeros = NewtonSchulz(RawTensor::Zeros({1, 2, 3}), kNsA, kNsB, kNsC, 5, 1e-7);
  EXPECT_EQ(zeros.to_vector<double>(), std::vector<double>(6, 0.0));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] {
        NewtonSchulz(Randn({1, 4, 3}, gen, kF32), kNsA, kNsB, kNsC, 5, 1e-7);
      },
      "newton_schulz: expected wide matrices (m <= n; transpose a tall one), got [1, 4, 3]"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] {
        NewtonSchulz(Randn({4, 3}, gen, kF32), kNsA, kNsB, kNsC, 5, 1e-7);
      },
      "newton_schulz: expected a batch of matrices [batch, m, n], got [4, 3]"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] {
        NewtonSchulz(Randn({1, 3, 4}, gen, kF32), kNsA, kNsB, kNsC, 100, 1e-7);
      },
      "newton_schulz: ns_steps must be in 0..99, got 100"));
}

}  // namespace tg
