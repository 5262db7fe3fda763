#include "tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/error.h"

namespace tg::cuda {
namespace {

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.2f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

std::string AllocatorStats::ToString() const {
  return absl::StrCat("allocated ", Mib(allocated_bytes), " (peak ", Mib(peak_allocated_bytes),
                      "), reserved ", Mib(reserved_bytes), " (peak ", Mib(peak_reserved_bytes),
                      "), ", segments, " segments");
}

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<SegmentSource> source)
    : device_(device), source_(std::move(source)) {}

CachingAllocator::~CachingAllocator() {
  // Walk every segment from its first block (blocks still handed out included) and give it back.
  absl::MutexLock lock(&mu_);
  // Collect the heads first: the walks below delete the other blocks.
  std::vector<Block*> heads;
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (Block* b : *pool) {
      if (b->prev == nullptr) heads.push_back(b);
    }
  }
  for (const auto& [ptr, b] : allocated_) {
    if (b->prev == nullptr) heads.push_back(b);
  }
  for (Block* b : heads) {
    size_t size = 0;
    for (Block* it = b; it != nullptr;) {
      size += it->size;
      Block* next = it->next;
      if (it != b) delete it;
      it = next;
    }
    source_->Free(b->ptr, size);
    delete b;
  }
}

size_t CachingAllocator::RoundSize(size_t nbytes) {
  // Also leaves room for SegmentSize's rounding, so no size computed from it overflows.
  TG_CHECK(nbytes <= SIZE_MAX - kLargeSegmentRound, "CUDA caching allocator: cannot allocate ",
           nbytes, " bytes");
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::SegmentSize(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  return (rounded + kLargeSegmentRound - 1) / kLargeSegmentRound * kLargeSegmentRound;
}

void* CachingAllocator::Allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t size = RoundSize(nbytes);
  const bool small = size <= kSmallSize;
  absl::MutexLock lock(&mu_);
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* block = FindFree(pool, size);
  if (block == nullptr) {
    block = NewSegment(size, small);
    if (block == nullptr) {
      // Cached but unused segments may be what the device lacks: give them back and retry once.
      ++stats_.oom_retries;
      EmptyCacheLocked();
      block = NewSegment(size, small);
      if (block == nullptr) ThrowOutOfMemory(nbytes, size, SegmentSize(size));
    }
  } else {
    pool.erase(block);
  }
  // Split off the rest when it is worth keeping as a block of its own.
  const size_t rest = block->size - size;
  if (small ? rest >= kMinBlockSize : rest > kSmallSize) {
    Block* tail = new Block{block->ptr + size, rest, small};
    tail->prev = block;
    tail->next = block->next;
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = size;
    pool.insert(tail);
  }
  block->allocated = true;
  allocated_.emplace(block->ptr, block);
  stats_.allocated_bytes += static_cast<int64_t>(block->size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.active_blocks;
  return block->ptr;
}

void CachingAllocator::Deallocate(void* ptr, size_t) {
  if (ptr == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = allocated_.find(ptr);
  TG_CHECK(it != allocated_.end(), "CUDA caching allocator of ", device_.ToString(),
           ": freeing a pointer it did not allocate");
  Block* block = it->second;
  allocated_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= static_cast<int64_t>(block->size);
  --stats_.active_blocks;
  Pool& pool = block->small ? small_pool_ : large_pool_;
  // Merge with free neighbours; the survivor is the block with the lowest address.
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

CachingAllocator::Block* CachingAllocator::FindFree(Pool& pool, size_t size) {
  Block key{nullptr, size, false};
  auto it = pool.lower_bound(&key);
  return it == pool.end() ? nullptr : *it;
}

CachingAllocator::Block* CachingAllocator::NewSegment(size_t size, bool small) {
  const size_t segment = SegmentSize(size);
  void* ptr = source_->Malloc(segment);
  if (ptr == nullptr) return nullptr;
  ++stats_.segment_mallocs;
  ++stats_.segments;
  stats_.reserved_bytes += static_cast<int64_t>(segment);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  return new Block{static_cast<char*>(ptr), segment, small};
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CachingAllocator::ResetPeakStats() {
  absl::MutexLock lock(&mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      // A free block without neighbours is a whole segment with nothing handed out.
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      source_->Free(b->ptr, b->size);
      ++stats_.segment_frees;
      --stats_.segments;
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      delete b;
    }
  }
}

void CachingAllocator::ThrowOutOfMemory(size_t nbytes, size_t rounded, size_t segment) const {
  throw Error(absl::StrCat(
      "CUDA out of memory: tried to allocate ", nbytes, " bytes (", Mib(nbytes), "; a segment of ",
      segment, " bytes for the rounded size ", rounded, ") on ", device_.ToString(), "; ",
      stats_.allocated_bytes, " bytes (", Mib(stats_.allocated_bytes),
      ") are allocated to tensors and ", stats_.reserved_bytes, " bytes (",
      Mib(stats_.reserved_bytes), ") reserved by the caching allocator after emptying its cache"));
}

}  // namespace tg::cuda
