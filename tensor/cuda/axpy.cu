#include <cuda_runtime.h>

#include "tensor/cuda/axpy.h"

namespace tg::cuda {
namespace {

__global__ void AxpyKernel(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

std::string Describe(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorString(err);
}

}  // namespace

std::string AxpySync(float a, const std::vector<float>& x, std::vector<float>& y) {
  if (x.size() != y.size()) return "AxpySync: x and y differ in length";
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
    const int n = static_cast<int>(x.size());
    AxpyKernel<<<(n + 255) / 256, 256>>>(n, a, dx, dy);
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
