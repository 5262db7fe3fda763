// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), with bias
// correction and AMSGrad, in the order of PyTorch's _single_tensor_adam. For each parameter p
// with gradient g, state m ("exp_avg"), v ("exp_avg_sq"), vmax ("max_exp_avg_sq", amsgrad
// only) and the per-parameter step count t ("step"):
//
//   t = t + 1
//   g = g + weight_decay * p                       (Adam, if weight_decay != 0)
//   p = p * (1 - lr * weight_decay)                (AdamW, if weight_decay != 0)
//   m = m * beta1 + g * (1 - beta1)
//   v = v * beta2 + (g * (1 - beta2)) * g
//   vmax = maximum(vmax, v); use vmax for v below  (amsgrad; NaN propagates)
//   step_size = lr / (1 - beta1^t)                           (host, double)
//   bias_correction2_sqrt = sqrt(1 - beta2^t)                (host, double)
//   denom = sqrt(v) / bias_correction2_sqrt + eps
//   p = p - (m * step_size) / denom
//
//   tg::optim::AdamWOptions o;
//   o.lr = 6e-4;
//   o.weight_decay = 0.1;
//   tg::optim::AdamWOptions no_decay = o;
//   no_decay.weight_decay = 0;
//   tg::optim::AdamW opt({tg::optim::ParamGroup(decay_params),
//                         tg::optim::ParamGroup(no_decay_params, no_decay)}, o);
//   opt.step();
//
// Decisions:
// - The moments use m*beta1 + g*(1-beta1), the form of PyTorch's fused CUDA Adam (and of the
//   Adam paper), not _single_tensor_adam's m.lerp_(g, 1-beta1): one rounding fewer, and no
//   branch on the weight. PyTorch's own CPU kernels use FMA in places, so no formula would
//   match PyTorch's last bit on every path anyway.
// - Host scalars (1 - beta^t, step_size, sqrt of bias correction, 1 - lr*wd, 1 - beta) are
//   computed in double like Python floats and rounded once to the compute type (f32 for
//   f16/bf16/f32 params, f64 for f64) where they meet a tensor; every tensor operation rounds
//   to the compute type in the order above. The per-tensor and fused paths are bit-identical:
//   both are tensor/ops.h's FusedAdam, the per-tensor path its composed form (tensor/composed.h).
// - Weight decay 0 skips the decay terms (PyTorch skips Adam's; AdamW's factor is exactly 1).
// - Turning amsgrad on after a parameter has stepped starts its max_exp_avg_sq at zero.
// - With `fused`, each group's parameters of one device and step count go to tg::FusedAdam in one
//   call (the kernel list's FusedAdam kernel of that device: one pass per parameter; model copies set
//   with set_model_copy, such as the f16/bf16 models of amp::MixedPrecisionOptimizer's f32
//   masters, are written in the same call). Cases a device's kernel declines (on CUDA: Adam's L2
//   decay, f64 or f16/bf16 parameters without masters, strided tensors) take the composed tensor
//   ops on that device, as fused = false does.
#ifndef TAPEGRAD_OPTIM_ADAM_H_
#define TAPEGRAD_OPTIM_ADAM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/optimizer_kernels.h"

namespace tg::optim {

struct AdamOptions : OptimizerOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  // The multi-tensor path; false: composed tensor ops per parameter. The optimizer's, read from
  // the options it is constructed with; a group's copy ignores it (not a group option).
  bool fused = true;

  AdamOptions() = default;
  // libtorch's AdamOptions(lr).
  AdamOptions(double learning_rate) : lr(learning_rate) {}  // NOLINT: implicit, as libtorch's
  AdamOptions(const AdamOptions&) = default;
  AdamOptions& operator=(const AdamOptions&) = default;
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "AdamOptions"; }
  double get_lr() const override { return lr; }
  void set_lr(double new_lr) override { lr = new_lr; }
  // amsgrad, beta1, beta2, eps, lr, weight_decay.
  std::vector<NamedOption> named() const override;

 protected:
  bool SetNamed(const std::string& name, double value, const std::string& context) override;
};

// AdamW's defaults differ only in weight_decay (PyTorch: 1e-2). Adam and AdamW take either type.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { weight_decay = 1e-2; }
  AdamWOptions(double learning_rate) : AdamWOptions() { lr = learning_rate; }  // NOLINT
  explicit AdamWOptions(const AdamOptions& o) : AdamOptions(o) {}  // every field of o
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "AdamWOptions"; }
};

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  explicit Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});

  bool decoupled_weight_decay() const { return decoupled_; }

 protected:
  Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups,
       const AdamOptions& defaults);

  void CheckOptions(const OptimizerOptions& options, const std::string& context) const override;
  StateSpec ParamStateSpec(const OptimizerOptions& options) const override;
  bool AcceptsOptions(const OptimizerOptions& options) const override;
  void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) override;
  bool DeviceStateToHost(std::map<std::string, RawTensor>* device_state,
                         StateDict* state) const override;

 private:
  // step(found_inf): the step counts on the device (FusedAdamOptions::device_step).
  void StepGroupOnDevice(const std::vector<ParamUpdate>& updates, FusedAdamOptions f);

  bool decoupled_;
};

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults = {});
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_ADAM_H_
