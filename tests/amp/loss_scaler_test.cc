// LossScaler: the required trajectories of each preset (the scale after every update, flags given
// as T = found_inf / F = clean), the preset-specific rules, options validation and state_dict
// round trips that resume the same trajectory. The Apex and DeepSpeed literals come from
// tests/amp/loss_scaler_reference.py; both presets are also run beside a transcription of their
// reference's update in its own terms on random flags.
#include "amp/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
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

// --loss_scaler=deepspeed: the engine's config defaults, not the class's. The (update, scale)
// after every change, from tests/amp/loss_scaler_reference.py (ENGINE_FLAGS), checked by hand:
// hysteresis 2 absorbs the first overflow (update 1) and backs off at the second; the first
// growth after it comes at window + 1 = 1001 clean updates (update 1003) and refills the
// hysteresis, so overflow 1004 is absorbed again and 1006 backs off. The class defaults back off
// at every overflow from 2^32.
TEST(LossScalerTest, DeepSpeedEngineDefaultsTrajectory) {
  const std::string flags = "TT" + std::string(1001, 'F') + "TFT" + std::string(10, 'F');
  using Changes = std::vector<std::pair<int, double>>;
  auto changes = [&](LossScaler scaler) {
    Changes out;
    for (size_t i = 0; i < flags.size(); ++i) {
      const double before = scaler.scale();
      scaler.update(flags[i] == 'T');
      if (scaler.scale() != before) out.push_back({static_cast<int>(i) + 1, scaler.scale()});
    }
    return out;
  };
  LossScaler engine = LossScaler::DeepSpeedEngine();
  EXPECT_EQ(engine.scale(), 65536);
  EXPECT_EQ(engine.options().growth_interval, 1000);
  EXPECT_EQ(engine.options().hysteresis, 2);
  EXPECT_EQ(engine.options().min_scale, 1);
  EXPECT_FALSE(engine.options().consecutive_hysteresis);
  EXPECT_TRUE(engine.options().raise_at_min_scale);
  EXPECT_EQ(changes(engine), (Changes{{2, 32768}, {1003, 65536}, {1006, 32768}}));
  EXPECT_EQ(changes(LossScaler::DeepSpeedDynamic()), (Changes{{1, 2147483648.0},
                                                              {2, 1073741824.0},
                                                              {1003, 2147483648.0},
                                                              {1004, 1073741824.0},
                                                              {1006, 536870912.0}}));
  // The hysteresis tracker after the absorbed overflow, and refilled by the growth.
  LossScaler tracked = LossScaler::DeepSpeedEngine();
  tracked.update(true);
  EXPECT_EQ(tracked.hysteresis_tracker(), 1);
  EXPECT_EQ(tracked.scale(), 65536);
}

TEST(LossScalerTest, DeepSpeedGrowthTimingBeforeAndSinceV0_17_1) {
  // tests/amp/loss_scaler_reference.py: the updates (1-based) whose clean step grew the scale
  // and the scales, DeepSpeed's update_scale with both growth checks on one overflow pattern.
  const std::string flags = "FFFFFFFTFFFFFFTTFFFFFTFFF";
  auto growths = [&](LossScaler scaler) {
    std::vector<int> grew;
    for (size_t i = 0; i < flags.size(); ++i) {
      const double before = scaler.scale();
      scaler.update(flags[i] == 'T');
      if (scaler.scale() > before) grew.push_back(static_cast<int>(i) + 1);
    }
    return grew;
  };
  using Updates = std::vector<int>;
  auto make = [](int64_t window, DeepSpeedGrowth growth) {
    return LossScaler::DeepSpeedDynamic(1024, 2.0, window, 1, 1, false, true, growth);
  };
  EXPECT_EQ(growths(make(3, DeepSpeedGrowth::kBeforeV0_17_1)), (Updates{3, 6, 11, 14, 19, 25}));
  EXPECT_EQ(growths(make(3, DeepSpeedGrowth::kSinceV0_17_1)), (Updates{4, 7, 12, 20}));
  EXPECT_EQ(growths(make(1, DeepSpeedGrowth::kBeforeV0_17_1)),
            (Updates{1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 17, 18, 19, 20, 21, 23, 24, 25}));
  EXPECT_EQ(growths(make(1, DeepSpeedGrowth::kSinceV0_17_1)),
            (Updates{2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 18, 19, 20, 21, 24, 25}));
  // The default is DeepSpeed's current rule.
  EXPECT_EQ(growths(LossScaler::DeepSpeedDynamic(1024, 2.0, 3, 1, 1)), (Updates{4, 7, 12, 20}));

  LossScaler before = make(3, DeepSpeedGrowth::kBeforeV0_17_1);
  EXPECT_EQ(Trajectory(before, flags),
            (Scales{1024, 1024, 2048, 2048, 2048, 4096, 4096, 2048, 2048, 2048, 4096, 4096, 4096,
                    8192, 4096, 2048, 2048, 2048, 4096, 4096, 4096, 2048, 2048, 2048, 4096}));
  LossScaler since = make(3, DeepSpeedGrowth::kSinceV0_17_1);
  EXPECT_EQ(Trajectory(since, flags),
            (Scales{1024, 1024, 1024, 2048, 2048, 2048, 4096, 2048, 2048, 2048, 2048, 4096, 4096,
                    4096, 2048, 1024, 1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 1024}));
}

TEST(LossScalerTest, DeepSpeedBeforeV0_17_1KeepsHysteresisAndRefillsOnGrowth) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, 2, 1, 2, false, true,
                                                   DeepSpeedGrowth::kBeforeV0_17_1);
  EXPECT_FALSE(scaler.options().first_growth_waits_one_more);
  EXPECT_EQ(Trajectory(scaler, "TFFTTFFFTTT"),
            (Scales{1024, 1024, 2048, 2048, 1024, 1024, 2048, 2048, 2048, 1024, 512}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);
}

// DeepSpeed's DynamicLossScaler.update_scale in its own terms (cur_iter, last_overflow_iter,
// cur_hysteresis), with the growth check of either release.
struct DeepSpeedSource {
  double cur_scale;
  double scale_factor;
  int64_t scale_window;
  double min_scale;
  int64_t delayed_shift;
  bool consecutive_hysteresis;
  bool before_v0_17_1;
  int64_t cur_hysteresis = delayed_shift;
  int64_t cur_iter = 0;
  int64_t last_overflow_iter = -1;

  void update_scale(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) cur_hysteresis = delayed_shift;
      const int64_t since = cur_iter - last_overflow_iter;
      const bool grow = before_v0_17_1 ? since % scale_window == 0
                                       : since - 1 > 0 && (since - 1) % scale_window == 0;
      if (grow) {
        if (!consecutive_hysteresis) cur_hysteresis = delayed_shift;
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
  }
};

// Random overflow patterns: mostly clean, overflows at random, some long clean runs.
std::string RandomFlags(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string flags;
  while (static_cast<int>(flags.size()) < n) {
    const uint32_t r = rng() % 100;
    flags += r < 8 ? std::string(1 + rng() % 14, 'F') : std::string(1, r < 30 ? 'T' : 'F');
  }
  flags.resize(n);
  return flags;
}

TEST(LossScalerTest, DeepSpeedFollowsItsSourceOnRandomFlags) {
  for (DeepSpeedGrowth growth : {DeepSpeedGrowth::kSinceV0_17_1, DeepSpeedGrowth::kBeforeV0_17_1}) {
    for (int64_t window : {1, 2, 3, 5}) {
      for (int64_t shift : {1, 2, 3}) {
        for (bool consecutive : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << (growth == DeepSpeedGrowth::kBeforeV0_17_1 ? "before" : "since")
                       << " window " << window << " shift " << shift << " consecutive "
                       << consecutive);
          LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2.0, window, 0.25, shift,
                                                           consecutive, false, growth);
          DeepSpeedSource source{1024,
                                 2.0,
                                 window,
                                 0.25,
                                 shift,
                                 consecutive,
                                 growth == DeepSpeedGrowth::kBeforeV0_17_1};
          const std::string flags = RandomFlags(600, static_cast<uint32_t>(window * 10 + shift));
          for (size_t i = 0; i < flags.size(); ++i) {
            scaler.update(flags[i] == 'T');
            source.update_scale(flags[i] == 'T');
            ASSERT_EQ(scaler.scale(), source.cur_scale) << "update " << i + 1;
            ASSERT_EQ(scaler.hysteresis_tracker(), source.cur_hysteresis) << "update " << i + 1;
          }
        }
      }
    }
  }
}

// ---- NVIDIA Apex amp LossScaler ----------------------------------------------------------------

TEST(LossScalerTest, ApexDefaults) {
  LossScaler scaler = LossScaler::Apex();
  EXPECT_EQ(scaler.scale(), 65536);
  EXPECT_EQ(scaler.options().growth_interval, 2000);
  EXPECT_EQ(scaler.options().min_scale, 0);
  EXPECT_EQ(scaler.options().max_scale, 16777216);
  EXPECT_EQ(scaler.options().growth_factor, 2);
  EXPECT_FALSE(scaler.options().f32_scale);
  EXPECT_FALSE(scaler.options().raise_at_min_scale);
  EXPECT_EQ(Trajectory(scaler, std::string(1999, 'F')).back(), 65536);
  scaler.update(false);  // the 2000th clean update
  EXPECT_EQ(scaler.scale(), 131072);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(LossScalerTest, ApexClampsAnInitialScaleAboveTheMaximum) {
  // Apex: _loss_scale = min(max_loss_scale, init_scale); not an error.
  LossScaler scaler = LossScaler::Apex(1073741824.0, 2, 0, 16777216.0);
  EXPECT_EQ(scaler.scale(), 16777216);
  // The growth at the window is capped (and still restarts the counter).
  EXPECT_EQ(Trajectory(scaler, "FFTFFF"),
            (Scales{16777216, 16777216, 8388608, 8388608, 16777216, 16777216}));
  EXPECT_EQ(scaler.growth_tracker(), 1);

  EXPECT_EQ(LossScaler::Apex(kInf).scale(), 16777216);        // the default cap
  EXPECT_EQ(LossScaler::Apex(16777216.0).scale(), 16777216);  // at the cap
  LossScaler uncapped = LossScaler::Apex(65536, 1, 0, kInf);  // no cap at all
  EXPECT_EQ(Trajectory(uncapped, "FF"), (Scales{131072, 262144}));
}

TEST(LossScalerTest, ApexBacksOffToTheMinimumAndNeverRaises) {
  LossScaler scaler = LossScaler::Apex(1024, 3, 100);
  // tests/amp/loss_scaler_reference.py: growth at updates 8 and 11 (the counter restarts at 0 on
  // every overflow, growth when it reaches the window).
  EXPECT_EQ(Trajectory(scaler, "TTTTTFFFFFF"),
            (Scales{512, 256, 128, 100, 100, 100, 100, 200, 200, 200, 400}));
  EXPECT_EQ(scaler.hysteresis_tracker(), 1);

  LossScaler no_minimum = LossScaler::Apex(3, 3);  // Apex's min_loss_scale=None
  EXPECT_EQ(Trajectory(no_minimum, "TTTFFF"), (Scales{1.5, 0.75, 0.375, 0.375, 0.375, 0.75}));
}

TEST(LossScalerTest, ApexGrowsWhenTheCleanCounterReachesTheWindow) {
  LossScaler scaler = LossScaler::Apex(1024, 3);
  // tests/amp/loss_scaler_reference.py: growth at updates 3, 6, 10, 13.
  EXPECT_EQ(
      Trajectory(scaler, "FFFFFFTFFFFFFF"),
      (Scales{1024, 1024, 2048, 2048, 2048, 4096, 2048, 2048, 2048, 4096, 4096, 4096, 8192, 8192}));
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_EQ(scaler.clean_streak(), 7);
}

// Apex amp's LossScaler.update_scale in its own terms (_loss_scale, _unskipped).
struct ApexSource {
  double loss_scale;
  int64_t scale_seq_len;
  double min_loss_scale;  // 0: None
  double max_loss_scale;
  int64_t unskipped = 0;

  void update_scale(bool has_overflow) {
    if (has_overflow) {
      loss_scale =
          min_loss_scale != 0 ? std::max(min_loss_scale, loss_scale / 2.) : loss_scale / 2.;
      unskipped = 0;
    } else {
      unskipped += 1;
    }
    if (unskipped == scale_seq_len) {
      loss_scale = std::min(max_loss_scale, loss_scale * 2.);
      unskipped = 0;
    }
  }
};

TEST(LossScalerTest, ApexFollowsItsSourceOnRandomFlags) {
  for (int64_t window : {1, 2, 3, 7}) {
    for (double min_scale : {0.0, 1.0, 700.0}) {
      for (double init : {1000.0, 5000.0, 1e9}) {
        SCOPED_TRACE(::testing::Message()
                     << "window " << window << " min " << min_scale << " init " << init);
        LossScaler scaler = LossScaler::Apex(init, window, min_scale, 4096);
        ApexSource source{std::min(4096.0, init), window, min_scale, 4096};
        const std::string flags = RandomFlags(600, static_cast<uint32_t>(window + 100));
        for (size_t i = 0; i < flags.size(); ++i) {
          scaler.update(flags[i] == 'T');
          source.update_scale(flags[i] == 'T');
          ASSERT_EQ(scaler.scale(), source.loss_scale) << "update " << i + 1;
          ASSERT_EQ(scaler.growth_tracker(), source.unskipped) << "update " << i + 1;
        }
      }
    }
  }
}

TEST(LossScalerTest, ApexValidatesWhatItCannotClamp) {
  EXPECT_TRUE(ThrowsErrorExactly([] { LossScaler::Apex(65536, 2000, 0, 0); },
                                 "LossScaler::Apex: max_loss_scale must be positive, got 0"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::Apex(65536, 2000, 0, std::nan("")); },
                          "max_loss_scale must be positive"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::Apex(65536, 0); }, "growth_interval must be >= 1"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::Apex(std::nan("")); }, "init_scale"));
  EXPECT_TRUE(ThrowsError([] { LossScaler::Apex(0x1p30, 2000, 0x1p25); },
                          "min_scale (3.35544e+07) must not exceed init_scale (1.67772e+07)"));
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
      {"DeepSpeedBeforeV0_17_1",
       [] {
         return LossScaler::DeepSpeedDynamic(1024, 2.0, 3, 1, 2, false, false,
                                             DeepSpeedGrowth::kBeforeV0_17_1);
       }},
      {"Apex", [] { return LossScaler::Apex(1024, 3, 4); }},
      {"ApexClamped", [] { return LossScaler::Apex(1e9, 2, 0, 2048); }},
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
                            s.tensors["scale"] = RawTensor();
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
                          "'scale' must be finite and > 0 and in [min_scale, max_scale] = [0, "
                          "inf], got -1"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["scale"] = std::nan(""); }),
                          "'scale' must be finite and > 0"));
  // A scale of 0 made every unscaled gradient NaN (0 * inf) without an overflow being seen, and
  // a resumed run applied that NaN update to every master weight.
  EXPECT_TRUE(ThrowsErrorExactly(edited([](StateDict& s) { s.scalars["scale"] = 0; }),
                                 "LossScaler::load_state_dict: 'scale' must be finite and > 0 and "
                                 "in [min_scale, max_scale] = [0, inf], got 0"));
  EXPECT_TRUE(ThrowsError(edited([](StateDict& s) { s.scalars["scale"] = INFINITY; }),
                          "'scale' must be finite and > 0"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        StateDict state = LossScaler::MegatronDynamic(65536, 1, 2, 0.5, 1000, 2).state_dict();
        state.scalars["scale"] = 0.5;  // below min_scale
        LossScaler::MegatronDynamic(4096, 1, 2, 0.5, 1000, 2).load_state_dict(state);
      },
      "LossScaler::load_state_dict: 'scale' must be finite and > 0 and in [min_scale, "
      "max_scale] = [1, inf], got 0.5"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        StateDict state = LossScaler::MegatronDynamic(4096, 1, 2, 0.5, 1000, 2).state_dict();
        state.scalars["hysteresis_tracker"] = 3;
        LossScaler::MegatronDynamic(4096, 1, 2, 0.5, 1000, 2).load_state_dict(state);
      },
      "LossScaler::load_state_dict: 'hysteresis_tracker' is 3; expected at most hysteresis (2)"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        StateDict state = LossScaler::Constant(2).state_dict();
        state.scalars["scale"] = 0;
        LossScaler::Constant(2).load_state_dict(state);
      },
      "LossScaler::load_state_dict: 'scale' must be finite and > 0, got 0"));
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
