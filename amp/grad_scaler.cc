#include "amp/grad_scaler.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg {
namespace amp {

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options),
      enabled_(options.enabled()),
      scaler_(LossScaler::PyTorch(options.init_scale(), options.growth_factor(),
                                  options.backoff_factor(), options.growth_interval())) {}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!enabled_) return loss;
  return MulScalar(loss, scaler_.scale());
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  TG_CHECK(state.stage != Stage::kUnscaled,
           "unscale_() has already been called on this optimizer since the last update().");
  TG_CHECK(state.stage != Stage::kStepped, "unscale_() is being called after step().");
  // One check per device, as PyTorch's.
  std::vector<std::pair<Device, std::vector<RawTensor>>> grads;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      TG_CHECK(p.grad().dtype() != kF16, "Attempting to unscale FP16 gradients.");
      const Device device = p.grad().device();
      auto it = std::find_if(grads.begin(), grads.end(),
                             [&](const auto& entry) { return entry.first == device; });
      if (it == grads.end()) it = grads.insert(grads.end(), {device, {}});
      it->second.push_back(p.grad().data());
    }
  }
  // inv_scale = scale.double().reciprocal().float(), as PyTorch computes it.
  const RawTensor inv_scale = RawTensor::Scalar(static_cast<float>(1.0 / scaler_.scale()), kF32);
  bool found_inf = false;
  for (const auto& [device, list] : grads) {
    const RawTensor found = RawTensor::Zeros({}, kF32).to(device);
    NonFiniteCheckAndUnscale(list, found, inv_scale.to(device));
    found_inf = found_inf || found.to(Device::Cpu()).item() != 0;
  }
  state.found_inf = found_inf;
  state.stage = Stage::kUnscaled;
}

void GradScaler::step(optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return;
  }
  PerOptimizer& state = per_optimizer_[&optimizer];
  TG_CHECK(state.stage != Stage::kStepped,
           "step() has already been called since the last update().");
  if (state.stage == Stage::kReady) unscale_(optimizer);
  if (!state.found_inf) optimizer.step();
  state.stage = Stage::kStepped;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale.has_value()) {
    TG_CHECK(*new_scale > 0 && *new_scale < std::numeric_limits<double>::infinity(),
             "GradScaler: new_scale must be positive and finite, got ", *new_scale);
    StateDict sd = scaler_.state_dict();
    sd.scalars["scale"] = static_cast<float>(*new_scale);
    scaler_.load_state_dict(sd);
  } else {
    bool any = false, found_inf = false;
    for (const auto& [optimizer, state] : per_optimizer_) {
      if (state.stage == Stage::kReady) continue;
      any = true;
      found_inf = found_inf || state.found_inf;
    }
    TG_CHECK(any, "No inf checks were recorded prior to update.");
    scaler_.update(found_inf);
  }
  per_optimizer_.clear();
}

StateDict GradScaler::state_dict() const {
  StateDict sd;
  if (!enabled_) return sd;
  sd.scalars["scale"] = scaler_.scale();
  sd.scalars["growth_factor"] = options_.growth_factor();
  sd.scalars["backoff_factor"] = options_.backoff_factor();
  sd.scalars["growth_interval"] = static_cast<double>(options_.growth_interval());
  sd.scalars["_growth_tracker"] = static_cast<double>(scaler_.growth_tracker());
  return sd;
}

void GradScaler::load_state_dict(const StateDict& state) {
  TG_CHECK(enabled_, "GradScaler: load_state_dict on a disabled scaler");
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    TG_CHECK(state.has_scalar(key), "GradScaler: load_state_dict: missing key '", key, "'");
  }
  const double tracker = state.scalar("_growth_tracker");
  const int64_t interval = static_cast<int64_t>(state.scalar("growth_interval"));
  TG_CHECK(static_cast<double>(interval) == state.scalar("growth_interval") && interval >= 1,
           "GradScaler: load_state_dict: growth_interval must be a positive integer, got ",
           state.scalar("growth_interval"));
  LossScaler loaded = LossScaler::PyTorch(state.scalar("scale"), state.scalar("growth_factor"),
                                          state.scalar("backoff_factor"), interval);
  StateDict sd = loaded.state_dict();
  sd.scalars["growth_tracker"] = tracker;
  // The tracker must not exceed the streak and iteration counters the scaler checks.
  sd.scalars["clean_streak"] = std::max(sd.scalar("clean_streak"), tracker);
  sd.scalars["iteration"] = std::max(sd.scalar("iteration"), tracker);
  loaded.load_state_dict(sd);  // validates the tracker (a non-negative integer)
  options_.init_scale(state.scalar("scale"))
      .growth_factor(state.scalar("growth_factor"))
      .backoff_factor(state.scalar("backoff_factor"))
      .growth_interval(interval);
  scaler_ = loaded;
  per_optimizer_.clear();
}

}  // namespace amp
}  // namespace tg
