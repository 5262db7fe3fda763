// The CUDA device backend (tensor/device_backend.h): its allocators (the caching allocator of
// runtime.h), copies, fill, streams, preferences and kernel table (every entry of the kernel list
// points at tg::cuda's function of the same name). Registers itself when //tensor/cuda:backend is
// linked (//tensor:devices links it), so that RawTensor::Empty/Zeros/Full, copy_, fill_,
// to(Device), contiguous(), clone(), item() and every op work on CUDA tensors.
//
// Copies (dst and src have one shape; the core broadcast src already):
//   - on one device: the Copy kernel (a cudaMemcpyAsync for same dtype and both contiguous);
//     views of one storage that partly overlap go through a temporary (read all, then write);
//   - host -> device: the host side converts and densifies (src.to(dtype).contiguous()), one
//     cudaMemcpyAsync on the current stream (from pageable memory it returns once the driver has
//     staged the bytes, so the host tensor may change or die right after), then a strided
//     scatter kernel when dst is not contiguous;
//   - device -> host: the device side converts and densifies, one cudaMemcpyAsync, then the
//     stream is synchronised before the host reads (and scatters into a strided dst);
//   - across devices: cudaMemcpyPeerAsync on the destination's current stream, ordered after
//     the source's stream by an event, and the source's stream waits for the copy in turn so
//     that the source's memory is not reused under it.
//
//   // BUILD: deps = ["//tensor:devices"]
//   tg::RawTensor x = tg::RawTensor::Ones({2, 3}, tg::kF16, tg::Device::Cuda(0));
//   double v = x.select(0, 1).select(0, 2).item();   // 1, read back through the host
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "tensor/cuda/amp_kernels.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_fused.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/kernel_table.h"
#include "tensor/tensor.h"

namespace tg::cuda {
namespace {

size_t Bytes(const RawTensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// src converted to `dtype` and densified on its device (the current one); src when it already
// is both.
RawTensor DenseOnDevice(const RawTensor& src, DType dtype) {
  if (src.dtype() == dtype && src.is_contiguous()) return src;
  RawTensor out = RawTensor::Empty(src.shape(), dtype, src.device());
  tg::cuda::Copy(out, src);
  return out;
}

// Whether dst and src share bytes in a way an elementwise copy could read after writing (an
// exact alias, the same elements in place, is fine). Strides are never negative.
bool PartialOverlap(const RawTensor& dst, const RawTensor& src) {
  if (!dst.shares_storage(src)) return false;
  if (dst.raw_data() == src.raw_data() && dst.strides() == src.strides() &&
      dst.dtype() == src.dtype()) {
    return false;
  }
  auto extent = [](const RawTensor& t) {
    int64_t last = 0;
    for (size_t d = 0; d < t.shape().size(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
    const int64_t esize = static_cast<int64_t>(t.element_size());
    const int64_t lo = t.offset() * esize;
    return std::pair<int64_t, int64_t>(lo, lo + (last + 1) * esize);
  };
  const auto [dst_lo, dst_hi] = extent(dst);
  const auto [src_lo, src_hi] = extent(src);
  return dst_lo < src_hi && src_lo < dst_hi;
}

// dst itself when the bytes can land in it directly, else a contiguous tensor like it.
RawTensor Landing(const RawTensor& dst) {
  return dst.is_contiguous() ? dst : RawTensor::Empty(dst.shape(), dst.dtype(), dst.device());
}

void HostToDevice(const RawTensor& dst, const RawTensor& src) {
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const RawTensor host = src.to(dst.dtype()).contiguous();
  const RawTensor landing = Landing(dst);
  TG_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), host.raw_data(), Bytes(dst),
                                cudaMemcpyHostToDevice, CurrentStream(device)));
  if (!landing.shares_storage(dst)) tg::cuda::Copy(dst, landing);
}

void DeviceToHost(const RawTensor& dst, const RawTensor& src) {
  const int device = src.device().index;
  DeviceGuard guard(device);
  const RawTensor dense = DenseOnDevice(src, dst.dtype());
  const RawTensor landing = Landing(dst);
  const cudaStream_t stream = CurrentStream(device);
  TG_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), dense.raw_data(), Bytes(dst),
                                cudaMemcpyDeviceToHost, stream));
  SynchronizeStream(stream);
  if (!landing.shares_storage(dst)) CopyInto(dst, landing);
}

void AcrossDevices(const RawTensor& dst, const RawTensor& src) {
  const int from = src.device().index, to = dst.device().index;
  RawTensor dense;
  std::unique_ptr<Event> source_ready, copied;  // each created on the device it is recorded on
  {
    DeviceGuard guard(from);
    dense = DenseOnDevice(src, dst.dtype());
    source_ready = std::make_unique<Event>();
    source_ready->Record(CurrentStream(from));
  }
  {
    DeviceGuard guard(to);
    const cudaStream_t stream = CurrentStream(to);
    const RawTensor landing = Landing(dst);
    source_ready->Block(stream);
    TG_CUDA_CHECK(
        cudaMemcpyPeerAsync(landing.raw_data(), to, dense.raw_data(), from, Bytes(dst), stream));
    if (!landing.shares_storage(dst)) tg::cuda::Copy(dst, landing);
    copied = std::make_unique<Event>();
    copied->Record(stream);
  }
  // Later work on the source's stream (which may reuse `dense` or overwrite src) waits for the
  // copy to have read them.
  DeviceGuard guard(from);
  copied->Block(CurrentStream(from));
}

KernelTable MakeKernelTable() {
  KernelTable table;
  // Every entry points at tg::cuda's function of the same name (a missing one does not link).
#define TG_KERNEL(ret, name, params) table.name = &name;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  return table;
}

// CUDA's attention kernels were checked on a GPU with contiguous [B, H, T, D] tensors: the output
// and gradients are allocated so, and grad_out is given contiguous.
constexpr DevicePreferences kCudaPreferences = {
    DevicePreferences::AttentionLayout::kHeadsMajor,
    /*attention_grad_out_contiguous=*/true,
};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend() : DeviceBackend(DeviceType::kCuda) {}

  int DeviceCount() override { return tg::cuda::DeviceCount(); }

  Allocator* allocator(int index) override {
    const int count = DeviceCount();
    TG_CHECK(count > 0,
             "no CUDA device is available (DeviceCount() = 0: no CUDA driver or no GPU)");
    TG_CHECK(index >= 0 && index < count, "cuda:", index,
             " does not exist (DeviceCount() = ", count, ")");
    return DeviceAllocator(index);
  }

  void Copy(const RawTensor& dst, const RawTensor& src) override {
    if (dst.numel() == 0) return;
    const Device to = dst.device(), from = src.device();
    if (to.is_cuda() && from.is_cuda()) {
      if (to.index == from.index) {
        DeviceGuard guard(to.index);
        if (PartialOverlap(dst, src)) {
          // Read everything before writing anything, as the CPU's memmove would.
          const RawTensor staged = RawTensor::Empty(src.shape(), dst.dtype(), from);
          tg::cuda::Copy(staged, src);
          tg::cuda::Copy(dst, staged);
        } else {
          tg::cuda::Copy(dst, src);
        }
      } else {
        AcrossDevices(dst, src);
      }
    } else if (to.is_cuda()) {
      HostToDevice(dst, src);
    } else {
      DeviceToHost(dst, src);
    }
  }

  void Fill(const RawTensor& dst, double value) override {
    if (dst.numel() == 0) return;
    DeviceGuard guard(dst.device().index);
    tg::cuda::Fill(dst, value);  // a memset where every element's bytes are equal
  }

  void Synchronize(int index) override { tg::cuda::Synchronize(index); }

  void* CurrentStream(int index) override {
    return static_cast<void*>(tg::cuda::CurrentStream(index));
  }
};

[[maybe_unused]] const bool registered = [] {
  RegisterDeviceBackend(new CudaBackend());
  RegisterKernels(DeviceType::kCuda, MakeKernelTable(), kCudaPreferences);
  return true;
}();

}  // namespace
}  // namespace tg::cuda
