#include "optim/lr_scheduler.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <limits>

#include "tensor/error.h"

namespace tg {
namespace optim {

void LRScheduler::step() {
  set_optimizer_lrs(get_lrs());
  ++step_count_;
}

std::vector<double> LRScheduler::get_current_lrs() const {
  std::vector<double> lrs;
  for (const ParamGroup& group : optimizer_.param_groups()) lrs.push_back(group.lr());
  return lrs;
}

void LRScheduler::set_optimizer_lrs(const std::vector<double>& lrs) {
  TG_CHECK(lrs.size() == optimizer_.param_groups().size(), "LRScheduler: ", lrs.size(),
           " learning rates for ", optimizer_.param_groups().size(), " param groups");
  for (size_t i = 0; i < lrs.size(); ++i) optimizer_.param_groups()[i].set_lr(lrs[i]);
}

StepLR::StepLR(Optimizer& optimizer, unsigned step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  TG_CHECK(step_size > 0, "StepLR: step_size must be positive");
}

std::vector<double> StepLR::get_lrs() {
  std::vector<double> lrs = get_current_lrs();
  if (step_count_ > 0 && step_count_ % step_size_ == 0) {
    for (double& lr : lrs) lr *= gamma_;
  }
  return lrs;
}

ReduceLROnPlateauScheduler::ReduceLROnPlateauScheduler(Optimizer& optimizer, SchedulerMode mode,
                                                       float factor, int patience, double threshold,
                                                       ThresholdMode threshold_mode, int cooldown,
                                                       const std::vector<float>& min_lr, double eps,
                                                       bool verbose)
    : optimizer_(optimizer),
      mode_(mode),
      factor_(factor),
      patience_(patience),
      threshold_(threshold),
      threshold_mode_(threshold_mode),
      cooldown_(cooldown),
      min_lrs_(min_lr),
      eps_(eps),
      verbose_(verbose),
      best_(mode == min ? std::numeric_limits<double>::infinity()
                        : -std::numeric_limits<double>::infinity()) {
  const size_t groups = optimizer.param_groups().size();
  if (min_lrs_.empty()) min_lrs_.assign(groups, 0.0f);
  TG_CHECK(min_lrs_.size() == groups, "ReduceLROnPlateauScheduler: ", min_lrs_.size(),
           " min_lr values for ", groups, " param groups");
  TG_CHECK(factor < 1.0, "ReduceLROnPlateauScheduler: factor should be < 1.0, got ", factor);
  TG_CHECK(patience >= 0 && cooldown >= 0,
           "ReduceLROnPlateauScheduler: patience and cooldown must be non-negative");
}

bool ReduceLROnPlateauScheduler::IsBetter(double metric) const {
  if (mode_ == min) {
    return threshold_mode_ == rel ? metric < best_ * (1.0 - threshold_)
                                  : metric < best_ - threshold_;
  }
  return threshold_mode_ == rel ? metric > best_ * (1.0 + threshold_) : metric > best_ + threshold_;
}

void ReduceLROnPlateauScheduler::step(float metric) {
  ++last_epoch_;
  if (IsBetter(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > patience_) {
    ReduceLr();
    cooldown_counter_ = cooldown_;
    num_bad_epochs_ = 0;
  }
}

void ReduceLROnPlateauScheduler::ReduceLr() {
  for (size_t i = 0; i < optimizer_.param_groups().size(); ++i) {
    ParamGroup& group = optimizer_.param_groups()[i];
    const double old_lr = group.lr();
    const double new_lr = std::max(old_lr * factor_, static_cast<double>(min_lrs_[i]));
    if (old_lr - new_lr > eps_) {
      group.set_lr(new_lr);
      if (verbose_) {
        std::cout << std::setprecision(4) << "Epoch " << last_epoch_
                  << ": reducing learning rate of group " << i << " to " << new_lr << std::endl;
      }
    }
  }
}

}  // namespace optim
}  // namespace tg
