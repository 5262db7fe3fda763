// The loss-scale state machine of mixed-precision training, written once: UpdateLossScale moves a
// LossScaleState (the options and counters of an amp::LossScaler, one POD) by one optimizer step.
// The host's amp::LossScaler::update runs it on its own state, and the kernel list's LossScaleStep
// kernel (tensor/ops.h StepLossScale) runs it where the tensors live (on CUDA in one device
// thread, on a copy kept in device memory), so the device scale follows the host's bit for bit
// and updating it never waits for the GPU. It lives in tensor/, below both amp/ and tensor/cuda/.
//
//   tg::LossScaleState s = scaler.state();       // amp::LossScaler (amp/loss_scaler.h)
//   tg::UpdateLossScale(&s, /*found_inf=*/true);  // what scaler.update(true) does to its state
//   scaler.load_state(s);                        // the scaler continues from s
//
// The state machine (dynamic scalers), one update(found_inf) per optimizer step:
//   overflow (found_inf):  growth_tracker = 0, clean_streak = 0. If hysteresis_tracker <= 1 the
//       scale backs off: scale * backoff_factor (scale / growth_factor with
//       backoff_by_division), rounded to f32 with f32_scale, then max(.., min_scale); with
//       raise_at_min_scale an overflow that would back off while scale == min_scale is
//       DeepSpeed's "loss scale already at minimum" error and changes nothing. Then
//       hysteresis_tracker -= 1 (with hysteresis_stops_at_one it never goes below 1; otherwise
//       it goes on to 0, -1, ...).
//   clean step:  growth_tracker += 1, clean_streak += 1; with consecutive_hysteresis
//       hysteresis_tracker = hysteresis. When growth_tracker reaches growth_interval (+1 with
//       first_growth_waits_one_more, for the first growth since the last overflow or the
//       start) a growth step happens: growth_tracker = 0, hysteresis_tracker = hysteresis,
//       scale = min(scale * growth_factor (f32-rounded with f32_scale), max_scale); with
//       skip_nonfinite_growth a non-finite result is not applied (the scale stays).
//   iteration += 1 after every update (constant scalers count iteration and clean_streak only).
//
// The min-scale error: the host throws tg::Error and changes nothing; a kernel cannot throw, so
// UpdateLossScale records it in min_scale_error, leaves the rest of the state as it was, and
// every later update is a no-op (the run is over, as it would be on the host). The host's update
// throws when it sees the flag; LossScaler::load_state throws when it loads a state with it set.
//
// Numbers: each step is one correctly rounded IEEE double operation (the device intrinsics
// __dmul_rn / __ddiv_rn, plain double arithmetic on the host: x86-64 SSE2 rounds the same), and
// the f32 rounding is round-to-nearest-even overflowing to inf (__double2float_rn on the device).
// std::max / std::min are spelled out so that equal and infinite operands pick the same side.
#ifndef TAPEGRAD_TENSOR_LOSS_SCALE_UPDATE_H_
#define TAPEGRAD_TENSOR_LOSS_SCALE_UPDATE_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/host_device.h"

namespace tg {

// The options of an amp::LossScaler (amp/loss_scaler.h: LossScalerOptions, same names) as the
// scaler holds them, and its state. Trivially copyable: it moves to and from the device as bytes.
struct LossScaleState {
  // Options, constant across updates.
  double growth_factor;
  double backoff_factor;
  double min_scale;  // rounded to f32 with f32_scale
  double max_scale;  // rounded down to an f32 with f32_scale
  int64_t growth_interval;
  int64_t hysteresis;
  bool dynamic;
  bool f32_scale;
  bool skip_nonfinite_growth;
  bool backoff_by_division;
  bool first_growth_waits_one_more;
  bool hysteresis_stops_at_one;
  bool consecutive_hysteresis;
  bool raise_at_min_scale;
  // State: LossScaler's accessors and state_dict() keys of the same names.
  double scale;
  int64_t growth_tracker;
  int64_t hysteresis_tracker;
  int64_t clean_streak;
  int64_t iteration;
  // 1 once an update hit the min-scale error (see the header comment); the host never keeps it.
  int32_t min_scale_error;
  int32_t reserved;  // zero; keeps the size a multiple of 8
};
static_assert(std::is_trivially_copyable_v<LossScaleState>);

namespace loss_scale_internal {

TG_HOST_DEVICE inline double Mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

TG_HOST_DEVICE inline double Div(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

TG_HOST_DEVICE inline bool IsFinite(double x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

}  // namespace loss_scale_internal

// x rounded to the nearest f32 (ties to even), as a double: an f32 store on the device, which
// overflows to inf from FLT_MAX + half an ulp on. Defined for every input (a plain cast of a
// double beyond FLT_MAX is undefined in C++, hence the branches on the host).
TG_HOST_DEVICE inline double RoundToF32(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<double>(__double2float_rn(x));
#else
  constexpr double kFloatMax = 0x1.fffffep127;
  constexpr double kFloatOverflow = 0x1.ffffffp127;  // FLT_MAX's last bit is 1: ties go up
  if (std::isnan(x) || std::isinf(x)) return x;
  const double magnitude = std::fabs(x);
  if (magnitude >= kFloatOverflow) {
    return std::copysign(std::numeric_limits<double>::infinity(), x);
  }
  if (magnitude > kFloatMax) return std::copysign(kFloatMax, x);
  return static_cast<double>(static_cast<float>(x));
#endif
}

namespace loss_scale_internal {

// The scale's own type: f32 with f32_scale, else double.
TG_HOST_DEVICE inline double Round(const LossScaleState& s, double x) {
  return s.f32_scale ? RoundToF32(x) : x;
}

}  // namespace loss_scale_internal

// One update of the state machine above (found_inf: this step's gradients had an inf/NaN).
TG_HOST_DEVICE inline void UpdateLossScale(LossScaleState* state, bool found_inf) {
  namespace internal = loss_scale_internal;
  LossScaleState& s = *state;
  if (s.min_scale_error != 0) return;
  if (!s.dynamic) {
    s.clean_streak = found_inf ? 0 : s.clean_streak + 1;
    ++s.iteration;
    return;
  }
  if (found_inf) {
    if (s.hysteresis_tracker <= 1) {
      if (s.raise_at_min_scale && s.scale == s.min_scale) {
        s.min_scale_error = 1;  // the host throws here; nothing else changes
        return;
      }
      const double backed_off = s.backoff_by_division ? internal::Div(s.scale, s.growth_factor)
                                                      : internal::Mul(s.scale, s.backoff_factor);
      const double rounded = internal::Round(s, backed_off);
      s.scale = rounded < s.min_scale ? s.min_scale : rounded;  // std::max(rounded, min_scale)
    }
    if (!s.hysteresis_stops_at_one || s.hysteresis_tracker > 1) --s.hysteresis_tracker;
    s.growth_tracker = 0;
    s.clean_streak = 0;
  } else {
    ++s.growth_tracker;
    ++s.clean_streak;
    if (s.consecutive_hysteresis) s.hysteresis_tracker = s.hysteresis;
    // No growth step since the last overflow (or the start) iff the two counters agree.
    const bool first_growth = s.growth_tracker == s.clean_streak;
    const int64_t needed =
        s.growth_interval + (s.first_growth_waits_one_more && first_growth ? 1 : 0);
    if (s.growth_tracker >= needed) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = s.hysteresis;
      const double product = internal::Round(s, internal::Mul(s.scale, s.growth_factor));
      const double grown = s.max_scale < product ? s.max_scale : product;  // std::min
      if (!s.skip_nonfinite_growth || internal::IsFinite(grown)) s.scale = grown;
    }
  }
  ++s.iteration;
}

// What the training facade derives from the scale (amp::MixedPrecisionOptimizer): the f32 loss
// multiplier and the f32 of 1 / scale computed in double. Either output may be null.
TG_HOST_DEVICE inline void LossScaleOutputs(const LossScaleState& s, float* scale_out,
                                            float* inv_scale_out) {
  if (scale_out != nullptr) *scale_out = static_cast<float>(RoundToF32(s.scale));
  if (inv_scale_out != nullptr) {
    *inv_scale_out = static_cast<float>(RoundToF32(loss_scale_internal::Div(1.0, s.scale)));
  }
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_LOSS_SCALE_UPDATE_H_
