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
  skip_on_device_ = options.skip_on_device;
  if (skip_on_device_) {
    TG_CHECK(options.update_scaler && scaler_->options().dynamic,
             "MixedPrecisionOptions: skip_on_device needs a dynamic loss scaler that this "
             "optimizer updates (update_scaler = true); got ",
             scaler_->options().dynamic ? "update_scaler = false" : "a constant scaler");
    TG_CHECK(check_non_finite_,
             "MixedPrecisionOptions: skip_on_device decides the overflow skip on the device; "
             "check_non_finite = false turns that skip off");
    device_skipped_ = RawTensor::Zeros({}, kF64, device_);
  }
  found_inf_ = RawTensor::Zeros({}, kF32, device_);
  // A dynamic scaler updated here also lives with the tensors; a shared scaler (update_scaler =
  // false) is updated by its owner on the host.
  device_scaler_ = update_scaler_ && scaler_->options().dynamic;
  if (device_scaler_) {
    scale_t_ = RawTensor::Empty({}, kF32, device_);
    inv_scale_t_ = RawTensor::Empty({}, kF32, device_);
    found_one_ = RawTensor::Ones({}, kF32, device_);
    SyncDeviceScaler();
  }
}

StepCore::ScalerCounters StepCore::HostCounters() const {
  return {scaler_->scale(), scaler_->growth_tracker(), scaler_->hysteresis_tracker(),
          scaler_->clean_streak(), scaler_->iteration()};
}

void StepCore::SyncHostScaler() const {
  if (!host_behind_) return;
  // load_state throws the device's recorded min-scale error (after loading that state).
  host_behind_ = false;
  ++host_reads_;
  scaler_->load_state(ReadLossScaleState(scaler_state_));  // waits for the device
  mirrored_ = HostCounters();
}

int64_t StepCore::skipped_steps() const {
  if (device_skipped_.defined()) {
    const double skipped = device_skipped_.item();  // waits for the device
    ++host_reads_;
    if (skipped != 0) {
      skipped_steps_ += static_cast<int64_t>(skipped);
      device_skipped_.zero_();
    }
  }
  return skipped_steps_;
}

void StepCore::SyncDeviceScaler() const {
  if (host_behind_) return;  // the device state is the newer one
  const ScalerCounters now = HostCounters();
  if (scaler_state_.defined() && now == mirrored_) return;
  // The host scaler changed outside Step (load_state_dict, or a caller's own update): upload it.
  // An upload of host memory may wait for the device; steps themselves never get here.
  scaler_state_ = LossScaleStateTensor(scaler_->state(), device_);
  WriteLossScale(scaler_state_, scale_t_, inv_scale_t_);
  mirrored_ = now;
}

Tensor StepCore::Scale(const Tensor& loss) const {
  if (skip_on_device_) {
    // The device scale, copied (a device copy): the next step writes scale_t_ in place, and the
    // backward of this product reads it. The same f32 product as MulScalar with the host scale.
    SyncDeviceScaler();
    return Mul(Cast(loss, kF32), Tensor(scale_t_.clone()));
  }
  return MulScalar(Cast(loss, kF32), scaler_->scale());
}

RawTensor StepCore::InvScale() {
  if (device_scaler_) {
    SyncDeviceScaler();
    return inv_scale_t_;
  }
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
  if (device_scaler_) SyncDeviceScaler();  // no-op unless changed outside Step
  scaler_->update(found_inf);  // throws (changing nothing) at DeepSpeed's min-scale error
  TraceEvent("amp", "scaler update: found_inf=", found_inf, " scale ", scale_used, " -> ",
             scaler_->scale(), found_inf ? " (step skipped)" : "");
  if (device_scaler_) {
    // The same state machine where the tensors live (tensor/loss_scale_update.h), so the next
    // step's inverse scale is already there; the host scaler stays current for logs and
    // checkpoints.
    StepLossScale(scaler_state_, found_inf ? found_one_ : RawTensor(), scale_t_, inv_scale_t_);
    mirrored_ = HostCounters();
  }
}

StepResult StepCore::StepOnDevice(const std::vector<MasterPiece>& pieces,
                                  optim::Optimizer& optimizer,
                                  const std::function<void()>& on_update) {
  SyncDeviceScaler();  // a scaler changed on the host since the last step goes up first
  StepResult result;
  if (hooks_.reduce_found_inf) hooks_.reduce_found_inf(found_inf_);
  // The step's outcome stays on the device: copies for the caller (no host wait).
  result.device_found_inf = found_inf_.clone();
  result.device_scale = scale_t_.clone();
  for (const MasterPiece& p : pieces) {
    p.master.set_grad(p.grad.defined() ? Tensor(p.grad) : Tensor());
    if (p.model_copy.defined()) optimizer.set_model_copy(p.master, p.model_copy);
  }
  try {
    optimizer.step(found_inf_);  // writes nothing where found_inf != 0
  } catch (...) {
    for (const MasterPiece& p : pieces) p.master.set_grad(Tensor());
    throw;
  }
  for (const MasterPiece& p : pieces) p.master.set_grad(Tensor());
  // Publishing unchanged masters after a skipped step is harmless (their values are what the
  // model already holds); on_skip cannot run, as the host does not know: the owner's
  // zero_grad() before the next backward clears the gradients either way.
  if (on_update) on_update();
  device_skipped_.copy_(Add(device_skipped_, found_inf_.to(kF64)));
  TraceEvent("amp", "scaler update on the device (skip decided there)");
  StepLossScale(scaler_state_, found_inf_, scale_t_, inv_scale_t_);
  host_behind_ = true;
  found_inf_.zero_();
  return result;
}

StepResult StepCore::Step(const std::vector<MasterPiece>& pieces, optim::Optimizer& optimizer,
                          const std::function<void()>& on_skip,
                          const std::function<void()>& on_update) {
  if (skip_on_device_) return StepOnDevice(pieces, optimizer, on_update);
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
