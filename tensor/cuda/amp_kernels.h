// Fused multi-tensor kernels of mixed-precision training on CUDA: the non-finite check + unscale
// of a gradient list and the dynamic loss-scale update. Each takes a whole list of tensors and
// does its work in one launch (or a few, for very long lists) over 64K-element chunks
// (multi_tensor.cuh); none of them synchronises the host. The decisions that depend on values
// (found_inf, the scale) are read on the device, so a training step never waits for the GPU.
// The optimizer's kernels (Adam with f32 masters, the global grad norm, clipping) are entries of
// the kernel list, in tensor/cuda/optimizer_kernels.cu, reached through tensor/ops.h:
//
//   // Once: the scaler's state on the device; scale / inv_scale as 0-d f32 device tensors.
//   RawTensor state = tg::cuda::UploadScalerState(scaler.state(), dev);
//   tg::cuda::WriteScaleOnDevice(state, scale, inv_scale);
//   // Every step (loss scaled by `scale` on the device, backward, bf16/f16 grads in `grads`):
//   found_inf.zero_();
//   tg::cuda::NonFiniteCheck(grads, found_inf);
//   tg::FusedAdam(lists, {lr, ..., inv_scale, found_inf, device_step});  // skipped on inf
//   tg::cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale);
//   // Now and then (logging, checkpoints): one host read.
//   scaler.load_state(tg::cuda::DownloadScalerState(state));
//
// Contracts shared by all kernels:
// - Every tensor is contiguous, defined and on one CUDA device (the list's first tensor's); the
//   0-d helpers (found_inf, inv_scale, scale) are f32 on that device. Violations throw tg::Error
//   naming the op and the tensor. Kernels enqueue on that device's current stream
//   (tensor/cuda/runtime.h). A tensor listed twice in an in-place op would be updated twice:
//   same-address duplicates throw.
// - f16/bf16 load and store in their own format (round to nearest even) and compute in f32; f32
//   computes in f32, f64 in f64. Each arithmetic step is one correctly rounded IEEE operation
//   (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn; nvcc would otherwise contract a*b+c into an
//   FMA), in the order of the CPU reference, so the results equal the CPU kernels bit for bit:
//   tensor/ops.h NonFiniteCheckAndUnscale / MulScalarInPlace and tensor/loss_scale_update.h.
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
// An entry of the kernel list (tensor/kernel_list.inc): always KernelStatus::kDone.
KernelStatus NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors,
                                      const RawTensor& found_inf, const RawTensor& inv_scale);
// The check alone (read-only): for low-precision gradients that FusedAdam unscales itself, so
// they are not rounded to f16/bf16 a second time by an in-place unscale.
void NonFiniteCheck(const std::vector<RawTensor>& tensors, const RawTensor& found_inf);

// ---- Dynamic loss scale on the device --------------------------------------------------------

// The scaler's state (tensor/loss_scale_update.h: LossScaleState, amp::LossScaler::state())
// lives in device memory as a u8 tensor of its bytes; the kernel moves it with the function the
// host's LossScaler::update runs, so every preset stays bit-identical to the host: PyTorch (f32
// scale, each product computed in double and rounded to f32, a growth to inf not applied),
// Megatron (f32 factors, hysteresis tracker 1, 0, -1, ..., min_scale), DeepSpeed (double scale,
// division by the factor, first growth one update late, hysteresis floor 1, raise at min_scale
// recorded in min_scale_error, which LossScaler::load_state turns into the host's error).

// A u8 device tensor of sizeof(LossScaleState) bytes on `device` holding `state`.
RawTensor UploadScalerState(const LossScaleState& state, Device device);
// The state held by UploadScalerState's tensor. Synchronises the host with the current stream
// (checkpoints and logs only; the training loop never needs it).
LossScaleState DownloadScalerState(const RawTensor& state);
// One UpdateLossScale(state, found_inf = *found_inf != 0) in a single device thread. found_inf
// undefined: a clean step. scale_out / inv_scale_out (0-d f32, or undefined) then receive the
// new scale and 1 / scale rounded to f32, exactly what the host facade hands to the loss
// multiply and to NonFiniteCheckAndUnscale.
void UpdateScaleOnDevice(const RawTensor& state, const RawTensor& found_inf,
                         const RawTensor& scale_out, const RawTensor& inv_scale_out);
// Writes scale_out / inv_scale_out from the state without updating it (the first step).
void WriteScaleOnDevice(const RawTensor& state, const RawTensor& scale_out,
                        const RawTensor& inv_scale_out);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_
