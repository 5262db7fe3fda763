// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), with bias
// correction and AMSGrad, in the order of PyTorch's _single_tensor_adam. For each parameter p
// with gradient g, state m ("exp_avg"), v ("exp_avg_sq"), vmax ("max_exp_avg_sq", amsgrad
// only) and the per-parameter step count t ("step"):
//
//   t = t + 1
//   g = fma(weight_decay, p, g)                    (Adam, if weight_decay != 0)
//   p = p * (1 - lr * weight_decay)                (AdamW, if weight_decay != 0)
//   m = lerp(m, g, 1 - beta1)                      (torch's lerp: fma(w, g - m, m) for w < 0.5)
//   v = fma(g * (1 - beta2), g, v * beta2)
//   vmax = maximum(vmax, v); use vmax for v below  (amsgrad; NaN propagates)
//   step_size = lr / (1 - beta1^t)                           (host, double)
//   bias_correction2_sqrt = sqrt(1 - beta2^t)                (host, double)
//   denom = sqrt(v) / bias_correction2_sqrt + eps
//   p = p - (m * step_size) / denom
//
//   auto o = tg::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1);
//   auto no_decay = tg::optim::AdamWOptions(o).weight_decay(0);
//   tg::optim::AdamW opt({tg::optim::ParamGroup(decay_params),
//                         tg::optim::ParamGroup(no_decay_params, no_decay)}, o);
//   opt.step();
//
// Decisions:
// - Every operation is the one torch 2.15's CPU _single_tensor_adam performs, with its roundings
//   (measured element by element: its grad.add(p, alpha), lerp_ and addcmul_ are fused
//   multiply-adds, written fma above; its addcdiv_ rounds value * m before the division), so
//   AdamW traces equal torch's bit for bit given the same square roots. torch's CPU f32 sqrt is
//   not correctly rounded (up to 0.75 ulp); ours is (docs/mixed_precision.md has the traces).
// - Host scalars (1 - beta^t, step_size, sqrt of bias correction, 1 - lr*wd, 1 - beta) are
//   computed in double like Python floats and rounded once to the compute type (f32 for
//   f16/bf16/f32 params, f64 for f64) where they meet a tensor; every tensor operation rounds
//   to the compute type in the order above. The per-tensor and fused paths are bit-identical:
//   both are tensor/ops.h's FusedAdam, the per-tensor path its composed form (tensor/composed.h).
// - Weight decay 0 skips the decay terms (PyTorch skips Adam's; AdamW's factor is exactly 1).
// - Turning amsgrad on after a parameter has stepped starts its max_exp_avg_sq at zero.
// - With `fused`, each group's parameters of one device and step count go to tg::FusedAdam in one
//   call (the kernel list's FusedAdam kernel of that device: one pass per parameter; model copies
//   set with set_model_copy, such as the f16/bf16 models of amp::MixedPrecisionOptimizer's f32
//   masters, are written in the same call). Cases a device's kernel declines (on CUDA: Adam's L2
//   decay, f64 or f16/bf16 parameters without masters, strided tensors) take the composed tensor
//   ops on that device, as fused = false does.
#ifndef TAPEGRAD_OPTIM_ADAM_H_
#define TAPEGRAD_OPTIM_ADAM_H_

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/arg.h"
#include "tensor/optimizer_kernels.h"

namespace tg::optim {

// libtorch's chain: AdamOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1); each option read
// as options.eps(), the betas also one at a time (beta1(), beta2()).
struct AdamOptions : OptimizerOptions {
  TG_ARG(double, lr) = 1e-3;
  TG_ARG(double, eps) = 1e-8;
  TG_ARG(double, weight_decay) = 0;
  TG_ARG(bool, amsgrad) = false;
  // The multi-tensor path; false: composed tensor ops per parameter. The optimizer's, read from
  // the options it is constructed with; a group's copy ignores it (not a group option).
  TG_ARG(bool, fused) = true;

 public:
  AdamOptions& betas(const std::tuple<double, double>& betas) {
    std::tie(beta1_, beta2_) = betas;
    return *this;
  }
  std::tuple<double, double> betas() const { return {beta1_, beta2_}; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  AdamOptions& beta1(double v) {
    beta1_ = v;
    return *this;
  }
  AdamOptions& beta2(double v) {
    beta2_ = v;
    return *this;
  }

  AdamOptions() = default;
  // libtorch's AdamOptions(lr).
  AdamOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as libtorch's
  AdamOptions(const AdamOptions&) = default;
  AdamOptions& operator=(const AdamOptions&) = default;
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "AdamOptions"; }
  double get_lr() const override { return lr_; }
  void set_lr(double new_lr) override { lr_ = new_lr; }
  // amsgrad, beta1, beta2, eps, lr, weight_decay.
  std::vector<NamedOption> named() const override;

 protected:
  bool SetNamed(const std::string& name, double value, const std::string& context) override;

 private:
  double beta1_ = 0.9;
  double beta2_ = 0.999;
};

// AdamW's defaults differ only in weight_decay (PyTorch: 1e-2). Adam and AdamW take either type.
struct AdamWOptions : AdamOptions {
  AdamWOptions() { AdamOptions::weight_decay(1e-2); }
  AdamWOptions(double lr) : AdamWOptions() { AdamOptions::lr(lr); }  // NOLINT: as libtorch's
  // The chain returns AdamWOptions (the getters are AdamOptions').
  using AdamOptions::amsgrad;
  using AdamOptions::beta1;
  using AdamOptions::beta2;
  using AdamOptions::betas;
  using AdamOptions::eps;
  using AdamOptions::fused;
  using AdamOptions::lr;
  using AdamOptions::weight_decay;
  AdamWOptions& lr(const double& v) { return Set(&AdamOptions::lr, v); }
  AdamWOptions& eps(const double& v) { return Set(&AdamOptions::eps, v); }
  AdamWOptions& weight_decay(const double& v) { return Set(&AdamOptions::weight_decay, v); }
  AdamWOptions& amsgrad(const bool& v) { return Set(&AdamOptions::amsgrad, v); }
  AdamWOptions& fused(const bool& v) { return Set(&AdamOptions::fused, v); }
  AdamWOptions& beta1(double v) {
    AdamOptions::beta1(v);
    return *this;
  }
  AdamWOptions& beta2(double v) {
    AdamOptions::beta2(v);
    return *this;
  }
  AdamWOptions& betas(const std::tuple<double, double>& v) {
    AdamOptions::betas(v);
    return *this;
  }
  explicit AdamWOptions(const AdamOptions& o) : AdamOptions(o) {}  // every field of o
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "AdamWOptions"; }

 private:
  template <typename V>
  AdamWOptions& Set(AdamOptions& (AdamOptions::*setter)(const V&), const V& v) {
    (this->*setter)(v);
    return *this;
  }
};

class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  explicit Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});

  bool decoupled_weight_decay() const { return decoupled_; }

 protected:
  Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups,
       const AdamOptions& defaults);
  // Without Init (AdamW's protected constructor).
  Adam(const char* name, bool decoupled, std::unique_ptr<OptimizerOptions> defaults, bool fused);

  void CheckOptions(const OptimizerOptions& options, const std::string& context) const override;
  StateSpec ParamStateSpec(const OptimizerOptions& options) const override;
  bool AcceptsOptions(const OptimizerOptions& options) const override;
  void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) override;

 private:
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults = {});

 protected:
  // For an optimizer that steps some of its groups as AdamW (MuonWithAdamW): `defaults` of its
  // own type, `fused` for the AdamW groups; the derived constructor calls Init.
  AdamW(const char* name, std::unique_ptr<OptimizerOptions> defaults, bool fused);
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_ADAM_H_
