// Fused multi-tensor kernels of mixed-precision training on CUDA: the non-finite check + unscale
// of a gradient list and the dynamic loss-scale update. Each takes a whole list of tensors and
// does its work in one launch (or a few, for very long lists) over 64K-element chunks
// (multi_tensor.cuh); none of them synchronises the host. The decisions that depend on values
// (found_inf, the scale) are read on the device, so a training step never waits for the GPU.
// The optimizer's kernels (Adam with f32 masters, the global grad norm, clipping) are entries of
// the op list, in tensor/cuda/optimizer_kernels.cu, reached through tensor/ops.h:
//
//   // Once: the scaler's state on the device; scale / inv_scale as 0-d f32 device tensors.
//   Tensor state = tg::cuda::UploadScalerState(tg::amp::ToDeviceScalerState(scaler), dev);
//   tg::cuda::WriteScaleOnDevice(state, scale, inv_scale);
//   // Every step (loss scaled by `scale` on the device, backward, bf16/f16 grads in `grads`):
//   found_inf.zero_();
//   tg::cuda::NonFiniteCheck(grads, found_inf);
//   tg::FusedAdam(lists, {lr, ..., inv_scale, found_inf, device_step});  // skipped on inf
//   tg::cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale);
//   // Now and then (logging, checkpoints): one host read.
//   tg::amp::LoadDeviceScalerState(tg::cuda::DownloadScalerState(state), &scaler);
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
//   tensor/ops.h NonFiniteCheckAndUnscale / MulScalarInPlace and amp/loss_scaler.h.
#ifndef TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_
#define TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/kernel_table.h"
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
// The check alone (read-only): for low-precision gradients that FusedAdam unscales itself, so
// they are not rounded to f16/bf16 a second time by an in-place unscale.
void NonFiniteCheck(const std::vector<Tensor>& tensors, const Tensor& found_inf);

// ---- Dynamic loss scale on the device --------------------------------------------------------

// The state of an amp::LossScaler (amp/loss_scaler.h) as one POD that lives in device memory and
// that UpdateScaleOnDevice moves exactly as LossScaler::update moves the host state. The
// conversion to and from a LossScaler is amp/cuda/device_scaler.h (amp sits above tensor).
struct DeviceScalerState {
  // LossScalerOptions, as the LossScaler holds them (constant across updates).
  double growth_factor;
  double backoff_factor;
  double min_scale;  // LossScaler's rounded min_scale_ (f32 with f32_scale)
  double max_scale;  // LossScaler's max_scale_ (rounded down to f32 with f32_scale)
  int64_t growth_interval;
  int64_t hysteresis;
  bool dynamic;
  bool f32_scale;
  bool skip_nonfinite_growth;
  bool backoff_by_division;
  bool first_growth_waits_one_more;
  bool hysteresis_stops_at_one;
  bool consecutive_hysteresis;
  bool raise_at_min_scale;
  // The LossScaler's state (its accessors / state_dict keys of the same names).
  double scale;
  int64_t growth_tracker;
  int64_t hysteresis_tracker;
  int64_t clean_streak;
  int64_t iteration;
  // Device only. The host throws "Current loss scale already at minimum ..." (raise_at_min_scale,
  // DeepSpeed) and changes nothing; a kernel cannot throw, so the update that would raise sets
  // this flag instead and leaves the state as it was, and every later update is a no-op (the run
  // is over, as it would be on the host). amp::LoadDeviceScalerState, the host's lazy check,
  // throws the host's error when it finds the flag set.
  int32_t min_scale_error;
  int32_t reserved;  // zero; keeps the size a multiple of 8
};
static_assert(std::is_trivially_copyable_v<DeviceScalerState>);

// A u8 device tensor of sizeof(DeviceScalerState) bytes on `device` holding `state`.
Tensor UploadScalerState(const DeviceScalerState& state, Device device);
// The state held by UploadScalerState's tensor. Synchronises the host with the current stream
// (checkpoints and logs only; the training loop never needs it).
DeviceScalerState DownloadScalerState(const Tensor& state);
// One LossScaler::update(found_inf = *found_inf != 0), in a single device thread, bit-identical
// to the host for every preset: PyTorch (f32 scale, each product computed in double and rounded
// to f32, a growth to inf not applied), Megatron (f32 factors, hysteresis tracker 1, 0, -1, ...,
// min_scale), DeepSpeed (double scale, division by the factor, first growth one update late,
// hysteresis floor 1, raise at min_scale recorded in min_scale_error). found_inf undefined: a
// clean step. scale_out / inv_scale_out (0-d f32, or undefined) then receive the new scale and
// 1 / scale rounded to f32, exactly what the host facade hands to the loss multiply and to
// NonFiniteCheckAndUnscale.
void UpdateScaleOnDevice(const Tensor& state, const Tensor& found_inf, const Tensor& scale_out,
                         const Tensor& inv_scale_out);
// The same update on the host: the kernel's code compiled for the CPU (double arithmetic rounds
// alike on both), so the state machine is testable against amp::LossScaler without a GPU.
void UpdateScaleOnHost(DeviceScalerState* state, bool found_inf);
// Writes scale_out / inv_scale_out from the state without updating it (the first step).
void WriteScaleOnDevice(const Tensor& state, const Tensor& scale_out, const Tensor& inv_scale_out);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_AMP_KERNELS_H_
