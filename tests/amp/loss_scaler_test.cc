// LossScaler: the required trajectories of each preset (the scale after every update, flags given
// as T = found_inf / F = clean), the preset-specific rules, options validation and state_dict
// round trips that resume the same trajectory.
#include "amp/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/state_dict.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace amp {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr char kAtMinimum[] =
    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";

// The scale after each update, one update per character of `flags` ('T' = found_inf).
std::vector<double> Trajectory(LossScaler& scaler, const std::string& flags) {
  std::vector<double> scales;
  for (char flag : flags) {
    scaler.update(flag == 'T');
    scales.push_back(scaler.scale());
  }
  return scales;
}

using Scales = std::vector<double>;

// ---- PyTorch GradScaler ------------------------------------------------------------------------

TEST(LossScalerTest, PyTorchGrowsEveryInterval) {
  LossScaler scaler = LossScaler::PyTorch(65536, 2.0, 0.5, 3);
  EXPECT_EQ(scaler.scale(), 65536);
  EXPECT_EQ(Trajectory(scaler, "FFFFFF"), (Scales{65536, 65536, 131072, 131072, 131072, 262144}));
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.iteration(), 6);
}

TEST(LossScalerTest, PyTorchBacksOffOnEveryOverflow) {
  LossScaler scaler = LossScaler::PyTorch(65536, 2.0, 0.5, 3);
  EXPECT_EQ(Trajectory(scaler, "TTFFFTF"),
            (Scales{32768, 16384, 16384, 16384, 32768, 16384, 16384}));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.clean_streak(), 1);
}

TEST(LossScalerTest, PyTorchDefaults) {
  LossScaler scaler = LossScaler::PyTorch();
  EXPECT_EQ(scaler.scale(), 65536);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_EQ(Trajectory(scaler, std::string(1999, 'F')).back(), 65536);
  EXPECT_EQ(scaler.growth_tracker(), 1999);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(LossScalerTest, PyTorchDoesNotGrowToF32Inf) {
  const double init = 1.5 * std::ldexp(1.0, 127);  // an f32; times 2 is beyond FLT_MAX
  LossScaler scaler = LossScaler::PyTorch(init, 2.0, 0.5, 1);
  EXPECT_EQ(Trajectory(scaler, "FF"), (Scales{init, init}));
  EXPECT_EQ(scaler.growth_tracker(), 0);  // the tracker still resets
  EXPECT_EQ(Trajectory(scaler, "T"), (Scales{init / 2}));
  EXPECT_EQ(Trajectory(scaler, "F"), (Scales{init}));

  // The same rule with a double scale: 3 * 2^127 is a finite double, so it grows.
  LossScaler::Options options;
  options.init_scale = init;
  options.growth_interval = 1;
  LossScaler in_double(options);
  EXPECT_EQ(Trajectory(in_double, "F"), (Scales{2 * init}));
}

TEST(LossScalerTest, PyTorchRoundsEachProductToF32WithDoubleFactors) {
  LossScaler scaler = LossScaler::PyTorch(1000, 1.1, 0.3, 1);
  const std::string flags = "FFTFFFTTFFFFFFFTFFFFTFFFFFFFFFFFFFTFF";
  float expected = 1000;
  double in_double = 1000;
  for (char flag : flags) {
    // PyTorch: float * double factor in double, stored back into the f32 scale.
    expected = static_cast<float>(expected * (flag == 'T' ? 0.3 : 1.1));
    in_double *= flag == 'T' ? 0.3 : 1.1;
    scaler.update(flag == 'T');
    ASSERT_EQ(scaler.scale(), static_cast<double>(expected)) << "at update " << scaler.iteration();
  }
  EXPECT_NE(scaler.scale(), in_double);  // the f32 rounding is visible
}

// ---- Megatron DynamicGradScaler / ConstantGradScaler -------------------------------------------

TEST(LossScalerTest, MegatronHysteresisDelaysBackoff) {
  LossScaler scaler = LossScaler::MegatronDynamic(1024, 1, 2.0, 0.5, 3, 2);
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);
  EXPECT_EQ(Trajectory(scaler, "TTT"), (Scales{1024, 512, 256}));
  EXPECT_EQ(scaler.hysteresis_tracker(), -1);  // Megatron's tracker keeps decreasing
  EXPECT_EQ(Trajectory(scaler, "FFF"), (Scales{256, 256, 512}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 2);  // refilled by the growth step
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(LossScalerTest, MegatronCleanStepDoesNotRefillHysteresis) {
  LossScaler scaler = LossScaler::MegatronDynamic(1024, 1, 2.0, 0.5, 3, 2);
  EXPECT_EQ(Trajectory(scaler, "TFT"), (Scales{1024, 1024, 512}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 0);
}

TEST(LossScalerTest, MegatronClampsAtMinScaleAndNeverRaises) {
  LossScaler scaler = LossScaler::MegatronDynamic(4, 1, 2.0, 0.5, 1000, 1);
  EXPECT_EQ(Trajectory(scaler, "TTTTT"), (Scales{2, 1, 1, 1, 1}));
  LossScaler odd_min = LossScaler::MegatronDynamic(8, 3, 2.0, 0.5, 1000, 1);
  EXPECT_EQ(Trajectory(odd_min, "TTT"), (Scales{4, 3, 3}));
}

TEST(LossScalerTest, MegatronMultipliesInF32) {
  LossScaler scaler = LossScaler::MegatronDynamic(1000, 1, 1.1, 0.3, 1, 1);
  EXPECT_EQ(scaler.options().growth_factor, static_cast<double>(1.1f));
  EXPECT_EQ(scaler.options().backoff_factor, static_cast<double>(0.3f));
  const std::string flags = "FFTFFFTTFFFFFFFTFFFFTFFFFFFFFFFFFFTFF";
  float expected = 1000;
  for (char flag : flags) {
    expected = flag == 'T' ? std::max(expected * 0.3f, 1.0f) : expected * 1.1f;  // f32 tensors
    scaler.update(flag == 'T');
    ASSERT_EQ(scaler.scale(), static_cast<double>(expected)) << "at update " << scaler.iteration();
  }
}

TEST(LossScalerTest, MegatronGrowthOverflowsToInfAsInMegatron) {
  const double init = 1.5 * std::ldexp(1.0, 127);
  LossScaler scaler = LossScaler::MegatronDynamic(init, 1, 2.0, 0.5, 1, 1);
  EXPECT_EQ(Trajectory(scaler, "F"), (Scales{kInf}));
}

TEST(LossScalerTest, MegatronConstantNeverChanges) {
  LossScaler scaler = LossScaler::MegatronConstant(1.0 / 3);
  const double third = static_cast<float>(1.0 / 3);
  EXPECT_EQ(scaler.scale(), third);
  EXPECT_EQ(Trajectory(scaler, "TTFFFFT"), Scales(7, third));
  EXPECT_EQ(scaler.iteration(), 7);
}

// ---- DeepSpeed DynamicLossScaler ---------------------------------------------------------------

TEST(LossScalerTest, DeepSpeedFirstGrowthAfterWindowPlusOneCleanUpdates) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 2, 1, 1);
  EXPECT_EQ(Trajectory(scaler, "FFFFFFF"), (Scales{1024, 1024, 2048, 2048, 4096, 4096, 8192}));
}

TEST(LossScalerTest, DeepSpeedGrowthCountsFromTheLastOverflow) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 2, 1, 1);
  EXPECT_EQ(Trajectory(scaler, "FFFT"), (Scales{1024, 1024, 2048, 1024}));
  EXPECT_EQ(Trajectory(scaler, "FFFFF"), (Scales{1024, 1024, 2048, 2048, 4096}));
}

TEST(LossScalerTest, DeepSpeedHysteresisWithoutConsecutiveRefill) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 1000, 1, 2, false);
  EXPECT_EQ(Trajectory(scaler, "TFTT"), (Scales{1024, 1024, 512, 256}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);  // never below 1
}

TEST(LossScalerTest, DeepSpeedConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 1000, 1, 3, true);
  std::vector<int64_t> trackers;
  for (char flag : std::string("TTFTT")) {
    scaler.update(flag == 'T');
    EXPECT_EQ(scaler.scale(), 1024);
    trackers.push_back(scaler.hysteresis_tracker());
  }
  EXPECT_EQ(trackers, (std::vector<int64_t>{2, 1, 3, 2, 1}));
  EXPECT_EQ(Trajectory(scaler, "T"), (Scales{512}));

  LossScaler not_consecutive = LossScaler::DeepSpeedDynamic(1024, 2.0, 1000, 1, 3, false);
  EXPECT_EQ(Trajectory(not_consecutive, "TTFT"), (Scales{1024, 1024, 1024, 512}));
}

TEST(LossScalerTest, DeepSpeedGrowthRefillsHysteresis) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 1, 1, 3, false);
  EXPECT_EQ(Trajectory(scaler, "TTF"), (Scales{1024, 1024, 1024}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
  EXPECT_EQ(Trajectory(scaler, "F"), (Scales{2048}));  // window 1: the second clean update grows
  EXPECT_EQ(scaler.hysteresis_tracker(), 3);
}

TEST(LossScalerTest, DeepSpeedRaisesAtMinScale) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(4, 2.0, 1000, 1, 1, false, true);
  EXPECT_EQ(Trajectory(scaler, "TT"), (Scales{2, 1}));
  EXPECT_TRUE(ThrowsErrorExactly([&] { scaler.update(true); }, kAtMinimum));
  EXPECT_EQ(scaler.scale(), 1);  // nothing changed
  EXPECT_EQ(scaler.iteration(), 2);
  EXPECT_EQ(Trajectory(scaler, "F"), (Scales{1}));  // a clean step still works

  LossScaler no_raise = LossScaler::DeepSpeedDynamic(4, 2.0, 1000, 1, 1, false, false);
  EXPECT_EQ(Trajectory(no_raise, "TTTT"), (Scales{2, 1, 1, 1}));
}

TEST(LossScalerTest, DeepSpeedRaisesOnlyWhenHysteresisIsSpent) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1, 2.0, 1000, 1, 2, false, true);
  EXPECT_EQ(Trajectory(scaler, "T"), (Scales{1}));  // tolerated by hysteresis: no raise
  EXPECT_TRUE(ThrowsErrorExactly([&] { scaler.update(true); }, kAtMinimum));
}

TEST(LossScalerTest, DeepSpeedDividesByScaleFactorInDouble) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1000, 3.0, 1, 1e-3, 1, false);
  EXPECT_EQ(Trajectory(scaler, "TT"), (Scales{1000.0 / 3, 1000.0 / 3 / 3}));
  EXPECT_EQ(Trajectory(scaler, "FF"), (Scales{1000.0 / 3 / 3, 1000.0 / 3 / 3 * 3}));
}

TEST(LossScalerTest, DeepSpeedDefaults) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic();
  EXPECT_EQ(scaler.scale(), 4294967296.0);
  EXPECT_EQ(scaler.options().growth_interval, 1000);
  EXPECT_EQ(scaler.options().min_scale, 1);
  EXPECT_EQ(scaler.options().hysteresis, 1);
  EXPECT_TRUE(scaler.options().raise_at_min_scale);
  EXPECT_FALSE(scaler.options().f32_scale);
}

// ---- Generic options ---------------------------------------------------------------------------

TEST(LossScalerTest, GrowthNeverExceedsMaxScale) {
  LossScaler::Options options;
  options.init_scale = 1024;
  options.growth_interval = 1;
  options.max_scale = 3000;
  LossScaler scaler(options);
  EXPECT_EQ(Trajectory(scaler, "FFFTF"), (Scales{2048, 3000, 3000, 1500, 3000}));

  LossScaler::Options f32 = LossScaler::PyTorch(1024, 2.0, 0.5, 1).options();
  f32.max_scale = 3000.0002;  // nearest f32 is 3000.000244; the cap is the f32 below
  LossScaler capped(f32);
  EXPECT_EQ(Trajectory(capped, "FF"), (Scales{2048, 3000}));
}

TEST(LossScalerTest, ConstantScalerNeverChanges) {
  LossScaler scaler = LossScaler::Constant(1.0 / 3);
  EXPECT_EQ(Trajectory(scaler, "TTTFFFFFFFFFFT"), Scales(14, 1.0 / 3));
  EXPECT_EQ(scaler.iteration(), 14);
  EXPECT_EQ(scaler.clean_streak(), 0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  Trajectory(scaler, "FF");
  EXPECT_EQ(scaler.clean_streak(), 2);

  LossScaler::Options options;
  options.dynamic = false;
  options.init_scale = 8;
  options.growth_interval = 1;
  LossScaler by_option(options);
  EXPECT_EQ(Trajectory(by_option, "FFTT"), Scales(4, 8));
}

TEST(LossScalerTest, OptionsAreValidated) {
  auto with = [](const std::function<void(LossScaler::Options&)>& edit) {
    return [edit] {
      LossScaler::Options options;
      edit(options);
      LossScaler scaler(options);
    };
  };
  EXPECT_TRUE(ThrowsErrorExactly(with([](auto& o) { o.init_scale = 0; }),
                                 "LossScaler: init_scale must be positive and finite, got 0"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) { o.init_scale = kInf; }), "init_scale"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) { o.init_scale = std::nan(""); }), "init_scale"));
  EXPECT_TRUE(ThrowsErrorExactly(with([](auto& o) { o.growth_factor = 0.5; }),
                                 "LossScaler: growth_factor must be finite and >= 1, got 0.5"));
  EXPECT_TRUE(ThrowsErrorExactly(with([](auto& o) { o.backoff_factor = 0; }),
                                 "LossScaler: backoff_factor must be in (0, 1], got 0"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) { o.backoff_factor = 1.5; }), "backoff_factor"));
  EXPECT_TRUE(ThrowsErrorExactly(with([](auto& o) { o.growth_interval = 0; }),
                                 "LossScaler: growth_interval must be >= 1, got 0"));
  EXPECT_TRUE(ThrowsErrorExactly(with([](auto& o) { o.hysteresis = 0; }),
                                 "LossScaler: hysteresis must be >= 1, got 0"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) { o.min_scale = -1; }), "min_scale must be finite"));
  EXPECT_TRUE(
      ThrowsErrorExactly(with([](auto& o) { o.min_scale = 1e6; }),
                         "LossScaler: min_scale (1e+06) must not exceed init_scale (65536)"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) { o.max_scale = 1024; }),
                          "max_scale (1024) must be at least init_scale (65536)"));
  EXPECT_TRUE(ThrowsError(with([](auto& o) {
                            o.backoff_by_division = true;
                            o.growth_factor = 4;
                          }),
                          "backoff_factor must be 1 / growth_factor"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::PyTorch(65536, 2.0, 0.5, 0); }, "growth_interval"));
  EXPECT_TRUE(
      ThrowsError([] { LossScaler::MegatronDynamic(1024, 2048, 2.0, 0.5, 10, 1); }, "min_scale"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::DeepSpeedDynamic(1024, 0.5); },
                          "LossScaler: scale_factor must be finite and >= 1, got 0.5"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::Constant(-1); }, "init_scale"));
}

// ---- state_dict --------------------------------------------------------------------------------

TEST(LossScalerTest, StateDictHoldsTheCounters) {
  LossScaler scaler = LossScaler::MegatronDynamic(1024, 1, 2.0, 0.5, 3, 2);
  Trajectory(scaler, "FTTFF");
  StateDict state = scaler.state_dict();
  EXPECT_TRUE(state.tensors.empty());
  EXPECT_EQ(state.scalars, (std::map<std::string, double>{{"scale", 512},
                                                          {"growth_tracker", 2},
                                                          {"hysteresis_tracker", 0},
                                                          {"clean_streak", 2},
                                                          {"iteration", 5},
                                                          {"dynamic", 1}}));
}

struct Preset {
  std::string name;
  std::function<LossScaler()> make;
};

TEST(LossScalerTest, StateDictRoundTripResumesTheSameTrajectory) {
  const std::vector<Preset> presets = {
      {"PyTorch", [] { return LossScaler::PyTorch(65536, 2.0, 0.5, 3); }},
      {"PyTorchOddFactors", [] { return LossScaler::PyTorch(1000, 1.1, 0.3, 2); }},
      {"Megatron", [] { return LossScaler::MegatronDynamic(1024, 1, 2.0, 0.5, 3, 2); }},
      {"MegatronConstant", [] { return LossScaler::MegatronConstant(4096); }},
      {"DeepSpeed", [] { return LossScaler::DeepSpeedDynamic(1024, 2.0, 2, 1, 1); }},
      {"DeepSpeedHysteresis", [] { return LossScaler::DeepSpeedDynamic(1024, 2.0, 3, 1, 3); }},
      {"DeepSpeedConsecutive",
       [] { return LossScaler::DeepSpeedDynamic(1024, 2.0, 3, 1, 3, true, false); }},
      {"Constant", [] { return LossScaler::Constant(8); }},
  };
  const std::string flags = "FFFFFFTFFFFTTTFFFFFFFFTFTFFFFFFFTTTTTFFFFFFFFFFF";
  for (const Preset& preset : presets) {
    SCOPED_TRACE(preset.name);
    LossScaler reference = preset.make();
    std::vector<StateDict> saved;  // saved[k]: the state after k updates
    std::vector<LossScaler> after;
    saved.push_back(reference.state_dict());
    after.push_back(reference);
    for (char flag : flags) {
      reference.update(flag == 'T');
      saved.push_back(reference.state_dict());
      after.push_back(reference);
    }
    for (size_t k = 0; k < saved.size(); ++k) {
      LossScaler resumed = preset.make();
      resumed.load_state_dict(saved[k]);
      for (size_t i = k; i <= flags.size(); ++i) {
        const LossScaler& expected = after[i];
        ASSERT_EQ(resumed.scale(), expected.scale()) << "saved at " << k << ", update " << i;
        ASSERT_EQ(resumed.growth_tracker(), expected.growth_tracker()) << k << " " << i;
        ASSERT_EQ(resumed.hysteresis_tracker(), expected.hysteresis_tracker()) << k << " " << i;
        ASSERT_EQ(resumed.clean_streak(), expected.clean_streak()) << k << " " << i;
        ASSERT_EQ(resumed.iteration(), expected.iteration()) << k << " " << i;
        if (i < flags.size()) resumed.update(flags[i] == 'T');
      }
    }
  }
}

TEST(LossScalerTest, LoadStateDictNamesMissingKeys) {
  LossScaler scaler = LossScaler::PyTorch(65536, 2.0, 0.5, 3);
  StateDict state = LossScaler::PyTorch(1024, 2.0, 0.5, 3).state_dict();
  state.scalars.erase("iteration");
  state.scalars.erase("clean_streak");
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { scaler.load_state_dict(state); },
      "LossScaler::load_state_dict: missing scalar(s) 'clean_streak', 'iteration' (a loss "
      "scaler's state holds the scalars 'scale', 'growth_tracker', 'hysteresis_tracker', "
      "'clean_streak', 'iteration', 'dynamic')"));
  EXPECT_EQ(scaler.scale(), 65536);  // unchanged
  EXPECT_TRUE(ThrowsError([&] { scaler.load_state_dict(StateDict()); },
                          "missing scalar(s) 'scale', 'growth_tracker', 'hysteresis_tracker', "
                          "'clean_streak', 'iteration', 'dynamic'"));
}

TEST(LossScalerTest, LoadStateDictRejectsWrongState) {
  LossScaler scaler = LossScaler::PyTorch(65536, 2.0, 0.5, 3);
  const StateDict good = LossScaler::PyTorch(1024, 2.0, 0.5, 3).state_dict();
  auto edited = [&](const std::function<void(StateDict&)>& edit) {
    StateDict state = good;
    edit(state);
    return [&scaler, state] { scaler.load_state_dict(state); };
  };
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["_growth_tracker"] = 0; }),
                          "unexpected scalar '_growth_tracker'"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) {
                            s.scalars.erase("scale");
                            s.tensors["scale"] = Tensor();
                          }),
                          "missing scalar(s) 'scale'; unexpected tensor 'scale'"));
  EXPECT_TRUE(ThrowsErrorExactly(
      edited([](StateDict& s) { s.scalars["dynamic"] = 0; }),
      "LossScaler::load_state_dict: the state is from a constant scaler, this scaler is dynamic"));
  EXPECT_TRUE(ThrowsError([&] { scaler.load_state_dict(LossScaler::Constant(2).state_dict()); },
                          "from a constant scaler"));
  EXPECT_TRUE(ThrowsError([&] { LossScaler::Constant(2).load_state_dict(good); },
                          "the state is from a dynamic scaler, this scaler is constant"));
  EXPECT_TRUE(ThrowsErrorExactly(
      edited([](StateDict& s) { s.scalars["growth_tracker"] = 1.5; }),
      "LossScaler::load_state_dict: 'growth_tracker' must be an integer, got 1.5"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["iteration"] = 1e300; }),
                          "'iteration' must be an integer"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["scale"] = -1; }),
                          "'scale' must be >= 0 and not NaN, got -1"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["scale"] = std::nan(""); }),
                          "'scale' must be >= 0 and not NaN"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["growth_tracker"] = 2; }),
                          "counters out of order: expected 0 <= growth_tracker (2) <= "
                          "clean_streak (0) <= iteration (0)"));
  EXPECT_EQ(scaler.scale(), 65536);
  EXPECT_EQ(scaler.iteration(), 0);
}

TEST(LossScalerTest, LoadStateDictRoundsToTheScalersType) {
  StateDict state = LossScaler::DeepSpeedDynamic(1.0 / 3, 2.0, 1000, 0).state_dict();
  LossScaler f32 = LossScaler::PyTorch();
  f32.load_state_dict(state);
  EXPECT_EQ(f32.scale(), static_cast<double>(static_cast<float>(1.0 / 3)));
  LossScaler f64 = LossScaler::DeepSpeedDynamic(1024, 2.0, 1000, 0);
  f64.load_state_dict(state);
  EXPECT_EQ(f64.scale(), 1.0 / 3);

  // A constant scaler keeps its configured scale.
  LossScaler constant = LossScaler::Constant(8);
  StateDict other = LossScaler::Constant(2).state_dict();
  other.scalars["iteration"] = 5;
  constant.load_state_dict(other);
  EXPECT_EQ(constant.scale(), 8);
  EXPECT_EQ(constant.iteration(), 5);
}

}  // namespace
}  // namespace amp
}  // namespace tg
