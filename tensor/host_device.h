// TG_HOST_DEVICE marks a function that host code and CUDA kernels share (one definition, compiled
// by nvcc for both sides and by the host compiler everywhere else): tensor/philox.h,
// tensor/loss_scale_update.h.
//
//   TG_HOST_DEVICE inline float Twice(float x) { return 2 * x; }
#ifndef TAPEGRAD_TENSOR_HOST_DEVICE_H_
#define TAPEGRAD_TENSOR_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__
#else
#define TG_HOST_DEVICE
#endif

#endif  // TAPEGRAD_TENSOR_HOST_DEVICE_H_
