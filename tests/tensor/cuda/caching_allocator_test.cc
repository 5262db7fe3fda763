// The caching device allocator's bookkeeping on the CPU: a fake SegmentSource hands out made-up
// addresses (never dereferenced), so every block offset, split, merge and byte count is exact.
#include "tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tests/tensor/throws.h"

namespace tg::cuda {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

constexpr size_t kMiB = 1 << 20;

// What the fake source did, shared with the test so it can be read after the allocator is gone.
struct SourceLog {
  size_t capacity = SIZE_MAX;  // Malloc fails when live bytes would exceed it
  int fail_next = 0;           // Mallocs that fail whatever the capacity
  size_t live = 0;
  int mallocs = 0;  // successful
  int frees = 0;
  std::map<uintptr_t, size_t> segments;  // base -> size
};

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(std::shared_ptr<SourceLog> log) : log_(std::move(log)) {}

  void* Malloc(size_t nbytes) override {
    if (log_->fail_next > 0) {
      --log_->fail_next;
      return nullptr;
    }
    if (nbytes > log_->capacity - log_->live) return nullptr;
    // Segments lie 1 TiB apart, so no two touch and offsets inside one are easy to read.
    const uintptr_t base = (uintptr_t{1} << 44) + (uintptr_t{1} << 40) * next_++;
    log_->segments[base] = nbytes;
    log_->live += nbytes;
    ++log_->mallocs;
    return reinterpret_cast<void*>(base);
  }

  void Free(void* ptr, size_t nbytes) override {
    auto it = log_->segments.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, log_->segments.end()) << "freeing an unknown segment";
    EXPECT_EQ(it->second, nbytes) << "segment freed with another size";
    log_->live -= it->second;
    log_->segments.erase(it);
    ++log_->frees;
  }

 private:
  std::shared_ptr<SourceLog> log_;
  uintptr_t next_ = 0;
};

class CachingAllocatorTest : public ::testing::Test {
 protected:
  CachingAllocatorTest()
      : log_(std::make_shared<SourceLog>()),
        alloc_(std::make_unique<CachingAllocator>(Device::Cuda(0),
                                                  std::make_unique<FakeSource>(log_))) {}

  // Byte offset of p inside the segment with base `base`.
  static int64_t Offset(void* p, void* base) {
    return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base));
  }

  std::shared_ptr<SourceLog> log_;
  std::unique_ptr<CachingAllocator> alloc_;
};

TEST(CachingAllocatorSizes, RoundAndSegment) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 0u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1000000), 1000448u);
  EXPECT_EQ(CachingAllocator::SegmentSize(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB), 2 * kMiB);        // the largest small request
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB + 512), 2 * kMiB);  // the smallest large one
  EXPECT_EQ(CachingAllocator::SegmentSize(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(2 * kMiB + 512), 4 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(5 * kMiB), 6 * kMiB);
  EXPECT_TRUE(ThrowsErrorExactly([] { CachingAllocator::RoundSize(SIZE_MAX); },
                                 "CUDA caching allocator: cannot allocate 18446744073709551615 "
                                 "bytes"));
}

TEST_F(CachingAllocatorTest, ZeroBytesIsNullAndFree) {
  EXPECT_EQ(alloc_->Allocate(0), nullptr);
  alloc_->Deallocate(nullptr, 0);
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.segment_mallocs, 0);
  EXPECT_EQ(alloc_->device(), Device::Cuda(0));
}

TEST_F(CachingAllocatorTest, SmallRequestsAreCutFromOneSegment) {
  void* a = alloc_->Allocate(1000);  // 1024
  void* b = alloc_->Allocate(1);     // 512
  void* c = alloc_->Allocate(512);   // 512
  EXPECT_EQ(Offset(b, a), 1024);
  EXPECT_EQ(Offset(c, a), 1536);
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.reserved_bytes, int64_t{2 * kMiB});
  EXPECT_EQ(s.active_blocks, 3);
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.segment_mallocs, 1);
  ASSERT_EQ(log_->segments.size(), 1u);
  EXPECT_EQ(log_->segments.begin()->second, 2 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a), log_->segments.begin()->first);

  // A freed hole is reused by a request that fits it exactly (best fit beats the large tail).
  alloc_->Deallocate(b, 1);
  EXPECT_EQ(alloc_->stats().allocated_bytes, 1536);
  void* b2 = alloc_->Allocate(300);
  EXPECT_EQ(b2, b);

  // a and b2 merge into one 1536-byte hole at the segment start; c stays where it is.
  alloc_->Deallocate(a, 1000);
  alloc_->Deallocate(b2, 300);
  void* d = alloc_->Allocate(1536);
  EXPECT_EQ(d, a);
  alloc_->Deallocate(d, 1536);

  // With c freed too everything merges back into the whole segment, which EmptyCache releases.
  alloc_->Deallocate(c, 512);
  s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.active_blocks, 0);
  EXPECT_EQ(s.reserved_bytes, int64_t{2 * kMiB});
  alloc_->EmptyCache();
  s = alloc_->stats();
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.segments, 0);
  EXPECT_EQ(s.segment_frees, 1);
  EXPECT_EQ(log_->live, 0u);
}

TEST_F(CachingAllocatorTest, MergesWithBothNeighbours) {
  void* a = alloc_->Allocate(512);
  void* b = alloc_->Allocate(512);
  void* c = alloc_->Allocate(512);
  void* keep = alloc_->Allocate(512);  // keeps the tail apart from c's hole
  alloc_->Deallocate(a, 512);
  alloc_->Deallocate(c, 512);
  alloc_->Deallocate(b, 512);  // joins a and c: one 1536-byte hole
  void* big = alloc_->Allocate(1536);
  EXPECT_EQ(big, a);
  EXPECT_EQ(alloc_->stats().segment_mallocs, 1);
  alloc_->Deallocate(big, 1536);
  alloc_->Deallocate(keep, 512);
  alloc_->EmptyCache();
  EXPECT_EQ(alloc_->stats().segments, 0);
}

TEST_F(CachingAllocatorTest, BestFitPicksTheSmallestHoleThatFits) {
  void* h1 = alloc_->Allocate(4096);  // @0
  void* s1 = alloc_->Allocate(512);   // @4096
  void* h2 = alloc_->Allocate(1024);  // @4608
  void* s2 = alloc_->Allocate(512);   // @5632
  void* h3 = alloc_->Allocate(2048);  // @6144
  void* s3 = alloc_->Allocate(512);   // @8192
  EXPECT_EQ(Offset(s3, h1), 8192);
  alloc_->Deallocate(h1, 4096);
  alloc_->Deallocate(h2, 1024);
  alloc_->Deallocate(h3, 2048);
  void* p = alloc_->Allocate(1000);
  EXPECT_EQ(Offset(p, h1), 4608);  // the 1024 hole
  void* q = alloc_->Allocate(2000);
  EXPECT_EQ(Offset(q, h1), 6144);  // the 2048 hole
  void* r = alloc_->Allocate(3000);
  EXPECT_EQ(Offset(r, h1), 0);  // 3072 of the 4096 hole; the last 1024 become a hole
  void* t = alloc_->Allocate(1024);
  EXPECT_EQ(Offset(t, h1), 3072);
  const AllocatorStats st = alloc_->stats();
  EXPECT_EQ(st.allocated_bytes, 512 * 3 + 1024 + 2048 + 3072 + 1024);
  EXPECT_EQ(st.segment_mallocs, 1);
  for (void* x : {s1, s2, s3, p, q, r, t}) alloc_->Deallocate(x, 0);
  EXPECT_EQ(alloc_->stats().allocated_bytes, 0);
}

TEST_F(CachingAllocatorTest, LargeRequestsGetTheirOwnRoundedSegments) {
  void* a = alloc_->Allocate(3 * kMiB);  // a 4 MiB segment; the 1 MiB rest is not split off
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, int64_t{4 * kMiB});
  EXPECT_EQ(s.reserved_bytes, int64_t{4 * kMiB});
  void* b = alloc_->Allocate(kMiB + 1);  // large: a 2 MiB segment
  s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, int64_t{6 * kMiB});
  EXPECT_EQ(s.reserved_bytes, int64_t{6 * kMiB});
  EXPECT_EQ(s.segment_mallocs, 2);
  alloc_->Deallocate(a, 0);
  alloc_->Deallocate(b, 0);

  void* c = alloc_->Allocate(5 * kMiB);  // a new 6 MiB segment: no free block is large enough
  EXPECT_EQ(alloc_->stats().segment_mallocs, 3);
  alloc_->Deallocate(c, 0);
  // 2 MiB: best fit is b's 2 MiB segment, not a cut of the 6 MiB one.
  void* d = alloc_->Allocate(2 * kMiB);
  EXPECT_EQ(d, b);
  // 2.5 MiB rounds to 2.5 MiB: best fit is a's 4 MiB block, whose 1.5 MiB rest is split off.
  void* e = alloc_->Allocate(5 * kMiB / 2);
  EXPECT_EQ(e, a);
  void* f = alloc_->Allocate(3 * kMiB / 2);
  EXPECT_EQ(Offset(f, a), int64_t{5 * kMiB / 2});
  s = alloc_->stats();
  EXPECT_EQ(s.segment_mallocs, 3);
  EXPECT_EQ(s.allocated_bytes, int64_t{2 * kMiB + 4 * kMiB});
  EXPECT_EQ(s.reserved_bytes, int64_t{12 * kMiB});

  // Small requests never take memory from the large pool, even when it has free blocks.
  void* small = alloc_->Allocate(100);
  EXPECT_EQ(alloc_->stats().segment_mallocs, 4);
  EXPECT_EQ(alloc_->stats().reserved_bytes, int64_t{14 * kMiB});
  for (void* x : {d, e, f, small}) alloc_->Deallocate(x, 0);
}

TEST_F(CachingAllocatorTest, SteadyLoopNeedsNoNewSegments) {
  const std::vector<size_t> sizes = {1000, 300000, 3 * kMiB, 5000, 12 * kMiB, 700, kMiB, 64};
  std::mt19937 rng(7);
  AllocatorStats after_first;
  for (int step = 0; step < 200; ++step) {
    std::vector<std::pair<void*, size_t>> live;
    for (size_t n : sizes) live.emplace_back(alloc_->Allocate(n), n);
    // Free some in the middle of the step and allocate again (activations and temporaries).
    for (int i = 0; i < 3; ++i) {
      alloc_->Deallocate(live[i * 2].first, live[i * 2].second);
      live[i * 2].first = alloc_->Allocate(live[i * 2].second);
    }
    std::shuffle(live.begin(), live.end(), rng);
    for (auto [p, n] : live) alloc_->Deallocate(p, n);
    if (step == 0) after_first = alloc_->stats();
  }
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.segment_mallocs, after_first.segment_mallocs);
  EXPECT_EQ(s.segment_frees, 0);
  EXPECT_EQ(s.reserved_bytes, after_first.reserved_bytes);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.active_blocks, 0);
}

TEST_F(CachingAllocatorTest, StatsAndPeaks) {
  void* a = alloc_->Allocate(3 * kMiB);  // 4 MiB segment, 4 MiB allocated
  void* b = alloc_->Allocate(1000);      // 2 MiB segment, 1024 allocated
  alloc_->Deallocate(a, 0);
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.peak_allocated_bytes, int64_t{4 * kMiB + 1024});
  EXPECT_EQ(s.reserved_bytes, int64_t{6 * kMiB});
  EXPECT_EQ(s.peak_reserved_bytes, int64_t{6 * kMiB});
  EXPECT_EQ(s.active_blocks, 1);
  EXPECT_EQ(s.segments, 2);

  alloc_->EmptyCache();  // the 4 MiB segment is free; b's is not
  s = alloc_->stats();
  EXPECT_EQ(s.reserved_bytes, int64_t{2 * kMiB});
  EXPECT_EQ(s.peak_reserved_bytes, int64_t{6 * kMiB});
  EXPECT_EQ(s.segment_frees, 1);

  alloc_->ResetPeakStats();
  s = alloc_->stats();
  EXPECT_EQ(s.peak_allocated_bytes, 1024);
  EXPECT_EQ(s.peak_reserved_bytes, int64_t{2 * kMiB});
  void* c = alloc_->Allocate(2048);
  alloc_->Deallocate(c, 0);
  s = alloc_->stats();
  EXPECT_EQ(s.peak_allocated_bytes, 1024 + 2048);
  EXPECT_EQ(s.segment_mallocs, 2);
  EXPECT_EQ(s.ToString(),
            "allocated 0.00 MiB (peak 0.00 MiB), reserved 2.00 MiB (peak 2.00 MiB), "
            "1 segments");
  alloc_->Deallocate(b, 0);
}

TEST_F(CachingAllocatorTest, EmptyCacheReleasesOnlyFullyFreeSegments) {
  // 1 MiB requests are small: two share each 2 MiB segment.
  void* a1 = alloc_->Allocate(kMiB);
  void* a2 = alloc_->Allocate(kMiB);
  void* a3 = alloc_->Allocate(kMiB);
  void* a4 = alloc_->Allocate(kMiB);
  void* big = alloc_->Allocate(8 * kMiB);
  EXPECT_EQ(Offset(a2, a1), int64_t{kMiB});
  EXPECT_EQ(Offset(a4, a3), int64_t{kMiB});
  EXPECT_EQ(alloc_->stats().segments, 3);
  alloc_->Deallocate(a1, 0);  // its segment still holds a2
  alloc_->Deallocate(a3, 0);
  alloc_->Deallocate(a4, 0);
  alloc_->Deallocate(big, 0);
  alloc_->EmptyCache();
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(s.segment_frees, 2);
  EXPECT_EQ(s.reserved_bytes, int64_t{2 * kMiB});
  EXPECT_EQ(s.allocated_bytes, int64_t{kMiB});
  ASSERT_EQ(log_->segments.size(), 1u);
  EXPECT_EQ(log_->segments.begin()->first, reinterpret_cast<uintptr_t>(a1));
  // The surviving segment still works: a1's half is reused.
  void* again = alloc_->Allocate(kMiB);
  EXPECT_EQ(again, a1);
  alloc_->Deallocate(again, 0);
  alloc_->Deallocate(a2, 0);
  alloc_->EmptyCache();
  EXPECT_EQ(alloc_->stats().segments, 0);
  EXPECT_EQ(log_->live, 0u);
}

TEST_F(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  log_->capacity = 4 * kMiB;
  void* small = alloc_->Allocate(1000);  // 2 MiB segment
  alloc_->Deallocate(small, 0);          // cached, unused
  // 3 MiB needs a 4 MiB segment: 2 + 4 > 4 fails, the cached 2 MiB goes back, the retry fits.
  void* big = alloc_->Allocate(3 * kMiB);
  ASSERT_NE(big, nullptr);
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.oom_retries, 1);
  EXPECT_EQ(s.segment_mallocs, 2);
  EXPECT_EQ(s.segment_frees, 1);
  EXPECT_EQ(s.reserved_bytes, int64_t{4 * kMiB});
  EXPECT_EQ(s.peak_reserved_bytes, int64_t{4 * kMiB});
  alloc_->Deallocate(big, 0);
}

TEST_F(CachingAllocatorTest, TransientFailureIsRetriedOnce) {
  log_->fail_next = 1;
  void* p = alloc_->Allocate(512);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(alloc_->stats().oom_retries, 1);
  EXPECT_EQ(alloc_->stats().segment_mallocs, 1);
  alloc_->Deallocate(p, 0);
}

TEST_F(CachingAllocatorTest, OutOfMemoryErrorNamesSizesAndDevice) {
  void* held = alloc_->Allocate(1000);  // keeps its 2 MiB segment reserved
  log_->capacity = 2 * kMiB;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { alloc_->Allocate(3000000); },
      "CUDA out of memory: tried to allocate 3000000 bytes (2.86 MiB; a segment of 4194304 bytes "
      "for the rounded size 3000320) on cuda:0; 1024 bytes (0.00 MiB) are allocated to tensors "
      "and 2097152 bytes (2.00 MiB) reserved by the caching allocator after emptying its cache"));
  // Nothing changed but the retry count; the allocator keeps working.
  AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.oom_retries, 1);
  EXPECT_EQ(s.allocated_bytes, 1024);
  EXPECT_EQ(s.reserved_bytes, int64_t{2 * kMiB});
  void* more = alloc_->Allocate(1000);
  EXPECT_EQ(Offset(more, held), 1024);
  alloc_->Deallocate(more, 0);
  alloc_->Deallocate(held, 0);
}

TEST_F(CachingAllocatorTest, FreeingAForeignPointerThrows) {
  int x = 0;
  EXPECT_TRUE(ThrowsErrorExactly([&] { alloc_->Deallocate(&x, 4); },
                                 "CUDA caching allocator of cuda:0: freeing a pointer it did not "
                                 "allocate"));
}

TEST_F(CachingAllocatorTest, DestructorReturnsEverySegment) {
  alloc_->Allocate(1000);  // still handed out
  void* p = alloc_->Allocate(5000);
  alloc_->Allocate(7 * kMiB);
  alloc_->Deallocate(p, 0);
  EXPECT_EQ(log_->segments.size(), 2u);
  alloc_.reset();
  EXPECT_EQ(log_->frees, 2);
  EXPECT_EQ(log_->live, 0u);
}

TEST_F(CachingAllocatorTest, ThreadsShareOneAllocator) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<size_t> size(1, 3 * kMiB);
      std::vector<std::pair<void*, size_t>> live;
      for (int i = 0; i < 2000; ++i) {
        if (live.size() < 8 && rng() % 2 == 0) {
          const size_t n = size(rng);
          live.emplace_back(alloc_->Allocate(n), n);
        } else if (!live.empty()) {
          alloc_->Deallocate(live.back().first, live.back().second);
          live.pop_back();
        }
      }
      for (auto [p, n] : live) alloc_->Deallocate(p, n);
    });
  }
  for (std::thread& t : threads) t.join();
  const AllocatorStats s = alloc_->stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.active_blocks, 0);
  alloc_->EmptyCache();
  EXPECT_EQ(alloc_->stats().reserved_bytes, 0);
  EXPECT_EQ(log_->live, 0u);
}

}  // namespace
}  // namespace tg::cuda
