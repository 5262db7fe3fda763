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

void RunNonFiniteCheck(const char* op, const std::vector<Tensor>& tensors, const Tensor& found_inf,
                       const Tensor* inv_scale) {
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

// The scalar arithmetic of the update, one correctly rounded operation each, on either side:
// the device intrinsics, or plain double operations on the host (x86-64 SSE2 rounds the same).
__host__ __device__ inline double DMul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

__host__ __device__ inline double DDiv(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// To the nearest f32, ties to even, overflowing to inf from FLT_MAX + half an ulp on: what
// __double2float_rn does, and loss_scaler.cc's RoundToFloat (a plain cast of a double beyond
// FLT_MAX is undefined in C++, hence the branches on the host).
__host__ __device__ inline float DoubleToFloat(double x) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(x);
#else
  constexpr double kFloatMax = 0x1.fffffep127;
  constexpr double kFloatOverflow = 0x1.ffffffp127;
  if (std::isnan(x) || std::isinf(x)) return static_cast<float>(x);
  const double magnitude = std::fabs(x);
  if (magnitude >= kFloatOverflow) return std::copysign(INFINITY, static_cast<float>(x));
  if (magnitude > kFloatMax) return std::copysign(static_cast<float>(kFloatMax), x);
  return static_cast<float>(x);
#endif
}

// LossScaler::Round.
__host__ __device__ inline double RoundScale(const DeviceScalerState& s, double x) {
  return s.f32_scale ? static_cast<double>(DoubleToFloat(x)) : x;
}

// LossScaler::update, line by line (amp/loss_scaler.cc); std::max(a, b) is (a < b ? b : a) and
// std::min(a, b) is (b < a ? b : a), spelled out so that equal and infinite values pick the same
// operand as on the host. After the min-scale error every update is a no-op.
__host__ __device__ void UpdateScale(DeviceScalerState& s, bool found_inf) {
  if (s.min_scale_error != 0) return;
  if (!s.dynamic) {
    s.clean_streak = found_inf ? 0 : s.clean_streak + 1;
    ++s.iteration;
    return;
  }
  if (found_inf) {
    if (s.hysteresis_tracker <= 1) {
      if (s.raise_at_min_scale && s.scale == s.min_scale) {
        s.min_scale_error = 1;  // the host throws here and changes nothing
        return;
      }
      const double backed_off =
          s.backoff_by_division ? DDiv(s.scale, s.growth_factor) : DMul(s.scale, s.backoff_factor);
      const double rounded = RoundScale(s, backed_off);
      s.scale = rounded < s.min_scale ? s.min_scale : rounded;
    }
    if (!s.hysteresis_stops_at_one || s.hysteresis_tracker > 1) --s.hysteresis_tracker;
    s.growth_tracker = 0;
    s.clean_streak = 0;
  } else {
    ++s.growth_tracker;
    ++s.clean_streak;
    if (s.consecutive_hysteresis) s.hysteresis_tracker = s.hysteresis;
    const bool first_growth = s.growth_tracker == s.clean_streak;
    const int64_t needed =
        s.growth_interval + (s.first_growth_waits_one_more && first_growth ? 1 : 0);
    if (s.growth_tracker >= needed) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = s.hysteresis;
      const double product = RoundScale(s, DMul(s.scale, s.growth_factor));
      const double grown = s.max_scale < product ? s.max_scale : product;
      if (!s.skip_nonfinite_growth || isfinite(grown)) s.scale = grown;
    }
  }
  ++s.iteration;
}

// What the host facade derives from the scale: the f32 loss multiplier and the f32 of 1 / scale
// computed in double (MixedPrecisionOptimizer: Tensor::Scalar(1.0 / scale, kF32)).
__device__ void WriteScales(const DeviceScalerState& s, float* scale_out, float* inv_scale_out) {
  if (scale_out != nullptr) *scale_out = __double2float_rn(s.scale);
  if (inv_scale_out != nullptr) *inv_scale_out = __double2float_rn(__ddiv_rn(1.0, s.scale));
}

// One thread: the update is a handful of scalar operations; the point is that it needs no host.
__global__ void UpdateScaleKernel(DeviceScalerState* state, const float* found_inf,
                                  float* scale_out, float* inv_scale_out) {
  DeviceScalerState s = *state;
  UpdateScale(s, found_inf != nullptr && *found_inf != 0.0f);
  *state = s;
  WriteScales(s, scale_out, inv_scale_out);
}

__global__ void WriteScaleKernel(const DeviceScalerState* state, float* scale_out,
                                 float* inv_scale_out) {
  WriteScales(*state, scale_out, inv_scale_out);
}

void CheckState(const char* op, const Tensor& state) {
  TG_CHECK(state.defined(), op, ": the scaler state is an undefined tensor");
  TG_CHECK(state.device().is_cuda() && state.dtype() == kU8 && state.is_contiguous() &&
               state.numel() == static_cast<int64_t>(sizeof(DeviceScalerState)),
           op, ": expected the scaler state of UploadScalerState (contiguous u8 [",
           sizeof(DeviceScalerState), "] on a CUDA device), got ", DTypeName(state.dtype()), " ",
           ShapeToString(state.shape()), " on ", state.device().ToString());
}

// A one-element f32 output on the state's device, or null when undefined.
float* OptionalScalarOut(const char* op, const char* what, const Tensor& t, Device device) {
  if (!t.defined()) return nullptr;
  CheckScalar(op, what, t, device);
  return static_cast<float*>(t.raw_data());
}

}  // namespace

KernelStatus NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                                      const Tensor& inv_scale) {
  RunNonFiniteCheck("non_finite_check_and_unscale", tensors, found_inf, &inv_scale);
  return KernelStatus::kDone;
}

void NonFiniteCheck(const std::vector<Tensor>& tensors, const Tensor& found_inf) {
  RunNonFiniteCheck("non_finite_check", tensors, found_inf, nullptr);
}

Tensor UploadScalerState(const DeviceScalerState& state, Device device) {
  TG_CHECK(device.is_cuda(), "UploadScalerState: expected a CUDA device, got ", device.ToString());
  DeviceGuard guard(device.index);
  Tensor t = Tensor::Empty({static_cast<int64_t>(sizeof(DeviceScalerState))}, kU8, device);
  // From pageable memory the call returns once `state` has been staged, so it may go away.
  TG_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), &state, sizeof(state), cudaMemcpyHostToDevice,
                                CurrentStream(device.index)));
  return t;
}

DeviceScalerState DownloadScalerState(const Tensor& state) {
  CheckState("DownloadScalerState", state);
  DeviceGuard guard(state.device().index);
  cudaStream_t stream = CurrentStream(state.device().index);
  DeviceScalerState s;
  TG_CUDA_CHECK(cudaMemcpyAsync(&s, state.raw_data(), sizeof(s), cudaMemcpyDeviceToHost, stream));
  TG_CUDA_CHECK(cudaStreamSynchronize(stream));
  return s;
}

void UpdateScaleOnHost(DeviceScalerState* state, bool found_inf) {
  TG_CHECK(state != nullptr, "UpdateScaleOnHost: the state is null");
  UpdateScale(*state, found_inf);
}

void UpdateScaleOnDevice(const Tensor& state, const Tensor& found_inf, const Tensor& scale_out,
                         const Tensor& inv_scale_out) {
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
      static_cast<DeviceScalerState*>(state.raw_data()), found, scale, inv);
  TG_CUDA_CHECK_LAUNCH("UpdateScaleKernel");
}

void WriteScaleOnDevice(const Tensor& state, const Tensor& scale_out, const Tensor& inv_scale_out) {
  const char* op = "WriteScaleOnDevice";
  CheckState(op, state);
  const Device device = state.device();
  float* scale = OptionalScalarOut(op, "scale_out", scale_out, device);
  float* inv = OptionalScalarOut(op, "inv_scale_out", inv_scale_out, device);
  DeviceGuard guard(device.index);
  WriteScaleKernel<<<1, 1, 0, CurrentStream(device.index)>>>(
      static_cast<const DeviceScalerState*>(state.raw_data()), scale, inv);
  TG_CUDA_CHECK_LAUNCH("WriteScaleKernel");
}

}  // namespace tg::cuda
