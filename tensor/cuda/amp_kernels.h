// Fused multi-tensor kernels of mixed-precision training on CUDA: the non-finite check + unscale
// of a gradient list, the dynamic loss-scale update, AdamW over f32 master weights, and the global
// gradient norm with clipping. Each takes a whole list of tensors and does its work in one launch
// (or a few, for very long lists) over 64K-element chunks; none of them synchronises the host.
// The decisions that depend on values (found_inf, the scale, the clip coefficient, the step count)
// are read on the device, so a training step never waits for the GPU:
//
//   // Once: the scaler's state on the device; scale / inv_scale as 0-d f32 device tensors.
//   Tensor state = tg::cuda::UploadScalerState(scaler.state(), dev);
//   tg::cuda::WriteScaleOnDevice(state, scale, inv_scale);
//   // Every step (loss scaled by `scale` on the device, backward, bf16/f16 grads in `grads`):
//   found_inf.zero_();
//   tg::cuda::NonFiniteCheck(grads, found_inf);
//   tg::cuda::FusedAdamW(lists, {lr, ..., inv_scale, found_inf, device_step});  // skipped on inf
//   tg::cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale);
//   // Now and then (logging, checkpoints): one host read.
//   scaler.load_state(tg::cuda::DownloadScalerState(state));
//
// Contracts shared by all kernels:
// - Every tensor is contiguous, defined and on one CUDA device (the list's first tensor's); the
//   0-d helpers (found_inf, inv_scale, scale, norms) are f32 (device_step f64) on that device.
//   Violations throw tg::Error naming the op and the tensor. Kernels enqueue on that device's
//   current stream (tensor/cuda/runtime.h). A tensor listed twice in an in-place op would be
//   updated twice: same-address duplicates throw.
// - f16/bf16 load and store in their own format (round to nearest even) and compute in f32; f32
//   computes in f32, f64 in f64. Each arithmetic step is one correctly rounded IEEE operation
//   (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn; nvcc would otherwise contract a*b+c into an
//   FMA), in the order of the CPU reference, so the results equal the CPU kernels bit for bit:
//   tensor/ops.h NonFiniteCheckAndUnscale / MulScalarInPlace, optim/adam.h (AdamW, fused path)
//   and tensor/loss_scale_update.h. The grad norm is the exception (see GlobalGradNorm).
#ifndef TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_
#define TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_

#include <cstdint>
#include <vector>

#include "tensor/kernel_table.h"
#include "tensor/loss_scale_update.h"
#include "tensor/tensor.h"

namespace tg::cuda {

// ---- Non-finite check and unscale ------------------------------------------------------------

// PyTorch's _amp_foreach_non_finite_check_and_unscale_: every tensor (f32, f64, f16, bf16) is
// multiplied in place by *inv_scale (read on the device; C = f32, or f64 for f64 tensors, as
// the CPU op), and found_inf is set to 1 if any element was inf/NaN before scaling. found_inf
// is never reset to 0 here, so it accumulates across calls (zero it once per step).
// An entry of the op list (tensor/kernel_list.inc): always KernelStatus::kDone.
KernelStatus NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                                      const Tensor& inv_scale);
// The check alone (read-only): for low-precision gradients that FusedAdamW unscales itself, so
// they are not rounded to f16/bf16 a second time by an in-place unscale.
void NonFiniteCheck(const std::vector<Tensor>& tensors, const Tensor& found_inf);

// ---- Dynamic loss scale on the device --------------------------------------------------------

// The scaler's state (tensor/loss_scale_update.h: LossScaleState, amp::LossScaler::state())
// lives in device memory as a u8 tensor of its bytes; the kernel moves it with the function the
// host's LossScaler::update runs, so every preset stays bit-identical to the host: PyTorch (f32
// scale, each product computed in double and rounded to f32, a growth to inf not applied),
// Megatron (f32 factors, hysteresis tracker 1, 0, -1, ..., min_scale), DeepSpeed (double scale,
// division by the factor, first growth one update late, hysteresis floor 1, raise at min_scale
// recorded in min_scale_error, which LossScaler::load_state turns into the host's error).

// A u8 device tensor of sizeof(LossScaleState) bytes on `device` holding `state`.
Tensor UploadScalerState(const LossScaleState& state, Device device);
// The state held by UploadScalerState's tensor. Synchronises the host with the current stream
// (checkpoints and logs only; the training loop never needs it).
LossScaleState DownloadScalerState(const Tensor& state);
// One UpdateLossScale(state, found_inf = *found_inf != 0) in a single device thread. found_inf
// undefined: a clean step. scale_out / inv_scale_out (0-d f32, or undefined) then receive the
// new scale and 1 / scale rounded to f32, exactly what the host facade hands to the loss
// multiply and to NonFiniteCheckAndUnscale.
void UpdateScaleOnDevice(const Tensor& state, const Tensor& found_inf, const Tensor& scale_out,
                         const Tensor& inv_scale_out);
// Writes scale_out / inv_scale_out from the state without updating it (the first step).
void WriteScaleOnDevice(const Tensor& state, const Tensor& scale_out, const Tensor& inv_scale_out);

// ---- AdamW over f32 master weights -----------------------------------------------------------

// Parameter i of one param group: its gradient grads[i] (f32, f16 or bf16: the model's .grad,
// still scaled when inv_scale is given), its f32 master masters[i] and f32 state exp_avgs[i],
// exp_avg_sqs[i] (and max_exp_avg_sqs[i] with amsgrad), all of one shape; model_params[i] is
// the f16/bf16/f32 model parameter that receives the updated master rounded to its dtype, or
// undefined when the master is the parameter itself. model_params and max_exp_avg_sqs may be
// empty (no model copies; no amsgrad).
struct AdamWTensorLists {
  std::vector<Tensor> grads;
  std::vector<Tensor> masters;
  std::vector<Tensor> exp_avgs;
  std::vector<Tensor> exp_avg_sqs;
  std::vector<Tensor> max_exp_avg_sqs;
  std::vector<Tensor> model_params;
};

struct FusedAdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  // This update's step number t (>= 1; the CPU state's "step" after its increment). Ignored when
  // device_step is defined.
  int64_t step = 0;
  // 0-d f64 on the device: the number of updates done so far. t = device_step + 1, and
  // device_step is incremented after the update unless it was skipped (PyTorch's capturable
  // fused Adam), so skipped steps need no host decision. The bias corrections are then computed
  // on the device in double. CUDA's double pow is not correctly rounded (2 ulp documented;
  // glibc's is within 1), so step_size and sqrt(1 - beta2^t) equal the host's f32 scalars
  // unless a double lands within those few ulps of an f32 rounding boundary (about one case in
  // 2^27), and then differ by 1 f32 ulp.
  Tensor device_step;
  // 0-d f32 or undefined: each gradient element is multiplied by it first, in f32 (what
  // MixedPrecisionOptimizer's unscale does to the master gradient).
  Tensor inv_scale;
  // 0-d f32 or undefined: when *found_inf != 0 nothing is written (the step is skipped).
  Tensor found_inf;
};

// For each parameter, in one pass over its elements, optim::AdamW's fused loop (optim/adam.cc,
// decoupled weight decay, maximize = false) in its exact order of f32 operations:
//   g = grad * inv_scale; p = master * (1 - lr * wd); m = m * beta1 + g * (1 - beta1);
//   v = v * beta2 + (g * (1 - beta2)) * g; [vmax = maximum(vmax, v); v = vmax]
//   master = p - (m * step_size) / (sqrt(v) / sqrt(1 - beta2^t) + eps); model = round(master)
// with the host scalars computed in double and rounded once to f32, as the CPU does. A weight
// decay of 0 multiplies by exactly 1, as the CPU's skipped decay term.
void FusedAdamW(const AdamWTensorLists& lists, const FusedAdamWOptions& options);

// ---- Gradient norm and clipping --------------------------------------------------------------

// The joint norm of all elements of `tensors` (f32, f64, f16, bf16) as a new 0-d f32 device
// tensor: norm_type 2 (squares summed in f64 per thread, block and final reduction, then the
// square root, rounded to f32) or infinity (max |x|, exact). NaN anywhere gives NaN; a norm
// above FLT_MAX is inf (the CPU's double norm stays finite there). No host sync.
// optim::clip_grad_norm accumulates every element in double in list order, so the 2-norm
// agrees to about one f32 ulp (another summation order), not bit for bit. Other norm types and
// an empty list (no device to put the result on) throw.
Tensor GlobalGradNorm(const std::vector<Tensor>& tensors, double norm_type = 2.0);
// optim::clip_grad_norm's scaling with the norm read on the device: clip_coef = max_norm /
// (norm + 1e-6) in double; when the norm is finite and clip_coef < 1 every tensor is multiplied
// in place by clip_coef rounded to f32 (f64 for f64 tensors), else nothing changes.
void ClipByNorm(const std::vector<Tensor>& tensors, const Tensor& total_norm, double max_norm);
// GlobalGradNorm then ClipByNorm; returns the norm (0-d f32 device tensor, before clipping).
Tensor ClipGradNorm(const std::vector<Tensor>& tensors, double max_norm, double norm_type = 2.0);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_
