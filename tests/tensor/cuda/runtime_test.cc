// The CUDA runtime layer: error text of the check macros (runs without a GPU), and on a GPU the
// current-stream bookkeeping, events, library handles, workspaces, launch geometry and the
// caching allocator over real cudaMalloc.
#include "tensor/cuda/runtime.h"

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg::cuda {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

#define SKIP_WITHOUT_GPU() \
  if (!Available()) GTEST_SKIP() << "no CUDA device"

TEST(CudaErrorTest, CheckMacrosNameFileLineCallAndError) {
  const int cuda_line = __LINE__ + 1;
  auto cuda_call = [] { TG_CUDA_CHECK(cudaErrorInvalidValue); };
  EXPECT_TRUE(
      ThrowsErrorExactly(cuda_call, absl::StrCat(__FILE__, ":", cuda_line,
                                                 ": cudaErrorInvalidValue failed: "
                                                 "cudaErrorInvalidValue: invalid argument")));
  const int cublas_line = __LINE__ + 1;
  auto cublas_call = [] { TG_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); };
  EXPECT_TRUE(ThrowsErrorExactly(
      cublas_call,
      absl::StrCat(__FILE__, ":", cublas_line,
                   ": CUBLAS_STATUS_NOT_SUPPORTED failed: CUBLAS_STATUS_NOT_SUPPORTED: "
                   "the requested functionality is not supported")));
  const int cudnn_line = __LINE__ + 1;
  auto cudnn_call = [] { TG_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); };
  EXPECT_TRUE(ThrowsErrorExactly(
      cudnn_call, absl::StrCat(__FILE__, ":", cudnn_line,
                               ": CUDNN_STATUS_BAD_PARAM failed: CUDNN_STATUS_BAD_PARAM")));
  EXPECT_NO_THROW(TG_CUDA_CHECK(cudaSuccess));
}

TEST(CudaRuntimeTest, DeviceCountNeverThrows) {
  int count = -1;
  EXPECT_NO_THROW(count = DeviceCount());
  EXPECT_GE(count, 0);
  EXPECT_EQ(Available(), count > 0);
  EXPECT_EQ(DeviceCount(), count);  // cached, stable
}

TEST(CudaRuntimeTest, DeviceIndexErrorsNameTheDeviceCount) {
  if (!Available()) {
    const std::string none =
        "no CUDA device is available (DeviceCount() = 0: no CUDA driver or no GPU)";
    EXPECT_TRUE(ThrowsErrorExactly([] { DeviceAllocator(0); }, "DeviceAllocator: " + none));
    EXPECT_TRUE(ThrowsErrorExactly([] { CurrentStream(); }, "CurrentStream: " + none));
    EXPECT_TRUE(ThrowsErrorExactly([] { MemoryStats(); }, "MemoryStats: " + none));
    EXPECT_TRUE(ThrowsErrorExactly([] { Synchronize(0); }, "Synchronize: " + none));
    return;
  }
  const int n = DeviceCount();
  const std::string missing =
      absl::StrCat("CUDA device ", n, " does not exist (DeviceCount() = ", n, ")");
  EXPECT_TRUE(ThrowsErrorExactly([&] { DeviceAllocator(n); }, "DeviceAllocator: " + missing));
  EXPECT_TRUE(ThrowsErrorExactly([&] { CurrentStream(n); }, "CurrentStream: " + missing));
  EXPECT_TRUE(ThrowsErrorExactly([&] { DeviceGuard guard(n); }, "DeviceGuard: " + missing));
}

TEST(CudaRuntimeTest, DeviceGuardRestoresTheDevice) {
  SKIP_WITHOUT_GPU();
  const int before = CurrentDevice();
  {
    DeviceGuard guard(DeviceCount() - 1);
    EXPECT_EQ(CurrentDevice(), DeviceCount() - 1);
  }
  EXPECT_EQ(CurrentDevice(), before);
}

TEST(CudaRuntimeTest, CurrentStreamIsPerThreadAndGuarded) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(CurrentStream(), nullptr);  // the legacy default stream
  Stream side;
  EXPECT_NE(side.get(), nullptr);
  EXPECT_EQ(side.device(), CurrentDevice());
  {
    StreamGuard guard(side);
    EXPECT_EQ(CurrentStream(), side.get());
    EXPECT_EQ(CurrentStream(side.device()), side.get());
    cudaStream_t seen_elsewhere = side.get();
    std::thread([&] { seen_elsewhere = CurrentStream(side.device()); }).join();
    EXPECT_EQ(seen_elsewhere, nullptr);  // other threads keep their own
    {
      Stream inner;
      StreamGuard inner_guard(inner);
      EXPECT_EQ(CurrentStream(), inner.get());
    }
    EXPECT_EQ(CurrentStream(), side.get());
  }
  EXPECT_EQ(CurrentStream(), nullptr);
}

TEST(CudaRuntimeTest, EventsOrderStreams) {
  SKIP_WITHOUT_GPU();
  const size_t n = 64 << 20;
  CachingAllocator* alloc = DeviceAllocator(CurrentDevice());
  void* a = alloc->Allocate(n);
  void* b = alloc->Allocate(n);
  std::vector<uint8_t> host(n);
  Stream s1, s2;
  Event done;
  TG_CUDA_CHECK(cudaMemsetAsync(a, 7, n, s1.get()));
  done.Record(s1.get());
  done.Block(s2.get());  // s2's copy reads a only after s1's memset
  TG_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, s2.get()));
  TG_CUDA_CHECK(cudaStreamSynchronize(s2.get()));
  EXPECT_TRUE(done.Query());
  TG_CUDA_CHECK(cudaMemcpy(host.data(), b, n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(host.front(), 7);
  EXPECT_EQ(host.back(), 7);
  done.Synchronize();
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  alloc->Deallocate(a, n);
  alloc->Deallocate(b, n);
}

TEST(CudaRuntimeTest, LaunchCheckReportsBadConfigurations) {
  SKIP_WITHOUT_GPU();
  EXPECT_NO_THROW(TG_CUDA_CHECK_LAUNCH("nothing"));
  // A memset with an invalid pointer fails at the call; the error is cleared after throwing.
  EXPECT_TRUE(ThrowsError([] { TG_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(8), 0, 4)); },
                          "cudaMemset(reinterpret_cast<void*>(8), 0, 4) failed: cudaError"));
  EXPECT_NO_THROW(TG_CUDA_CHECK_LAUNCH("after a failed call"));
}

TEST(CudaRuntimeTest, LibraryHandles) {
  SKIP_WITHOUT_GPU();
  cublasLtHandle_t lt = CublasLtHandle();
  EXPECT_NE(lt, nullptr);
  EXPECT_EQ(CublasLtHandle(), lt);  // one per device
  cublasLtHandle_t other_lt = nullptr;
  std::thread([&] { other_lt = CublasLtHandle(); }).join();
  EXPECT_EQ(other_lt, lt);

  cudnnHandle_t dnn = CudnnHandle();
  EXPECT_NE(dnn, nullptr);
  EXPECT_EQ(CudnnHandle(), dnn);  // one per thread and device
  cudaStream_t bound = reinterpret_cast<cudaStream_t>(1);
  TG_CUDNN_CHECK(cudnnGetStream(dnn, &bound));
  EXPECT_EQ(bound, nullptr);
  Stream side;
  {
    StreamGuard guard(side);
    TG_CUDNN_CHECK(cudnnGetStream(CudnnHandle(), &bound));
    EXPECT_EQ(bound, side.get());  // rebound to the current stream
  }
  cudnnHandle_t other_dnn = nullptr;
  std::thread([&] { other_dnn = CudnnHandle(); }).join();
  EXPECT_NE(other_dnn, dnn);
  // That thread ended and returned its handle; the next new thread reuses it.
  cudnnHandle_t reused = nullptr;
  std::thread([&] { reused = CudnnHandle(); }).join();
  EXPECT_EQ(reused, other_dnn);
}

TEST(CudaRuntimeTest, WorkspaceGrowsPerStream) {
  SKIP_WITHOUT_GPU();
  const int device = CurrentDevice();
  const int64_t allocated = MemoryStats(device).allocated_bytes;
  // On a thread of its own: workspaces live as long as their thread, and one left on the main
  // thread would keep a small segment in use for the tests after this one (the caching
  // allocator test counts the segments it gets).
  std::thread([&] {
    DeviceGuard device_guard(device);
    EXPECT_EQ(Workspace(0), nullptr);
    void* w = Workspace(1000);
    EXPECT_NE(w, nullptr);
    EXPECT_EQ(Workspace(500), w);  // large enough already
    void* bigger = Workspace(8 << 20);
    EXPECT_NE(bigger, nullptr);
    EXPECT_EQ(Workspace(1000), bigger);
    Stream side;
    StreamGuard guard(side);
    void* on_side = Workspace(1000);
    EXPECT_NE(on_side, bigger);  // another stream gets its own buffer
    TG_CUDA_CHECK(cudaMemsetAsync(on_side, 0, 1000, CurrentStream()));
    Synchronize();
    EXPECT_EQ(MemoryStats(device).allocated_bytes - allocated, (8 << 20) + 1024);
  }).join();
  // The thread returned its buffers when it ended.
  EXPECT_EQ(MemoryStats(device).allocated_bytes, allocated);
}

TEST(CudaRuntimeTest, BlocksFor) {
  SKIP_WITHOUT_GPU();
  int sms = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, CurrentDevice()));
  EXPECT_EQ(BlocksFor(0), 1);
  EXPECT_EQ(BlocksFor(1), 1);
  EXPECT_EQ(BlocksFor(256), 1);
  EXPECT_EQ(BlocksFor(257), 2);
  EXPECT_EQ(BlocksFor(1000, 128), 8);
  EXPECT_EQ(BlocksFor(int64_t{1} << 40), sms * 32);
  EXPECT_EQ(BlocksFor(int64_t{1} << 40, 1024), sms * 8);
  EXPECT_TRUE(ThrowsErrorExactly([] { BlocksFor(10, 0); },
                                 "BlocksFor: 0 threads per block is not in [1, 1024]"));
}

TEST(CudaRuntimeTest, CachingAllocatorOnRealMemory) {
  SKIP_WITHOUT_GPU();
  const int device = CurrentDevice();
  CachingAllocator* alloc = DeviceAllocator(device);
  EXPECT_EQ(alloc, DeviceAllocator(device));
  EXPECT_EQ(alloc->device(), Device::Cuda(device));
  EmptyCache();
  const AllocatorStats base = MemoryStats();

  // The memory is real: write and read it back.
  void* p = alloc->Allocate(3000);
  std::vector<uint8_t> host(3000, 0);
  TG_CUDA_CHECK(cudaMemset(p, 0x5a, 3000));
  TG_CUDA_CHECK(cudaMemcpy(host.data(), p, 3000, cudaMemcpyDeviceToHost));
  EXPECT_EQ(host[0], 0x5a);
  EXPECT_EQ(host[2999], 0x5a);
  AllocatorStats s = MemoryStats(device);
  EXPECT_EQ(s.allocated_bytes - base.allocated_bytes, 3072);
  EXPECT_EQ(s.segment_mallocs - base.segment_mallocs, 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  alloc->Deallocate(p, 3000);

  // A steady loop reuses the cache: no cudaMalloc after the first round.
  const int64_t mallocs = MemoryStats().segment_mallocs;
  for (int i = 0; i < 100; ++i) {
    void* a = alloc->Allocate(1 << 20);
    void* b = alloc->Allocate(40 << 20);
    void* c = alloc->Allocate(123);
    alloc->Deallocate(b, 0);
    alloc->Deallocate(a, 0);
    alloc->Deallocate(c, 0);
  }
  EXPECT_EQ(MemoryStats().segment_mallocs, mallocs + 1);  // the 40 MiB segment, once

  // Out of memory: the cache is emptied, then a clear error; later allocations still work.
  const size_t huge = size_t{1} << 50;
  EXPECT_TRUE(ThrowsError([&] { alloc->Allocate(huge); },
                          absl::StrCat("CUDA out of memory: tried to allocate ", huge, " bytes")));
  EXPECT_EQ(MemoryStats().reserved_bytes, base.reserved_bytes);  // emptied
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  void* q = alloc->Allocate(10);
  EXPECT_NE(q, nullptr);
  alloc->Deallocate(q, 10);
  ResetPeakMemoryStats();
  EXPECT_EQ(MemoryStats().peak_allocated_bytes, MemoryStats().allocated_bytes);
}

}  // namespace
}  // namespace tg::cuda
