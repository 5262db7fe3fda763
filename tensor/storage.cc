#include "tensor/storage.h"

#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace tg {
namespace {

class CpuAllocatorImpl final : public Allocator {
 public:
  void* Allocate(size_t nbytes) override {
    // aligned_alloc wants a multiple of the alignment; never ask for 0 bytes.
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    TG_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes");
    return p;
  }
  void Deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::Cpu(); }
};

}  // namespace

Allocator* CpuAllocator() {
  static CpuAllocatorImpl* allocator = new CpuAllocatorImpl();
  return allocator;
}

Storage::Storage(size_t nbytes, Allocator* allocator)
    : data_(allocator->Allocate(nbytes)), nbytes_(nbytes), allocator_(allocator) {}

Storage::~Storage() { allocator_->Deallocate(data_, nbytes_); }

}  // namespace tg
