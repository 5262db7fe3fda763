// libtorch's learning-rate schedulers (torch::optim::LRScheduler, StepLR,
// ReduceLROnPlateauScheduler), spelled tg::optim::, over any optimizer's param groups. They set
// each group's lr in place (tapegrad's own schedules, optim/lr_schedule.h, are functions of the
// step that the training binaries use instead).
//
//   tg::optim::StepLR scheduler(opt, /*step_size=*/30, /*gamma=*/0.1);
//   for (int epoch = 0; epoch < 90; ++epoch) { train(...); scheduler.step(); }
//   tg::optim::ReduceLROnPlateauScheduler plateau(opt);   // mode min, factor 0.1, patience 10
//   plateau.step(validation_loss);
//
// The rules are libtorch's, call by call, which are not always PyTorch Python's:
// - LRScheduler::step() sets every group's lr to get_lrs() and then counts the call
//   (step_count()); StepLR multiplies by gamma on the calls that find step_count() a positive
//   multiple of step_size, i.e. the (step_size + 1)-th call, the (2 step_size + 1)-th, ...
//   (Python's StepLR, which steps once in its constructor, decays one call earlier).
// - ReduceLROnPlateauScheduler: a metric is better when below best * (1 - threshold) (min, rel),
//   below best - threshold (min, abs), above best * (1 + threshold) (max, rel) or above
//   best + threshold (max, abs; libtorch 2.15 compares with best * threshold there, a bug this
//   class does not copy); after more than `patience` calls without a better metric each group's
//   lr becomes max(lr * factor, min_lr) if that lowers it by more than eps, followed by
//   `cooldown` calls in which bad calls are not counted. `best` starts at +inf (min) or -inf
//   (max; libtorch starts at the smallest positive float, so a max-mode metric that is never
//   positive is never better there).
#ifndef TAPEGRAD_OPTIM_LR_SCHEDULER_H_
#define TAPEGRAD_OPTIM_LR_SCHEDULER_H_

#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace tg {
namespace optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {}
  virtual ~LRScheduler() = default;
  void step();
  int64_t step_count() const { return step_count_; }

 protected:
  // The lr of every param group for this call (one per group, in order).
  virtual std::vector<double> get_lrs() = 0;
  std::vector<double> get_current_lrs() const;
  void set_optimizer_lrs(const std::vector<double>& lrs);

  int64_t step_count_ = 0;
  Optimizer& optimizer_;
};

class StepLR : public LRScheduler {
 public:
  // Throws tg::Error for step_size 0.
  StepLR(Optimizer& optimizer, unsigned step_size, double gamma = 0.1);

 private:
  std::vector<double> get_lrs() override;
  unsigned step_size_;
  double gamma_;
};

class ReduceLROnPlateauScheduler {
 public:
  enum SchedulerMode { min, max };
  enum ThresholdMode { rel, abs };
  // min_lr: empty (0 for every group) or one per param group; factor < 1. Throws tg::Error
  // otherwise.
  explicit ReduceLROnPlateauScheduler(Optimizer& optimizer, SchedulerMode mode = min,
                                      float factor = 0.1, int patience = 10,
                                      double threshold = 1e-4, ThresholdMode threshold_mode = rel,
                                      int cooldown = 0, const std::vector<float>& min_lr = {},
                                      double eps = 1e-8, bool verbose = false);
  void step(float metric);
  double best() const { return best_; }
  int num_bad_epochs() const { return num_bad_epochs_; }

 private:
  bool IsBetter(double metric) const;
  void ReduceLr();

  Optimizer& optimizer_;
  SchedulerMode mode_;
  double factor_;
  int patience_;
  double threshold_;
  ThresholdMode threshold_mode_;
  int cooldown_;
  std::vector<float> min_lrs_;
  double eps_;
  bool verbose_;
  double best_;
  int num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

}  // namespace optim
}  // namespace tg

#endif  // TAPEGRAD_OPTIM_LR_SCHEDULER_H_
