// The multi-tensor kernels of tensor/cuda/amp_kernels.h (multi-tensor apply: multi_tensor.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "tensor/cuda/amp_kernels.h"
#include "tensor/cuda/multi_tensor.cuh"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tg::cuda {
namespace {

// ---- Non-finite check and unscale ------------------------------------------------------------

template <typename T, bool kScale>
__global__ void __launch_bounds__(kThreads)
    NonFiniteCheckKernel(const __grid_constant__ ChunkTable<1> table, float* found_inf,
                         const float* inv_scale) {
  using C = Compute<T>;
  const ChunkRef c = Locate(table);
  T* p = static_cast<T*>(table.ptr[0][c.tensor]) + c.begin;
  const C s = kScale ? static_cast<C>(*inv_scale) : C(1);
  bool bad = false;
#pragma unroll 4
  for (int i = threadIdx.x; i < c.n; i += kThreads) {
    const C v = Load(p + i);
    bad |= !isfinite(v);  // checked before scaling: v * inv_scale may overflow or flush
    if constexpr (kScale) Store(p + i, Mul(v, s));
  }
  // One write per block; several blocks writing the same 1 is a benign race (as in PyTorch).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

void RunNonFiniteCheck(const char* op, const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                       const RawTensor* inv_scale) {
  if (tensors.empty()) return;
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/inv_scale != nullptr);
  CheckScalar(op, "found_inf", found_inf, device);
  if (inv_scale != nullptr) CheckScalar(op, "inv_scale", *inv_scale, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  float* found = static_cast<float*>(found_inf.raw_data());
  const float* inv =
      inv_scale != nullptr ? static_cast<const float*>(inv_scale->raw_data()) : nullptr;
  ForEachDTypeGroup(tensors, [&](auto tag, const auto& ptrs, const auto& numel) {
    using T = decltype(tag);
    ForEachChunkTable<1>(op, ptrs, numel, [&](const ChunkTable<1>& table, int blocks, int) {
      if (inv != nullptr) {
        NonFiniteCheckKernel<T, true><<<blocks, kThreads, 0, stream>>>(table, found, inv);
      } else {
        NonFiniteCheckKernel<T, false><<<blocks, kThreads, 0, stream>>>(table, found, inv);
      }
      TG_CUDA_CHECK_LAUNCH("NonFiniteCheckKernel");
    });
  });
}

// ---- Loss scale ------------------------------------------------------------------------------

// The update itself is UpdateLossScale (tensor/loss_scale_update.h), the host's own function.

// One thread: the update is a handful of scalar operations; the point is that it needs no host.
__global__ void UpdateScaleKernel(LossScaleState* state, const float* found_inf, float* scale_out,
                                  float* inv_scale_out) {
  LossScaleState s = *state;
  UpdateLossScale(&s, found_inf != nullptr && *found_inf != 0.0f);
  *state = s;
  LossScaleOutputs(s, scale_out, inv_scale_out);
}

__global__ void WriteScaleKernel(const LossScaleState* state, float* scale_out,
                                 float* inv_scale_out) {
  LossScaleOutputs(*state, scale_out, inv_scale_out);
}

void CheckState(const char* op, const RawTensor& state) {
  TG_CHECK(state.defined(), op, ": the scaler state is an undefined tensor");
  TG_CHECK(state.device().is_cuda() && state.dtype() == kU8 && state.is_contiguous() &&
               state.numel() == static_cast<int64_t>(sizeof(LossScaleState)),
           op, ": expected the scaler state of UploadScalerState (contiguous u8 [",
           sizeof(LossScaleState), "] on a CUDA device), got ", DTypeName(state.dtype()), " ",
           ShapeToString(state.shape()), " on ", state.device().ToString());
}

// A one-element f32 output on the state's device, or null when undefined.
float* OptionalScalarOut(const char* op, const char* what, const RawTensor& t, Device device) {
  if (!t.defined()) return nullptr;
  CheckScalar(op, what, t, device);
  return static_cast<float*>(t.raw_data());
}

}  // namespace

KernelStatus NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                                      const RawTensor& inv_scale) {
  RunNonFiniteCheck("non_finite_check_and_unscale", tensors, found_inf, &inv_scale);
  return KernelStatus::kDone;
}

void NonFiniteCheck(const std::vector<RawTensor>& tensors, const RawTensor& found_inf) {
  RunNonFiniteCheck("non_finite_check", tensors, found_inf, nullptr);
}

RawTensor UploadScalerState(const LossScaleState& state, Device device) {
  TG_CHECK(device.is_cuda(), "UploadScalerState: expected a CUDA device, got ", device.ToString());
  DeviceGuard guard(device.index);
  RawTensor t = RawTensor::Empty({static_cast<int64_t>(sizeof(LossScaleState))}, kU8, device);
  // From pageable memory the call returns once `state` has been staged, so it may go away.
  TG_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), &state, sizeof(state), cudaMemcpyHostToDevice,
                                CurrentStream(device.index)));
  return t;
}

LossScaleState DownloadScalerState(const RawTensor& state) {
  CheckState("DownloadScalerState", state);
  DeviceGuard guard(state.device().index);
  cudaStream_t stream = CurrentStream(state.device().index);
  LossScaleState s;
  TG_CUDA_CHECK(cudaMemcpyAsync(&s, state.raw_data(), sizeof(s), cudaMemcpyDeviceToHost, stream));
  SynchronizeStream(stream);
  return s;
}

void UpdateScaleOnDevice(const RawTensor& state, const RawTensor& found_inf, const RawTensor& scale_out,
                         const RawTensor& inv_scale_out) {
  const char* op = "UpdateScaleOnDevice";
  CheckState(op, state);
  const Device device = state.device();
  const float* found = nullptr;
  if (found_inf.defined()) {
    CheckScalar(op, "found_inf", found_inf, device);
    found = static_cast<const float*>(found_inf.raw_data());
  }
  float* scale = OptionalScalarOut(op, "scale_out", scale_out, device);
  float* inv = OptionalScalarOut(op, "inv_scale_out", inv_scale_out, device);
  DeviceGuard guard(device.index);
  UpdateScaleKernel<<<1, 1, 0, CurrentStream(device.index)>>>(
      static_cast<LossScaleState*>(state.raw_data()), found, scale, inv);
  TG_CUDA_CHECK_LAUNCH("UpdateScaleKernel");
}

void WriteScaleOnDevice(const RawTensor& state, const RawTensor& scale_out, const RawTensor& inv_scale_out) {
  const char* op = "WriteScaleOnDevice";
  CheckState(op, state);
  const Device device = state.device();
  float* scale = OptionalScalarOut(op, "scale_out", scale_out, device);
  float* inv = OptionalScalarOut(op, "inv_scale_out", inv_scale_out, device);
  DeviceGuard guard(device.index);
  WriteScaleKernel<<<1, 1, 0, CurrentStream(device.index)>>>(
      static_cast<const LossScaleState*>(state.raw_data()), scale, inv);
  TG_CUDA_CHECK_LAUNCH("WriteScaleKernel");
}

KernelStatus LossScaleStep(const RawTensor& state, const RawTensor& found_inf, bool update,
                           const RawTensor& scale_out, const RawTensor& inv_scale_out) {
  if (update) {
    UpdateScaleOnDevice(state, found_inf, scale_out, inv_scale_out);
  } else {
    WriteScaleOnDevice(state, scale_out, inv_scale_out);
  }
  return KernelStatus::kDone;
}

}  // namespace tg::cuda
