// The first CUDA code of tapegrad: y = a*x + y on f32 device buffers. It proves that the nvcc
// rule (tools/bazel/cuda.bzl) builds, links and runs; the real kernels live beside it.
//
//   if (tg::cuda::DeviceCount() > 0) tg::cuda::AxpySync(2.0f, x_host, y_host);  // runtime.h
#ifndef TAPEGRAD_TENSOR_CUDA_AXPY_H_
#define TAPEGRAD_TENSOR_CUDA_AXPY_H_

#include <string>
#include <vector>

namespace tg::cuda {

// y[i] = a * x[i] + y[i] computed on the current device: copies both vectors to the device,
// runs the kernel, copies y back and synchronises. Returns an empty string on success, else the
// CUDA error text with the call that failed. Empty vectors launch nothing.
std::string AxpySync(float a, const std::vector<float>& x, std::vector<float>& y);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_AXPY_H_
