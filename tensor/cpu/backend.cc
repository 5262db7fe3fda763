// The CPU's device backend (tensor/device_backend.h), registered like every other device when
// //tensor/cpu:backend is linked (//tensor:core links it: the CPU is the host every binary has):
// its allocator (64-byte-aligned host memory), copies and fill between CPU tensors (threaded,
// with the vectorised f32 <-> f16/bf16 conversions), its kernel table (tensor/cpu/kernels.h)
// and its preferences.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/kernel_table.h"
#include "tensor/strided_loop.h"
#include "tensor/tensor.h"

namespace tg::cpu {
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

// n contiguous values between f32 and f16/bf16 with the vectorised conversions (the scalar ones'
// results); false for other pairs.
template <typename Dst, typename Src>
bool ConvertContiguous(const char* src, char* dst, int64_t n) {
  const auto* f = reinterpret_cast<const float*>(src);
  const auto* bits = reinterpret_cast<const uint16_t*>(src);
  if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, Half>) {
    F32ToHalfBits(f, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, BFloat16>) {
    F32ToBFloat16Bits(f, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<Src, Half> && std::is_same_v<Dst, float>) {
    HalfBitsToF32(bits, reinterpret_cast<float*>(dst), n);
  } else if constexpr (std::is_same_v<Src, BFloat16> && std::is_same_v<Dst, float>) {
    BFloat16BitsToF32(bits, reinterpret_cast<float*>(dst), n);
  } else {
    return false;
  }
  return true;
}

template <typename Dst, typename Src>
void CopyRows(const Shape& shape, char* dst, const Shape& dst_strides, const char* src,
              const Shape& src_strides) {
  ForEachRow<2>(shape, {dst, const_cast<char*>(src)}, {dst_strides, src_strides},
                [](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> step) {
                  const bool unit = step[0] == sizeof(Dst) && step[1] == sizeof(Src);
                  if (std::is_same_v<Dst, Src> && unit) {
                    std::memmove(p[0], p[1], static_cast<size_t>(n) * sizeof(Dst));
                    return;
                  }
                  if (unit && ConvertContiguous<Dst, Src>(p[1], p[0], n)) return;
                  for (int64_t i = 0; i < n; ++i) {
                    Src v;
                    std::memcpy(&v, p[1] + i * step[1], sizeof(Src));
                    const Dst out = Convert<Dst>(v);
                    std::memcpy(p[0] + i * step[0], &out, sizeof(Dst));
                  }
                });
}

// dst = src (one shape, src's stride-0 dims broadcast), both in host memory.
void HostCopy(const RawTensor& dst, const RawTensor& src) {
  const Shape dst_strides = BroadcastByteStrides(dst, dst.shape());
  const Shape src_strides = BroadcastByteStrides(src, dst.shape());
  // Large copies between two storages split their first dimension over the threads (each element
  // is copied once, so the result does not depend on the split); a copy within one storage, which
  // may overlap itself, stays on one thread.
  const Shape& shape = dst.shape();
  const int64_t outer = shape.empty() || dst.storage() == src.storage() ? 1 : shape[0];
  const int64_t inner = outer == 0 ? 0 : dst.numel() / outer;
  VisitStorage(dst.dtype(), [&](auto dst_tag) {
    VisitStorage(src.dtype(), [&](auto src_tag) {
      ParallelFor(outer, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, inner)),
                  [&](int64_t begin, int64_t end) {
                    Shape part = shape;
                    const bool split = outer > 1;
                    if (split) part[0] = end - begin;
                    const int64_t d0 = split ? dst_strides[0] : 0;
                    const int64_t s0 = split ? src_strides[0] : 0;
                    CopyRows<decltype(dst_tag), decltype(src_tag)>(
                        part, static_cast<char*>(dst.raw_data()) + begin * d0, dst_strides,
                        static_cast<const char*>(src.raw_data()) + begin * s0, src_strides);
                  });
    });
  });
}

KernelTable MakeKernelTable() {
  KernelTable table;
  // Every entry points at tg::cpu's function of the same name (a missing one does not link).
#define TG_KERNEL(ret, name, params) table.name = &name;
#include "tensor/kernel_list.inc"
#undef TG_KERNEL
  return table;
}

// The CPU's attention kernel reads any strides (each head's rows are gathered anyway) and lays
// out its output [B, T, H, D], so that the heads merge back into [B, T, H * D] as a view.
constexpr DevicePreferences kCpuPreferences = {
    DevicePreferences::AttentionLayout::kTokensMajor,
    /*attention_grad_out_contiguous=*/false,
};

class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend() : DeviceBackend(DeviceType::kCpu) {}

  int DeviceCount() override { return 1; }

  Allocator* allocator(int index) override {
    TG_CHECK(index == 0, "cpu:", index, " does not exist (the CPU is device 0)");
    return &allocator_;
  }

  void Copy(const RawTensor& dst, const RawTensor& src) override { HostCopy(dst, src); }

  void Fill(const RawTensor& dst, double value) override {
    // All-zero bytes are 0 in every dtype (+0.0 for the floating ones): a memset.
    if (value == 0 && !std::signbit(value) && dst.is_contiguous()) {
      std::memset(dst.raw_data(), 0, static_cast<size_t>(dst.numel()) * dst.element_size());
      return;
    }
    const RawTensor v = RawTensor::Empty({}, kF64);
    *v.data<double>() = value;
    HostCopy(dst, v.expand(dst.shape()));
  }

  void Synchronize(int) override {}  // the CPU's work is done when its call returns
  void* CurrentStream(int) override { return nullptr; }

 private:
  CpuAllocatorImpl allocator_;
};

[[maybe_unused]] const bool registered = [] {
  RegisterDeviceBackend(new CpuBackend());
  RegisterKernels(DeviceType::kCpu, MakeKernelTable(), kCpuPreferences);
  return true;
}();

}  // namespace
}  // namespace tg::cpu
