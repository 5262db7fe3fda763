// CachingAllocator: a tg::Allocator that keeps device memory it got from a SegmentSource and
// hands it out again, so that the steady state of a training loop never calls cudaMalloc or
// cudaFree (each of which synchronises the device). Pure C++: the caching logic knows nothing
// about CUDA, and tests drive it on the CPU with a fake SegmentSource. The process-wide
// allocator of each device (cudaMalloc/cudaFree behind a DeviceGuard) is
// tg::cuda::DeviceAllocator(device) in tensor/cuda/runtime.h.
//
// Design (ours; the idea is PyTorch's CUDACachingAllocator, much simplified):
//   - Request sizes are rounded up to a multiple of 512 bytes; a request of 0 bytes returns
//     nullptr and touches nothing.
//   - Two pools. Small requests (<= 1 MiB) are cut from 2 MiB segments; a large request gets a
//     segment of its size rounded up to 2 MiB. A segment serves only its own pool.
//   - Allocation takes the best fit (the smallest free block that is large enough, the lowest
//     address among equals) from a size-ordered set, and splits it when the rest is worth
//     keeping: >= 512 bytes in the small pool, > 1 MiB in the large pool (a smaller rest stays
//     inside the block, so one large segment is not cut into slivers).
//   - A freed block merges with its free neighbours in the same segment and goes back to the
//     pool at once. That is correct under tapegrad's single-stream model: all work on a device
//     is ordered on the stream it was allocated for, so later work that reuses the block runs
//     after the work that used it. Memory used on another stream must be ordered by events
//     (tg::cuda::Event) before it is freed; record_stream-like tracking comes with the NCCL
//     communication stream.
//   - When the source runs out of memory, every fully free segment is released (EmptyCache) and
//     the request retried once; then tg::Error names the request, the device and the allocated
//     and reserved bytes.
//   - Thread-safe: one mutex per allocator.
//
//   class FakeSource : public tg::cuda::SegmentSource { ... };
//   tg::cuda::CachingAllocator alloc(tg::Device::Cuda(0), std::make_unique<FakeSource>());
//   void* p = alloc.Allocate(1000);          // a 1024-byte block of a new 2 MiB segment
//   alloc.Deallocate(p, 1000);               // back to the pool; the segment stays reserved
//   alloc.stats().reserved_bytes;            // 2097152
#ifndef TAPEGRAD_TENSOR_CUDA_CACHING_ALLOCATOR_H_
#define TAPEGRAD_TENSOR_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tensor/device.h"
#include "tensor/storage.h"

namespace tg::cuda {

// Where segments come from (cudaMalloc for a real device, a fake in tests).
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // `nbytes` (> 0) bytes, or nullptr when out of memory; throws tg::Error on other failures.
  virtual void* Malloc(size_t nbytes) = 0;
  virtual void Free(void* ptr, size_t nbytes) = 0;
};

// Byte counts of one allocator. "allocated" counts the blocks handed out (their rounded sizes,
// including a rest too small to split off); "reserved" counts the segments held.
struct AllocatorStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t active_blocks = 0;    // blocks handed out now
  int64_t segments = 0;         // segments held now
  int64_t segment_mallocs = 0;  // successful SegmentSource::Malloc calls
  int64_t segment_frees = 0;    // SegmentSource::Free calls
  int64_t oom_retries = 0;      // failed Mallocs that emptied the cache and retried

  // "allocated 1.50 MiB (peak 2.00 MiB), reserved 4.00 MiB (peak 4.00 MiB), 3 segments"
  std::string ToString() const;
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kMinBlockSize = 512;           // rounding unit and smallest block
  static constexpr size_t kSmallSize = 1 << 20;          // largest request of the small pool
  static constexpr size_t kSmallSegment = 2 << 20;       // segment size of the small pool
  static constexpr size_t kLargeSegmentRound = 2 << 20;  // large segments are multiples of it

  CachingAllocator(Device device, std::unique_ptr<SegmentSource> source);
  // Returns every segment to the source; pointers still handed out become invalid (the
  // process-wide device allocators are never destroyed).
  ~CachingAllocator() override;

  // Throws tg::Error when the source has no memory even after EmptyCache().
  void* Allocate(size_t nbytes) override;
  // `ptr` must come from Allocate (nullptr is ignored); the size argument is not needed.
  void Deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return device_; }

  AllocatorStats stats() const;
  // Peaks restart from the current values.
  void ResetPeakStats();
  // Releases every segment none of whose memory is handed out.
  void EmptyCache();

  // nbytes rounded up to kMinBlockSize (0 stays 0); throws when that overflows.
  static size_t RoundSize(size_t nbytes);
  // The segment a rounded request of a new segment gets.
  static size_t SegmentSize(size_t rounded);

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small;  // which pool the block's segment belongs to
    bool allocated = false;
    Block* prev = nullptr;  // neighbours inside the segment, by address
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BySizeThenAddress>;

  Block* FindFree(Pool& pool, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* NewSegment(size_t size, bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[noreturn]] void ThrowOutOfMemory(size_t nbytes, size_t rounded, size_t segment) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Device device_;
  const std::unique_ptr<SegmentSource> source_;
  mutable absl::Mutex mu_;
  Pool small_pool_ ABSL_GUARDED_BY(mu_);
  Pool large_pool_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<void*, Block*> allocated_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_CACHING_ALLOCATOR_H_
