// tg::amp::GradScaler: PyTorch's torch.amp.GradScaler with its C++-frontend call sequence, for a
// program that keeps its own optimizer (tapegrad's MixedPrecisionOptimizer does the same inside
// one step() call, with f32 masters).
//
//   tg::amp::GradScaler scaler;                       // init_scale 65536, x2 every 2000
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);                             // optional: clip the true gradients here
//   scaler.step(opt);                                 // skipped when a gradient is inf/NaN
//   scaler.update();
//
// The rules are PyTorch's (torch/amp/grad_scaler.py), messages included: scale() multiplies by
// the f32 scale; unscale_() multiplies every gradient of the optimizer by the f32 reciprocal of
// the scale (computed in f64, rounded once) and records whether any was inf/NaN before; it is
// refused twice between updates, after step(), and for f16 gradients (unscaling f16 in place
// loses them); step() unscales first if needed and runs opt.step() only when no gradient was
// inf/NaN; update() applies torch._amp_update_scale_ to the combined found_inf of every optimizer
// stepped since the last update (amp::LossScaler::PyTorch, the same arithmetic) and needs at
// least one. A disabled scaler passes everything through (scale 1, step() always steps).
#ifndef TAPEGRAD_AMP_GRAD_SCALER_H_
#define TAPEGRAD_AMP_GRAD_SCALER_H_

#include <cstdint>
#include <map>
#include <optional>

#include "amp/loss_scaler.h"
#include "autograd/variable.h"
#include "optim/optimizer.h"
#include "tensor/arg.h"
#include "tensor/state_dict.h"

namespace tg {
namespace amp {

// torch.amp.GradScaler's arguments, as a chain: GradScalerOptions().init_scale(1024).
class GradScalerOptions {
  TG_ARG(double, init_scale) = 65536.0;
  TG_ARG(double, growth_factor) = 2.0;
  TG_ARG(double, backoff_factor) = 0.5;
  TG_ARG(int64_t, growth_interval) = 2000;
  TG_ARG(bool, enabled) = true;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = GradScalerOptions());

  // loss * scale, rounded to the loss's dtype (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;
  void unscale_(optim::Optimizer& optimizer);
  void step(optim::Optimizer& optimizer);
  // Backs off or grows the scale from the found_inf of every optimizer stepped since the last
  // update; update(s) sets the scale to s instead. Throws tg::Error "No inf checks were recorded
  // prior to update." when no optimizer was stepped.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const { return enabled_ ? scaler_.scale() : 1.0; }
  bool is_enabled() const { return enabled_; }
  int64_t growth_tracker() const { return scaler_.growth_tracker(); }
  // PyTorch's keys: "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (empty when disabled).
  StateDict state_dict() const;
  // Throws tg::Error naming a missing key or an invalid value, and changes nothing then.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };
  GradScalerOptions options_;
  bool enabled_;
  LossScaler scaler_;
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_GRAD_SCALER_H_
