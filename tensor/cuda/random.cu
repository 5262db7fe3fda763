// Random kernels of kernels.h: DropoutMask draws the Generator's Philox stream on the device
// (tensor/philox.h), so a CUDA mask holds exactly the CPU's values and nothing is uploaded.
#include <cstdint>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/tensor_args.cuh"
#include "tensor/philox.h"

namespace tg::cuda {
namespace {

// One thread per Philox block (four draws): block `first + b` holds draws 4 (first + b) + w,
// of which those in [offset, offset + n) are elements draw - offset.
template <typename T>
__global__ void DropoutMaskKernel(T* out, int64_t n, uint64_t seed, uint64_t offset,
                                  int64_t blocks, uint32_t threshold) {
  const uint64_t first = offset / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
       b += step) {
    const uint64_t counter = first + static_cast<uint64_t>(b);
    const PhiloxBlock r = Philox4x32(counter, seed);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t draw = 4 * counter + static_cast<uint64_t>(w);
      if (draw < offset || draw - offset >= static_cast<uint64_t>(n)) continue;
      out[draw - offset] = ConvertTo<T>(DropoutKeeps(r.v[w], threshold) ? 1.0f : 0.0f);
    }
  }
}

}  // namespace

void DropoutMask(const RawTensor& out, uint64_t seed, uint64_t offset, double p) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const DeviceGuard guard(out.device().index);
  const uint32_t threshold = DropoutThreshold(p);
  const int64_t blocks =
      static_cast<int64_t>((offset + static_cast<uint64_t>(n) - 1) / 4 - offset / 4 + 1);
  VisitDeviceFloating("dropout", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    DropoutMaskKernel<T><<<BlocksFor(blocks, kThreads), kThreads, 0, StreamOf(out)>>>(
        static_cast<T*>(out.raw_data()), n, seed, offset, blocks, threshold);
    TG_CUDA_CHECK_LAUNCH("dropout_mask");
  });
}

}  // namespace tg::cuda
