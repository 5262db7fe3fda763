// AddScaled and Lerp on the CPU (tensor/kernel_list.inc): out = fma(s, b, a) per element with
// s = alpha or factor[i], and torch's lerp as one such fused multiply-add of b - a; one rounding
// in the compute type (then one to f16/bf16). The fused multiply-add is the CPU's own where it
// has one (chosen at run time: loops compiled for AVX2 + FMA), else glibc's fma, which is exact
// too. out may be an input: each element is read before it is written.
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

// out[i] = fma(s, b[i] - a[i], base[i]) with base = a (from_b false) or b: torch's lerp for
// s = w, |w| < 0.5, and for s = -(1 - w) from b otherwise.
template <typename C>
__attribute__((target("avx2,fma"))) void LerpRowHardware(const C* a, const C* b, C s, bool from_b,
                                                         C* out, int64_t n) {
  if (from_b) {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(s, b[i] - a[i], b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(s, b[i] - a[i], a[i]);
  }
}

template <typename C>
void LerpRow(const C* a, const C* b, C s, bool from_b, C* out, int64_t n) {
  static const bool hardware = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (hardware) return LerpRowHardware(a, b, s, from_b, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = std::fma(s, b[i] - a[i], from_b ? b[i] : a[i]);
}

// fn(len, a, b, c, out) over the n elements of a, b and c (c may be null) in parallel runs, in
// the compute type: for f16/bf16 each run of at most kBlock elements is widened first and its
// results rounded back into out.
template <typename T, typename Fn>
void ForEachRun(int64_t n, const T* a, const T* b, const T* c, T* out, Fn&& fn) {
  using C = ComputeType<T>;
  constexpr int64_t kBlock = 1024;
  ParallelFor(n, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
    if constexpr (std::is_same_v<T, C>) {
      fn(end - begin, a + begin, b + begin, c == nullptr ? nullptr : c + begin, out + begin);
    } else {
      C wa[kBlock], wb[kBlock], wc[kBlock], wo[kBlock];
      for (int64_t i = begin; i < end; i += kBlock) {
        const int64_t len = std::min(kBlock, end - i);
        LoadRow(a + i, 1, len, wa);
        LoadRow(b + i, 1, len, wb);
        if (c != nullptr) LoadRow(c + i, 1, len, wc);
        fn(len, wa, wb, c == nullptr ? nullptr : wc, wo);
        StoreRow(wo, len, out + i, 1);
      }
    }
  });
}

}  // namespace

KernelStatus Lerp(const RawTensor& out, const RawTensor& a, const RawTensor& b, double weight) {
  VisitFloating("Lerp", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C w = static_cast<C>(weight);
    const bool from_b = !(std::abs(w) < C(0.5));
    const C s = from_b ? -(C(1) - w) : w;
    ForEachRun<T>(out.numel(), static_cast<const T*>(a.raw_data()),
                  static_cast<const T*>(b.raw_data()), nullptr, static_cast<T*>(out.raw_data()),
                  [&](int64_t len, const C* wa, const C* wb, const C*, C* wo) {
                    LerpRow(wa, wb, s, from_b, wo, len);
                  });
  });
  return KernelStatus::kDone;
}

KernelStatus AddScaled(const RawTensor& out, const RawTensor& a, const RawTensor& b, double alpha,
                       const RawTensor& factor) {
  VisitFloating("AddScaled", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C s = static_cast<C>(alpha);
    ForEachRun<T>(out.numel(), static_cast<const T*>(a.raw_data()),
                  static_cast<const T*>(b.raw_data()),
                  factor.defined() ? static_cast<const T*>(factor.raw_data()) : nullptr,
                  static_cast<T*>(out.raw_data()),
                  [&](int64_t len, const C* wa, const C* wb, const C* ws, C* wo) {
                    FmaRow(wa, wb, s, ws, wo, len);
                  });
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
