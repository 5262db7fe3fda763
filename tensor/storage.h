// Storage: one allocation that tensors (and their views) share, and the Allocator interface that
// provides it. Each device backend (tensor/device_backend.h) has its allocators: the CPU's returns
// 64-byte-aligned memory (a cache line, and the widest AVX-512 load), CUDA's is a caching device
// allocator behind the same interface.
//
//   auto s = std::make_shared<tg::Storage>(1024, tg::CpuAllocator());
//   std::memset(s->data(), 0, s->nbytes());
#ifndef TAPEGRAD_TENSOR_STORAGE_H_
#define TAPEGRAD_TENSOR_STORAGE_H_

#include <cstddef>
#include <cstdint>

#include "tensor/device.h"

namespace tg {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` bytes (nbytes may be 0); throws tg::Error when it cannot.
  virtual void* Allocate(size_t nbytes) = 0;
  virtual void Deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
};

inline constexpr size_t kCpuAlignment = 64;

// The process-wide CPU allocator (stateless; safe from any thread): the CPU backend's
// (tensor/cpu/backend.cc), found through the registry.
Allocator* CpuAllocator();

class Storage {
 public:
  Storage(size_t nbytes, Allocator* allocator) : Storage(nbytes, allocator, allocator->device()) {}
  // `device` must be allocator->device(); callers that know it save a virtual call.
  Storage(size_t nbytes, Allocator* allocator, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  // Cached at construction: tensors ask for their device on every op, and a virtual call there
  // would cost the CPU fast paths.
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }

  // Bumped by every in-place op of the autograd layer on any view of this storage, so that a
  // tensor saved for backward can tell it was overwritten (all views share one counter).
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  uint64_t version_ = 0;
  void* data_;
  size_t nbytes_;
  Allocator* allocator_;
  Device device_;
};

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_STORAGE_H_
