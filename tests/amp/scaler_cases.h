// The loss-scaler cases shared by the tests of the one state machine (tensor/loss_scale_update.h)
// on the host (loss_scale_update_test) and on the device (tests/tensor/cuda/amp_kernels_test): every preset
// of amp::LossScaler over a sequence of found_inf flags, and a runner that moves a bare
// LossScaleState beside LossScaler::update and compares the whole state after every update.
//
//   for (const ScalerCase& c : ScalerCases()) {
//     LossScaleState s = c.make().state();
//     RunScalerCase(c, [&](bool found_inf) { UpdateLossScale(&s, found_inf); return s; },
//                   c.make().state());
//   }
#ifndef TAPEGRAD_TESTS_AMP_SCALER_CASES_H_
#define TAPEGRAD_TESTS_AMP_SCALER_CASES_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/loss_scale_update.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace testing {

inline constexpr char kLossScaleAtMinimum[] =
    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";

// 'T' = found_inf, 'F' = clean: mostly clean with overflows at random and some long clean runs.
inline std::string MixedFlags(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string flags;
  while (static_cast<int>(flags.size()) < n) {
    const uint32_t r = rng() % 100;
    if (r < 8) {
      flags += std::string(1 + rng() % 12, 'F');  // long enough for growth steps
    } else {
      flags += r < 30 ? 'T' : 'F';
    }
  }
  flags.resize(n);
  return flags;
}

struct ScalerCase {
  std::string name;
  std::function<amp::LossScaler()> make;
  std::string flags;
};

inline std::vector<ScalerCase> ScalerCases() {
  const std::string mixed = MixedFlags(400, 7);
  amp::LossScalerOptions custom;  // every generic option at once, bounds not f32 values
  custom.init_scale = 1000.1;
  custom.growth_factor = 3;
  custom.backoff_factor = 0.25;
  custom.growth_interval = 2;
  custom.hysteresis = 2;
  custom.min_scale = 0.1;
  custom.max_scale = 1e5;
  custom.f32_scale = true;
  custom.skip_nonfinite_growth = false;
  custom.consecutive_hysteresis = true;
  return {
      {"PyTorch", [] { return amp::LossScaler::PyTorch(65536, 2.0, 0.5, 3); }, mixed},
      // Double factors: every product is rounded from double to f32.
      {"PyTorchOddFactors", [] { return amp::LossScaler::PyTorch(1000.3, 1.7, 0.3, 2); }, mixed},
      {"PyTorchGrowthToInfNotApplied",
       [] { return amp::LossScaler::PyTorch(0x1p126, 2.0, 0.5, 1); }, "FFFFTFFF"},
      {"PyTorchUnderflowsToZero", [] { return amp::LossScaler::PyTorch(1.0, 2.0, 0.5, 2000); },
       std::string(160, 'T') + "FF"},
      {"MegatronDynamic", [] { return amp::LossScaler::MegatronDynamic(65536, 1, 2, 0.5, 3, 2); },
       mixed},
      {"MegatronOddFactors",
       [] { return amp::LossScaler::MegatronDynamic(3000.7, 0.1, 1.1, 0.7, 2, 3); }, mixed},
      {"MegatronGrowsToInf",
       [] { return amp::LossScaler::MegatronDynamic(0x1p126, 1, 2, 0.5, 1, 1); }, "FFFFTF"},
      {"MegatronHitsMinScale",
       [] { return amp::LossScaler::MegatronDynamic(16, 1, 2, 0.5, 1000, 1); },
       std::string(20, 'T') + "F"},
      {"MegatronConstant", [] { return amp::LossScaler::MegatronConstant(3.3); }, mixed},
      {"Constant", [] { return amp::LossScaler::Constant(1024.5); }, mixed},
      {"DeepSpeed",
       [] { return amp::LossScaler::DeepSpeedDynamic(65536, 2, 3, 1, 2, false, true); }, mixed},
      {"DeepSpeedConsecutiveHysteresis",
       [] { return amp::LossScaler::DeepSpeedDynamic(65536, 2, 2, 1, 3, true, false); }, mixed},
      {"DeepSpeedOddFactor",
       [] { return amp::LossScaler::DeepSpeedDynamic(1000.1, 1.5, 2, 0.01, 1, false, false); },
       mixed},
      {"DeepSpeedRaisesAtMinScale",
       [] { return amp::LossScaler::DeepSpeedDynamic(4, 2, 1000, 1, 1, false, true); }, "TTTTF"},
      {"DeepSpeedBeforeV0_17_1",
       [] {
         return amp::LossScaler::DeepSpeedDynamic(65536, 2, 3, 1, 2, false, true,
                                                  amp::DeepSpeedGrowth::kBeforeV0_17_1);
       },
       mixed},
      {"Apex", [] { return amp::LossScaler::Apex(65536, 3, 1000); }, mixed},
      {"ApexClampedAtMax", [] { return amp::LossScaler::Apex(0x1p30, 2, 0, 0x1p20); }, mixed},
      {"CustomF32WithBounds", [custom] { return amp::LossScaler(custom); }, mixed},
  };
}

inline ::testing::AssertionResult SameState(const LossScaleState& e, const LossScaleState& a) {
  auto fail = [](const char* field, auto expected, auto actual) {
    return ::testing::AssertionFailure()
           << field << ": expected " << expected << ", got " << actual;
  };
  if (std::memcmp(&e.scale, &a.scale, sizeof(double)) != 0) return fail("scale", e.scale, a.scale);
  if (e.growth_tracker != a.growth_tracker) {
    return fail("growth_tracker", e.growth_tracker, a.growth_tracker);
  }
  if (e.hysteresis_tracker != a.hysteresis_tracker) {
    return fail("hysteresis_tracker", e.hysteresis_tracker, a.hysteresis_tracker);
  }
  if (e.clean_streak != a.clean_streak) return fail("clean_streak", e.clean_streak, a.clean_streak);
  if (e.iteration != a.iteration) return fail("iteration", e.iteration, a.iteration);
  return ::testing::AssertionSuccess();
}

// Runs `update` (host or device) beside amp::LossScaler::update over the case's flags and compares
// the whole state after every update. The min-scale error: the host throws at some update; the
// device must then hold the state from before it with min_scale_error set, ignore later updates,
// and LossScaler::load_state must throw the host's message.
inline void RunScalerCase(const ScalerCase& c,
                          const std::function<LossScaleState(bool found_inf)>& update,
                          const LossScaleState& initial) {
  SCOPED_TRACE(c.name);
  amp::LossScaler host = c.make();
  EXPECT_TRUE(SameState(host.state(), initial));
  for (size_t k = 0; k < c.flags.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << "update " << k << " (" << c.flags[k] << ")");
    const bool found_inf = c.flags[k] == 'T';
    bool raised = false;
    try {
      host.update(found_inf);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), kLossScaleAtMinimum);
      raised = true;
    }
    const LossScaleState device = update(found_inf);
    ASSERT_TRUE(SameState(host.state(), device));
    ASSERT_EQ(device.min_scale_error, raised ? 1 : 0);
    if (raised) {
      const LossScaleState again = update(false);  // a no-op from now on
      EXPECT_TRUE(SameState(device, again));
      amp::LossScaler loaded = c.make();
      EXPECT_TRUE(ThrowsErrorExactly([&] { loaded.load_state(again); }, kLossScaleAtMinimum));
      EXPECT_TRUE(SameState(host.state(), loaded.state()));
      return;
    }
  }
  // The end state loads into a fresh scaler of the same preset: it continues as `host` does.
  // Except a scale that underflowed to 0 or grew to inf: no later update leaves it, and no step
  // can unscale with it, so a checkpoint holding it is refused (the state stays as it was).
  amp::LossScaler loaded = c.make();
  const LossScaleState end = update(false);
  if (!amp::UnscalesFinitely(end.scale)) {
    const LossScaleState before = loaded.state();
    EXPECT_TRUE(ThrowsError([&] { loaded.load_state(end); },
                            "LossScaler::load_state_dict: 'scale' must be finite and > 0"));
    EXPECT_TRUE(SameState(before, loaded.state()));
    return;
  }
  loaded.load_state(end);
  host.update(false);
  EXPECT_EQ(loaded.state_dict().scalars, host.state_dict().scalars);
}

}  // namespace testing
}  // namespace tg

#endif  // TAPEGRAD_TESTS_AMP_SCALER_CASES_H_
