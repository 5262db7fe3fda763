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

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFloatMax = 0x1.fffffep127;
// FLT_MAX + half an ulp: from here on round-to-nearest-even gives inf (FLT_MAX's last bit is 1).
constexpr double kFloatOverflow = 0x1.ffffffp127;
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// Rounds to the nearest f32 (ties to even) like a float store on the device, overflowing to inf;
// defined for every input (a plain static_cast<float> of a value beyond FLT_MAX is undefined).
double RoundToFloat(double x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double magnitude = std::fabs(x);
  if (magnitude >= kFloatOverflow) return std::copysign(kInf, x);
  if (magnitude > kFloatMax) return std::copysign(kFloatMax, x);
  return static_cast<double>(static_cast<float>(x));
}

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

}  // namespace

LossScaler::LossScaler(const Options& options) : options_(options) {
  Validate(options_);
  scale_ = Round(options_.init_scale);
  min_scale_ = Round(options_.min_scale);
  max_scale_ = options_.f32_scale ? RoundDownToFloat(options_.max_scale) : options_.max_scale;
  TG_CHECK(scale_ <= max_scale_, "LossScaler: init_scale (", options_.init_scale,
           ") rounds to an f32 above max_scale (", options_.max_scale, ")");
  hysteresis_tracker_ = options_.hysteresis;
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
  o.min_scale = RoundToFloat(min_scale);
  o.growth_factor = RoundToFloat(growth_factor);
  o.backoff_factor = RoundToFloat(backoff_factor);
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
                                        bool raise_error_at_min_scale) {
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
  o.first_growth_waits_one_more = true;
  o.hysteresis_stops_at_one = true;
  o.skip_nonfinite_growth = false;
  return LossScaler(o);
}

LossScaler LossScaler::Constant(double scale) {
  Options o;
  o.dynamic = false;
  o.init_scale = scale;
  return LossScaler(o);
}

double LossScaler::Round(double value) const {
  return options_.f32_scale ? RoundToFloat(value) : value;
}

void LossScaler::update(bool found_inf) {
  if (!options_.dynamic) {
    clean_streak_ = found_inf ? 0 : clean_streak_ + 1;
    ++iteration_;
    return;
  }
  if (found_inf) {
    if (hysteresis_tracker_ <= 1) {
      // Checked before anything changes, so a caller that catches the error keeps the state.
      TG_CHECK(!(options_.raise_at_min_scale && scale_ == min_scale_),
               "Current loss scale already at minimum - cannot decrease scale anymore. Exiting "
               "run.");
      const double backed_off = options_.backoff_by_division ? scale_ / options_.growth_factor
                                                             : scale_ * options_.backoff_factor;
      scale_ = std::max(Round(backed_off), min_scale_);
    }
    if (!options_.hysteresis_stops_at_one || hysteresis_tracker_ > 1) --hysteresis_tracker_;
    growth_tracker_ = 0;
    clean_streak_ = 0;
  } else {
    ++growth_tracker_;
    ++clean_streak_;
    if (options_.consecutive_hysteresis) hysteresis_tracker_ = options_.hysteresis;
    // No growth step since the last overflow (or the start) iff the two counters agree.
    const bool first_growth = growth_tracker_ == clean_streak_;
    const int64_t needed =
        options_.growth_interval + (options_.first_growth_waits_one_more && first_growth ? 1 : 0);
    if (growth_tracker_ >= needed) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = options_.hysteresis;
      const double grown = std::min(Round(scale_ * options_.growth_factor), max_scale_);
      if (!options_.skip_nonfinite_growth || std::isfinite(grown)) scale_ = grown;
    }
  }
  ++iteration_;
}

StateDict LossScaler::state_dict() const {
  StateDict state;
  state.scalars["scale"] = scale_;
  state.scalars["growth_tracker"] = static_cast<double>(growth_tracker_);
  state.scalars["hysteresis_tracker"] = static_cast<double>(hysteresis_tracker_);
  state.scalars["clean_streak"] = static_cast<double>(clean_streak_);
  state.scalars["iteration"] = static_cast<double>(iteration_);
  state.scalars["dynamic"] = options_.dynamic ? 1.0 : 0.0;
  return state;
}

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
  TG_CHECK(!std::isnan(scale) && scale >= 0,
           "LossScaler::load_state_dict: 'scale' must be >= 0 and not NaN, got ", scale);
  const int64_t growth_tracker = IntegerScalar(state, "growth_tracker");
  const int64_t hysteresis_tracker = IntegerScalar(state, "hysteresis_tracker");
  const int64_t clean_streak = IntegerScalar(state, "clean_streak");
  const int64_t iteration = IntegerScalar(state, "iteration");
  TG_CHECK(0 <= growth_tracker && growth_tracker <= clean_streak && clean_streak <= iteration,
           "LossScaler::load_state_dict: counters out of order: expected 0 <= growth_tracker (",
           growth_tracker, ") <= clean_streak (", clean_streak, ") <= iteration (", iteration, ")");

  if (options_.dynamic) scale_ = Round(scale);
  growth_tracker_ = growth_tracker;
  hysteresis_tracker_ = hysteresis_tracker;
  clean_streak_ = clean_streak;
  iteration_ = iteration;
}

}  // namespace amp
}  // namespace tg
