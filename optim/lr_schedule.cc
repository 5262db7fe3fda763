#include "optim/lr_schedule.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg::optim {

LrSchedule::LrSchedule(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const ParamGroup& group : optimizer.param_groups()) base_lrs_.push_back(group.lr());
}

void LrSchedule::Apply() {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  TG_CHECK(groups.size() == base_lrs_.size(), "LrSchedule: bound to ", base_lrs_.size(),
           " param groups, the optimizer now has ", groups.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_lr(LrAt(last_step_, base_lrs_[g]));
}

void LrSchedule::step(bool optimizer_skipped) {
  if (optimizer_skipped) return;
  ++last_step_;
  Apply();
}

StateDict LrSchedule::state_dict() const {
  StateDict sd;
  sd.scalars["last_step"] = static_cast<double>(last_step_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    sd.scalars[absl::StrCat("base_lrs.", g)] = base_lrs_[g];
  }
  return sd;
}

void LrSchedule::set_base_lrs(const std::vector<double>& base_lrs) {
  TG_CHECK(base_lrs.size() == optimizer_.param_groups().size(), "LrSchedule.set_base_lrs: ",
           base_lrs.size(), " lrs for ", optimizer_.param_groups().size(), " param groups");
  for (double lr : base_lrs) {
    TG_CHECK(std::isfinite(lr) && lr >= 0, "LrSchedule.set_base_lrs: lr ", lr,
             " is not finite and >= 0");
  }
  base_lrs_ = base_lrs;
  Apply();
}

void LrSchedule::load_state_dict(const StateDict& sd) {
  const char* op = "LrSchedule.load_state_dict: ";
  TG_CHECK(sd.has_scalar("last_step"), op, "missing scalar 'last_step'");
  const double last = sd.scalar("last_step");
  TG_CHECK(last >= 0 && last <= 9007199254740992.0 && std::floor(last) == last, op,
           "'last_step' is ", last, "; expected a non-negative integer");
  const size_t groups = optimizer_.param_groups().size();
  std::vector<double> base(groups);
  for (size_t g = 0; g < groups; ++g) {
    const std::string key = absl::StrCat("base_lrs.", g);
    TG_CHECK(sd.has_scalar(key), op, "missing scalar '", key, "' (the optimizer has ", groups,
             " param groups)");
    base[g] = sd.scalar(key);
    TG_CHECK(std::isfinite(base[g]) && base[g] >= 0, op, "'", key, "' is ", base[g]);
  }
  for (const auto& [key, value] : sd.scalars) {
    if (key == "last_step") continue;
    bool known = false;
    for (size_t g = 0; g < groups && !known; ++g) known = key == absl::StrCat("base_lrs.", g);
    TG_CHECK(known, op, "unexpected scalar '", key, "' (the optimizer has ", groups,
             " param groups)");
  }
  TG_CHECK(sd.tensors.empty(), op, "unexpected tensor '", sd.tensors.begin()->first, "'");
  base_lrs_ = std::move(base);
  last_step_ = static_cast<int64_t>(last);
  Apply();
}

ConstantLr::ConstantLr(Optimizer& optimizer) : LrSchedule(optimizer) { Apply(); }

double ConstantLr::LrAt(int64_t, double base_lr) const { return base_lr; }

StepLr::StepLr(Optimizer& optimizer, int64_t step_size, double gamma)
    : LrSchedule(optimizer), step_size_(step_size), gamma_(gamma) {
  TG_CHECK(step_size > 0, "StepLr: step_size must be > 0, got ", step_size);
  TG_CHECK(gamma >= 0 && std::isfinite(gamma), "StepLr: gamma must be >= 0, got ", gamma);
  Apply();
}

double StepLr::LrAt(int64_t t, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(t / step_size_));
}

CosineWithWarmupLr::CosineWithWarmupLr(Optimizer& optimizer, int64_t warmup_steps,
                                       int64_t total_steps, double min_lr)
    : LrSchedule(optimizer),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      min_lr_(min_lr) {
  TG_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
           "CosineWithWarmupLr: need 0 <= warmup_steps <= total_steps, got warmup_steps ",
           warmup_steps, " and total_steps ", total_steps);
  TG_CHECK(min_lr >= 0 && std::isfinite(min_lr), "CosineWithWarmupLr: min_lr must be >= 0, got ",
           min_lr);
  Apply();
}

double CosineWithWarmupLr::LrAt(int64_t t, double base_lr) const {
  if (t < warmup_steps_) {
    return base_lr * static_cast<double>(t + 1) / static_cast<double>(warmup_steps_);
  }
  if (t >= total_steps_) return min_lr_;
  const double ratio =
      static_cast<double>(t - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return min_lr_ + coeff * (base_lr - min_lr_);
}

}  // namespace tg::optim
