#include "amp/cuda/device_scaler.h"

#include <cmath>
#include <limits>

#include "tensor/error.h"
#include "tensor/state_dict.h"

namespace tg::amp {
namespace {

constexpr double kFloatMax = 0x1.fffffep127;
constexpr double kFloatOverflow = 0x1.ffffffp127;  // FLT_MAX + half an ulp: rounds to inf

// The scaler keeps min_scale / max_scale "as the scale's type holds them" without accessors;
// these are the same roundings as loss_scaler.cc's (nearest f32, overflowing to inf; the largest
// f32 not above), so the device clamps at exactly the host's bounds.
double RoundToFloat(double x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double magnitude = std::fabs(x);
  if (magnitude >= kFloatOverflow) return std::copysign(std::numeric_limits<double>::infinity(), x);
  if (magnitude > kFloatMax) return std::copysign(kFloatMax, x);
  return static_cast<float>(x);
}

double RoundDownToFloat(double x) {
  if (std::isinf(x)) return x;
  if (x >= kFloatMax) return kFloatMax;
  float f = static_cast<float>(x);
  if (static_cast<double>(f) > x) f = std::nextafter(f, 0.0f);
  return f;
}

bool SameOptions(const cuda::DeviceScalerState& a, const cuda::DeviceScalerState& b) {
  return a.growth_factor == b.growth_factor && a.backoff_factor == b.backoff_factor &&
         a.min_scale == b.min_scale && a.max_scale == b.max_scale &&
         a.growth_interval == b.growth_interval && a.hysteresis == b.hysteresis &&
         a.dynamic == b.dynamic && a.f32_scale == b.f32_scale &&
         a.skip_nonfinite_growth == b.skip_nonfinite_growth &&
         a.backoff_by_division == b.backoff_by_division &&
         a.first_growth_waits_one_more == b.first_growth_waits_one_more &&
         a.hysteresis_stops_at_one == b.hysteresis_stops_at_one &&
         a.consecutive_hysteresis == b.consecutive_hysteresis &&
         a.raise_at_min_scale == b.raise_at_min_scale;
}

}  // namespace

cuda::DeviceScalerState ToDeviceScalerState(const LossScaler& scaler) {
  const LossScalerOptions& o = scaler.options();
  cuda::DeviceScalerState s{};
  s.growth_factor = o.growth_factor;
  s.backoff_factor = o.backoff_factor;
  s.min_scale = o.f32_scale ? RoundToFloat(o.min_scale) : o.min_scale;
  s.max_scale = o.f32_scale ? RoundDownToFloat(o.max_scale) : o.max_scale;
  s.growth_interval = o.growth_interval;
  s.hysteresis = o.hysteresis;
  s.dynamic = o.dynamic;
  s.f32_scale = o.f32_scale;
  s.skip_nonfinite_growth = o.skip_nonfinite_growth;
  s.backoff_by_division = o.backoff_by_division;
  s.first_growth_waits_one_more = o.first_growth_waits_one_more;
  s.hysteresis_stops_at_one = o.hysteresis_stops_at_one;
  s.consecutive_hysteresis = o.consecutive_hysteresis;
  s.raise_at_min_scale = o.raise_at_min_scale;
  s.scale = scaler.scale();
  s.growth_tracker = scaler.growth_tracker();
  s.hysteresis_tracker = scaler.hysteresis_tracker();
  s.clean_streak = scaler.clean_streak();
  s.iteration = scaler.iteration();
  s.min_scale_error = 0;
  return s;
}

void LoadDeviceScalerState(const cuda::DeviceScalerState& state, LossScaler* scaler) {
  TG_CHECK(scaler != nullptr, "LoadDeviceScalerState: the scaler is null");
  TG_CHECK(SameOptions(state, ToDeviceScalerState(*scaler)),
           "LoadDeviceScalerState: the device state was made from a scaler with other options "
           "(growth_factor ",
           state.growth_factor, ", backoff_factor ", state.backoff_factor, ", growth_interval ",
           state.growth_interval, ", hysteresis ", state.hysteresis, ", min_scale ",
           state.min_scale, ", dynamic ", state.dynamic, ")");
  // load_state_dict validates the counters and changes nothing if they are not consistent.
  StateDict sd;
  sd.scalars["scale"] = state.scale;
  sd.scalars["growth_tracker"] = static_cast<double>(state.growth_tracker);
  sd.scalars["hysteresis_tracker"] = static_cast<double>(state.hysteresis_tracker);
  sd.scalars["clean_streak"] = static_cast<double>(state.clean_streak);
  sd.scalars["iteration"] = static_cast<double>(state.iteration);
  sd.scalars["dynamic"] = state.dynamic ? 1.0 : 0.0;
  scaler->load_state_dict(sd);
  TG_CHECK(state.min_scale_error == 0,
           "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.");
}

}  // namespace tg::amp
