#include "optim/sgd.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/optim/trace.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

using testing::ExpectTrace;
using testing::kTraceSteps;

// Expected values: tests/optim/reference_traces.py (PyTorch's torch.optim.SGD formulas in f32).
constexpr float kPlain[kTraceSteps][3] = {
    {0.611000001f, -1.324f, 2.0f},
    {0.611000001f, -1.25f, 1.88899994f},
    {0.5f, -1.28699994f, 1.92599988f},
    {0.537f, -1.17599988f, 1.85199988f},
    {0.536800027f, -1.17599988f, 1.85219991f},
    {0.537f, -1.17629993f, 1.8520999f},
    {0.536899984f, -1.17619991f, 1.85239995f},
    {0.537199974f, -1.17639995f, 1.85239995f},
    {0.537199974f, -1.17619991f, 1.8520999f},
    {0.536899984f, -1.17629993f, 1.85219991f},
};

constexpr float kMomentumDampeningDecay[kTraceSteps][3] = {
    {0.610499978f, -1.32274997f, 1.99800003f},  {0.709400535f, -1.32043445f, 1.89450181f},
    {0.697872579f, -1.35046208f, 1.83294833f},  {0.720169306f, -1.2763716f, 1.70930064f},
    {0.739408255f, -1.20854139f, 1.5966593f},   {0.756237805f, -1.14667654f, 1.4937551f},
    {0.77061379f, -1.08987617f, 1.40006697f},   {0.783128619f, -1.03795493f, 1.31448758f},
    {0.793687165f, -0.990111649f, 1.23601305f}, {0.802205503f, -0.946251631f, 1.16436362f},
};
constexpr float kMomentumDampeningDecayBuffer[3] = {-0.0851836503f, -0.438600391f, 0.716494381f};

constexpr float kNesterov[kTraceSteps][3] = {
    {0.70994997f, -1.38822496f, 1.99619997f},   {0.798106074f, -1.30391479f, 1.7798872f},
    {0.665669084f, -1.36370766f, 1.75382054f},  {0.716129363f, -1.17190373f, 1.55473018f},
    {0.727102041f, -1.09818089f, 1.44115329f},  {0.736800492f, -1.03136849f, 1.3372252f},
    {0.744413555f, -0.969806135f, 1.24310613f}, {0.751174033f, -0.913955569f, 1.15697062f},
    {0.756231248f, -0.862266421f, 1.0777992f},  {0.759451926f, -0.815300405f, 1.00599837f},
};
constexpr float kNesterovBuffer[3] = {-0.0475213043f, -0.513374865f, 0.786922336f};

TEST(SgdTest, PlainTraceMatchesPyTorchFormula) {
  SGDOptions o;
  o.lr(0.1);
  ExpectTrace<SGD>(o, kPlain);
}

TEST(SgdTest, MomentumDampeningWeightDecayTrace) {
  SGDOptions o;
  o.lr(0.1);
  o.momentum(0.9);
  o.dampening(0.1);
  o.weight_decay(0.01);
  ExpectTrace<SGD>(o, kMomentumDampeningDecay);
}

TEST(SgdTest, NesterovTrace) {
  SGDOptions o;
  o.lr(0.1);
  o.momentum(0.9);
  o.weight_decay(0.01);
  o.nesterov(true);
  ExpectTrace<SGD>(o, kNesterov);
}

// The buffer after the trace; the first step's buffer is the gradient itself (no dampening).
TEST(SgdTest, MomentumBufferStateAndFirstStep) {
  struct Case {
    bool nesterov;
    double dampening;
    const float* buffer;
  };
  for (const Case& c :
       {Case{false, 0.1, kMomentumDampeningDecayBuffer}, Case{true, 0.0, kNesterovBuffer}}) {
    for (bool fused : {true, false}) {
      SGDOptions o;
      o.lr(0.1);
      o.momentum(0.9);
      o.dampening(c.dampening);
      o.weight_decay(0.01);
      o.nesterov(c.nesterov);
      o.fused(fused);
      Tensor p = testing::TraceParam();
      SGD opt(std::vector<Tensor>{p}, o);
      testing::SetTraceGrad(p, 0, kF32);
      opt.step();
      // buf = g + 0.01 * p0, undampened (reference_traces.py arithmetic, by hand).
      const std::vector<float> first = {-1.10500002f, 0.727500021f, 0.0199999996f};
      EXPECT_EQ(opt.param_state(p)->tensor("momentum_buffer").to_vector<float>(), first);
      for (int k = 1; k < testing::kTraceSteps; ++k) {
        testing::SetTraceGrad(p, k, kF32);
        opt.step();
      }
      const RawTensor buf = opt.param_state(p)->tensor("momentum_buffer");
      EXPECT_EQ(buf.dtype(), kF32);
      EXPECT_EQ(buf.to_vector<float>(), std::vector<float>(c.buffer, c.buffer + 3));
    }
  }
}

TEST(SgdTest, PlainSgdKeepsNoBuffer) {
  Tensor p = testing::TraceParam();
  SGD opt(std::vector<Tensor>{p});
  testing::SetTraceGrad(p, 0, kF32);
  opt.step();
  EXPECT_TRUE(opt.has_state());
  EXPECT_TRUE(opt.param_state(p)->tensors.empty());
  EXPECT_TRUE(opt.state_dict().Sub("state.").tensors.empty());
}

TEST(SgdTest, OptionsRoundTripThroughTheirStateDictNames) {
  SGDOptions o;
  o.lr(0.5);
  o.momentum(0.8);
  o.dampening(0.25);
  o.weight_decay(0.125);
  o.nesterov(true);
  const std::vector<NamedOption> named = o.named();
  EXPECT_EQ(named, (std::vector<NamedOption>{{"dampening", 0.25},
                                             {"lr", 0.5},
                                             {"momentum", 0.8},
                                             {"nesterov", 1},
                                             {"weight_decay", 0.125}}));
  SGDOptions back;
  for (const NamedOption& n : named) EXPECT_TRUE(back.set_named(n.name, n.value)) << n.name;
  EXPECT_EQ(back.lr(), 0.5);
  EXPECT_EQ(back.momentum(), 0.8);
  EXPECT_EQ(back.dampening(), 0.25);
  EXPECT_EQ(back.weight_decay(), 0.125);
  EXPECT_TRUE(back.nesterov());
  EXPECT_FALSE(back.set_named("beta1", 0.9));
  EXPECT_EQ(back.named(), named);
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly([&] { back.set_named("nesterov", 0.5, "here: "); },
                                              "here: nesterov must be 0 or 1, got 0.5"));
  EXPECT_TRUE(back.nesterov());
}

TEST(SgdTest, InvalidOptionsAreNamed) {
  Tensor p = testing::TraceParam();
  SGDOptions o;
  o.lr(-0.1);
  EXPECT_TRUE(
      tg::testing::ThrowsErrorExactly([&] { SGD(std::vector<Tensor>{p}, o); },
                                      "SGD: param group 0: invalid lr -0.1 (must be >= 0)"));
  o = SGDOptions();
  o.nesterov(true);
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] { SGD(std::vector<Tensor>{p}, o); },
      "SGD: param group 0: nesterov momentum requires a momentum > 0 and zero dampening, got "
      "momentum 0 and dampening 0"));
  o.momentum(0.9);
  o.dampening(0.1);
  EXPECT_TRUE(tg::testing::ThrowsError([&] { SGD(std::vector<Tensor>{p}, o); },
                                       "got momentum 0.9 and dampening 0.1"));
  o = SGDOptions();
  o.weight_decay(-1);
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] { SGD(std::vector<Tensor>{p}, o); },
      "SGD: param group 0: invalid weight_decay -1 (must be >= 0)"));
  SGD opt(std::vector<Tensor>{p});
  StateDict sd = opt.state_dict();
  sd.scalars["param_groups.0.nesterov"] = 0.5;
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] { opt.load_state_dict(sd); },
      "SGD.load_state_dict: param group 0: nesterov must be 0 or 1, got 0.5"));
}

}  // namespace
}  // namespace tg::optim
