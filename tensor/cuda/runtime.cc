#include "tensor/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tg::cuda {
namespace {

// Devices beyond this many are not used (fixed-size per-device tables keep the hot lookups,
// CurrentStream and the handles, free of locks and allocation).
constexpr int kMaxDevices = 64;

int QueryDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" / "no device" error so later checks start clean
    return 0;
  }
  return std::min(count, kMaxDevices);
}

bool Usable(int device) { return device >= 0 && device < DeviceCount(); }

// Throws "<op>: <why `device` is not usable>".
[[noreturn]] ABSL_ATTRIBUTE_NOINLINE void ThrowUnusable(const char* op, int device) {
  const int count = DeviceCount();
  if (count == 0) {
    throw Error(absl::StrCat(
        op, ": no CUDA device is available (DeviceCount() = 0: no CUDA driver or no GPU)"));
  }
  throw Error(
      absl::StrCat(op, ": CUDA device ", device, " does not exist (DeviceCount() = ", count, ")"));
}

// `device`, or the current device for -1; throws naming `op` when it is not usable.
int Resolve(const char* op, int device) {
  if (device == -1 && DeviceCount() > 0) device = CurrentDevice();
  if (ABSL_PREDICT_FALSE(!Usable(device))) ThrowUnusable(op, device);
  return device;
}

// The current stream of each device for this thread; nullptr is stream 0, the legacy default
// stream (tapegrad is not compiled with --default-stream per-thread), which is what a thread
// uses until a StreamGuard says otherwise.
thread_local cudaStream_t current_streams[kMaxDevices] = {};

// ---- Library handles ----------------------------------------------------------------------

// cuBLASLt handles hold no stream (each matmul call takes one), so one per device is shared by
// all threads. Created under a lock, read without one.
std::atomic<cublasLtHandle_t> cublaslt_handles[kMaxDevices] = {};
absl::Mutex handles_mu(absl::kConstInit);

// A cuDNN handle carries its stream (cudnnSetStream), so two threads sharing one would race on
// it: each thread gets its own per device. Handles of finished threads go back to a per-device
// pool (never destroyed: the pool outlives every thread, and destroying handles at process exit
// would race with the CUDA runtime's own teardown).
struct CudnnPool {
  absl::Mutex mu;
  std::vector<cudnnHandle_t> free ABSL_GUARDED_BY(mu);
};
CudnnPool* CudnnPools() {
  static CudnnPool* pools = new CudnnPool[kMaxDevices];
  return pools;
}

struct ThreadCudnnHandles {
  cudnnHandle_t handles[kMaxDevices] = {};
  ~ThreadCudnnHandles() {
    for (int d = 0; d < kMaxDevices; ++d) {
      if (handles[d] == nullptr) continue;
      CudnnPool& pool = CudnnPools()[d];
      absl::MutexLock lock(&pool.mu);
      pool.free.push_back(handles[d]);
    }
  }
};
thread_local ThreadCudnnHandles thread_cudnn;

// ---- Workspaces ---------------------------------------------------------------------------

// One buffer per (device, stream) of each thread: work enqueued on one stream is ordered, so a
// buffer reused there is never read by two kernels at once; two streams or two threads must not
// share one. Returned to the caching allocator when the thread ends.
struct WorkspaceEntry {
  int device;
  cudaStream_t stream;
  void* ptr;
  size_t size;
};
struct ThreadWorkspaces {
  std::vector<WorkspaceEntry> entries;
  ~ThreadWorkspaces() {
    for (const WorkspaceEntry& e : entries) DeviceAllocator(e.device)->Deallocate(e.ptr, e.size);
  }
};
thread_local ThreadWorkspaces thread_workspaces;

// ---- Multiprocessor counts ----------------------------------------------------------------

std::atomic<int> sm_counts[kMaxDevices] = {};

int SmCount(int device) {
  int count = sm_counts[device].load(std::memory_order_relaxed);
  if (count == 0) {
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    sm_counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// ---- Device memory ------------------------------------------------------------------------

// cudaMalloc/cudaFree on one device, whatever device is current for the calling thread.
class CudaSegmentSource final : public SegmentSource {
 public:
  explicit CudaSegmentSource(int device) : device_(device) {}

  void* Malloc(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, nbytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it, the caching allocator reports the failure
      return nullptr;
    }
    if (err != cudaSuccess) ThrowCudaError(err, "cudaMalloc(&ptr, nbytes)", __FILE__, __LINE__);
    return ptr;
  }

  // cudaFree waits for the device, so freed memory is no longer in use by any kernel.
  void Free(void* ptr, size_t) override {
    DeviceGuard guard(device_);
    TG_CUDA_CHECK(cudaFree(ptr));
  }

 private:
  const int device_;
};

}  // namespace

// ---- Devices ------------------------------------------------------------------------------

int DeviceCount() {
  static const int count = QueryDeviceCount();
  return count;
}

bool Available() { return DeviceCount() > 0; }

int CurrentDevice() {
  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

DeviceGuard::DeviceGuard(int device) : previous_(CurrentDevice()), device_(device) {
  if (device_ == previous_) return;
  if (!Usable(device_)) ThrowUnusable("DeviceGuard", device_);
  TG_CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; switching back to a device that worked before does not fail.
  if (device_ != previous_) cudaSetDevice(previous_);
}

// ---- Streams and events -------------------------------------------------------------------

Stream::Stream() : device_(CurrentDevice()) {
  // Non-blocking: the stream does not wait for the legacy default stream (nor it for this
  // one); work on both is ordered only through events.
  TG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

cudaStream_t CurrentStream(int device) { return current_streams[Resolve("CurrentStream", device)]; }

StreamGuard::StreamGuard(const Stream& stream)
    : device_(stream.device()), previous_(current_streams[stream.device()]) {
  current_streams[device_] = stream.get();
}

StreamGuard::~StreamGuard() { current_streams[device_] = previous_; }

Event::Event() { TG_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void Event::Record(cudaStream_t stream) { TG_CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::Block(cudaStream_t stream) const {
  TG_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

bool Event::Query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error: keep it from later checks
    return false;
  }
  ThrowCudaError(err, "cudaEventQuery(event_)", __FILE__, __LINE__);
}

namespace {
std::atomic<int64_t> host_syncs{0};
}  // namespace

int64_t HostSyncCount() { return host_syncs.load(std::memory_order_relaxed); }

void Event::Synchronize() const {
  host_syncs.fetch_add(1, std::memory_order_relaxed);
  TG_CUDA_CHECK(cudaEventSynchronize(event_));
}

void SynchronizeStream(cudaStream_t stream) {
  host_syncs.fetch_add(1, std::memory_order_relaxed);
  TG_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void Synchronize(int device) {
  const int d = Resolve("Synchronize", device);
  DeviceGuard guard(d);  // stream 0 means the legacy stream of the current device
  SynchronizeStream(current_streams[d]);
}

// ---- Library handles ----------------------------------------------------------------------

cublasLtHandle_t CublasLtHandle(int device) {
  const int d = Resolve("CublasLtHandle", device);
  cublasLtHandle_t handle = cublaslt_handles[d].load(std::memory_order_acquire);
  if (handle != nullptr) return handle;
  absl::MutexLock lock(&handles_mu);
  handle = cublaslt_handles[d].load(std::memory_order_relaxed);
  if (handle == nullptr) {
    DeviceGuard guard(d);
    TG_CUBLAS_CHECK(cublasLtCreate(&handle));
    cublaslt_handles[d].store(handle, std::memory_order_release);
  }
  return handle;
}

cudnnHandle_t CudnnHandle(int device) {
  const int d = Resolve("CudnnHandle", device);
  cudnnHandle_t& handle = thread_cudnn.handles[d];
  if (handle == nullptr) {
    CudnnPool& pool = CudnnPools()[d];
    {
      absl::MutexLock lock(&pool.mu);
      if (!pool.free.empty()) {
        handle = pool.free.back();
        pool.free.pop_back();
      }
    }
    if (handle == nullptr) {
      DeviceGuard guard(d);
      cudnnHandle_t created = nullptr;
      TG_CUDNN_CHECK(cudnnCreate(&created));
      handle = created;
    }
  }
  TG_CUDNN_CHECK(cudnnSetStream(handle, current_streams[d]));
  return handle;
}

// ---- Memory -------------------------------------------------------------------------------

CachingAllocator* DeviceAllocator(int device) {
  // Created together on first use and never destroyed: tensors held by static objects may be
  // freed during exit, after any destructor here would have run.
  static CachingAllocator** allocators = [] {
    auto** all = new CachingAllocator*[kMaxDevices]();
    for (int d = 0; d < DeviceCount(); ++d) {
      all[d] = new CachingAllocator(Device::Cuda(d), std::make_unique<CudaSegmentSource>(d));
    }
    return all;
  }();
  if (ABSL_PREDICT_FALSE(!Usable(device))) ThrowUnusable("DeviceAllocator", device);
  return allocators[device];
}

AllocatorStats MemoryStats(int device) {
  return DeviceAllocator(Resolve("MemoryStats", device))->stats();
}

void ResetPeakMemoryStats(int device) {
  DeviceAllocator(Resolve("ResetPeakMemoryStats", device))->ResetPeakStats();
}

void EmptyCache(int device) { DeviceAllocator(Resolve("EmptyCache", device))->EmptyCache(); }

void* Workspace(size_t nbytes, int device) {
  const int d = Resolve("Workspace", device);
  const cudaStream_t stream = current_streams[d];
  WorkspaceEntry* entry = nullptr;
  for (WorkspaceEntry& e : thread_workspaces.entries) {
    if (e.device == d && e.stream == stream) entry = &e;
  }
  if (entry == nullptr) {
    thread_workspaces.entries.push_back({d, stream, nullptr, 0});
    entry = &thread_workspaces.entries.back();
  }
  if (nbytes > entry->size) {
    // The old buffer may still be read by work already enqueued on `stream`; the allocator may
    // hand it out again only to work enqueued later (single-stream model), so that is safe.
    CachingAllocator* allocator = DeviceAllocator(d);
    allocator->Deallocate(entry->ptr, entry->size);
    entry->ptr = nullptr;
    entry->size = 0;
    entry->ptr = allocator->Allocate(nbytes);
    entry->size = nbytes;
  }
  return entry->ptr;
}

int BlocksFor(int64_t n, int threads) {
  TG_CHECK(threads > 0 && threads <= 1024, "BlocksFor: ", threads,
           " threads per block is not in [1, 1024]");
  // At most 8192 threads per multiprocessor: four waves of the 2048 an SM keeps resident, enough
  // to hide the tail of uneven blocks; grid-stride loops cover the rest of n.
  const int64_t cap = int64_t{SmCount(CurrentDevice())} * std::max(1, 8192 / threads);
  const int64_t needed = (std::max<int64_t>(n, 0) + threads - 1) / threads;
  return static_cast<int>(std::clamp<int64_t>(needed, 1, cap));
}

// ---- Errors -------------------------------------------------------------------------------

void ThrowCudaError(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a non-sticky error so that the next TG_CUDA_CHECK_LAUNCH does not report it again.
  cudaGetLastError();
  throw Error(absl::StrCat(file, ":", line, ": ", call, " failed: ", cudaGetErrorName(err), ": ",
                           cudaGetErrorString(err)));
}

void ThrowCublasError(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(absl::StrCat(file, ":", line, ": ", call, " failed: ", cublasLtGetStatusName(status),
                           ": ", cublasLtGetStatusString(status)));
}

void ThrowCudnnError(cudnnStatus_t status, const char* call, const char* file, int line) {
  // cudnnGetErrorString gives the status name; the last error string of this thread says why.
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message =
      absl::StrCat(file, ":", line, ": ", call, " failed: ", cudnnGetErrorString(status));
  if (detail[0] != '\0') absl::StrAppend(&message, ": ", detail);
  throw Error(message);
}

}  // namespace tg::cuda
