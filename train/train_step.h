// One optimizer step of a training loop: the forward under the run's autocast, backward through
// the training optimizer (with gradient accumulation over micro-batches), clipping, the step and
// the schedule.
#ifndef TAPEGRAD_TRAIN_TRAIN_STEP_H_
#define TAPEGRAD_TRAIN_TRAIN_STEP_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "amp/fp8.h"
#include "amp/training_optimizer.h"
#include "autograd/autocast.h"
#include "autograd/variable.h"
#include "optim/lr_schedule.h"
#include "tensor/dtype.h"

namespace tg::train {

// The run's precision as its forward passes see it: autocast to `dtype` (none for f32) and, for
// --precision=fp8, the FP8 training whose Linear GEMMs run in FP8 (amp/fp8.h).
struct ForwardPrecision {
  ForwardPrecision(DType dtype) : dtype(dtype) {}  // NOLINT(runtime/explicit): a dtype alone
  ForwardPrecision(DType dtype, amp::Fp8Training* fp8) : dtype(dtype), fp8(fp8) {}
  DType dtype;
  amp::Fp8Training* fp8 = nullptr;
};

// The forward pass's precision: autocast to the dtype, and the FP8 scope (amp::Fp8Autocast) of
// an FP8 run, inside it as Transformer Engine nests fp8_autocast in bf16 autocast. update_fp8 =
// false for evaluation and sampling: their casts leave delayed scaling's state as it is.
class PrecisionScope {
 public:
  // The autocast guard is entered before the FP8 scope (members are initialised in order).
  explicit PrecisionScope(const ForwardPrecision& precision, bool update_fp8 = true)
      : guard_(MakeGuard(precision.dtype)), fp8_(precision.fp8, update_fp8) {}
  // The end of a training forward: FP8's forward update (amp::Fp8Autocast::Finish), inside
  // autocast. Not for update_fp8 = false.
  void Finish() { fp8_.Finish(); }

 private:
  static std::optional<amp::AutocastGuard> MakeGuard(DType dtype) {
    if (dtype == kF32) return std::nullopt;
    return std::optional<amp::AutocastGuard>(std::in_place, dtype);
  }

  std::optional<amp::AutocastGuard> guard_;
  amp::Fp8Autocast fp8_;  // destroyed first: it ends inside autocast
};

struct StepStats {
  double loss = 0;  // unscaled
  double lr = 0;    // of parameter group 0, used by this step
  double grad_norm =
      0;  // total norm of the unscaled gradients before clipping (inf/NaN on overflow)
  amp::StepResult result;      // result.scale: the loss scale this step's backward used
  double loss_scale_next = 1;  // the scaler's scale after this step's update
};

// Gradient accumulation: one optimizer step over `micro_batches` forward/backward passes.
struct Accumulation {
  int64_t micro_batches = 1;  // >= 1
  // Data-parallel ranks whose gradients are summed (DDP with ReduceOp::kSum), >= 1: each rank's
  // backward runs on loss / (micro_batches * summed_ranks), the seed that one process on the
  // global batch gives each row, so the backward's per-row values (and their f16 overflows) are
  // that process's. 1 without data parallelism or when the gradients are averaged.
  int64_t summed_ranks = 1;
  // Runs `body` (one micro-batch's forward and backward) with the data-parallel gradient
  // synchronisation off when `sync` is false (DDP's no_sync); null: body() as it is.
  std::function<void(bool sync, const std::function<void()>& body)> sync_scope;
};

// One optimizer step: zero_grad, `loss_fn()` under PrecisionScope(precision), backward through the
// mixed-precision optimizer, clipping to `max_grad_norm` (> 0; 0 only measures the norm), step,
// and the schedule's step (which does not advance when the optimizer step was skipped).
StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule,
                    const ForwardPrecision& precision, double max_grad_norm,
                    const std::function<Tensor()>& loss_fn);
// With accumulation: `loss_fn(k)` is the mean loss of micro-batch k (of equal sizes), and the
// backward runs on loss / micro_batches (/ summed_ranks), so the master gradients end as the
// gradient of the mean over all micro-batches (the large batch, within f32 rounding); one clip, one
// step and one scaler update follow. Where the optimizer can defer (can_defer_master_grads: the
// MixedPrecisionOptimizer, ZeRO stage 1), every micro-batch but the last accumulates in the
// model's .grad without synchronisation (sync_scope(false, ...)) and the last one reduces and
// unscales the sum once, as DDP's no_sync; ZeRO stage 2/3 reduce every micro-batch into the
// master gradients. StepStats::loss is the mean of the micro-batch losses.
StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule,
                    const ForwardPrecision& precision, double max_grad_norm,
                    const std::function<Tensor(int64_t micro)>& loss_fn,
                    const Accumulation& accumulation);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_TRAIN_STEP_H_
