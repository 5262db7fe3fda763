// AddScaled on the CPU (tensor/kernel_list.inc): out = fma(alpha, b, a) per element, one rounding
// in the compute type (then one to f16/bf16). The fused multiply-add is the CPU's own where it has
// one (chosen at run time: a loop compiled for AVX2 + FMA), else glibc's fma, which is exact too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"

namespace tg::cpu {
namespace {

template <typename C>
__attribute__((target("avx2,fma"))) void FmaRowHardware(const C* a, const C* b, C alpha, C* out,
                                                        int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __builtin_fma(alpha, b[i], a[i]);
}
template <>
__attribute__((target("avx2,fma"))) void FmaRowHardware<float>(const float* a, const float* b,
                                                               float alpha, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = __builtin_fmaf(alpha, b[i], a[i]);
}

template <typename C>
void FmaRow(const C* a, const C* b, C alpha, C* out, int64_t n) {
  static const bool hardware = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (hardware) return FmaRowHardware(a, b, alpha, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::fma(alpha, b[i], a[i]);
}

}  // namespace

KernelStatus AddScaled(const RawTensor& out, const RawTensor& a, const RawTensor& b, double alpha) {
  VisitFloating("AddScaled", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    const C s = static_cast<C>(alpha);
    constexpr int64_t kBlock = 1024;
    ParallelFor(out.numel(), int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, C>) {
        FmaRow(pa + begin, pb + begin, s, po + begin, end - begin);
      } else {
        C wa[kBlock], wb[kBlock], wo[kBlock];
        for (int64_t i = begin; i < end; i += kBlock) {
          const int64_t len = std::min(kBlock, end - i);
          LoadRow(pa + i, 1, len, wa);
          LoadRow(pb + i, 1, len, wb);
          FmaRow(wa, wb, s, wo, len);
          StoreRow(wo, len, po + i, 1);
        }
      }
    });
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
