#include "train/optimizer_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "amp/loss_scaler.h"
#include "optim/adam.h"
#include "optim/muon.h"
#include "optim/sgd.h"

namespace tg::train {

void ApplyOptimizerOverrides(const OptimizerConfig& config,
                             const std::vector<std::string>& overrides, amp::TrainingOptimizer& opt,
                             optim::LrSchedule& schedule) {
  auto overridden = [&](const char* name) {
    return std::find(overrides.begin(), overrides.end(), name) != overrides.end();
  };
  std::vector<optim::ParamGroup>& groups = opt.optimizer().param_groups();
  std::vector<double> base_lrs = schedule.base_lrs();
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool muon = dynamic_cast<const optim::MuonOptions*>(&groups[g].options()) != nullptr;
    // With decay_matrices_only, the group of the vectors (biases, norms) is never decayed.
    const bool never_decayed =
        config.decay_matrices_only && std::any_of(groups[g].params.begin(), groups[g].params.end(),
                                                  [](const Tensor& p) { return p.dim() < 2; });
    if (overridden("weight_decay") && !never_decayed) {
      groups[g].options().set_named("weight_decay", config.weight_decay);
    }
    // Only optimizers with a beta2 (set_named changes nothing for the others).
    if (overridden("beta2")) groups[g].options().set_named("beta2", config.beta2);
    if (muon ? overridden("muon_lr") : overridden("lr")) {
      base_lrs[g] = muon ? config.muon.lr : config.lr;
    }
  }
  if (overridden("lr") || overridden("muon_lr")) schedule.set_base_lrs(base_lrs);
}

namespace {

absl::StatusOr<optim::MuonAdjustLr> ParseAdjustLr(const std::string& name) {
  if (name == "original") return optim::MuonAdjustLr::kOriginal;
  if (name == "match_rms_adamw") return optim::MuonAdjustLr::kMatchRmsAdamW;
  if (name == "spectral_unclamped") return optim::MuonAdjustLr::kSpectralUnclamped;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown Muon adjust_lr '", name,
                   "' (expected original, match_rms_adamw or spectral_unclamped)"));
}

// --optimizer=muon: the hidden matrices under Muon, the rest under AdamW (see the header).
absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeMuon(const std::vector<Tensor>& params,
                                                           const OptimizerConfig& config) {
  absl::StatusOr<optim::MuonAdjustLr> adjust = ParseAdjustLr(config.muon.adjust_lr);
  if (!adjust.ok()) return adjust.status();
  auto listed = [&](const Tensor& p) {
    for (const Tensor& a : config.adamw_matrices) {
      if (a.is_same(p)) return true;
    }
    return false;
  };
  std::vector<Tensor> hidden, adamw_matrices, rest;
  for (const Tensor& p : params) {
    if (p.dim() == 2 && !listed(p)) {
      hidden.push_back(p);
    } else if (p.dim() >= 2 && config.decay_matrices_only) {
      adamw_matrices.push_back(p);
    } else {
      rest.push_back(p);
    }
  }
  if (hidden.empty()) {
    return absl::InvalidArgumentError(
        "--optimizer=muon: the model has no hidden 2-D matrices for Muon (every 2-D parameter is "
        "an embedding or the output head)");
  }
  optim::MuonOptions muon;
  muon.lr(config.muon.lr)
      .momentum(config.muon.momentum)
      .nesterov(config.muon.nesterov)
      .ns_steps(config.muon.ns_steps)
      .adjust_lr_fn(*adjust)
      .weight_decay(config.weight_decay);
  optim::AdamWOptions adamw;
  adamw.lr(config.lr).beta2(config.beta2).weight_decay(config.weight_decay);
  std::vector<optim::ParamGroup> groups;
  groups.emplace_back(hidden, muon);
  if (!adamw_matrices.empty()) groups.emplace_back(adamw_matrices, adamw);
  if (config.decay_matrices_only) adamw.weight_decay(0);
  if (!rest.empty()) groups.emplace_back(rest, adamw);
  return std::unique_ptr<optim::Optimizer>(
      std::make_unique<optim::MuonWithAdamW>(std::move(groups), muon));
}

}  // namespace

absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const std::vector<Tensor>& params,
                                                                const OptimizerConfig& config) {
  std::vector<Tensor> matrices, others;
  if (config.decay_matrices_only) {
    for (const Tensor& p : params) (p.dim() >= 2 ? matrices : others).push_back(p);
  }
  // The groups for the optimizer's options: with decay_matrices_only, group 1 (the vectors) has
  // the same options without weight decay.
  auto make_groups = [&](auto options) {
    std::vector<optim::ParamGroup> groups;
    if (!config.decay_matrices_only) {
      groups.emplace_back(params);
      return groups;
    }
    groups.emplace_back(matrices);
    options.weight_decay(0);
    if (!others.empty()) groups.emplace_back(others, options);
    return groups;
  };
  if (config.name == "muon") return MakeMuon(params, config);
  std::unique_ptr<optim::Optimizer> opt;
  if (config.name == "adamw" || config.name == "adam") {
    optim::AdamWOptions o;
    o.lr(config.lr);
    o.weight_decay(config.weight_decay);
    o.beta2(config.beta2);
    if (config.name == "adamw") {
      opt = std::make_unique<optim::AdamW>(make_groups(o), o);
    } else {
      const optim::AdamOptions& adam = o;
      opt = std::make_unique<optim::Adam>(make_groups(adam), adam);
    }
  } else if (config.name == "sgd") {
    optim::SGDOptions o;
    o.lr(config.lr);
    o.momentum(config.momentum);
    o.weight_decay(config.weight_decay);
    opt = std::make_unique<optim::SGD>(make_groups(o), o);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", config.name, "' (expected adamw, adam, sgd or muon)"));
  }
  return opt;
}

absl::StatusOr<amp::MixedPrecisionOptions> MakeMixedPrecisionOptions(
    const PrecisionConfig& precision) {
  amp::MixedPrecisionOptions mp;
  mp.reduce_found_inf = precision.reduce_found_inf;
  // Every precision checks for non-finite gradients, not only f16: an f32 or bf16 step on NaN
  // gradients would write NaN into every master weight before the loss showed it. A skipped step
  // of a constant scale stops the run (DivergenceCheck). The cost is the found_inf read of each
  // step (nothing on the CPU; on a GPU one read next to the gradient norm's).
  mp.check_non_finite = true;
  const std::string& s = precision.loss_scaler;
  if (s == "pytorch") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch());
  } else if (s == "megatron") {
    // Megatron-LM's defaults for --fp16 with dynamic scaling.
    mp.scaler = std::make_shared<amp::LossScaler>(
        amp::LossScaler::MegatronDynamic(4294967296.0, 1.0, 2.0, 0.5, 1000, 2));
  } else if (s == "deepspeed") {
    // What a DeepSpeed user's fp16 run gets from the engine's config defaults (2^16, hysteresis
    // 2); the class defaults are deepspeed_class.
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedEngine());
  } else if (s == "deepspeed_class") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedDynamic());
  } else if (s == "deepspeed_legacy") {
    // DeepSpeed's defaults with its growth timing before v0.17.1.
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedDynamic(
        4294967296.0, 2.0, 1000, 1.0, 1, false, true, amp::DeepSpeedGrowth::kBeforeV0_17_1));
  } else if (s == "apex") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::Apex());
  } else if (s == "none") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::Constant(1.0));
  } else if (s != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown loss scaler '", s,
        "' (expected auto, pytorch, megatron, deepspeed, deepspeed_class, deepspeed_legacy, apex "
        "or none)"));
  }
  return mp;
}

absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Tensor>& params, const OptimizerConfig& config,
    const PrecisionConfig& precision) {
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> opt = MakeOptimizer(params, config);
  if (!opt.ok()) return opt.status();
  absl::StatusOr<amp::MixedPrecisionOptions> mp = MakeMixedPrecisionOptions(precision);
  if (!mp.ok()) return mp.status();
  return std::make_unique<amp::MixedPrecisionOptimizer>(std::move(*opt), std::move(*mp));
}

}  // namespace tg::train
