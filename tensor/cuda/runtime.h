// The CUDA runtime layer of tapegrad: device queries, the current stream of each thread and
// device, events, per-device cuBLASLt/cuDNN handles and the error checks that every call into
// CUDA, cuBLAS(Lt), cuDNN and NCCL goes through.
//
// Errors: each TG_*_CHECK throws tg::Error "<file>:<line>: <call> failed: <library's error
// string>" (plus the error code's name), so a failure names where it happened and why.
//
// Streams: every thread has a current stream per device (the legacy default stream until a
// StreamGuard sets another). Kernels, copies and library calls of tapegrad enqueue on the
// current stream of the device they run on; nothing synchronises the host except an explicit
// Synchronize(), a device-to-host copy, or item().
//
//   if (tg::cuda::Available()) {
//     tg::cuda::Stream side;                 // a new non-blocking stream on the current device
//     tg::cuda::StreamGuard guard(side);     // ops on this thread now enqueue on `side`
//     ...
//   }
#ifndef TAPEGRAD_TENSOR_CUDA_RUNTIME_H_
#define TAPEGRAD_TENSOR_CUDA_RUNTIME_H_

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>

#include "tensor/error.h"

namespace tg::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int DeviceCount();
// Whether at least one device is usable. Tests use it to skip: if (!Available()) GTEST_SKIP().
bool Available();

// The calling thread's current device (cudaGetDevice) and a guard that switches it.
int CurrentDevice();
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// An owned, non-blocking stream on the device that was current at construction.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

// The stream ops of this thread enqueue on for `device` (default: the current device).
cudaStream_t CurrentStream(int device = -1);
// Makes `stream` the current stream of its device for this thread until destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// An event without timing (cudaEventDisableTiming), for ordering streams: a.Record(s1);
// a.Block(s2) makes work enqueued on s2 afterwards wait for what s1 had enqueued before.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void Record(cudaStream_t stream);
  void Block(cudaStream_t stream) const;
  bool Query() const;  // whether the recorded work completed
  void Synchronize() const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Waits for all work on the current stream of `device` (default: the current device).
void Synchronize(int device = -1);

// Per-device library handles, created on first use; cuDNN's is bound to the current stream on
// every call of CudnnHandle(). Calls with a cuBLASLt handle take the stream as an argument.
cublasLtHandle_t CublasLtHandle(int device = -1);
cudnnHandle_t CudnnHandle(int device = -1);

// A per-device scratch buffer for library workspaces (cuBLASLt, cuDNN): grows on demand, is
// reused across calls on the same stream, and comes from the caching allocator.
void* Workspace(size_t nbytes, int device = -1);

// Launch geometry for elementwise kernels: enough blocks of `threads` to cover n items, capped
// at a multiple of the SM count (grid-stride loops do the rest).
int BlocksFor(int64_t n, int threads = 256);

// Error text helpers behind the macros (file and line of the failing call).
[[noreturn]] void ThrowCudaError(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void ThrowCudnnError(cudnnStatus_t status, const char* call, const char* file,
                                  int line);

}  // namespace tg::cuda

#define TG_CUDA_CHECK(call)                                                \
  do {                                                                     \
    const cudaError_t tg_cuda_err_ = (call);                               \
    if (tg_cuda_err_ != cudaSuccess)                                       \
      ::tg::cuda::ThrowCudaError(tg_cuda_err_, #call, __FILE__, __LINE__); \
  } while (false)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define TG_CUDA_CHECK_LAUNCH(kernel_name)                                        \
  do {                                                                           \
    const cudaError_t tg_cuda_err_ = cudaGetLastError();                         \
    if (tg_cuda_err_ != cudaSuccess)                                             \
      ::tg::cuda::ThrowCudaError(tg_cuda_err_, kernel_name, __FILE__, __LINE__); \
  } while (false)

#define TG_CUBLAS_CHECK(call)                                                     \
  do {                                                                            \
    const cublasStatus_t tg_cublas_status_ = (call);                              \
    if (tg_cublas_status_ != CUBLAS_STATUS_SUCCESS)                               \
      ::tg::cuda::ThrowCublasError(tg_cublas_status_, #call, __FILE__, __LINE__); \
  } while (false)

#define TG_CUDNN_CHECK(call)                                                    \
  do {                                                                          \
    const cudnnStatus_t tg_cudnn_status_ = (call);                              \
    if (tg_cudnn_status_ != CUDNN_STATUS_SUCCESS)                               \
      ::tg::cuda::ThrowCudnnError(tg_cudnn_status_, #call, __FILE__, __LINE__); \
  } while (false)

#endif  // TAPEGRAD_TENSOR_CUDA_RUNTIME_H_
