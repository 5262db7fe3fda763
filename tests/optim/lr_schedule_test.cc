#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <vector>

#include "optim/sgd.h"
#include "tensor/state_dict.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

using tg::testing::ThrowsErrorExactly;

// An SGD with two groups of base lr 6e-4 and 1e-3.
struct Fixture {
  Tensor w{RawTensor::FromVector<float>({1, 2}, {2}), true};
  Tensor b{RawTensor::FromVector<float>({3}, {1}), true};
  SGD opt;
  Fixture() : opt(MakeGroups(w, b), Defaults()) {}
  static std::vector<ParamGroup> MakeGroups(const Tensor& w, const Tensor& b) {
    SGDOptions second = Defaults();
    second.lr(1e-3);
    return {ParamGroup({w}), ParamGroup({b}, second)};
  }
  static SGDOptions Defaults() {
    SGDOptions o;
    o.lr(6e-4);
    return o;
  }
  std::vector<double> lrs() const {
    return {opt.param_groups()[0].lr(), opt.param_groups()[1].lr()};
  }
};

// Expected values: the formulas in lr_schedule.h evaluated with Python floats (same operation
// order, libm cos), so equality is exact.
TEST(LrScheduleTest, CosineWithWarmupSequence) {
  const double kGroup0[] = {0.00019999999999999998,
                            0.00039999999999999996,
                            0.0006,
                            0.0006,
                            0.0005732615943336531,
                            0.000498342246501858,
                            0.0003900806521682048,
                            0.0002699193478317951,
                            0.00016165775349814195,
                            8.673840566634686e-05,
                            6e-05,
                            6e-05};
  const double kGroup1[] = {0.0003333333333333333,
                            0.0006666666666666666,
                            0.001,
                            0.001,
                            0.000953455367914137,
                            0.0008230402068736048,
                            0.0006345848389594678,
                            0.00042541516104053226,
                            0.00023695979312639525,
                            0.00010654463208586306,
                            6e-05,
                            6e-05};
  Fixture f;
  CosineWithWarmupLr sched(f.opt, /*warmup_steps=*/3, /*total_steps=*/10, /*min_lr=*/6e-5);
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{6e-4, 1e-3}));
  for (int t = 0; t < 12; ++t) {
    EXPECT_EQ(sched.last_step(), t);
    EXPECT_EQ(f.lrs(), (std::vector<double>{kGroup0[t], kGroup1[t]})) << "t = " << t;
    sched.step();
  }
}

TEST(LrScheduleTest, StepLrSequence) {
  const double kGroup0[] = {6e-4 * 1, 6e-4 * 1, 6e-4 * 0.5, 6e-4 * 0.5, 6e-4 * 0.25};
  Fixture f;
  StepLr sched(f.opt, /*step_size=*/2, /*gamma=*/0.5);
  for (int t = 0; t < 5; ++t) {
    EXPECT_EQ(f.opt.param_groups()[0].lr(), kGroup0[t]) << t;
    sched.step();
  }
  // A gamma that is not a power of two: base * pow(0.1, t / 3) (PyTorch's closed form).
  SGDOptions o;
  o.lr(0.1);
  Tensor w(RawTensor::Zeros({1}), true);
  SGDOptions half = o;
  half.lr(0.5);
  SGD opt({ParamGroup({w}), ParamGroup(std::vector<Tensor>{}, half)}, o);
  StepLr tenth(opt, /*step_size=*/3);
  const double kTenth0[] = {0.1,
                            0.1,
                            0.1,
                            0.010000000000000002,
                            0.010000000000000002,
                            0.010000000000000002,
                            0.0010000000000000002};
  const double kTenth1[] = {0.5, 0.5, 0.5, 0.05, 0.05, 0.05, 0.005000000000000001};
  for (int t = 0; t < 7; ++t) {
    EXPECT_EQ(opt.param_groups()[0].lr(), kTenth0[t]) << t;
    EXPECT_EQ(opt.param_groups()[1].lr(), kTenth1[t]) << t;
    tenth.step();
  }
}

TEST(LrScheduleTest, ConstantKeepsTheBaseLr) {
  Fixture f;
  ConstantLr sched(f.opt);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(f.lrs(), (std::vector<double>{6e-4, 1e-3}));
    sched.step();
  }
  EXPECT_EQ(sched.last_step(), 3);
}

// A skipped optimizer step (e.g. an f16 overflow) leaves t and the lr as they were: the next real
// step uses the lr the skipped one would have used.
TEST(LrScheduleTest, SkippedStepsDoNotAdvance) {
  Fixture f;
  CosineWithWarmupLr sched(f.opt, 3, 10, 6e-5);
  sched.step();  // t = 1
  const std::vector<double> at1 = f.lrs();
  sched.step(/*optimizer_skipped=*/true);
  sched.step(/*optimizer_skipped=*/true);
  EXPECT_EQ(sched.last_step(), 1);
  EXPECT_EQ(f.lrs(), at1);
  EXPECT_EQ(f.lrs()[0], 0.00039999999999999996);
  sched.step();
  EXPECT_EQ(sched.last_step(), 2);
  EXPECT_EQ(f.lrs()[0], 0.0006);
}

TEST(LrScheduleTest, TheOptimizerStepsWithTheScheduledLr) {
  Tensor w(RawTensor::FromVector<float>({1}, {1}), true);
  SGDOptions o;
  o.lr(1);
  SGD opt(std::vector<Tensor>{w}, o);
  StepLr sched(opt, 1, 0.5);  // lr 1, 0.5, 0.25, ...
  for (int k = 0; k < 3; ++k) {
    w.set_grad(Tensor(RawTensor::FromVector<float>({1}, {1})));
    opt.step();
    sched.step();
  }
  EXPECT_EQ(w.data().to_vector<float>(), (std::vector<float>{1 - 1 - 0.5f - 0.25f}));
}

TEST(LrScheduleTest, StateDictRoundTrip) {
  Fixture a;
  CosineWithWarmupLr sa(a.opt, 3, 10, 6e-5);
  for (int k = 0; k < 5; ++k) sa.step(k == 2);
  const StateDict sd = sa.state_dict();
  EXPECT_EQ(sd.scalars, (std::map<std::string, double>{
                            {"last_step", 4}, {"base_lrs.0", 6e-4}, {"base_lrs.1", 1e-3}}));
  Fixture b;
  CosineWithWarmupLr sb(b.opt, 3, 10, 6e-5);
  sb.load_state_dict(sd);
  EXPECT_EQ(sb.last_step(), 4);
  EXPECT_EQ(b.lrs(), a.lrs());
  for (int k = 0; k < 8; ++k) {
    sa.step();
    sb.step();
    EXPECT_EQ(b.lrs(), a.lrs());
  }
  // The base lrs come from the state dict, not from the lrs the optimizer had when bound.
  Fixture c;
  c.opt.param_groups()[0].set_lr(1);
  ConstantLr sc(c.opt);
  StateDict constant = sd;
  sc.load_state_dict(constant);
  EXPECT_EQ(c.lrs(), (std::vector<double>{6e-4, 1e-3}));
}

TEST(LrScheduleTest, ErrorsAreNamed) {
  Fixture f;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { CosineWithWarmupLr(f.opt, 5, 3); },
      "CosineWithWarmupLr: need 0 <= warmup_steps <= total_steps, got warmup_steps 5 and "
      "total_steps 3"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { StepLr(f.opt, 0); }, "StepLr: step_size must be > 0, got 0"));
  ConstantLr sched(f.opt);
  StateDict sd = sched.state_dict();
  sd.scalars.erase("base_lrs.1");
  EXPECT_TRUE(ThrowsErrorExactly([&] { sched.load_state_dict(sd); },
                                 "LrSchedule.load_state_dict: missing scalar 'base_lrs.1' (the "
                                 "optimizer has 2 param groups)"));
  sd = sched.state_dict();
  sd.scalars["base_lrs.2"] = 1;
  EXPECT_TRUE(ThrowsErrorExactly([&] { sched.load_state_dict(sd); },
                                 "LrSchedule.load_state_dict: unexpected scalar 'base_lrs.2' "
                                 "(the optimizer has 2 param groups)"));
  sd = sched.state_dict();
  sd.scalars["last_step"] = -1;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { sched.load_state_dict(sd); },
      "LrSchedule.load_state_dict: 'last_step' is -1; expected a non-negative integer"));
  f.opt.add_param_group(ParamGroup());
  EXPECT_TRUE(ThrowsErrorExactly([&] { sched.step(); },
                                 "LrSchedule: bound to 2 param groups, the optimizer now has 3"));
}

}  // namespace
}  // namespace tg::optim
