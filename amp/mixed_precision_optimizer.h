// MixedPrecisionOptimizer: fp32 master weights and gradients for an f16/bf16 model, loss scaling
// and overflow-skipping steps around any optimizer (Apex's FP16_Optimizer, Megatron's
// MixedPrecisionOptimizer and DeepSpeed's FP16_Optimizer, as one C++ class).
//
//   auto adamw = std::make_unique<tg::optim::AdamW>(model_params, adamw_options);
//   tg::amp::MixedPrecisionOptimizer opt(std::move(adamw));   // f16 params: PyTorch scaler
//   for (...) {
//     opt.zero_grad();
//     opt.backward(loss);                  // scale, backward, master grads = grads / scale
//     opt.clip_master_grads(1.0);          // true (unscaled) gradients
//     tg::amp::StepResult r = opt.step();  // skipped on inf/NaN; the scaler moves either way
//     schedule.step(r.skipped);            // a skipped step does not advance the schedule
//   }
//
// How it works:
// - At construction every f16/bf16 parameter of the wrapped optimizer's groups is replaced (in
//   the optimizer) by an f32 master copy; f32 and f64 parameters are their own masters. The
//   optimizer must not have stepped yet.
// - Master gradients are f32 buffers owned here. update_master_grads() moves each model
//   parameter's .grad into its master gradient (converted to f32, divided by the scale, in one
//   fused non-finite check + unscale over all of them that also records found_inf) and releases
//   the model .grad, so the next backward accumulates only its own contribution: gradient
//   accumulation over micro-batches works with or without deferring the update, and master
//   gradients accumulate until zero_grad(), like .grad in PyTorch.
// - The mechanics -- unscale + overflow check, the global norm and clip, the skip decision, the
//   master update and the scaler update -- are amp::StepCore's (amp/step_core.h), the same code
//   that dist::ZeroOptimizer runs on a rank's shards; this class owns the masters, the master
//   gradients and the hooks, and hands the core all of its (master, gradient) pieces.
// - step() makes the master gradients current (the deferred update, if any), reads found_inf
//   once (after the optional cross-rank max), and either skips (zeroing all gradients) or runs
//   the wrapped optimizer on the masters and copies them back into the model parameters in their
//   dtype; then the scaler is updated (unless Options::update_scaler is false, for several
//   optimizers sharing one scaler: the caller updates it once with the OR of their found_inf).
// - attach(): post-accumulate-grad hooks on the model parameters make a plain
//   `opt.scale(loss).backward()` (or `y.backward(grad)` with a scaled grad) equivalent to
//   opt.backward(loss): the first hook of the outermost user backward queues the master-grad
//   update as a callback of that outermost graph task, so it runs exactly once per backward,
//   after every gradient (also those accumulated in nested tasks of reentrant checkpointing);
//   backward passes started inside a ForwardScope (issued by a model's forward, a forward hook or
//   a custom function's Forward: nn::Module calls and custom functions enter one) queue nothing:
//   their gradients stay in .grad and the next update (the user backward's, or step()'s)
//   includes them, so a forward-time backward is counted once, like DDP and ZeroOptimizer.
// - found_inf and the scale live with the tensors (a 0-d f32 tensor); step() does one host read
//   of found_inf, and only when it checks for overflow (check_non_finite): bf16 runs read nothing.
// - Every device runs the same code (every parameter on one device; build the optimizer after
//   Module::to): masters, master gradients and found_inf live with the parameters. The check +
//   unscale is one multi-tensor op (tg::NonFiniteCheckAndUnscale); AdamW (and Adam without
//   weight decay) updates all masters of a group in one tg::FusedAdam call that also writes the
//   f16/bf16 model parameters in the same pass (other optimizers update the masters and copy).
//   The scale and its counters live in one place, the host LossScaler: step() updates it from
//   the one found_inf read, and an unscale gets 1/scale as a fill (a kernel argument, never an
//   upload), so loss_scale(), scaler() and state_dict() never wait for a device and there is
//   no second copy to keep in step. The only host<->device synchronisation of a step on a GPU
//   is that found_inf read (skip reporting, the LR schedule's skip rule); clip_master_grads
//   adds one read of the norm.
// - bf16 (and f32) models default to a constant scale of 1 and no skipping (check_non_finite
//   off); f16 models default to PyTorch's dynamic scaler with skipping.
#ifndef TAPEGRAD_AMP_MIXED_PRECISION_OPTIMIZER_H_
#define TAPEGRAD_AMP_MIXED_PRECISION_OPTIMIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/step_core.h"
#include "amp/training_optimizer.h"
#include "autograd/variable.h"
#include "optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/state_dict.h"

namespace tg {
namespace amp {

// MixedPrecisionOptions: amp/step_core.h.

// MasterBackwardOptions and StepResult: amp/training_optimizer.h.
class MixedPrecisionOptimizer : public TrainingOptimizer {
 public:
  using Options = MixedPrecisionOptions;

  explicit MixedPrecisionOptimizer(std::unique_ptr<optim::Optimizer> optimizer,
                                   Options options = Options());
  ~MixedPrecisionOptimizer() override;
  MixedPrecisionOptimizer(const MixedPrecisionOptimizer&) = delete;
  MixedPrecisionOptimizer& operator=(const MixedPrecisionOptimizer&) = delete;

  // loss (any floating dtype) cast to f32 and multiplied by the current scale (recorded).
  Tensor scale(const Tensor& loss) const override;
  // scale(loss), backward, then (unless deferred) update_master_grads().
  void backward(const Tensor& loss, const MasterBackwardOptions& options) override;
  using TrainingOptimizer::backward;  // backward(loss): not deferred
  // Moves the model .grad into the master grads (f32, divided by the scale), recording found_inf.
  // No-op when no model parameter has a .grad.
  void update_master_grads() override;
  bool can_defer_master_grads() const override { return true; }
  // Makes the master grads final for this step (the deferred update). At most once per step:
  // a second call throws tg::Error.
  void unscale();
  // See the header comment. Returns whether the step was skipped and the scale it used.
  StepResult step() override;

  // The master gradients (f32; undefined for parameters without one), by parameter number in
  // group order; nullopt while they are not current (a backward's gradients are still in the
  // model's .grad).
  std::optional<std::vector<RawTensor>> inspect_master_grads() const;
  // clip_grad_norm over the master gradients (made current first); returns the total norm,
  // inf/NaN when some gradient is (then nothing is scaled).
  double clip_master_grads(double max_norm, double norm_type) override;
  using TrainingOptimizer::clip_master_grads;  // clip_master_grads(max_norm): the 2-norm
  // Clears model .grad, master gradients and found_inf.
  void zero_grad() override;

  // "master.<i>" (f32 masters of f16/bf16 parameters), "optimizer.*" (the wrapped optimizer's
  // state, for the masters) and "scaler.*". load_state_dict restores all three and copies the
  // masters into the model parameters, so a resumed run continues bit for bit.
  StateDict state_dict() const;
  StateDict state_dict() override {
    return static_cast<const MixedPrecisionOptimizer&>(*this).state_dict();
  }
  void load_state_dict(const StateDict& state) override;

  // See the header comment; detach() removes the hooks (also done by the destructor).
  void attach();
  void detach();

  double loss_scale() const override { return core_->scaler().scale(); }
  LossScaler& scaler() override { return core_->scaler(); }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  // The model parameters and their masters, by parameter number in group order.
  const std::vector<Tensor>& model_params() const override { return model_; }
  const std::vector<Tensor>& master_params() const { return master_; }
  // The parameters' device (every parameter is on it).
  Device device() const { return device_; }
  // Counters for tests and logs.
  int64_t master_grad_updates() const { return master_grad_updates_; }
  // The mechanics of the step (shared with dist::ZeroOptimizer): its skip and host-read counts.
  const StepCore& step_core() const { return *core_; }
  int64_t skipped_steps() const override { return core_->skipped_steps(); }

 private:
  void MakeMasterGradsCurrent();
  bool HasModelGrads() const;
  void ClearAllGrads();

  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<Tensor> model_;            // the model's parameters
  std::vector<Tensor> master_;           // f32 copies for f16/bf16, else the same Tensor
  std::vector<RawTensor> master_grads_;  // f32 (f64 for f64 params); undefined: none yet
  Device device_;                     // of every parameter
  // The step's mechanics (scaler, found_inf, unscale, clip, skip), shared with ZeroOptimizer.
  std::unique_ptr<StepCore> core_;
  bool unscaled_ = false;            // unscale() was called since the last step()
  bool in_facade_backward_ = false;  // backward() is running: the hooks stay quiet
  int64_t armed_task_ = -1;          // outermost task whose epilogue is queued
  std::vector<HookHandle> hooks_;
  int64_t master_grad_updates_ = 0;
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_MIXED_PRECISION_OPTIMIZER_H_
