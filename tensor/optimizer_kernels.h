// The arguments of the optimizer entries of the kernel list (tensor/kernel_list.inc: FusedAdam,
// FusedSgd): the tensor lists of one param group on one device and the update's options. The ops
// of tensor/ops.h (tg::FusedAdam, tg::FusedSgd) validate them and reach the device's kernel;
// optim/ fills them from its state:
//
//   tg::AdamTensorLists lists;            // one entry per parameter of one device
//   lists.params = {w};  lists.grads = {w_grad};
//   lists.exp_avgs = {m};  lists.exp_avg_sqs = {v};
//   tg::FusedAdamOptions o;
//   o.lr = 1e-3;  o.weight_decay = 0.1;  o.decay = tg::WeightDecay::kDecoupled;  o.step = 1;
//   tg::FusedAdam(lists, o);              // w, m, v updated in place
#ifndef TAPEGRAD_TENSOR_OPTIMIZER_KERNELS_H_
#define TAPEGRAD_TENSOR_OPTIMIZER_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/host_device.h"
#include "tensor/tensor.h"

namespace tg {

// How weight_decay enters an update: not at all, added to the gradient (L2: Adam, SGD), or
// multiplied into the parameter before the update (decoupled: AdamW).
enum class WeightDecay { kNone, kL2, kDecoupled };

// Parameter i of an Adam update: params[i] (f32, f64, f16 or bf16; updated in place), its
// gradient grads[i] (any floating dtype, read as converted to the compute dtype: f64 for f64
// params, f32 otherwise), and its state exp_avgs[i], exp_avg_sqs[i] (and max_exp_avg_sqs[i] with
// amsgrad) of the compute dtype, all of one shape. model_params is empty or holds, per
// parameter, undefined or a tensor of the parameter's shape (f32, f16 or bf16) that receives the
// updated parameter rounded to its dtype (the model copy of an f32 master weight).
struct AdamTensorLists {
  std::vector<RawTensor> params;
  std::vector<RawTensor> grads;
  std::vector<RawTensor> exp_avgs;
  std::vector<RawTensor> exp_avg_sqs;
  std::vector<RawTensor> max_exp_avg_sqs;  // empty unless amsgrad
  std::vector<RawTensor> model_params;     // empty: no model copies
};

// The scalars of Adam's update t (t >= 1) that every device derives from the options: doubles (as
// PyTorch's Python floats), rounded to the compute dtype where they meet a tensor.
struct AdamStepScalars {
  double decay;                  // 1 - lr * weight_decay: the decoupled decay factor
  double step_size;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};

struct FusedAdamOptions {
  double DecayFactor() const { return 1 - lr * weight_decay; }
  AdamStepScalars ScalarsAt(double t) const {
    return {DecayFactor(), lr / (1 - std::pow(beta1, t)), std::sqrt(1 - std::pow(beta2, t))};
  }

  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  WeightDecay decay = WeightDecay::kNone;  // kNone when weight_decay is 0
  bool amsgrad = false;
  // This update's step number t (>= 1). Ignored when device_step is defined.
  int64_t step = 0;
  // 0-d f64 on the params' device, or undefined: the number of updates done so far; t =
  // device_step + 1, and device_step is incremented after the update unless it was skipped
  // (PyTorch's capturable Adam), so skipped steps need no host decision.
  RawTensor device_step;
  // 0-d f32 on the params' device, or undefined: every gradient element is multiplied by it
  // first, in the compute dtype (the unscale of a loss-scaled gradient).
  RawTensor inv_scale;
  // 0-d f32 on the params' device, or undefined: when it is != 0 nothing is written.
  RawTensor found_inf;
};

// clip_grad_norm's rule (torch.nn.utils.clip_grad_norm_), written once for every place that
// clips: optim::clip_grad_norm, amp::StepCore (MixedPrecisionOptimizer, ZeroOptimizer), the CPU
// and CUDA ClipByNorm kernels and its composed form. Returns whether gradients whose joint norm
// is `total` are scaled for `max_norm`, and then sets *coef: clip_coef = max_norm / (total +
// 1e-6) in double (each operation correctly rounded: the device intrinsics, plain double
// arithmetic on the host), applied when total is finite and clip_coef < 1. A non-finite total
// (inf or NaN) scales nothing: PyTorch would multiply by 0 or NaN; the caller sees the norm and
// skips the step instead.
TG_HOST_DEVICE inline bool ClipCoefficient(double total, double max_norm, double* coef) {
#ifdef __CUDA_ARCH__
  if (!isfinite(total)) return false;
  const double c = __ddiv_rn(max_norm, __dadd_rn(total, 1e-6));
#else
  if (!std::isfinite(total)) return false;
  const double c = max_norm / (total + 1e-6);
#endif
  if (!(c < 1)) return false;
  *coef = c;
  return true;
}

// Parameter i of an SGD update: params[i] (f32, f64, f16 or bf16; updated in place), grads[i]
// (any floating dtype, read as converted to the compute dtype) and, with momentum != 0,
// momentum_buffers[i] of the compute dtype (empty list without momentum), all of one shape.
struct SgdTensorLists {
  std::vector<RawTensor> params;
  std::vector<RawTensor> grads;
  std::vector<RawTensor> momentum_buffers;
};

struct FusedSgdOptions {
  double lr = 1e-3;
  double weight_decay = 0;  // L2: added to the gradient
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  // The buffers hold no value yet (a parameter's first step with momentum): each is set to its
  // gradient (after weight decay) instead of buf * momentum + g * (1 - dampening).
  bool init_momentum_buffers = false;
  // 0-d f32 on the params' device, or undefined: whether the buffers hold a value, decided where
  // it lives (no host wait): 0 acts as init_momentum_buffers, and the update sets it to 1 unless
  // it was skipped. With it, a first step that is skipped on the device leaves the buffers
  // without a value, and the next one still initialises them.
  // Only with momentum != 0 and init_momentum_buffers false.
  RawTensor momentum_buffers_valid;
  // 0-d f32 on the params' device, or undefined: when it is != 0 nothing is written (neither the
  // parameters, nor the buffers, nor momentum_buffers_valid).
  RawTensor found_inf;
};

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_OPTIMIZER_KERNELS_H_
