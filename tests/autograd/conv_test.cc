// Tests of the differentiable Conv2d and MaxPool2d (autograd/ops.h) beyond the op table (the
// f64 gradcheck, first and second order, and the f16/bf16 checks of both ops are rows of
// tests/autograd/op_table.h):
//  - the fused first-order backward equals the recorded one; only needed gradients are made;
//  - the gradient of max_pool2d goes to the first maximum;
//  - conv -> relu -> max pool in f16/bf16 has gradients close to f32 (2e-2 of the largest
//    magnitude), and autocast runs conv2d in the low dtype with the weight's cast cached;
//  - a small CNN (conv, relu, pool, conv, relu, pool, linear, cross-entropy) trains.
#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tests/autograd/low_precision.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ExpectCloseToF32;

using Fn = std::function<Tensor(const VariableList&)>;

Conv2dParams Params(std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                    std::array<int64_t, 2> dilation) {
  Conv2dParams p;
  p.stride = stride;
  p.padding = padding;
  p.dilation = dilation;
  return p;
}

std::vector<double> Values(const Tensor& v) { return v.data().to_vector<double>(); }

Tensor Param(const Shape& shape, uint64_t seed, DType dtype = kF64, double scale = 1) {
  Generator gen(seed);
  return Tensor(RandUniform(shape, gen, -scale, scale, kF64).to(dtype), /*requires_grad=*/true);
}

struct ConvCase {
  std::string name;
  Shape x, w;
  Conv2dParams p;
  bool bias;
};

std::vector<ConvCase> ConvCases() {
  return {
      {"3x3", {2, 2, 5, 5}, {3, 2, 3, 3}, Params({1, 1}, {0, 0}, {1, 1}), true},
      {"3x3 pad 1", {2, 2, 5, 4}, {3, 2, 3, 3}, Params({1, 1}, {1, 1}, {1, 1}), true},
      {"stride 2 pad 2 non-square",
       {1, 3, 6, 7},
       {2, 3, 2, 3},
       Params({2, 2}, {2, 1}, {1, 1}),
       true},
      {"dilation 2 no bias", {2, 2, 7, 6}, {2, 2, 3, 2}, Params({1, 2}, {1, 0}, {2, 2}), false},
      {"1x1", {2, 3, 3, 3}, {2, 3, 1, 1}, Params({1, 1}, {0, 0}, {1, 1}), true},
  };
}

VariableList ConvInputs(const ConvCase& c, uint64_t seed, DType dtype = kF64) {
  VariableList in = {Param(c.x, seed, dtype), Param(c.w, seed + 1, dtype)};
  if (c.bias) in.push_back(Param({c.w[0]}, seed + 2, dtype));
  return in;
}

Fn ConvFn(const ConvCase& c) {
  return
      [c](const VariableList& in) { return Conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.p); };
}

// ---- Nodes, saved variables, needed gradients
// ----------------------------------------------------

TEST(Conv2dGrad, NodeNamesAndOnlyNeededGradients) {
  const ConvCase c = ConvCases()[2];
  const Tensor x(Param(c.x, 1).data());  // does not require grad
  const Tensor w = Param(c.w, 2), b = Param({c.w[0]}, 3);
  const Tensor y = Conv2d(x, w, b, c.p);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "Conv2dBackward");
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 3u);
  EXPECT_FALSE(y.grad_fn()->next_edges()[0].valid());
  const Tensor pooled = MaxPool2d(y, {2, 2}, {1, 1});
  EXPECT_EQ(pooled.grad_fn()->name(), "MaxPool2dBackward");
  Sum(y).backward();
  EXPECT_FALSE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  ASSERT_TRUE(b.grad().defined());
  const Conv2dGrads ref = Conv2dBackward(RawTensor::Ones(y.shape(), kF64), x.data(), w.data(), c.p);
  EXPECT_EQ(Values(w.grad()), ref.grad_weight.to_vector<double>());
  EXPECT_EQ(Values(b.grad()), ref.grad_bias.to_vector<double>());

  // No grad mode: nothing is recorded.
  NoGradGuard no_grad;
  EXPECT_EQ(Conv2d(x, w, b, c.p).grad_fn(), nullptr);
  EXPECT_EQ(MaxPool2d(Tensor(y.data()), {2, 2}, {2, 2}).grad_fn(), nullptr);
}

TEST(Conv2dGrad, FusedAndRecordedBackwardsAgree) {
  for (const ConvCase& c : ConvCases()) {
    SCOPED_TRACE(c.name);
    const VariableList in = ConvInputs(c, 7);
    const Tensor g(Param(Conv2d(in[0].data(), in[1].data(), RawTensor(), c.p).shape(), 9).data());
    const Tensor out = ConvFn(c)(in);
    GradOptions retain;
    retain.retain_graph = true;
    const VariableList fused = Engine::Grad({out}, in, {g}, retain);
    GradOptions create;
    create.create_graph = true;
    const VariableList recorded = Engine::Grad({out}, in, {g}, create);
    ASSERT_EQ(fused.size(), recorded.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_FALSE(fused[i].requires_grad()) << i;
      // The bias gradient sums the (constant) output gradient: nothing to record.
      EXPECT_EQ(recorded[i].requires_grad(), i < 2) << i;
      const std::vector<double> a = Values(fused[i]), b = Values(recorded[i]);
      ASSERT_EQ(a.size(), b.size());
      for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-12) << i << " " << j;
    }
  }
}

TEST(MaxPool2dGrad, GradientGoesToTheFirstMaximum) {
  const Tensor x(RawTensor::FromVector<double>({1, 4, 3, 2, 4, 0, 1, 3}, {1, 1, 2, 4}), true);
  const Tensor y = MaxPool2d(x, {2, 2}, {2, 2});
  EXPECT_EQ(Values(y), (std::vector<double>{4, 3}));
  Sum(MulScalar(y, 2.0)).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{0, 2, 2, 0, 0, 0, 0, 0}));
}

// ---- Low precision and autocast -----------------------------------------------------------------

// conv -> relu -> max pool, then sum(c * out): gradients for every input.
VariableList ConvPoolGrads(const ConvCase& c, const VariableList& in) {
  const Tensor out = MaxPool2d(Relu(ConvFn(c)(in)), {2, 2}, {1, 1});
  std::vector<double> w(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + 0.125 * static_cast<double>(i % 7);
  return Engine::Grad(
      {Sum(Mul(out, Tensor(RawTensor::FromVector<double>(w, out.shape(), out.dtype()))))}, in);
}

TEST(Conv2dLowPrecision, GradientsMatchF32) {
  for (const ConvCase& c : ConvCases()) {
    for (DType dtype : {kF16, kBF16}) {
      SCOPED_TRACE(c.name + " " + DTypeName(dtype));
      const VariableList low = ConvInputs(c, 31, dtype);
      VariableList ref;  // the same rounded values in f32
      for (const Tensor& v : low) ref.emplace_back(v.data().to(kF32), true);
      EXPECT_EQ(ConvFn(c)(low).dtype(), dtype);
      const VariableList g_low = ConvPoolGrads(c, low), g_ref = ConvPoolGrads(c, ref);
      for (size_t i = 0; i < low.size(); ++i) {
        ExpectCloseToF32(g_low[i], g_ref[i], dtype, "input " + std::to_string(i));
      }
    }
  }
}

TEST(Conv2dAutocast, RunsInTheLowDtypeWithTheWeightCastCached) {
  for (DType low : {kF16, kBF16}) {
    SCOPED_TRACE(DTypeName(low));
    const Tensor x = Param({2, 3, 6, 6}, 1, kF32);
    const Tensor w = Param({4, 3, 3, 3}, 2, kF32), b = Param({4}, 3, kF32);
    const Tensor w2 = Param({4, 4, 3, 3}, 4, kF32);
    Tensor loss;
    {
      amp::AutocastGuard autocast(low);
      const Tensor y = Conv2d(x, w, b, Params({1, 1}, {1, 1}, {1, 1}));
      EXPECT_EQ(y.dtype(), low);
      EXPECT_EQ(y.grad_fn()->name(), "Conv2dBackward");
      EXPECT_EQ(amp::CachedCastCount(), 3u);  // x, w and b are f32 leaves requiring grad
      const Tensor h = MaxPool2d(Relu(y), {2, 2}, {2, 2});
      EXPECT_EQ(h.dtype(), low);  // pooling keeps its input's dtype
      // A second use of w reuses its cast: both convs point at the same CastBackward node.
      const Tensor z = Conv2d(h, w2);
      const Tensor y2 = Conv2d(x, w);
      EXPECT_EQ(z.dtype(), low);
      EXPECT_EQ(y.grad_fn()->next_edges()[1].fn, y2.grad_fn()->next_edges()[1].fn);
      EXPECT_EQ(amp::CachedCastCount(), 4u);  // + w2
      // f64 is never cast.
      EXPECT_EQ(Conv2d(Param({1, 3, 4, 4}, 5), Param({2, 3, 3, 3}, 6)).dtype(), kF64);
      loss = Add(Sum(z), Sum(y2));
      EXPECT_EQ(loss.dtype(), kF32);  // sum runs in f32
    }
    EXPECT_EQ(amp::CachedCastCount(), 0u);
    loss.backward();
    for (const Tensor& v : {x, w, b, w2}) {
      ASSERT_TRUE(v.grad().defined());
      EXPECT_EQ(v.grad().dtype(), kF32);
    }
    // The same network in f32 on the rounded values gives close gradients.
    auto rounded = [&](const Tensor& v) { return Tensor(v.data().to(low).to(kF32), true); };
    const Tensor xr = rounded(x), wr = rounded(w), br = rounded(b), w2r = rounded(w2);
    const Tensor y = Conv2d(xr, wr, br, Params({1, 1}, {1, 1}, {1, 1}));
    const Tensor z = Conv2d(MaxPool2d(Relu(y), {2, 2}, {2, 2}), w2r);
    Add(Sum(z), Sum(Conv2d(xr, wr))).backward();
    const std::pair<Tensor, Tensor> pairs[] = {{x, xr}, {w, wr}, {b, br}, {w2, w2r}};
    for (const auto& [got, ref] : pairs) {
      ExpectCloseToF32(got.grad(), ref.grad(), kF32, "autocast gradient");
    }
  }
}

// ---- A small CNN
// ----------------------------------------------------------------------------------

TEST(Conv2dTraining, SmallCnnLossDecreases) {
  // conv 1->4 3x3 pad 1, relu, pool 2, conv 4->8 3x3 pad 1, relu, pool 2, linear 8*2*2 -> 3.
  Generator gen(11);
  const RawTensor images = RandUniform({12, 1, 8, 8}, gen, 0, 1);
  std::vector<int64_t> labels(12);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 3);
  const RawTensor targets = RawTensor::FromVector<int64_t>(labels, {12});
  const VariableList params = {
      Tensor(RandNormal({4, 1, 3, 3}, gen, 0, 0.5), true), Tensor(RawTensor::Zeros({4}), true),
      Tensor(RandNormal({8, 4, 3, 3}, gen, 0, 0.2), true), Tensor(RawTensor::Zeros({8}), true),
      Tensor(RandNormal({3, 32}, gen, 0, 0.2), true),      Tensor(RawTensor::Zeros({3}), true)};
  const Conv2dParams same = Params({1, 1}, {1, 1}, {1, 1});
  auto forward = [&] {
    Tensor h = MaxPool2d(Relu(Conv2d(Tensor(images), params[0], params[1], same)), {2, 2}, {2, 2});
    h = MaxPool2d(Relu(Conv2d(h, params[2], params[3], same)), {2, 2}, {2, 2});
    return CrossEntropy(Linear(Reshape(h, {12, 32}), params[4], params[5]), targets);
  };
  const double first = forward().item();
  for (int step = 0; step < 30; ++step) {
    const Tensor loss = forward();
    for (const Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    NoGradGuard no_grad;
    for (const Tensor& p : params) {
      ASSERT_EQ(p.grad().shape(), p.shape());
      p.data().copy_(tg::Sub(p.data(), tg::MulScalar(p.grad().data(), 0.5)));
    }
  }
  EXPECT_LT(forward().item(), 0.8 * first);
}

TEST(Conv2dErrors, TensorValidationReachesTheVariableOps) {
  EXPECT_TRUE(testing::ThrowsError(
      [] {
        Conv2d(Param({2, 3, 5, 5}, 1), Param({4, 2, 3, 3}, 2));
      },
      "conv2d: input [2, 3, 5, 5] has 3 channels but weight [4, 2, 3, 3] expects 2"));
  EXPECT_TRUE(testing::ThrowsError(
      [] {
        MaxPool2d(Param({2, 3, 5}, 1), {2, 2}, {2, 2});
      },
      "max_pool2d: expected input [N, C, H, W], got shape [2, 3, 5]"));
}

}  // namespace
}  // namespace tg
