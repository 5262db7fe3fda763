// Layers against reference formulas: Linear's init and forward, RMSNorm, Dropout, Flatten, Mlp,
// causal attention (per-head f64 reference, causality, gradcheck), the transformer block, autocast.
#include "nn/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "nn/transformer.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace nn {
namespace {

using ::tg::testing::ThrowsErrorExactly;

void ExpectNear(const RawTensor& got, const std::vector<double>& want, double tol) {
  std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol) << "element " << i;
}

TEST(LinearTest, PyTorchInitBoundsAndSeededDeterminism) {
  Generator gen_a(7), gen_b(7);
  LinearImpl a(300, 20, gen_a), b(300, 20, gen_b);
  const double bound = 1 / std::sqrt(300.0);
  double max_abs = 0;
  for (float w : a.weight.data().to_vector<float>())
    max_abs = std::max(max_abs, std::fabs(double(w)));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.95 * bound);  // uniform over the whole range
  for (float v : a.bias.data().to_vector<float>()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_EQ(a.weight.data().to_vector<float>(), b.weight.data().to_vector<float>());
  EXPECT_EQ(a.bias.data().to_vector<float>(), b.bias.data().to_vector<float>());
}

TEST(LinearTest, OptionsDefaultsChainingAndTheGeneratorContract) {
  const LinearOptions d(5, 3);
  EXPECT_EQ(d.in_features(), 5);
  EXPECT_EQ(d.out_features(), 3);
  EXPECT_TRUE(d.bias());
  const LinearOptions o = LinearOptions(5, 3).bias(false).out_features(4);
  EXPECT_FALSE(o.bias());
  EXPECT_EQ(o.out_features(), 4);
  // One seed, one weight: with or without a bias, through either constructor (the bias is
  // drawn after the weight, so it does not shift the weight's draws).
  Generator g1(11), g2(11), g3(11);
  LinearImpl plain(5, 4, g1), no_bias(o, g2), full(LinearOptions(5, 4), g3);
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.parameters().size(), 1u);
  EXPECT_EQ(plain.weight.data().to_vector<float>(), no_bias.weight.data().to_vector<float>());
  EXPECT_EQ(plain.bias.data().to_vector<float>(), full.bias.data().to_vector<float>());
  EXPECT_EQ(no_bias.extra_repr(), "in=5, out=4, bias=false");
  EXPECT_EQ(no_bias.options().out_features(), 4);
  EXPECT_TRUE(ThrowsErrorExactly([&] { Linear bad(LinearOptions(0, 3), g1); },
                                 "Linear: sizes must be positive, got in=0 out=3"));
}

TEST(GeluTest, OptionsPickTheFormula) {
  EXPECT_EQ(GELUOptions().approximate(), "none");
  GELU exact, approx(GELUOptions().approximate("tanh"));
  Tensor x(RawTensor::FromVector<float>({-2, 0.5, 2}, {3}));
  EXPECT_EQ(exact(x).data().to_vector<float>(), Gelu(x).data().to_vector<float>());
  EXPECT_EQ(approx(x).data().to_vector<float>(), GeluTanh(x).data().to_vector<float>());
  EXPECT_EQ(exact->extra_repr(), "");
  EXPECT_EQ(approx->extra_repr(), "approximate=tanh");
  EXPECT_TRUE(ThrowsErrorExactly([] { GELU bad(GELUOptions().approximate("fast")); },
                                 "GELU: approximate must be 'none' or 'tanh', got 'fast'"));
}

// torch.nn.SiLU() on torch.tensor([-2., 0.5, 2.], requires_grad=True) (torch 2.15, f32):
// values [-0.23840583860874176, 0.3112296760082245, 1.7615940570831299], gradient of the sum
// [-0.09078425168991089, 0.7399612069129944, 1.0907843112945557]. Within one f32 ulp: PyTorch's
// vectorised exp and the C library's may round differently.
TEST(SiluTest, ModuleMatchesPyTorch) {
  SiLU silu;
  Tensor x(RawTensor::FromVector<float>({-2, 0.5, 2}, {3}), /*requires_grad=*/true);
  const Tensor y = silu(x);
  Sum(y).backward();
  const std::vector<float> got = y.data().to_vector<float>();
  const std::vector<float> grad = x.grad().data().to_vector<float>();
  const double want[] = {-0.23840583860874176, 0.3112296760082245, 1.7615940570831299};
  const double want_grad[] = {-0.09078425168991089, 0.7399612069129944, 1.0907843112945557};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(got[i], want[i], 1.2e-7 * std::abs(want[i])) << i;
    EXPECT_NEAR(grad[i], want_grad[i], 2.4e-7 * std::abs(want_grad[i])) << i;
  }
  EXPECT_EQ(silu->type_name(), "SiLU");
}

TEST(LayerNormTest, OptionsDefaultsAndChaining) {
  const LayerNormOptions d(6);
  EXPECT_EQ(d.eps(), 1e-5);
  EXPECT_TRUE(d.elementwise_affine());
  EXPECT_TRUE(d.bias());
  LayerNormImpl plain(6), no_bias(LayerNormOptions(6).eps(1e-3).bias(false)),
      none(LayerNormOptions(6).elementwise_affine(false));
  EXPECT_EQ(plain.parameters().size(), 2u);
  EXPECT_EQ(no_bias.parameters().size(), 1u);
  EXPECT_EQ(none.parameters().size(), 0u);
  EXPECT_EQ(no_bias.extra_repr(), "6, eps=0.001, affine=true");
  EXPECT_EQ(none.extra_repr(), "6, eps=1e-05, affine=false");
}

TEST(LinearTest, ForwardIsXWTransposePlusB) {
  Generator gen(1);
  LinearImpl lin(3, 2, gen);
  lin.to(kF64);
  Tensor x(RandNormal({4, 3}, gen, 0, 1, kF64));
  Tensor want = Add(Matmul(x, Transpose(lin.weight, 0, 1)), lin.bias);
  ExpectNear(lin(x).data(), want.data().to_vector<double>(), 1e-15);
}

TEST(RMSNormTest, MatchesFormulaAndGradchecks) {
  RMSNormImpl norm(4, 1e-6);
  norm.to(kF64);
  Generator gen(2);
  norm.parameter("weight").data().copy_(RawTensor::FromVector<double>({0.5, 1, 2, -1}, {4}));
  RawTensor x = RandNormal({3, 4}, gen, 0, 1, kF64);
  std::vector<double> xv = x.to_vector<double>(), want;
  const double w[] = {0.5, 1, 2, -1};
  for (int r = 0; r < 3; ++r) {
    double ms = 0;
    for (int c = 0; c < 4; ++c) ms += xv[r * 4 + c] * xv[r * 4 + c] / 4;
    for (int c = 0; c < 4; ++c) want.push_back(xv[r * 4 + c] / std::sqrt(ms + 1e-6) * w[c]);
  }
  ExpectNear(norm(Tensor(x)).data(), want, 1e-14);
  GradcheckResult r =
      Gradcheck([&](const VariableList& in) { return norm(in[0]); }, {Tensor(x, true)});
  EXPECT_TRUE(r.ok) << r.message;
  // bf16 input: normalised in f32, returned in bf16 without autocast, f32 with it.
  Tensor xb(RawTensor::Ones({2, 4}, kBF16));
  RMSNormImpl norm32(4);
  EXPECT_EQ(norm32(xb).dtype(), kBF16);
  amp::AutocastGuard autocast(kBF16);
  EXPECT_EQ(norm32(xb).dtype(), kF32);
}

TEST(DropoutTest, TrainingScalesSurvivorsAndEvalIsIdentity) {
  Generator gen(3);
  DropoutImpl drop(0.25, gen);
  Tensor x(RawTensor::Ones({10000}));
  std::vector<float> y = drop(x).data().to_vector<float>();
  int zeros = 0;
  for (float v : y) {
    if (v == 0) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(v, 1 / 0.75f);
    }
  }
  EXPECT_NEAR(zeros / 10000.0, 0.25, 0.02);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { Dropout(1.0, gen); }, "Dropout: p must be in [0, 1), got 1"));
}

TEST(FlattenTest, KeepsLeadingDims) {
  Flatten flat;
  EXPECT_EQ(flat(Tensor(RawTensor::Zeros({2, 1, 28, 28}))).shape(), (Shape{2, 784}));
  FlattenImpl from2(2);
  EXPECT_EQ(from2(Tensor(RawTensor::Zeros({2, 3, 4, 5}))).shape(), (Shape{2, 3, 20}));
}

TEST(MlpTest, ComposesLinearLayersWithActivationsBetween) {
  Generator gen(4);
  Mlp::Options options;
  options.activation = Activation::kTanh;
  Mlp mlp({4, 8, 3}, gen, options);
  mlp.to(kF64);
  Tensor x(RandNormal({5, 4}, gen, 0, 1, kF64));
  const LinearImpl& l0 = *mlp.layer(0);
  const LinearImpl& l1 = *mlp.layer(1);
  Tensor want = tg::Linear(tg::Tanh(tg::Linear(x, l0.weight, l0.bias)), l1.weight, l1.bias);
  ExpectNear(mlp(x).data(), want.data().to_vector<double>(), 0);
  std::vector<std::string> names;
  for (const auto& e : mlp.named_parameters()) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"}));
}

// Reference attention in f64 loops: per batch and head, causal softmax(q k^T / sqrt(d)) v.
std::vector<double> ReferenceAttention(const CausalSelfAttention& attn, const RawTensor& x,
                                       int64_t h) {
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2), d = c / h;
  std::vector<double> qkv = tg::Linear(Tensor(x), attn.qkv()->weight, attn.qkv()->bias)
                                .data()
                                .to_vector<double>();  // [b, t, 3c]
  std::vector<double> y(b * t * c, 0.0);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300, total = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) {
            dot +=
                qkv[(bi * t + i) * 3 * c + hi * d + e] * qkv[(bi * t + j) * 3 * c + c + hi * d + e];
          }
          s[j] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        for (int64_t j = 0; j <= i; ++j) total += (s[j] = std::exp(s[j] - mx));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j)
            acc += s[j] / total * qkv[(bi * t + j) * 3 * c + 2 * c + hi * d + e];
          y[(bi * t + i) * c + hi * d + e] = acc;
        }
      }
    }
  }
  RawTensor yt = RawTensor::FromVector<double>(y, {b, t, c});
  return tg::Linear(Tensor(yt), attn.proj()->weight, attn.proj()->bias).data().to_vector<double>();
}

TEST(AttentionTest, MatchesPerHeadReferenceAndIsCausal) {
  Generator gen(5);
  CausalSelfAttention attn({/*n_embd=*/8, /*n_head=*/2}, gen);
  attn.to(kF64);
  RawTensor x = RandNormal({2, 5, 8}, gen, 0, 1, kF64);
  RawTensor y = attn(Tensor(x)).data();
  ExpectNear(y, ReferenceAttention(attn, x, 2), 1e-13);
  // Changing the last position changes no earlier output, bit for bit.
  RawTensor x2 = x.clone();
  x2.select(1, 4).fill_(9.0);
  std::vector<double> a = y.to_vector<double>(), b = attn(Tensor(x2)).data().to_vector<double>();
  for (int64_t bi = 0; bi < 2; ++bi) {
    for (int64_t i = 0; i < 5 * 8; ++i) {
      size_t k = bi * 40 + i;
      if (i < 4 * 8) {
        EXPECT_EQ(a[k], b[k]) << k;
      } else {
        EXPECT_NE(a[k], b[k]) << k;
      }
    }
  }
}

TEST(AttentionTest, GradchecksInputAndWeights) {
  Generator gen(6);
  CausalSelfAttention attn({/*n_embd=*/4, /*n_head=*/2}, gen);
  attn.to(kF64);
  Tensor x(RandNormal({2, 3, 4}, gen, 0, 1, kF64), true);
  Tensor w = attn.qkv()->weight;
  GradcheckResult r = Gradcheck([&](const VariableList& in) { return attn(in[0]); }, {x, w});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(TransformerBlockTest, GradchecksAndNamesItsParts) {
  Generator gen(7);
  TransformerBlock block({/*n_embd=*/4, /*n_head=*/2}, gen);
  block.to(kF64);
  Tensor x(RandNormal({1, 3, 4}, gen, 0, 1, kF64), true);
  GradcheckResult r = Gradcheck([&](const VariableList& in) { return block(in[0]); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  std::vector<std::string> names;
  for (const auto& e : block.named_parameters()) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{"ln1.weight", "ln1.bias", "attn.qkv.weight",
                                             "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                             "ln2.weight", "ln2.bias", "mlp.fc0.weight",
                                             "mlp.fc0.bias", "mlp.fc1.weight", "mlp.fc1.bias"}));
}

TEST(AutocastModulesTest, SafeListDecidesWhereMatmulsRunInLowPrecision) {
  Generator gen(8);
  CausalSelfAttention attn({/*n_embd=*/8, /*n_head=*/2}, gen);
  Tensor x(RandNormal({1, 4, 8}, gen));
  {
    amp::AutocastGuard autocast(kBF16);
    EXPECT_EQ(attn(x).dtype(), kBF16);
  }
  {
    // Linear is safe but the attention around it is not: everything inside runs in f32.
    amp::AutocastGuard autocast(kBF16, true, {"Linear"});
    EXPECT_EQ(attn(x).dtype(), kF32);
    EXPECT_EQ((*attn.qkv())(x).dtype(), kBF16);
  }
  {
    // A container (Sequential) is transparent: its Linear follows the list.
    Sequential seq(Linear(8, 8, gen));
    amp::AutocastGuard autocast(kF16, true, {"Linear"});
    EXPECT_EQ(seq(x).dtype(), kF16);
    amp::AutocastGuard none(kF16, true, {});
    EXPECT_EQ(seq(x).dtype(), kF32);
  }
}

}  // namespace
}  // namespace nn
}  // namespace tg
