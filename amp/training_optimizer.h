// TrainingOptimizer: the training-step interface of a mixed-precision optimizer facade: loss
// scaling, backward into (f32) master gradients, clipping by the global norm, an
// overflow-skipping step and a checkpointable state. amp::MixedPrecisionOptimizer implements it
// in one process (or with DDP), dist::ZeroOptimizer with its state sharded across ranks, so a
// training loop (train::Run, train/run.h) is written once for both:
//
//   void Step(tg::amp::TrainingOptimizer& opt, const tg::Tensor& loss) {
//     opt.zero_grad();
//     opt.backward(loss);                      // scale, backward, master grads = grads / scale
//     double norm = opt.clip_master_grads(1.0);  // the norm of the whole (unscaled) gradient
//     tg::amp::StepResult r = opt.step();      // skipped on inf/NaN; the scaler moves either way
//   }
//
// The contracts (see amp/mixed_precision_optimizer.h for the single-process semantics and
// distributed/zero.h for the sharded ones):
// - Master gradients accumulate over backward() calls until zero_grad() (gradient
//   accumulation); step() makes them current, skips or updates, then updates the scaler once.
// - state_dict() has one format for every implementation ("master.<i>", "optimizer.*",
//   "scaler.*", by parameter number in optimizer order), so a checkpoint written by one loads
//   into another. It may be a collective (ZeRO gathers the shards): in a data-parallel run
//   every rank calls it, and so are step() and clip_master_grads().
// - update_master_grads = false in MasterBackwardOptions keeps the gradients in the model's
//   .grad (DDP's no_sync accumulation); an implementation that cannot defer
//   (can_defer_master_grads() false: ZeRO stage 2/3, which reduce from the hooks) throws
//   tg::Error for it.
// Both implementations run one amp::StepCore (amp/step_core.h) for the mechanics of the step, so
// the same run skips the same steps, clips to the same norm and updates the scaler the same way
// whichever implementation trains it (tests/distributed/zero_test
// OneRankRunsTheSingleProcessStepCore). Decision: an abstract class (one virtual call per method, a
// few per step) rather than a template, so the binaries pick the implementation from a flag at run
// time.
#ifndef TAPEGRAD_AMP_TRAINING_OPTIMIZER_H_
#define TAPEGRAD_AMP_TRAINING_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "amp/loss_scaler.h"
#include "autograd/variable.h"
#include "optim/optimizer.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg {
namespace amp {

struct MasterBackwardOptions {
  bool update_master_grads = true;  // false: defer to update_master_grads() / step()
  bool retain_graph = false;
};

struct StepResult {
  bool skipped = false;  // found_inf: the parameters did not change
  double scale = 0;      // the loss scale this step's gradients were computed with
};

class TrainingOptimizer {
 public:
  virtual ~TrainingOptimizer() = default;

  // loss (any floating dtype) cast to f32 and multiplied by the current scale (recorded).
  virtual Tensor scale(const Tensor& loss) const = 0;
  // scale(loss), backward, then (unless deferred) the master-gradient update.
  virtual void backward(const Tensor& loss, const MasterBackwardOptions& options) = 0;
  void backward(const Tensor& loss) { backward(loss, MasterBackwardOptions{}); }
  // Moves the gradients of deferred backward passes into the master gradients.
  virtual void update_master_grads() = 0;
  // Whether backward(loss, {update_master_grads = false}) is supported.
  virtual bool can_defer_master_grads() const = 0;
  // Skips on overflow or updates; then the scaler. A collective when distributed.
  virtual StepResult step() = 0;
  // The total norm of the unscaled gradient (inf/NaN on overflow: nothing is scaled), clipping
  // every master gradient by clip_grad_norm's rule. A collective when distributed.
  virtual double clip_master_grads(double max_norm, double norm_type) = 0;
  double clip_master_grads(double max_norm) { return clip_master_grads(max_norm, 2.0); }
  // Clears model .grad, master gradients and found_inf.
  virtual void zero_grad() = 0;

  // See the header comment: one format for every implementation; maybe a collective.
  virtual StateDict state_dict() = 0;
  virtual void load_state_dict(const StateDict& state) = 0;

  virtual double loss_scale() const = 0;
  virtual LossScaler& scaler() = 0;
  // The wrapped optimizer (its param groups hold the masters; the LR schedule drives it).
  virtual optim::Optimizer& optimizer() = 0;
  // The model parameters, by parameter number in optimizer order.
  virtual const std::vector<Tensor>& model_params() const = 0;
  virtual int64_t skipped_steps() const = 0;
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_TRAINING_OPTIMIZER_H_
