// CUDA max pooling over [N, C, H, W] (tensor/cuda/kernels.h), with the CPU kernel's choice of
// element (tensor/cpu/conv.cc): each window is scanned in row-major order from its first valid
// element, a strictly larger value or any NaN takes over, so ties keep the first maximum and the
// last NaN of a window wins. Padding never takes part. One thread per output element.
//
// The backward scatter-adds each output gradient at its index with atomicAdd, into the zeroed
// gradient for f32/f64 and into a zeroed f32 copy for f16/bf16 that is rounded once at the end
// (the CPU accumulates f16/bf16 in f32 as well). Without overlapping windows (stride >= kernel)
// every input element receives at most one gradient and the result is exact and deterministic;
// with overlap, the order of the atomics can change the last bits of f32 sums.
#include <algorithm>
#include <cmath>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_common.cuh"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace {

using namespace nn_detail;  // NOLINT(build/namespaces): this target's own helpers

constexpr int kBlockThreads = 256;

template <typename T>
__global__ void MaxPool2dKernel(T* out, int64_t* indices, const T* x, Window2d g, int64_t total) {
  using C = Acc<T>;
  const int64_t plane = g.h * g.w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t ox, oy;
    const int64_t p = DivMod(DivMod(i, g.ow, &ox), g.oh, &oy);
    const T* in = x + p * plane;
    const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    int64_t best = -1;
    C best_value = C(0);
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = y0 + ky * g.dh;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = x0 + kx * g.dw;
        if (xx < 0 || xx >= g.w) continue;
        const C v = ToCompute(in[yy * g.w + xx]);
        if (best < 0 || v > best_value || isnan(v)) {
          best = yy * g.w + xx;
          best_value = v;
        }
      }
    }
    if (best < 0) {  // an empty window; the op's validation rules it out
      out[i] = ConvertTo<T>(-Infinity<C>());
      indices[i] = 0;
      continue;
    }
    out[i] = in[best];  // the element's bits: NaN payloads included
    indices[i] = best;
  }
}

// acc[plane p][indices[i]] += grad_out[i] for every output element i of plane p = i / per_plane.
template <typename T, typename A>
__global__ void MaxPool2dBackwardKernel(A* acc, const T* grad_out, const int64_t* indices,
                                        int64_t total, int64_t per_plane, int64_t h, int64_t w,
                                        IndexErrorSink sink) {
  const int64_t plane = h * w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = indices[i];
    if (j < 0 || j >= plane) {
      RecordIndexError(sink, IndexOp::kMaxPool2dBackward, j, i, 0, h, w);
      continue;
    }
    int64_t unused;
    atomicAdd(acc + DivMod(i, per_plane, &unused) * plane + j,
              static_cast<A>(ToCompute(grad_out[i])));
  }
}

template <typename T>
__global__ void RoundKernel(T* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = ConvertTo<T>(src[i]);
  }
}

}  // namespace

void MaxPool2d(const RawTensor& out, const RawTensor& indices, const RawTensor& x, const Window2d& g) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = CurrentStream(device);
  VisitDeviceFloating("max_pool2d", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MaxPool2dKernel<T><<<BlocksFor(total, kBlockThreads), kBlockThreads, 0, stream>>>(
        static_cast<T*>(out.raw_data()), indices.data<int64_t>(),
        static_cast<const T*>(x.raw_data()), g, total);
    TG_CUDA_CHECK_LAUNCH("MaxPool2dKernel");
  });
}

void MaxPool2dBackward(const RawTensor& grad_input, const RawTensor& grad_out, const RawTensor& indices) {
  const int device = grad_input.device().index;
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  const cudaStream_t stream = CurrentStream(device);
  const int64_t h = grad_input.size(2), w = grad_input.size(3);
  const int64_t n = grad_input.numel(), total = grad_out.numel();
  const int64_t per_plane = grad_out.size(2) * grad_out.size(3);
  const IndexErrorSink sink = IndexErrorSinkFor(device);
  VisitDeviceFloating("max_pool2d_backward", grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    auto* gi = static_cast<T*>(grad_input.raw_data());
    const auto* go = static_cast<const T*>(grad_out.raw_data());
    C* acc = reinterpret_cast<C*>(gi);
    RawTensor scratch;
    if constexpr (!std::is_same_v<T, C>) {
      scratch = RawTensor::Empty({std::max<int64_t>(n, 1)}, kF32, grad_input.device());
      acc = static_cast<C*>(scratch.raw_data());
    }
    if (n > 0) TG_CUDA_CHECK(cudaMemsetAsync(acc, 0, n * sizeof(C), stream));
    if (total > 0) {
      MaxPool2dBackwardKernel<T, C><<<BlocksFor(total, kBlockThreads), kBlockThreads, 0, stream>>>(
          acc, go, indices.data<int64_t>(), total, per_plane, h, w, sink);
      TG_CUDA_CHECK_LAUNCH("MaxPool2dBackwardKernel");
    }
    if constexpr (!std::is_same_v<T, C>) {
      if (n > 0) {
        RoundKernel<T><<<BlocksFor(n, kBlockThreads), kBlockThreads, 0, stream>>>(gi, acc, n);
        TG_CUDA_CHECK_LAUNCH("RoundKernel");
      }
    }
  });
}

}  // namespace tg::cuda
