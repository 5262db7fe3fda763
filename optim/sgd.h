// SGD with momentum, dampening, Nesterov momentum and L2 weight decay, with PyTorch's
// torch.optim.SGD update (for each parameter p with gradient g, in this order):
//
//   g = g + weight_decay * p                       (if weight_decay != 0)
//   buf = g                                        (first step with momentum: no dampening)
//   buf = momentum * buf + (1 - dampening) * g     (later steps, if momentum != 0)
//   g = nesterov ? g + momentum * buf : buf        (if momentum != 0)
//   p = p - lr * g
//
//   tg::optim::SGD opt(model_params, tg::optim::SGDOptions(0.1).momentum(0.9));
//   opt.step();
//
// Arithmetic: f32 for f16/bf16/f32 params (f64 for f64); each scalar (lr, momentum,
// 1 - dampening, weight_decay; computed in double) is rounded to the compute type and each
// operation above rounds to it, in exactly this order, on both paths. The momentum buffer
// ("momentum_buffer") has the compute dtype (see optimizer.h).
// Paths: `fused` runs tg::FusedSgd (tensor/ops.h: the device's one-pass kernel; CUDA has none and
// declines, so its parameters take the composed ops on the device); fused = false runs its
// composed form (tensor/composed.h). Both are bit-identical.
#ifndef TAPEGRAD_OPTIM_SGD_H_
#define TAPEGRAD_OPTIM_SGD_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/arg.h"

namespace tg::optim {

// libtorch's chain: SGDOptions(0.01).momentum(0.9).nesterov(true); each option read as
// options.momentum().
struct SGDOptions : OptimizerOptions {
  TG_ARG(double, lr) = 1e-3;
  TG_ARG(double, momentum) = 0;
  TG_ARG(double, dampening) = 0;
  TG_ARG(double, weight_decay) = 0;
  TG_ARG(bool, nesterov) = false;  // needs momentum > 0 and dampening == 0 (PyTorch)
  // The multi-tensor path; false: composed tensor ops per parameter. The optimizer's, read from
  // the options it is constructed with; a group's copy ignores it (not a group option).
  TG_ARG(bool, fused) = true;

 public:
  SGDOptions() = default;
  // libtorch's SGDOptions(lr): `tg::optim::SGD opt(model->parameters(), 0.01)`.
  SGDOptions(double lr) : lr_(lr) {}  // NOLINT: implicit, as libtorch's
  SGDOptions(const SGDOptions&) = default;
  SGDOptions& operator=(const SGDOptions&) = default;
  std::unique_ptr<OptimizerOptions> clone() const override;
  const char* type_name() const override { return "SGDOptions"; }
  double get_lr() const override { return lr_; }
  void set_lr(double new_lr) override { lr_ = new_lr; }
  // dampening, lr, momentum, nesterov, weight_decay.
  std::vector<NamedOption> named() const override;

 protected:
  bool SetNamed(const std::string& name, double value, const std::string& context) override;
};

class SGD : public Optimizer {
 public:
  // One group holding `params` (throws on an empty list).
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  // Groups override any of the options; `defaults` fills in the rest.
  explicit SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults = {});

 protected:
  void CheckOptions(const OptimizerOptions& options, const std::string& context) const override;
  StateSpec ParamStateSpec(const OptimizerOptions& options) const override;
  bool AcceptsOptions(const OptimizerOptions& options) const override;
  void StepGroup(const ParamGroup& group, const std::vector<ParamUpdate>& updates) override;
};

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_SGD_H_
