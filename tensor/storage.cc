#include "tensor/storage.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace tg {
namespace {

class CpuAllocatorImpl final : public Allocator {
 public:
  // malloc + manual alignment: glibc's memalign takes a slow path for every request, which
  // dominated the cost of ops on small tensors. The original pointer sits just below the
  // aligned block.
  void* Allocate(size_t nbytes) override {
    TG_CHECK(nbytes <= SIZE_MAX - kCpuAlignment - sizeof(void*), "CPU allocator: cannot allocate ",
             nbytes, " bytes");
    void* raw = std::malloc(nbytes + kCpuAlignment + sizeof(void*));
    TG_CHECK(raw != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes");
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw) + sizeof(void*);
    const uintptr_t aligned = (start + kCpuAlignment - 1) & ~uintptr_t{kCpuAlignment - 1};
    reinterpret_cast<void**>(aligned)[-1] = raw;
    return reinterpret_cast<void*>(aligned);
  }
  void Deallocate(void* ptr, size_t) override { std::free(static_cast<void**>(ptr)[-1]); }
  Device device() const override { return Device::Cpu(); }
};

}  // namespace

Allocator* CpuAllocator() {
  static CpuAllocatorImpl* allocator = new CpuAllocatorImpl();
  return allocator;
}

Storage::Storage(size_t nbytes, Allocator* allocator, Device device)
    : data_(allocator->Allocate(nbytes)), nbytes_(nbytes), allocator_(allocator), device_(device) {}

Storage::~Storage() { allocator_->Deallocate(data_, nbytes_); }

}  // namespace tg
