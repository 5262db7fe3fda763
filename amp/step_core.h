// StepCore: the one implementation of the mechanics of a mixed-precision training step --
// unscale with the overflow check, the global gradient norm and clip_grad_norm's clip, the
// overflow-skipping master-weight update and the loss-scaler update -- that every
// amp::TrainingOptimizer runs: amp::MixedPrecisionOptimizer on all of the masters, and
// dist::ZeroOptimizer on the shard a rank owns. Sharding changes only which (master, gradient)
// pieces are handed in and the two cross-rank reductions (the max of found_inf, the sum or max
// of the partial norm), which the owner passes as hooks; everything else is this file's.
//
//   amp::StepCore core(scaler, options, any_f16, device, hooks);
//   core.Unscale(fresh_grads);                      // grads /= scale; found_inf |= non-finite
//   double norm = core.ClipGradNorm(grads, 1.0, 2.0);  // the norm over all ranks, then the clip
//   amp::StepResult r = core.Step(pieces, optimizer, on_skip, on_update);  // then the scaler
//
// The loss scaler has one truth: the host LossScaler. Step reads found_inf once (after the
// reduce_found_inf hook) when check_non_finite is on (f16 and dynamic scalers by default), and
// nothing otherwise (bf16/f32); that one read decides the skip and the scaler's update, on the
// host, with every preset's exact rule. The device never holds scaler state: Unscale hands the
// kernel 1/scale as a fill (a kernel argument, no upload, no wait), so nothing is synchronised
// by hand. ClipGradNorm reads the norm once (its return value) -- with the reduce_norm hook it
// reads the rank's partial norm once and the reduced one once.
#ifndef TAPEGRAD_AMP_STEP_CORE_H_
#define TAPEGRAD_AMP_STEP_CORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/training_optimizer.h"
#include "autograd/variable.h"
#include "optim/optimizer.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace tg {
namespace amp {

struct MixedPrecisionOptions {
  // Null: LossScaler::PyTorch() when some parameter is f16, a constant scale of 1 otherwise.
  // Shared so that several optimizers can use one scaler (then set update_scaler = false).
  std::shared_ptr<LossScaler> scaler;
  // Whether step() checks found_inf and skips on overflow. Default: on when some parameter is
  // f16 or the scaler is dynamic; off otherwise (bf16: no skipping unless asked for).
  std::optional<bool> check_non_finite;
  // Whether step() calls scaler->update(found_inf).
  bool update_scaler = true;
  // Set by data-parallel training: makes found_inf (0-d f32, 0 or 1) the max over all ranks, in
  // place, so that every rank skips the same steps.
  std::function<void(const RawTensor& found_inf)> reduce_found_inf;
};

// A piece of master weights that this process (rank) owns and steps: the master Tensor that
// the wrapped optimizer holds, its gradient (f32, f64 for f64 masters; undefined: no gradient
// this step, the optimizer skips the piece) and, optionally, the model tensor that receives the
// updated master rounded to its dtype (optim::Optimizer::set_model_copy; undefined: none).
struct MasterPiece {
  Tensor master;
  RawTensor grad;
  RawTensor model_copy;
};

// The cross-rank reductions; both empty in one process.
struct StepCoreHooks {
  // found_inf (0-d f32, 0 or 1) made the max over every rank, in place, so that every rank
  // skips the same steps. Runs once per step(), before its host read.
  std::function<void(const RawTensor& found_inf)> reduce_found_inf;
  // The norm of every rank's gradient from this rank's `local` norm of its own pieces (the norm
  // of norm_type over them; 0 when it owns none): sum of local^p over ranks then the p-th root
  // (max for the inf norm), NaN when any rank's is NaN.
  std::function<double(double local, double norm_type)> reduce_norm;
};

class StepCore {
 public:
  // `options`: MixedPrecisionOptions (scaler, check_non_finite, update_scaler; its
  // reduce_found_inf is used unless hooks.reduce_found_inf is set). any_f16: some parameter is
  // f16 (the defaults: PyTorch's dynamic scaler and check_non_finite on). Every tensor lives on
  // `device`.
  StepCore(const MixedPrecisionOptions& options, bool any_f16, Device device,
           StepCoreHooks hooks = {});

  // loss (any floating dtype) cast to f32 and multiplied by the current scale (recorded).
  Tensor Scale(const Tensor& loss) const;
  // 1 / scale as a 0-d f32 tensor on the device (a fill from the host scaler).
  RawTensor InvScale() const;
  // Divides every tensor (f32/f64, owned by the caller) by the scale in place, in one fused pass
  // that also records inf/NaN in found_inf (which accumulates until Step or ClearFoundInf).
  void Unscale(const std::vector<RawTensor>& grads);

  // clip_grad_norm over `grads` (this rank's pieces; may be empty) with the norm taken over every
  // rank: returns the total norm; when it is finite and max_norm / (total + 1e-6) < 1 every
  // gradient is multiplied by that coefficient (tg::ClipCoefficient, the one clip rule), else
  // nothing changes. Throws tg::Error for max_norm < 0 or norm_type <= 0 (clip_grad_norm's
  // messages). A collective with the reduce_norm hook.
  double ClipGradNorm(const std::vector<RawTensor>& grads, double max_norm, double norm_type);

  // The step: found_inf (reduced by the hook) decides, with a scale whose unscale cannot be
  // finite (amp::UnscalesFinitely), whether it is skipped. Skipped: on_skip() runs (the owner
  // clears its gradients) and skipped_steps() counts it. Otherwise each piece's gradient is set
  // as its master's .grad (and its model copy registered), `optimizer` steps, the .grads are
  // released again and on_update() runs (the owner publishes the new masters: bumps the model's
  // versions, all-gathers the shards). Then the scaler is updated once (unless update_scaler is
  // false) on the host, and found_inf is cleared.
  StepResult Step(const std::vector<MasterPiece>& pieces, optim::Optimizer& optimizer,
                  const std::function<void()>& on_skip, const std::function<void()>& on_update);

  // Clears found_inf (zero_grad).
  void ClearFoundInf() { found_inf_.zero_(); }
  const RawTensor& found_inf() const { return found_inf_; }

  // The host scaler, the one truth of the scale and its counters. Changes made through the
  // returned reference (load_state_dict, a caller's own update) are what the next step uses.
  LossScaler& scaler() { return *scaler_; }
  const LossScaler& scaler() const { return *scaler_; }
  const std::shared_ptr<LossScaler>& shared_scaler() const { return scaler_; }
  bool check_non_finite() const { return check_non_finite_; }
  bool update_scaler() const { return update_scaler_; }
  Device device() const { return device_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  // The values this core has read back to the host (found_inf in Step, the norm in
  // ClipGradNorm): each a device synchronisation on a GPU. For tests and logs.
  int64_t host_reads() const { return host_reads_; }

 private:
  void UpdateScaler(bool found_inf, double scale_used);

  std::shared_ptr<LossScaler> scaler_;
  bool check_non_finite_;
  bool update_scaler_;
  Device device_;
  StepCoreHooks hooks_;
  RawTensor found_inf_;  // 0-d f32 on device_
  int64_t skipped_steps_ = 0;
  int64_t host_reads_ = 0;
};

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AMP_STEP_CORE_H_
