// Learning-rate schedules bound to an Optimizer: each sets every group's lr from that group's
// base lr (its lr when the schedule was bound) and the schedule step t = last_step().
//
//   tg::optim::AdamW opt(params, tg::optim::AdamWOptions(6e-4));   // 6e-4 is the base lr
//   tg::optim::CosineWithWarmupLr sched(opt, /*warmup_steps=*/100, /*total_steps=*/5000,
//                                       /*min_lr=*/6e-5);
//   for (...) {
//     ...backward...
//     bool skipped = !scaler_step_was_taken;               // e.g. an f16 overflow
//     opt.step();                                          // (or the mixed-precision step)
//     sched.step(/*optimizer_skipped=*/skipped);           // a skipped step does not advance
//   }
//
// Semantics: binding sets lr = LrAt(0, base) (the lr of the first optimizer step; t counts
// optimizer steps taken). step() increments t and sets lr = LrAt(t, base); step(true) changes
// nothing, so the lr stays that of the step that was skipped and the schedule's horizon counts
// only real updates. All formulas are evaluated in double on the host:
//   ConstantLr:          lr(t) = base
//   StepLr:              lr(t) = base * pow(gamma, floor(t / step_size))  (PyTorch's closed form)
//   CosineWithWarmupLr:  lr(t) = base * (t + 1) / warmup_steps                   t < warmup
//                        lr(t) = min_lr + 0.5 * (1 + cos(pi * r)) * (base - min_lr)
//                                with r = (t - warmup) / (total - warmup)   warmup <= t < total
//                        lr(t) = min_lr                                         t >= total
//   (llm.c's schedule: the first step already has a non-zero lr, the warmup reaches base at
//   t = warmup - 1 and the cosine starts from base at t = warmup; min_lr is absolute, the same
//   for every group.)
// The optimizer must outlive the schedule, and keep its number of groups.
#ifndef TAPEGRAD_OPTIM_LR_SCHEDULE_H_
#define TAPEGRAD_OPTIM_LR_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/state_dict.h"

namespace tg::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  LrSchedule(const LrSchedule&) = delete;
  LrSchedule& operator=(const LrSchedule&) = delete;

  // Advances t and sets every group's lr, unless the optimizer step was skipped.
  void step(bool optimizer_skipped = false);
  // t: the number of optimizer steps taken (not counting skipped ones) since binding.
  int64_t last_step() const { return last_step_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lr at schedule step `t` for a group with base lr `base_lr`.
  virtual double LrAt(int64_t t, double base_lr) const = 0;

  // "last_step" and "base_lrs.<g>". load_state_dict checks the group count, restores both and
  // sets every group's lr to LrAt(last_step, base). The schedule's own parameters (warmup, ...)
  // come from its constructor.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state_dict);
  // Replaces the base lrs (one per group, finite and >= 0) and sets every group's lr from them:
  // a resumed run that changes its peak lr.
  void set_base_lrs(const std::vector<double>& base_lrs);

 protected:
  // Records the base lrs (each group's current lr). Subclass constructors validate their
  // parameters and then call Apply().
  explicit LrSchedule(Optimizer& optimizer);
  // Sets each group's lr to LrAt(last_step(), base).
  void Apply();

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_step_ = 0;
};

class ConstantLr : public LrSchedule {
 public:
  explicit ConstantLr(Optimizer& optimizer);
  double LrAt(int64_t t, double base_lr) const override;
};

class StepLr : public LrSchedule {
 public:
  // step_size > 0, gamma >= 0.
  StepLr(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double LrAt(int64_t t, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

class CosineWithWarmupLr : public LrSchedule {
 public:
  // 0 <= warmup_steps <= total_steps, min_lr >= 0.
  CosineWithWarmupLr(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                     double min_lr = 0);
  double LrAt(int64_t t, double base_lr) const override;

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_LR_SCHEDULE_H_
