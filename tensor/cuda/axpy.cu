#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/axpy.h"

namespace tg::cuda {
namespace {

// Grid-stride with 64-bit indices, so that any length fits a grid of at most 65535 blocks.
__global__ void AxpyKernel(int64_t n, float a, const float* x, float* y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = a * x[i] + y[i];
  }
}

std::string Describe(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorString(err);
}

}  // namespace

std::string AxpySync(float a, const std::vector<float>& x, std::vector<float>& y) {
  if (x.size() != y.size()) return "AxpySync: x and y differ in length";
  // Nothing to do; a launch of 0 blocks would fail with cudaErrorInvalidConfiguration.
  if (x.empty()) return "";
  const size_t bytes = x.size() * sizeof(float);
  float* dx = nullptr;
  float* dy = nullptr;
  cudaError_t err = cudaMalloc(&dx, bytes);
  if (err != cudaSuccess) return Describe("cudaMalloc", err);
  err = cudaMalloc(&dy, bytes);
  std::string result;
  if (err != cudaSuccess) {
    result = Describe("cudaMalloc", err);
  } else if ((err = cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
             (err = cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    result = Describe("cudaMemcpy to device", err);
  } else {
    const int64_t n = static_cast<int64_t>(x.size());
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
    AxpyKernel<<<blocks, 256>>>(n, a, dx, dy);
    if ((err = cudaGetLastError()) != cudaSuccess) {
      result = Describe("AxpyKernel launch", err);
    } else if ((err = cudaMemcpy(y.data(), dy, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
      result = Describe("cudaMemcpy to host", err);
    }
  }
  cudaFree(dx);
  cudaFree(dy);
  return result;
}

}  // namespace tg::cuda
