// The bridge between amp::LossScaler (host) and the loss-scale state that the CUDA kernels keep
// on the device (tensor/cuda/amp_kernels.h: DeviceScalerState, UpdateScaleOnDevice). It lives in
// amp, not in tensor/cuda, because the kernels sit below amp and must not depend on it.
//
//   tg::amp::LossScaler scaler = tg::amp::LossScaler::PyTorch();
//   Tensor state = tg::cuda::UploadScalerState(tg::amp::ToDeviceScalerState(scaler), device);
//   ... every step: tg::cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale) ...
//   // Checkpoints and logs: one host read; throws DeepSpeed's min-scale error if it happened.
//   tg::amp::LoadDeviceScalerState(tg::cuda::DownloadScalerState(state), &scaler);
//
// Field map (DeviceScalerState <- LossScaler):
//   growth_factor, backoff_factor, growth_interval, hysteresis, dynamic, f32_scale,
//   skip_nonfinite_growth, backoff_by_division, first_growth_waits_one_more,
//   hysteresis_stops_at_one, consecutive_hysteresis, raise_at_min_scale <- options().<same name>
//   min_scale <- options().min_scale rounded to f32 with f32_scale (the scaler's internal value)
//   max_scale <- options().max_scale rounded down to an f32 with f32_scale (likewise)
//   scale, growth_tracker, hysteresis_tracker, clean_streak, iteration <- the accessors of the
//       same names (state_dict() keys of the same names; "dynamic" is the option)
//   min_scale_error <- 0 (device only: see amp_kernels.h)
#ifndef TAPEGRAD_AMP_CUDA_DEVICE_SCALER_H_
#define TAPEGRAD_AMP_CUDA_DEVICE_SCALER_H_

#include "amp/loss_scaler.h"
#include "tensor/cuda/amp_kernels.h"

namespace tg::amp {

// The scaler's options and state as UpdateScaleOnDevice consumes them (field map above).
cuda::DeviceScalerState ToDeviceScalerState(const LossScaler& scaler);

// Makes `scaler` continue from `state` (a DownloadScalerState of a state that started as
// ToDeviceScalerState of a scaler with the same options). Throws tg::Error, changing nothing,
// when the options in `state` are not the scaler's. When the device recorded the min-scale error
// (raise_at_min_scale), the state as of that update is loaded and then the host's error is
// thrown: "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
// (the host's update() would have thrown at the same update, changing nothing).
void LoadDeviceScalerState(const cuda::DeviceScalerState& state, LossScaler* scaler);

}  // namespace tg::amp

#endif  // TAPEGRAD_AMP_CUDA_DEVICE_SCALER_H_
