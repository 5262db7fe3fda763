#include "tensor/storage.h"

#include "tensor/device_backend.h"

namespace tg {

Allocator* CpuAllocator() { return GetDeviceBackend(DeviceType::kCpu)->allocator(0); }

Storage::Storage(size_t nbytes, Allocator* allocator, Device device)
    : data_(allocator->Allocate(nbytes)), nbytes_(nbytes), allocator_(allocator), device_(device) {}

Storage::~Storage() { allocator_->Deallocate(data_, nbytes_); }

}  // namespace tg
