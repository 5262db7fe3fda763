#include "optim/optimizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/state_dict.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

using tg::testing::ThrowsError;
using tg::testing::ThrowsErrorExactly;

Tensor Param(std::vector<float> values, DType dtype = kF32) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor(RawTensor::FromVector<float>(values, {n}).to(dtype), true);
}

void SetGrad(const Tensor& p, std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  p.set_grad(Tensor(RawTensor::FromVector<float>(values, {n}).to(p.dtype())));
}

bool SameBits(const RawTensor& a, const RawTensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const RawTensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.numel() * ca.element_size()) == 0;
}

void ExpectSameStateDict(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.scalars, b.scalars);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [key, t] : a.tensors) {
    ASSERT_TRUE(b.has_tensor(key)) << key;
    EXPECT_TRUE(SameBits(t, b.tensor(key))) << key;
  }
}

TEST(OptimizerTest, GroupsTakeDefaultsAndKeepOverrides) {
  Tensor w = Param({1, 2}), b = Param({3});
  SGDOptions o;
  o.lr(0.1);
  o.momentum(0.9);
  SGDOptions second = o;
  second.weight_decay(0.5);
  second.lr(0.01);
  SGD opt({ParamGroup({w}), ParamGroup({b}, second)}, o);
  second.lr(0.03);  // the group holds a copy
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_EQ(opt.param_groups()[0].options().named(), o.named());
  const SGDOptions& got = opt.param_groups()[1].options_as<SGDOptions>();
  EXPECT_EQ(got.weight_decay(), 0.5);
  EXPECT_EQ(got.lr(), 0.01);
  EXPECT_EQ(got.momentum(), 0.9);
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.01);
  opt.param_groups()[1].set_lr(0.02);
  EXPECT_EQ(got.lr(), 0.02);
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.param_groups()[0].options_as<AdamOptions>(); },
                                 "param group options are SGDOptions, not AdamOptions"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { ParamGroup({w}).lr(); },
                                 "param group has no options (it takes the optimizer's "
                                 "defaults when added)"));
  // Copies of a group copy its options.
  ParamGroup copy = opt.param_groups()[1];
  copy.set_lr(0.5);
  EXPECT_EQ(opt.param_groups()[1].lr(), 0.02);

  Tensor c = Param({4});
  SGDOptions third = o;
  third.momentum(0);
  opt.add_param_group(ParamGroup({c}, third));
  EXPECT_EQ(opt.param_groups()[2].options_as<SGDOptions>().momentum(), 0);
  EXPECT_EQ(opt.param_groups()[2].lr(), 0.1);
  Tensor d = Param({5});
  opt.add_param_group(ParamGroup({d}));  // the defaults
  EXPECT_EQ(opt.param_groups()[3].options().named(), o.named());
}

TEST(OptimizerTest, BadGroupsAndParamsAreNamed) {
  Tensor w = Param({1, 2});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        SGD({ParamGroup({w}), ParamGroup({Param({1})}, AdamOptions())});
      },
      "SGD: param group 1: options are AdamOptions; SGD takes SGDOptions"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        SGD({ParamGroup({w}), ParamGroup({Param({1}), w})});
      },
      "SGD: param 1 of param group 1 is the same variable as param 0 "
      "of param group 0; a parameter may appear only once"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { SGD(std::vector<ParamGroup>{}); },
                                 "SGD: got an empty list of param groups"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { SGD(std::vector<Tensor>{}); }, "SGD: got an empty parameter list"));
  Tensor ints(RawTensor::FromVector<int64_t>({1, 2}, {2}));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        SGD(std::vector<Tensor>{w, ints});
      },
      "SGD: param 1 of param group 0 has dtype i64; only floating parameters can be optimized"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { SGD(std::vector<Tensor>{Tensor()}); },
                                 "SGD: param 0 of param group 0 is undefined"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        AdamOptions nan_lr;
        nan_lr.lr(std::nan(""));
        Adam({ParamGroup({w}, nan_lr)});
      },
      "Adam: param group 0: option 'lr' is nan"));
}

TEST(OptimizerTest, ZeroGradSetToNone) {
  Tensor w = Param({1, 2});
  SGD opt(std::vector<Tensor>{w});
  SetGrad(w, {3, 4});
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  opt.zero_grad();  // no grad: nothing to do
  EXPECT_FALSE(w.grad().defined());
}

TEST(OptimizerTest, ZeroGradInPlaceKeepsTheTensor) {
  Tensor w = Param({1, 2});
  Tensor none = Param({5});
  SGD opt(std::vector<Tensor>{w, none});
  SetGrad(w, {3, 4});
  const Tensor grad = w.grad();
  const uint64_t version = grad.version();
  opt.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(w.grad().is_same(grad));
  EXPECT_EQ(grad.data().to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_GT(grad.version(), version);
  EXPECT_FALSE(none.grad().defined());
}

TEST(OptimizerTest, StepSkipsParamsWithoutGradAndBumpsVersions) {
  Tensor w = Param({1, 2}), b = Param({3});
  SGDOptions o;
  o.lr(0.5);
  o.momentum(0.9);
  SGD opt(std::vector<Tensor>{w, b}, o);
  EXPECT_FALSE(opt.has_state());
  SetGrad(w, {1, -1});
  const uint64_t vw = w.version(), vb = b.version();
  opt.step();
  EXPECT_EQ(w.data().to_vector<float>(), (std::vector<float>{0.5f, 2.5f}));
  EXPECT_EQ(b.data().to_vector<float>(), (std::vector<float>{3}));
  EXPECT_GT(w.version(), vw);
  EXPECT_EQ(b.version(), vb);
  EXPECT_TRUE(opt.has_state());
  ASSERT_NE(opt.param_state(w), nullptr);
  EXPECT_EQ(opt.param_state(b), nullptr);
}

TEST(OptimizerTest, StateIsCreatedLazilyInTheComputeDType) {
  Tensor h = Param({1, 2}, kF16), bf = Param({1}, kBF16), d = Param({1}, kF64);
  Adam opt(std::vector<Tensor>{h, bf, d});
  EXPECT_EQ(opt.param_state(h), nullptr);
  SetGrad(h, {1, 1});
  SetGrad(bf, {1});
  SetGrad(d, {1});
  opt.step();
  EXPECT_EQ(opt.param_state(h)->tensor("exp_avg").dtype(), kF32);
  EXPECT_EQ(opt.param_state(bf)->tensor("exp_avg_sq").dtype(), kF32);
  EXPECT_EQ(opt.param_state(d)->tensor("exp_avg").dtype(), kF64);
  EXPECT_EQ(opt.param_state(h)->scalar("step"), 1);
  EXPECT_EQ(h.dtype(), kF16);
  EXPECT_EQ(StateDType(kBF16), kF32);
  EXPECT_EQ(StateDType(kF64), kF64);
}

// What MixedPrecisionOptimizer does: before the first step, swap a f16 param for an f32 master.
TEST(OptimizerTest, ParamGroupsAreMutableBeforeTheFirstStep) {
  Tensor model = Param({1, 2}, kF16);
  SGDOptions o;
  o.lr(0.5);
  SGD opt(std::vector<Tensor>{model}, o);
  EXPECT_FALSE(opt.has_state());
  Tensor master(model.data().to(kF32), true);
  opt.param_groups()[0].params[0] = master;
  master.set_grad(Tensor(RawTensor::FromVector<float>({2, 4}, {2})));
  opt.step();
  EXPECT_EQ(master.data().to_vector<float>(), (std::vector<float>{0, 0}));
  EXPECT_EQ(model.data().to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_NE(opt.param_state(master), nullptr);
  EXPECT_EQ(opt.param_state(model), nullptr);
}

TEST(OptimizerTest, StepUsesTheGroupLrAsWritten) {
  Tensor w = Param({1});
  SGD opt(std::vector<Tensor>{w});
  opt.param_groups()[0].set_lr(0.25);
  SetGrad(w, {2});
  opt.step();
  EXPECT_EQ(w.data().to_vector<float>(), (std::vector<float>{0.5f}));
}

TEST(OptimizerTest, StepValidatesEverythingBeforeUpdating) {
  Tensor w = Param({1}), b = Param({2});
  SGDOptions o;
  o.lr(1);
  SGD opt({ParamGroup({w}), ParamGroup({b})}, o);
  SetGrad(w, {1});
  b.set_grad(Tensor(RawTensor::FromVector<int64_t>({1}, {1})));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { opt.step(); },
      "SGD.step: the gradient of param 0 of param group 1 has dtype i64; expected a floating "
      "dtype"));
  EXPECT_EQ(w.data().to_vector<float>(), (std::vector<float>{1}));
  EXPECT_FALSE(opt.has_state());

  SetGrad(b, {1});
  opt.param_groups()[1].params.push_back(w);
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.step(); },
                                 "SGD.step: param 1 of param group 1 is the same variable as "
                                 "param 0 of param group 0; a parameter may appear only once"));
  opt.param_groups()[1].params.pop_back();
  const ParamGroup kept = opt.param_groups()[1];
  opt.param_groups()[1] = ParamGroup(kept.params, AdamWOptions());
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { opt.step(); },
      "SGD.step: param group 1: options are AdamWOptions; SGD takes SGDOptions"));
  opt.param_groups()[1] = kept;
  opt.param_groups()[1].set_lr(-1);
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.step(); },
                                 "SGD.step: param group 1: invalid lr -1 (must be >= 0)"));
  EXPECT_EQ(w.data().to_vector<float>(), (std::vector<float>{1}));
}

// Adam with two groups; param 1 never gets a gradient, so it has no state entries.
struct AdamFixture {
  std::vector<Tensor> params;
  std::unique_ptr<Adam> opt;
  explicit AdamFixture(bool amsgrad = true) {
    params = {Param({1, 2, 3}), Param({4}), Param({5, 6}, kF16)};
    AdamOptions o;
    o.lr(0.1);
    o.amsgrad(amsgrad);
    opt = std::make_unique<Adam>(std::vector<ParamGroup>{ParamGroup({params[0], params[1]}),
                                                         ParamGroup({params[2]},
                                                                    [&] {
                                                                      AdamOptions second = o;
                                                                      second.weight_decay(0.5);
                                                                      second.lr(0.2);
                                                                      return second;
                                                                    }())},
                                 o);
  }
  void Step(float scale) {
    SetGrad(params[0], {scale, -scale, 2 * scale});
    SetGrad(params[2], {scale, 3 * scale});
    opt->step();
  }
};

TEST(OptimizerTest, StateDictKeysLikePyTorch) {
  AdamFixture f;
  f.Step(1);
  f.Step(0.5);
  const StateDict sd = f.opt->state_dict();
  std::vector<std::string> tensors, scalars;
  for (const auto& kv : sd.tensors) tensors.push_back(kv.first);
  for (const auto& kv : sd.scalars) scalars.push_back(kv.first);
  EXPECT_EQ(tensors, (std::vector<std::string>{"param_groups.0.params", "param_groups.1.params",
                                               "state.0.exp_avg", "state.0.exp_avg_sq",
                                               "state.0.max_exp_avg_sq", "state.2.exp_avg",
                                               "state.2.exp_avg_sq", "state.2.max_exp_avg_sq"}));
  EXPECT_EQ(scalars, (std::vector<std::string>{
                         "param_groups.0.amsgrad", "param_groups.0.beta1", "param_groups.0.beta2",
                         "param_groups.0.eps", "param_groups.0.lr", "param_groups.0.weight_decay",
                         "param_groups.1.amsgrad", "param_groups.1.beta1", "param_groups.1.beta2",
                         "param_groups.1.eps", "param_groups.1.lr", "param_groups.1.weight_decay",
                         "state.0.step", "state.2.step"}));
  EXPECT_EQ(sd.tensor("param_groups.0.params").to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(sd.tensor("param_groups.1.params").to_vector<int64_t>(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sd.scalar("param_groups.1.lr"), 0.2);
  EXPECT_EQ(sd.scalar("param_groups.1.weight_decay"), 0.5);
  EXPECT_EQ(sd.scalar("state.2.step"), 2);
  EXPECT_EQ(sd.tensor("state.2.exp_avg").dtype(), kF32);  // f16 param, f32 state
}

// A state dict as the optimizers wrote it when groups held maps of names to doubles (the same
// keys checkpoints of that time hold) loads into the typed options, field by field, and is
// written back under exactly the same keys and values.
TEST(OptimizerTest, TypedOptionsLoadAndSaveTheOldKeys) {
  StateDict old;
  old.scalars = {{"param_groups.0.dampening", 0.125},
                 {"param_groups.0.lr", 0.25},
                 {"param_groups.0.momentum", 0.5},
                 {"param_groups.0.nesterov", 0},
                 {"param_groups.0.weight_decay", 0.75},
                 {"param_groups.1.dampening", 0},
                 {"param_groups.1.lr", 2},
                 {"param_groups.1.momentum", 0.9},
                 {"param_groups.1.nesterov", 1},
                 {"param_groups.1.weight_decay", 0}};
  old.tensors = {{"param_groups.0.params", RawTensor::FromVector<int64_t>({0}, {1})},
                 {"param_groups.1.params", RawTensor::FromVector<int64_t>({1}, {1})},
                 {"state.1.momentum_buffer", RawTensor::FromVector<float>({3}, {1})}};
  Tensor w = Param({1, 2}), b = Param({3});
  SGD opt({ParamGroup({w}), ParamGroup({b})});
  opt.load_state_dict(old);
  const SGDOptions& g0 = opt.param_groups()[0].options_as<SGDOptions>();
  const SGDOptions& g1 = opt.param_groups()[1].options_as<SGDOptions>();
  EXPECT_EQ(g0.dampening(), 0.125);
  EXPECT_EQ(g0.lr(), 0.25);
  EXPECT_EQ(g0.momentum(), 0.5);
  EXPECT_FALSE(g0.nesterov());
  EXPECT_EQ(g0.weight_decay(), 0.75);
  EXPECT_EQ(g1.lr(), 2);
  EXPECT_EQ(g1.momentum(), 0.9);
  EXPECT_TRUE(g1.nesterov());
  const StateDict back = opt.state_dict();
  EXPECT_EQ(back.scalars, old.scalars);
  EXPECT_EQ(back.tensors.size(), old.tensors.size());
  EXPECT_EQ(back.tensor("state.1.momentum_buffer").to_vector<float>(), (std::vector<float>{3}));
  // A name the options lack, or one missing, is still refused by name.
  StateDict extra = old;
  extra.scalars["param_groups.0.beta1"] = 0.9;
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.load_state_dict(extra); },
                                 "SGD.load_state_dict: unexpected scalar 'param_groups.0.beta1'"));
  StateDict missing = old;
  missing.scalars.erase("param_groups.1.momentum");
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.load_state_dict(missing); },
                                 "SGD.load_state_dict: missing scalar 'param_groups.1.momentum'"));
}

TEST(OptimizerTest, StateDictIsASnapshot) {
  AdamFixture f;
  f.Step(1);
  const StateDict sd = f.opt->state_dict();
  const std::vector<float> saved = sd.tensor("state.0.exp_avg").to_vector<float>();
  f.Step(1);
  EXPECT_EQ(sd.tensor("state.0.exp_avg").to_vector<float>(), saved);
  EXPECT_EQ(sd.scalar("state.0.step"), 1);
}

// Save after 3 steps, load into a fresh optimizer over copies of the parameters, and continue:
// both runs give the same bits, and state_dict() -> load -> state_dict() is the identity.
TEST(OptimizerTest, StateDictRoundTripContinuesBitIdentically) {
  for (bool amsgrad : {false, true}) {
    AdamFixture a(amsgrad);
    for (int k = 0; k < 3; ++k) a.Step(1.0f / (k + 1));
    const StateDict sd = a.opt->state_dict();
    AdamFixture b(amsgrad);
    for (size_t i = 0; i < b.params.size(); ++i) b.params[i].data().copy_(a.params[i].data());
    b.opt->param_groups()[1].set_lr(123);  // restored by the load
    b.opt->load_state_dict(sd);
    EXPECT_EQ(b.opt->param_groups()[1].lr(), 0.2);
    ExpectSameStateDict(b.opt->state_dict(), sd);
    for (int k = 3; k < 6; ++k) {
      a.Step(1.0f / (k + 1));
      b.Step(1.0f / (k + 1));
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      EXPECT_TRUE(SameBits(a.params[i].data(), b.params[i].data())) << i;
    }
    ExpectSameStateDict(a.opt->state_dict(), b.opt->state_dict());
  }
}

TEST(OptimizerTest, SgdMomentumStateDictRoundTrip) {
  SGDOptions o;
  o.lr(0.1);
  o.momentum(0.9);
  Tensor w = Param({1, 2}), w2 = Param({1, 2});
  SGD a(std::vector<Tensor>{w}, o);
  SGD b(std::vector<Tensor>{w2}, o);
  SetGrad(w, {1, 2});
  a.step();
  b.load_state_dict(a.state_dict());
  w2.data().copy_(w.data());
  for (int k = 0; k < 2; ++k) {
    SetGrad(w, {0.5f, -1});
    SetGrad(w2, {0.5f, -1});
    a.step();
    b.step();
  }
  EXPECT_TRUE(SameBits(w.data(), w2.data()));
  ExpectSameStateDict(a.state_dict(), b.state_dict());
}

TEST(OptimizerTest, LoadStateDictValidatesAndLeavesTheOptimizerUnchanged) {
  AdamFixture f;
  f.Step(1);
  const StateDict good = f.opt->state_dict();
  const std::string op = "Adam.load_state_dict: ";
  auto expect_error = [&](StateDict sd, const std::string& message) {
    AdamFixture g;
    g.Step(2);
    const StateDict before = g.opt->state_dict();
    EXPECT_TRUE(ThrowsErrorExactly([&] { g.opt->load_state_dict(sd); }, message));
    ExpectSameStateDict(g.opt->state_dict(), before);
  };
  {  // group count
    StateDict one;
    for (const auto& [k, v] : good.scalars)
      if (k.rfind("param_groups.0.", 0) == 0) one.scalars[k] = v;
    one.tensors["param_groups.0.params"] = good.tensor("param_groups.0.params");
    expect_error(one, op + "the state dict has 1 param groups, the optimizer has 2");
  }
  {  // params per group
    StateDict sd = good;
    sd.tensors["param_groups.0.params"] = RawTensor::FromVector<int64_t>({0}, {1});
    expect_error(sd, op + "param group 0 has 1 params in the state dict, 2 in the optimizer");
  }
  {  // missing option
    StateDict sd = good;
    sd.scalars.erase("param_groups.1.beta2");
    expect_error(sd, op + "missing scalar 'param_groups.1.beta2'");
  }
  {  // unknown option
    StateDict sd = good;
    sd.scalars["param_groups.0.momentum"] = 0.9;
    expect_error(sd, op + "unexpected scalar 'param_groups.0.momentum'");
  }
  {  // bad option value
    StateDict sd = good;
    sd.scalars["param_groups.0.beta1"] = 1.5;
    expect_error(sd, op + "param group 0: invalid beta1 1.5 (must be in [0, 1))");
  }
  {  // missing state tensor
    StateDict sd = good;
    sd.tensors.erase("state.2.exp_avg_sq");
    expect_error(sd, op + "missing tensor 'state.2.exp_avg_sq'");
  }
  {  // missing amsgrad state when the loaded options turn amsgrad on
    StateDict sd = good;
    sd.tensors.erase("state.0.max_exp_avg_sq");
    expect_error(sd, op + "missing tensor 'state.0.max_exp_avg_sq'");
  }
  {  // missing step
    StateDict sd = good;
    sd.scalars.erase("state.0.step");
    expect_error(sd, op + "missing scalar 'state.0.step'");
  }
  {  // state shape
    StateDict sd = good;
    sd.tensors["state.0.exp_avg"] = RawTensor::Zeros({2});
    expect_error(sd, op + "'state.0.exp_avg' has shape [2] but param 0 of param group 0 has "
                          "shape [3]");
  }
  {  // state dtype (the f16 param keeps f32 state)
    StateDict sd = good;
    sd.tensors["state.2.exp_avg"] = RawTensor::Zeros({2}, kF16);
    expect_error(sd, op + "'state.2.exp_avg' has dtype f16, expected f32 (the state dtype of a "
                          "f16 param)");
  }
  {  // state for an id no param has
    StateDict sd = good;
    sd.scalars["state.7.step"] = 1;
    expect_error(sd, op + "state for param id 7 but no param has that id ('state.7....')");
  }
  {  // unknown state entry
    StateDict sd = good;
    sd.tensors["state.0.momentum_buffer"] = RawTensor::Zeros({3});
    expect_error(sd, op + "unexpected tensor 'state.0.momentum_buffer'");
  }
  {  // a non-finite moment (an inf second moment froze its element for good)
    StateDict sd = good;
    sd.tensors["state.0.exp_avg_sq"] = RawTensor::FromVector<float>({0, INFINITY, 0}, {3});
    expect_error(sd, op + "'state.0.exp_avg_sq' holds a NaN or infinite value; the state of an "
                          "optimizer must be finite");
  }
  {  // bad step
    StateDict sd = good;
    sd.scalars["state.0.step"] = 1.5;
    expect_error(sd, op + "'state.0.step' is 1.5; expected a non-negative integer");
  }
  {  // a key outside the layout
    StateDict sd = good;
    sd.scalars["scale"] = 1;
    expect_error(sd, op + "unexpected scalar 'scale'");
  }
  {  // missing params list
    StateDict sd = good;
    sd.tensors.erase("param_groups.1.params");
    expect_error(sd, op + "missing tensor 'param_groups.1.params'");
  }
}

TEST(OptimizerTest, LoadedStateIsACopy) {
  AdamFixture a;
  a.Step(1);
  StateDict sd = a.opt->state_dict();
  AdamFixture b;
  b.opt->load_state_dict(sd);
  sd.tensors["state.0.exp_avg"].fill_(42);
  EXPECT_NE(b.opt->param_state(b.params[0])->tensor("exp_avg").to_vector<float>()[0], 42);
  EXPECT_TRUE(b.opt->has_state());
  EXPECT_EQ(b.opt->param_state(b.params[1]), nullptr);
}

}  // namespace
}  // namespace tg::optim
