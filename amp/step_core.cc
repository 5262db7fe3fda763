#include "amp/step_core.h"

#include <cmath>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "autograd/trace.h"
#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/optimizer_kernels.h"

namespace tg {
namespace amp {

StepCore::StepCore(const MixedPrecisionOptions& options, bool any_f16, Device device,
                   StepCoreHooks hooks)
    : scaler_(options.scaler),
      update_scaler_(options.update_scaler),
      device_(device),
      hooks_(std::move(hooks)) {
  if (!hooks_.reduce_found_inf) hooks_.reduce_found_inf = options.reduce_found_inf;
  if (scaler_ == nullptr) {
    scaler_ =
        std::make_shared<LossScaler>(any_f16 ? LossScaler::PyTorch() : LossScaler::Constant(1));
  }
  check_non_finite_ = options.check_non_finite.value_or(any_f16 || scaler_->options().dynamic);
  found_inf_ = RawTensor::Zeros({}, kF32, device_);
}

Tensor StepCore::Scale(const Tensor& loss) const {
  return MulScalar(Cast(loss, kF32), scaler_->scale());
}

RawTensor StepCore::InvScale() const {
  // A fill on the device (a kernel argument, not an upload) or a host scalar.
  return RawTensor::Full({}, 1.0 / scaler_->scale(), kF32, device_);
}

void StepCore::Unscale(const std::vector<RawTensor>& grads) {
  if (grads.empty()) return;
  NonFiniteCheckAndUnscale(grads, found_inf_, InvScale());
}

double StepCore::ClipGradNorm(const std::vector<RawTensor>& grads, double max_norm,
                              double norm_type) {
  TG_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  TG_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be > 0 (or inf), got ", norm_type);
  if (grads.empty() && !hooks_.reduce_norm) return 0;
  // This rank's norm: 0-d f64 where the gradients live.
  RawTensor norm = grads.empty() ? RawTensor() : GlobalGradNorm(grads, norm_type);
  double total = 0;
  if (norm.defined()) {
    total = norm.item();  // one host read (a device sync)
    ++host_reads_;
  }
  if (hooks_.reduce_norm) {
    total = hooks_.reduce_norm(total, norm_type);  // a collective: the norm over every rank
    if (norm.defined()) norm.fill_(total);
  }
  double clip_coef = 1;
  // The one clip rule (tensor/optimizer_kernels.h); ClipByNorm takes the same decision where the
  // norm lives.
  if (!grads.empty() && ClipCoefficient(total, max_norm, &clip_coef)) {
    ClipByNorm(grads, norm, max_norm);
  }
  return total;
}

void StepCore::UpdateScaler(bool found_inf, double scale_used) {
  scaler_->update(found_inf);  // throws (changing nothing) at DeepSpeed's min-scale error
  TraceEvent("amp", "scaler update: found_inf=", found_inf, " scale ", scale_used, " -> ",
             scaler_->scale(), found_inf ? " (step skipped)" : "");
}

StepResult StepCore::Step(const std::vector<MasterPiece>& pieces, optim::Optimizer& optimizer,
                          const std::function<void()>& on_skip,
                          const std::function<void()>& on_update) {
  StepResult result;
  result.scale = scaler_->scale();
  bool found_inf = false;
  if (check_non_finite_) {
    if (hooks_.reduce_found_inf) hooks_.reduce_found_inf(found_inf_);
    found_inf = found_inf_.item() != 0;  // the step's one host read (a device sync on CUDA)
    ++host_reads_;
  }
  // Whatever the scaler holds (a corrupt checkpoint, a caller's constant), an unscale that cannot
  // be finite skips the step, with or without check_non_finite: a host test, no device read. The
  // scale is the same on every rank, so every rank skips.
  found_inf = found_inf || !UnscalesFinitely(result.scale);
  if (found_inf) {
    ++skipped_steps_;
    result.skipped = true;
    if (on_skip) on_skip();
  } else {
    for (const MasterPiece& p : pieces) {
      p.master.set_grad(p.grad.defined() ? Tensor(p.grad) : Tensor());
      // The optimizer writes the model's copy (rounded to the model's dtype): tg::FusedAdam in
      // the pass that updates the master, other updates right after it.
      if (p.model_copy.defined()) optimizer.set_model_copy(p.master, p.model_copy);
    }
    try {
      optimizer.step();
    } catch (...) {
      for (const MasterPiece& p : pieces) p.master.set_grad(Tensor());
      throw;
    }
    // Masters keep their gradient with the owner only: an f32 parameter that is its own master
    // must have its .grad free for the next backward.
    for (const MasterPiece& p : pieces) p.master.set_grad(Tensor());
    if (on_update) on_update();
  }
  if (update_scaler_) UpdateScaler(found_inf, result.scale);
  found_inf_.zero_();
  return result;
}

}  // namespace amp
}  // namespace tg
