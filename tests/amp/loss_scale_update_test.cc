// The one loss-scale state machine (tensor/loss_scale_update.h: UpdateLossScale over a
// LossScaleState), run bare as the CUDA kernel runs it, against amp::LossScaler::update for every
// preset over a sequence of found_inf flags (the device runs the same cases in
// tests/tensor/cuda/amp_kernels_test); LossScaler's state() / load_state() round trip; RoundToF32's edges.
#include "tensor/loss_scale_update.h"

#include <cmath>
#include <limits>
#include <string>

#include "amp/loss_scaler.h"
#include "gtest/gtest.h"
#include "tensor/ops.h"
#include "tests/amp/scaler_cases.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using amp::LossScaler;
using ::tg::testing::ThrowsError;

TEST(LossScaleUpdateTest, MatchesLossScalerUpdateForEveryPreset) {
  for (const ::tg::testing::ScalerCase& c : ::tg::testing::ScalerCases()) {
    const LossScaleState initial = c.make().state();
    LossScaleState state = initial;
    ::tg::testing::RunScalerCase(
        c,
        [&](bool found_inf) {
          UpdateLossScale(&state, found_inf);
          return state;
        },
        initial);
  }
}

// The kernel list's LossScaleStep on the CPU (tg::StepLossScale on a state tensor): the same states,
// and the scale / 1/scale outputs the facade uses.
TEST(LossScaleUpdateTest, StepLossScaleOnATensorMatchesLossScalerUpdateForEveryPreset) {
  for (const ::tg::testing::ScalerCase& c : ::tg::testing::ScalerCases()) {
    const LossScaleState initial = c.make().state();
    const RawTensor state = LossScaleStateTensor(initial, Device());
    const RawTensor scale = RawTensor::Zeros({}, kF32), inv_scale = RawTensor::Zeros({}, kF32);
    WriteLossScale(state, scale, inv_scale);
    EXPECT_EQ(scale.item(), static_cast<float>(initial.scale)) << c.name;
    ::tg::testing::RunScalerCase(
        c,
        [&](bool found_inf) {
          StepLossScale(state, RawTensor::Full({}, found_inf ? 1.0 : 0.0, kF32), scale, inv_scale);
          const LossScaleState now = ReadLossScaleState(state);
          if (now.min_scale_error == 0) {
            EXPECT_EQ(scale.item(), static_cast<float>(now.scale)) << c.name;
            EXPECT_EQ(inv_scale.item(), static_cast<float>(1.0 / now.scale)) << c.name;
          }
          return now;
        },
        initial);
  }
}

TEST(LossScaleUpdateTest, LossScaleOpsRejectAStateOfTheWrongShape) {
  EXPECT_TRUE(ThrowsError([] { ReadLossScaleState(RawTensor::Zeros({3}, kU8)); },
                          "read_loss_scale_state: expected the loss-scale state of "
                          "LossScaleStateTensor (contiguous u8 ["));
  const RawTensor state = LossScaleStateTensor(LossScaler::PyTorch().state(), Device());
  EXPECT_TRUE(ThrowsError(
      [&] { StepLossScale(state, RawTensor::Zeros({}, kF64), RawTensor(), RawTensor()); },
      "step_loss_scale: found_inf must be a one-element f32 tensor, got f64"));
}

TEST(LossScaleUpdateTest, StateRoundTripsThroughTheLossScaler) {
  LossScaler scaler = LossScaler::DeepSpeedDynamic(1024, 2, 2, 1, 3, false, true);
  for (char flag : std::string("TFFFTFFFFT")) scaler.update(flag == 'T');
  const LossScaleState state = scaler.state();
  EXPECT_EQ(state.scale, scaler.scale());
  EXPECT_EQ(state.hysteresis_tracker, scaler.hysteresis_tracker());
  EXPECT_EQ(state.min_scale_error, 0);
  EXPECT_TRUE(state.raise_at_min_scale && state.backoff_by_division &&
              state.first_growth_waits_one_more && state.hysteresis_stops_at_one);
  LossScaler fresh = LossScaler::DeepSpeedDynamic(1024, 2, 2, 1, 3, false, true);
  fresh.load_state(state);
  EXPECT_EQ(fresh.state_dict().scalars, scaler.state_dict().scalars);
  // Another preset's state is refused, and nothing changes.
  LossScaler other = LossScaler::PyTorch();
  EXPECT_TRUE(ThrowsError([&] { other.load_state(state); },
                          "LossScaler::load_state: the state was made from a scaler with other "
                          "options"));
  EXPECT_EQ(other.scale(), 65536);
  // Counters out of order are refused as by load_state_dict, and nothing changes.
  LossScaleState bad = state;
  bad.growth_tracker = bad.iteration + 1;
  EXPECT_TRUE(ThrowsError([&] { fresh.load_state(bad); },
                          "LossScaler::load_state_dict: counters out of order"));
  EXPECT_EQ(fresh.state_dict().scalars, scaler.state_dict().scalars);
  // Megatron's f32 state keeps its bounds as the scaler holds them.
  const LossScaleState megatron = LossScaler::MegatronDynamic(65536, 0.1, 2, 0.5, 10, 2).state();
  EXPECT_EQ(megatron.min_scale, static_cast<double>(0.1f));
  EXPECT_EQ(megatron.hysteresis_tracker, 2);
}

TEST(LossScaleUpdateTest, RoundToF32RoundsToNearestEvenAndOverflowsToInf) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kFloatMax = 0x1.fffffep127;
  EXPECT_EQ(RoundToF32(0.1), static_cast<double>(0.1f));
  EXPECT_EQ(RoundToF32(1 + 0x1p-24), 1.0);                  // a tie goes to even
  EXPECT_EQ(RoundToF32(1 + 0x1.8p-23), 1 + 0x1p-22);        // a tie goes to even (up)
  EXPECT_EQ(RoundToF32(0x1.fffffefffffffp127), kFloatMax);  // below FLT_MAX + half an ulp
  EXPECT_EQ(RoundToF32(0x1.ffffffp127), kInf);              // the tie with 2^128 goes up
  EXPECT_EQ(RoundToF32(-1e300), -kInf);
  EXPECT_EQ(RoundToF32(kInf), kInf);
  EXPECT_TRUE(std::isnan(RoundToF32(std::nan(""))));
}

}  // namespace
}  // namespace tg
