// AddScaled on the CPU (tensor/kernel_list.inc): out = fma(s, b, a) per element with s = alpha or
// factor[i], one rounding in the compute type (then one to f16/bf16). The fused multiply-add is
// the CPU's own where it has one (chosen at run time: loops compiled for AVX2 + FMA), else
// glibc's fma, which is exact too.
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

inline float Fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline double Fma(double a, double b, double c) { return __builtin_fma(a, b, c); }

// out[i] = fma(s[i] (or alpha when s is null), b[i], a[i]).
template <typename C>
__attribute__((target("avx2,fma"))) void FmaRowHardware(const C* a, const C* b, C alpha, const C* s,
                                                        C* out, int64_t n) {
  if (s == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(alpha, b[i], a[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(s[i], b[i], a[i]);
  }
}

template <typename C>
void FmaRow(const C* a, const C* b, C alpha, const C* s, C* out, int64_t n) {
  static const bool hardware = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (hardware) return FmaRowHardware(a, b, alpha, s, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::fma(s == nullptr ? alpha : s[i], b[i], a[i]);
}

}  // namespace

KernelStatus AddScaled(const RawTensor& out, const RawTensor& a, const RawTensor& b, double alpha,
                       const RawTensor& factor) {
  VisitFloating("AddScaled", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    const T* ps = factor.defined() ? static_cast<const T*>(factor.raw_data()) : nullptr;
    T* po = static_cast<T*>(out.raw_data());
    const C s = static_cast<C>(alpha);
    constexpr int64_t kBlock = 1024;
    ParallelFor(out.numel(), int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, C>) {
        FmaRow(pa + begin, pb + begin, s, ps == nullptr ? nullptr : ps + begin, po + begin,
               end - begin);
      } else {
        C wa[kBlock], wb[kBlock], ws[kBlock], wo[kBlock];
        for (int64_t i = begin; i < end; i += kBlock) {
          const int64_t len = std::min(kBlock, end - i);
          LoadRow(pa + i, 1, len, wa);
          LoadRow(pb + i, 1, len, wb);
          if (ps != nullptr) LoadRow(ps + i, 1, len, ws);
          FmaRow(wa, wb, s, ps == nullptr ? nullptr : ws, wo, len);
          StoreRow(wo, len, po + i, 1);
        }
      }
    });
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
