// The CUDA runtime layer of tapegrad: device queries, the current stream of each thread and
// device, events, per-device cuBLASLt/cuDNN handles and the error checks that every call into
// CUDA, cuBLAS(Lt), cuDNN and NCCL goes through.
//
// Errors: each TG_*_CHECK throws tg::Error "<file>:<line>: <call> failed: <error name>:
// <library's error string>", e.g. "tensor/cuda/backend.cc:42: cudaMemcpyAsync(dst, src, n, kind,
// stream) failed: cudaErrorInvalidValue: invalid argument", so a failure names where it
// happened and why.
//
// Streams: every thread has a current stream per device: stream 0, the legacy default stream
// (tapegrad is not compiled with --default-stream per-thread), until a StreamGuard sets another.
// Kernels, copies and library calls of tapegrad enqueue on the current stream of the device
// they run on; nothing synchronises the host except an explicit Synchronize(), a
// device-to-host copy, or item(). Work on two streams is ordered only through Events.
//
// Memory: each device has one process-wide caching allocator (tensor/cuda/caching_allocator.h)
// over cudaMalloc/cudaFree; freed blocks are reused at once, which is safe for work ordered on
// one stream (see that header for cross-stream use).
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
#include <cstdint>

#include "tensor/cuda/caching_allocator.h"
#include "tensor/error.h"

namespace tg::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int DeviceCount();
// Whether at least one device is usable. Tests use it to skip: if (!Available()) GTEST_SKIP().
bool Available();

// The calling thread's current device (cudaGetDevice) and a guard that switches it (no CUDA
// call when it is already current; throws naming the device and DeviceCount() when it does not
// exist).
int CurrentDevice();
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int device_;
};

// An owned, non-blocking stream on the device that was current at construction (it does not
// synchronise with the legacy default stream: order the two with Events).
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

// The stream ops of this thread enqueue on for `device` (default: the current device); stream
// 0 (legacy default) unless a StreamGuard is active.
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
// Created on the current device; Record takes a stream of that device, Block any stream.
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

// Waits for all work on `stream`. Every wait of the host for the device in tapegrad goes through
// this, Synchronize() or Event::Synchronize(), and is counted: HostSyncCount() is the number of
// such waits since the process started, which a benchmark reads around steady-state training
// steps to show that they never wait (tools/bench/gpt2_gpu).
void SynchronizeStream(cudaStream_t stream);
int64_t HostSyncCount();

// Library handles, created on first use. cuBLASLt: one per device, shared by all threads
// (calls take the stream as an argument). cuDNN: one per device and thread (a cuDNN handle
// carries a stream), bound to the current stream on every call of CudnnHandle().
cublasLtHandle_t CublasLtHandle(int device = -1);
cudnnHandle_t CudnnHandle(int device = -1);

// A scratch buffer for library workspaces (cuBLASLt, cuDNN), one per thread, device and current
// stream: grows on demand, is reused across calls on the same stream, and comes from the
// caching allocator. The pointer stays valid until this thread asks for more bytes on the same
// device and stream; nullptr while nothing was asked for.
void* Workspace(size_t nbytes, int device = -1);

// The process-wide caching allocator of `device` (never destroyed); throws tg::Error naming
// the device and DeviceCount() when it does not exist.
CachingAllocator* DeviceAllocator(int device);
// Its statistics, peak reset and cache release (default: the current device).
AllocatorStats MemoryStats(int device = -1);
void ResetPeakMemoryStats(int device = -1);
void EmptyCache(int device = -1);

// Launch geometry for elementwise kernels on the current device: enough blocks of `threads` to
// cover n items (at least 1), capped at 8192 threads per SM (grid-stride loops do the rest).
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
