#include "amp/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace tg {
namespace amp {
namespace {

constexpr double kFloatMax = 0x1.fffffep127;
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53
constexpr char kAtMinimum[] =
    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.";

// The scale's type: f32 with f32_scale (nearest, overflowing to inf), else double.
double RoundScale(const LossScalerOptions& o, double x) { return o.f32_scale ? RoundToF32(x) : x; }

// The largest f32 value <= x (x > 0).
double RoundDownToFloat(double x) {
  if (std::isinf(x)) return x;
  if (x >= kFloatMax) return kFloatMax;
  float f = static_cast<float>(x);
  if (static_cast<double>(f) > x) f = std::nextafter(f, 0.0f);
  return f;
}

void Validate(const LossScalerOptions& o) {
  TG_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0,
           "LossScaler: init_scale must be positive and finite, got ", o.init_scale);
  TG_CHECK(std::isfinite(o.growth_factor) && o.growth_factor >= 1,
           "LossScaler: growth_factor must be finite and >= 1, got ", o.growth_factor);
  TG_CHECK(o.backoff_factor > 0 && o.backoff_factor <= 1,
           "LossScaler: backoff_factor must be in (0, 1], got ", o.backoff_factor);
  TG_CHECK(o.growth_interval >= 1, "LossScaler: growth_interval must be >= 1, got ",
           o.growth_interval);
  TG_CHECK(o.hysteresis >= 1, "LossScaler: hysteresis must be >= 1, got ", o.hysteresis);
  TG_CHECK(std::isfinite(o.min_scale) && o.min_scale >= 0,
           "LossScaler: min_scale must be finite and >= 0, got ", o.min_scale);
  TG_CHECK(o.min_scale <= o.init_scale, "LossScaler: min_scale (", o.min_scale,
           ") must not exceed init_scale (", o.init_scale, ")");
  TG_CHECK(!std::isnan(o.max_scale) && o.max_scale >= o.init_scale, "LossScaler: max_scale (",
           o.max_scale, ") must be at least init_scale (", o.init_scale, ")");
  TG_CHECK(!o.backoff_by_division || o.backoff_factor == 1.0 / o.growth_factor,
           "LossScaler: backoff_by_division divides by growth_factor (", o.growth_factor,
           "), so backoff_factor must be 1 / growth_factor, got ", o.backoff_factor);
}

const char* const kKeys[] = {"scale",        "growth_tracker", "hysteresis_tracker",
                             "clean_streak", "iteration",      "dynamic"};

// The integer held by scalar `key`; throws unless it is an integer of magnitude <= 2^53.
int64_t IntegerScalar(const StateDict& state, const char* key) {
  const double value = state.scalar(key);
  TG_CHECK(
      std::isfinite(value) && value == std::trunc(value) && std::fabs(value) <= kMaxExactInteger,
      "LossScaler::load_state_dict: '", key, "' must be an integer, got ", value);
  return static_cast<int64_t>(value);
}

// LossScaler::state_dict() of a scaler in `state`.
StateDict StateDictOf(const LossScaleState& state) {
  StateDict sd;
  sd.scalars["scale"] = state.scale;
  sd.scalars["growth_tracker"] = static_cast<double>(state.growth_tracker);
  sd.scalars["hysteresis_tracker"] = static_cast<double>(state.hysteresis_tracker);
  sd.scalars["clean_streak"] = static_cast<double>(state.clean_streak);
  sd.scalars["iteration"] = static_cast<double>(state.iteration);
  sd.scalars["dynamic"] = state.dynamic ? 1.0 : 0.0;
  return sd;
}

// The options part of two states (everything but the counters, the scale and the error flag).
bool SameOptions(const LossScaleState& a, const LossScaleState& b) {
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

LossScaler::LossScaler(const Options& options) : options_(options) {
  Validate(options_);
  // With f32_scale the scale and its bounds are f32 values: init_scale and min_scale rounded to
  // nearest, max_scale down (so that the cap is never above the requested value).
  state_ = LossScaleState{};
  state_.growth_factor = options_.growth_factor;
  state_.backoff_factor = options_.backoff_factor;
  state_.min_scale = RoundScale(options_, options_.min_scale);
  state_.max_scale = options_.f32_scale ? RoundDownToFloat(options_.max_scale) : options_.max_scale;
  state_.growth_interval = options_.growth_interval;
  state_.hysteresis = options_.hysteresis;
  state_.dynamic = options_.dynamic;
  state_.f32_scale = options_.f32_scale;
  state_.skip_nonfinite_growth = options_.skip_nonfinite_growth;
  state_.backoff_by_division = options_.backoff_by_division;
  state_.first_growth_waits_one_more = options_.first_growth_waits_one_more;
  state_.hysteresis_stops_at_one = options_.hysteresis_stops_at_one;
  state_.consecutive_hysteresis = options_.consecutive_hysteresis;
  state_.raise_at_min_scale = options_.raise_at_min_scale;
  state_.scale = RoundScale(options_, options_.init_scale);
  state_.hysteresis_tracker = options_.hysteresis;
  TG_CHECK(state_.scale <= state_.max_scale, "LossScaler: init_scale (", options_.init_scale,
           ") rounds to an f32 above max_scale (", options_.max_scale, ")");
}

LossScaler LossScaler::PyTorch(double init_scale, double growth_factor, double backoff_factor,
                               int64_t growth_interval) {
  Options o;
  o.init_scale = init_scale;
  o.growth_factor = growth_factor;
  o.backoff_factor = backoff_factor;
  o.growth_interval = growth_interval;
  o.hysteresis = 1;
  o.min_scale = 0;
  o.f32_scale = true;
  o.skip_nonfinite_growth = true;
  return LossScaler(o);
}

LossScaler LossScaler::MegatronDynamic(double initial_scale, double min_scale, double growth_factor,
                                       double backoff_factor, int64_t growth_interval,
                                       int64_t hysteresis) {
  Options o;
  // Megatron holds scale, min_scale and both factors in f32 tensors.
  o.init_scale = initial_scale;
  o.min_scale = RoundToF32(min_scale);
  o.growth_factor = RoundToF32(growth_factor);
  o.backoff_factor = RoundToF32(backoff_factor);
  o.growth_interval = growth_interval;
  o.hysteresis = hysteresis;
  o.f32_scale = true;
  o.skip_nonfinite_growth = false;
  return LossScaler(o);
}

LossScaler LossScaler::MegatronConstant(double scale) {
  Options o;
  o.dynamic = false;
  o.init_scale = scale;
  o.f32_scale = true;
  return LossScaler(o);
}

LossScaler LossScaler::DeepSpeedDynamic(double init_scale, double scale_factor,
                                        int64_t scale_window, double min_scale,
                                        int64_t delayed_shift, bool consecutive_hysteresis,
                                        bool raise_error_at_min_scale, DeepSpeedGrowth growth) {
  TG_CHECK(std::isfinite(scale_factor) && scale_factor >= 1,
           "LossScaler: scale_factor must be finite and >= 1, got ", scale_factor);
  Options o;
  o.init_scale = init_scale;
  o.growth_factor = scale_factor;
  o.backoff_factor = 1.0 / scale_factor;
  o.backoff_by_division = true;
  o.growth_interval = scale_window;
  o.min_scale = min_scale;
  o.hysteresis = delayed_shift;
  o.consecutive_hysteresis = consecutive_hysteresis;
  o.raise_at_min_scale = raise_error_at_min_scale;
  o.first_growth_waits_one_more = growth == DeepSpeedGrowth::kSinceV0_17_1;
  o.hysteresis_stops_at_one = true;
  o.skip_nonfinite_growth = false;
  return LossScaler(o);
}

LossScaler LossScaler::DeepSpeedEngine(DeepSpeedGrowth growth) {
  return DeepSpeedDynamic(/*init_scale=*/65536.0, /*scale_factor=*/2.0, /*scale_window=*/1000,
                          /*min_scale=*/1.0, /*delayed_shift=*/2, /*consecutive_hysteresis=*/false,
                          /*raise_error_at_min_scale=*/true, growth);
}

LossScaler LossScaler::Apex(double init_scale, int64_t scale_window, double min_loss_scale,
                            double max_loss_scale) {
  TG_CHECK(max_loss_scale > 0, "LossScaler::Apex: max_loss_scale must be positive, got ",
           max_loss_scale);
  Options o;
  // Apex: _loss_scale = min(max_loss_scale, init_scale). A NaN init_scale stays NaN (refused).
  o.init_scale = init_scale > max_loss_scale ? max_loss_scale : init_scale;
  o.growth_factor = 2.0;  // Apex's update multiplies and divides by a literal 2
  o.backoff_factor = 0.5;
  o.backoff_by_division = true;
  o.growth_interval = scale_window;
  o.min_scale = min_loss_scale;  // Apex's None is no floor: max(0, scale / 2) is scale / 2
  o.max_scale = max_loss_scale;
  o.hysteresis = 1;
  o.hysteresis_stops_at_one = true;  // no hysteresis: the tracker stays 1
  o.skip_nonfinite_growth = false;   // min(inf, inf) is applied, as in Python
  return LossScaler(o);
}

LossScaler LossScaler::Constant(double scale) {
  Options o;
  o.dynamic = false;
  o.init_scale = scale;
  return LossScaler(o);
}

void LossScaler::update(bool found_inf) {
  // The shared state machine records DeepSpeed's min-scale error instead of throwing (the device
  // cannot throw); the host throws, keeping the state from before the update, so that a caller
  // that catches the error still has it.
  LossScaleState next = state_;
  UpdateLossScale(&next, found_inf);
  TG_CHECK(next.min_scale_error == 0, kAtMinimum);
  state_ = next;
}

void LossScaler::load_state(const LossScaleState& state) {
  TG_CHECK(SameOptions(state, state_),
           "LossScaler::load_state: the state was made from a scaler with other options "
           "(growth_factor ",
           state.growth_factor, ", backoff_factor ", state.backoff_factor, ", growth_interval ",
           state.growth_interval, ", hysteresis ", state.hysteresis, ", min_scale ",
           state.min_scale, ", dynamic ", state.dynamic, "; this scaler's: growth_factor ",
           state_.growth_factor, ", backoff_factor ", state_.backoff_factor, ", growth_interval ",
           state_.growth_interval, ", hysteresis ", state_.hysteresis, ", min_scale ",
           state_.min_scale, ", dynamic ", state_.dynamic, ")");
  // load_state_dict validates the counters and changes nothing if they are not consistent.
  load_state_dict(StateDictOf(state));
  TG_CHECK(state.min_scale_error == 0, kAtMinimum);
}

StateDict LossScaler::state_dict() const { return StateDictOf(state_); }

void LossScaler::load_state_dict(const StateDict& state) {
  std::vector<std::string> missing;
  for (const char* key : kKeys) {
    if (!state.has_scalar(key)) missing.push_back(absl::StrCat("'", key, "'"));
  }
  std::vector<std::string> unexpected;
  for (const auto& [key, value] : state.scalars) {
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
      unexpected.push_back(absl::StrCat("scalar '", key, "'"));
    }
  }
  for (const auto& [key, value] : state.tensors) {
    unexpected.push_back(absl::StrCat("tensor '", key, "'"));
  }
  TG_CHECK(missing.empty() && unexpected.empty(), "LossScaler::load_state_dict: ",
           missing.empty() ? "" : absl::StrCat("missing scalar(s) ", absl::StrJoin(missing, ", ")),
           !missing.empty() && !unexpected.empty() ? "; " : "",
           unexpected.empty() ? "" : absl::StrCat("unexpected ", absl::StrJoin(unexpected, ", ")),
           " (a loss scaler's state holds the scalars 'scale', 'growth_tracker', "
           "'hysteresis_tracker', 'clean_streak', 'iteration', 'dynamic')");

  const double dynamic = state.scalar("dynamic");
  TG_CHECK(dynamic == 0 || dynamic == 1,
           "LossScaler::load_state_dict: 'dynamic' must be 0 or 1, got ", dynamic);
  TG_CHECK((dynamic == 1) == options_.dynamic, "LossScaler::load_state_dict: the state is from a ",
           dynamic == 1 ? "dynamic" : "constant", " scaler, this scaler is ",
           options_.dynamic ? "dynamic" : "constant");
  const double scale = state.scalar("scale");
  // A scale of 0 (or inf) makes 1 / scale non-finite: every unscaled gradient would be NaN, so
  // a resumed run would skip every step (or, before the step guard, apply NaN). A dynamic scale
  // also stays within the scaler's bounds; a constant one is not restored, but a value that no
  // scaler could have written still marks a corrupt state.
  const bool in_bounds =
      !options_.dynamic || (scale >= state_.min_scale && scale <= state_.max_scale);
  TG_CHECK(std::isfinite(scale) && scale > 0 && in_bounds,
           "LossScaler::load_state_dict: 'scale' must be finite and > 0",
           options_.dynamic ? absl::StrCat(" and in [min_scale, max_scale] = [", state_.min_scale,
                                           ", ", state_.max_scale, "]")
                            : std::string(),
           ", got ", scale);
  const int64_t growth_tracker = IntegerScalar(state, "growth_tracker");
  const int64_t hysteresis_tracker = IntegerScalar(state, "hysteresis_tracker");
  const int64_t clean_streak = IntegerScalar(state, "clean_streak");
  const int64_t iteration = IntegerScalar(state, "iteration");
  TG_CHECK(0 <= growth_tracker && growth_tracker <= clean_streak && clean_streak <= iteration,
           "LossScaler::load_state_dict: counters out of order: expected 0 <= growth_tracker (",
           growth_tracker, ") <= clean_streak (", clean_streak, ") <= iteration (", iteration, ")");
  // Overflows count hysteresis_tracker down from `hysteresis` (below 0 without
  // hysteresis_stops_at_one); nothing counts it up past it.
  TG_CHECK(hysteresis_tracker <= state_.hysteresis,
           "LossScaler::load_state_dict: 'hysteresis_tracker' is ", hysteresis_tracker,
           "; expected at most hysteresis (", state_.hysteresis, ")");

  if (options_.dynamic) state_.scale = RoundScale(options_, scale);
  state_.growth_tracker = growth_tracker;
  state_.hysteresis_tracker = hysteresis_tracker;
  state_.clean_streak = clean_streak;
  state_.iteration = iteration;
}

bool UnscalesFinitely(double scale) {
  return std::isfinite(scale) && scale > 0 && std::isfinite(static_cast<float>(1.0 / scale));
}

}  // namespace amp
}  // namespace tg
