// LossScaler: the loss scale of mixed-precision training and the state machine that moves it.
// The loss is multiplied by scale() before backward so small f16 gradients do not flush to zero;
// the optimizer step unscales the gradients, checks them for inf/NaN and calls update(found_inf)
// once per step (a step with found_inf is skipped). One dynamic state machine (growth, backoff,
// hysteresis, min/max scale) covers every preset; presets reproduce PyTorch GradScaler, Megatron
// DynamicGradScaler / ConstantGradScaler, DeepSpeed DynamicLossScaler (current and before
// v0.17.1) and NVIDIA Apex amp's dynamic LossScaler update by update.
//
//   tg::amp::LossScaler scaler = tg::amp::LossScaler::PyTorch();   // 65536, x2 every 2000
//   loss_scaled = loss * scaler.scale();  ... backward, unscale, found_inf = any non-finite ...
//   if (!found_inf) optimizer.step();
//   scaler.update(found_inf);
//   checkpoint.Merge("scaler.", scaler.state_dict());            // later: load_state_dict(Sub)
//
// The state machine (dynamic scalers) is tensor/loss_scale_update.h's UpdateLossScale: one
// function that update() runs on the host and the CUDA kernel runs on the device (the scaler
// hands out its state as one POD, state(), and continues from one, load_state()); its header
// states the rule: overflows back off (after `hysteresis` of them), growth_interval clean steps
// grow, both rounded as the options say. With raise_at_min_scale, an overflow that would back
// off while scale == min_scale throws tg::Error "Current loss scale already at minimum - cannot
// decrease scale anymore. Exiting run." and changes nothing.
//
// Presets (each reproduces the reference's scale after every update, bit for bit):
//   PyTorch(init 65536, growth 2, backoff 0.5, interval 2000): torch.amp.GradScaler, i.e.
//       amp_update_scale_cuda_kernel. The scale is an f32 tensor: every product is computed in
//       double (float * double factor) and rounded to float; a growth whose f32 result is inf is
//       not applied (the tracker still resets). No hysteresis, no lower bound (the scale can
//       underflow to 0 after ~150 consecutive overflows, as in PyTorch).
//   MegatronDynamic(initial, min, growth, backoff, interval, hysteresis): Megatron-LM
//       DynamicGradScaler. f32 scale and f32 factors (the factors and min_scale are rounded to
//       f32 when the preset is built, so each product is one f32 multiply); backoff to
//       max(scale * backoff, min_scale) when the decremented hysteresis tracker is <= 0 (the
//       tracker keeps decreasing: 1, 0, -1, ...; refilled only by a growth step); growth every
//       growth_interval clean steps, never checked for inf (an f32 overflow makes the scale inf,
//       as in Megatron). Never raises.
//   MegatronConstant(scale) / Constant(scale): a scale that never changes (Megatron's rounded to
//       f32, Constant's kept as given); update() only counts.
//   DeepSpeedDynamic(init 2^32, scale_factor 2, window 1000, min 1, delayed_shift 1,
//       consecutive_hysteresis false, raise_error_at_min_scale true, growth kSinceV0_17_1):
//       DeepSpeed DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py, update_scale).
//       Double scale; backoff is scale / scale_factor clamped to min_scale, only when the
//       hysteresis tracker is 1 (it never goes below 1; it is refilled to delayed_shift by a
//       growth step, or by every clean step with consecutive_hysteresis); raises at min_scale as
//       described above. (Since v0.17.1 DeepSpeed fixes scale_factor at 2; the preset still takes
//       it, as DeepSpeed up to v0.17.0 did.)
//       Growth: with c = the number of consecutive clean updates since the last overflow (the
//       start counts as an overflow), DeepSpeed's two rules, picked by `growth`:
//       kSinceV0_17_1 (DeepSpeed v0.17.1, June 2025, and later: the rule of its current source,
//           `stable_interval = cur_iter - last_overflow_iter - 1` grows when > 0 and a multiple
//           of scale_window, last_overflow_iter = -1 at the start): the update that makes
//           c = scale_window + 1 grows the scale, then every scale_window-th clean update after
//           it (c = 2 * window + 1, 3 * window + 1, ...). E.g. window 2, no overflow: updates 3,
//           5, 7, ... grow; window 1: every clean update but the first after an overflow.
//       kBeforeV0_17_1 (DeepSpeed up to v0.17.0, whose check was
//           `(cur_iter - last_overflow_iter) % scale_window == 0`): growth at c = window,
//           2 * window, ..., i.e. every growth one clean update earlier than kSinceV0_17_1, after
//           an overflow as well as at the start (window 2: updates 2, 4, 6, ...; window 1: every
//           clean update). DeepSpeed changed it in commit e440506 ("Improve overflow handling in
//           ZeRO", #6976).
//   DeepSpeedEngine(): DeepSpeedDynamic with the defaults DeepSpeed's engine config gives
//       (init 2^16, window 1000, min 1, delayed_shift 2): train's --loss_scaler=deepspeed.
//   Apex(init 2^16, window 2000, min_loss_scale 0, max_loss_scale 2^24): NVIDIA Apex amp's
//       dynamic LossScaler (apex/amp/scaler.py, amp.initialize(loss_scale="dynamic"); unchanged
//       from 2019 until amp left Apex in 25.07). Double scale, both factors fixed at 2 (Apex
//       accepts a scale_factor argument that its update never reads). The scale starts at
//       min(init_scale, max_loss_scale): an init_scale above the cap is clamped to it, as in
//       Apex, not refused. Overflow: scale = max(min_loss_scale, scale / 2) and the clean
//       counter (Apex's _unskipped) restarts at 0. Clean update: the counter counts up; when it
//       reaches the window the scale grows to min(max_loss_scale, scale * 2) and the counter
//       restarts (also when the scale is already at the cap). So growth at c = window,
//       2 * window, ... as in DeepSpeed before v0.17.1. No hysteresis, never raises.
//       min_loss_scale 0 is Apex's None (no floor: the halving may reach 0 in double, as in
//       Apex). Refused (tg::Error) where Apex would run on: a max_loss_scale that is not
//       positive (or NaN), a negative min_loss_scale or one above the clamped initial scale, a
//       scale_window below 1.
//
// Numbers: the scale is a double; with f32_scale it holds an f32 value at all times (init_scale
// and min_scale are rounded to nearest f32, max_scale down to an f32; products round to nearest
// even, overflowing to inf as on the device).
#ifndef TAPEGRAD_AMP_LOSS_SCALER_H_
#define TAPEGRAD_AMP_LOSS_SCALER_H_

#include <cstdint>
#include <limits>

#include "tensor/loss_scale_update.h"
#include "tensor/state_dict.h"

namespace tg {
namespace amp {

struct LossScalerOptions {
  // false: a constant scaler; the scale stays init_scale and update() only counts iteration and
  // clean_streak. The other dynamic options are still validated.
  bool dynamic = true;
  double init_scale = 65536.0;     // > 0, finite
  double growth_factor = 2.0;      // >= 1, finite
  double backoff_factor = 0.5;     // in (0, 1]
  int64_t growth_interval = 2000;  // >= 1: clean steps per growth step
  int64_t hysteresis = 1;          // >= 1: overflows until (and including) the one that backs off
  double min_scale = 0.0;          // >= 0, finite, <= init_scale: backoff never goes below it
  double max_scale = std::numeric_limits<double>::infinity();  // >= init_scale: growth cap
  bool raise_at_min_scale = false;                             // DeepSpeed raise_error_at_min_scale
  bool consecutive_hysteresis = false;  // refill the hysteresis tracker on every clean step
  // Preset-fidelity options (see the header comment):
  bool f32_scale = false;                    // the scale is an f32 value (PyTorch, Megatron)
  bool skip_nonfinite_growth = true;         // a growth to inf is not applied (PyTorch)
  bool backoff_by_division = false;          // backoff is scale / growth_factor (DeepSpeed); then
                                             // backoff_factor must be 1 / growth_factor
  bool first_growth_waits_one_more = false;  // first growth after an overflow or the start at
                                             // growth_interval + 1 clean updates (DeepSpeed
                                             // since v0.17.1)
  bool hysteresis_stops_at_one = false;      // the hysteresis tracker never drops below 1
};

// Which DeepSpeed release's growth timing LossScaler::DeepSpeedDynamic reproduces (see the
// header comment).
enum class DeepSpeedGrowth {
  kSinceV0_17_1,   // first growth at scale_window + 1 clean updates (DeepSpeed's current rule)
  kBeforeV0_17_1,  // growth at every scale_window-th clean update (DeepSpeed <= v0.17.0)
};

class LossScaler {
 public:
  using Options = LossScalerOptions;

  // Throws tg::Error naming the first invalid option and its value.
  explicit LossScaler(const Options& options = Options());

  // Presets; see the header comment for their exact rules.
  static LossScaler PyTorch(double init_scale = 65536.0, double growth_factor = 2.0,
                            double backoff_factor = 0.5, int64_t growth_interval = 2000);
  static LossScaler MegatronDynamic(double initial_scale, double min_scale, double growth_factor,
                                    double backoff_factor, int64_t growth_interval,
                                    int64_t hysteresis);
  static LossScaler MegatronConstant(double scale);
  static LossScaler DeepSpeedDynamic(double init_scale = 4294967296.0, double scale_factor = 2.0,
                                     int64_t scale_window = 1000, double min_scale = 1.0,
                                     int64_t delayed_shift = 1, bool consecutive_hysteresis = false,
                                     bool raise_error_at_min_scale = true,
                                     DeepSpeedGrowth growth = DeepSpeedGrowth::kSinceV0_17_1);
  // What DeepSpeed's engine builds for an "fp16" config section that names any of its dynamic
  // keys (initial_scale_power, loss_scale_window, hysteresis, min_loss_scale,
  // consecutive_hysteresis; the usual config templates, transformers' included), left at the
  // defaults of deepspeed/runtime/constants.py: init 2^16 (FP16_INITIAL_SCALE_POWER_DEFAULT 16),
  // scale_window 1000, delayed_shift (hysteresis) 2, min_scale 1, consecutive_hysteresis false;
  // the class's scale_factor 2 and raise_error_at_min_scale true (the engine passes neither).
  // DeepSpeedDynamic() keeps the class's own defaults (2^32, no hysteresis), which is what
  // DeepSpeed's ZeRO optimizers build for an "fp16" section with "enabled" alone.
  static LossScaler DeepSpeedEngine(DeepSpeedGrowth growth = DeepSpeedGrowth::kSinceV0_17_1);
  // Apex amp's defaults: init_scale 2^16, scale_window 2000, min_loss_scale None (0 here),
  // max_loss_scale 2^24. Throws tg::Error for a max_loss_scale that is not positive.
  static LossScaler Apex(double init_scale = 65536.0, int64_t scale_window = 2000,
                         double min_loss_scale = 0.0, double max_loss_scale = 16777216.0);
  static LossScaler Constant(double scale);

  double scale() const { return state_.scale; }
  // One call per optimizer step. Throws only with raise_at_min_scale (then nothing changes).
  void update(bool found_inf);

  // Scalars "scale", "growth_tracker", "hysteresis_tracker", "clean_streak", "iteration" and
  // "dynamic" (1 or 0); no tensors. Counters are exact in a double (< 2^53).
  StateDict state_dict() const;
  // Restores the state saved by state_dict(). Throws tg::Error (and changes nothing) naming every
  // missing key, any unexpected key, a dynamic/constant mismatch, or a value that is not valid
  // (scale NaN or negative; counters not integers; growth_tracker, clean_streak, iteration
  // negative or out of order: growth_tracker <= clean_streak <= iteration). With f32_scale the
  // saved scale is rounded to f32. A constant scaler keeps its configured scale (the saved one
  // is validated, not applied), as Megatron's ConstantGradScaler keeps no state.
  void load_state_dict(const StateDict& state);

  // The options as the update uses them (min_scale, max_scale rounded as the scale's type
  // holds them) and the state, as one POD: what UpdateLossScale moves, and what the CUDA
  // devices keep with the tensors (tensor/ops.h: LossScaleStateTensor(scaler.state(), device)).
  const LossScaleState& state() const { return state_; }
  // Continues from `state`: a state() of a scaler with the same options, moved by
  // UpdateLossScale (on a device: tg::ReadLossScaleState). Throws tg::Error, changing nothing,
  // when the options in `state` are not this scaler's, or when its counters are not valid (as
  // load_state_dict). When `state` recorded the min-scale error (raise_at_min_scale), its state
  // as of that update is loaded and then update()'s error is thrown: "Current loss scale already
  // at minimum - cannot decrease scale anymore. Exiting run." (the host's update() would have
  // thrown at the same update, changing nothing).
  void load_state(const LossScaleState& state);

  const Options& options() const { return options_; }
  // Clean updates since the last overflow, the last growth step or the start.
  int64_t growth_tracker() const { return state_.growth_tracker; }
  // Overflows still tolerated before one backs off, plus one (backoff when it is <= 1).
  int64_t hysteresis_tracker() const { return state_.hysteresis_tracker; }
  // Consecutive clean updates since the last overflow or the start.
  int64_t clean_streak() const { return state_.clean_streak; }
  // Number of update() calls.
  int64_t iteration() const { return state_.iteration; }

 private:
  Options options_;
  LossScaleState state_;  // min_scale_error always 0: update() throws instead
};

// Whether gradients scaled by `scale` can be unscaled to finite values: scale > 0 and finite,
// and 1 / scale a finite f32 (the unscale multiplies by it as an f32). The optimizers skip a step
// whose scale is not (MixedPrecisionOptimizer::step, ZeroOptimizer::step): the overflow check
// looks at the scaled gradients, so a scale of 0 (finite zero gradients, times inf: NaN) or one
// below 1 / FLT_MAX would otherwise write non-finite values into every master weight.
bool UnscalesFinitely(double scale);

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_LOSS_SCALER_H_
