// AddScaled and Lerp on the CPU (tensor/kernel_list.inc): out = fma(s, b, a) per element with
// s = alpha or factor[i] (and a, or a times its scale rounded for f32 and f64), and torch's lerp
// as one such fused multiply-add of b - a; one rounding in the compute type (then one to
// f16/bf16). The fused multiply-add is the CPU's own where it has one (chosen at run time: loops
// compiled for AVX2 + FMA), else glibc's fma, which is exact too. out may be an input: each element
// is read before it is written. Mixed dtypes (a bf16 b added to f32, an f32 lerp rounded to bf16)
// are widened and rounded in the same pass.
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

// out[i] = fma(s[i] (or alpha when s is null), b[i], a[i]), with a[i] * k (rounded) for a[i]
// where `scaled`.
template <typename C>
__attribute__((target("avx2,fma"))) void FmaRowHardware(const C* a, const C* b, C alpha, const C* s,
                                                        bool scaled, C k, C* out, int64_t n) {
  if (scaled) {
    if (s == nullptr) {
      for (int64_t i = 0; i < n; ++i) out[i] = Fma(alpha, b[i], a[i] * k);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = Fma(s[i], b[i], a[i] * k);
    }
  } else if (s == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(alpha, b[i], a[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = Fma(s[i], b[i], a[i]);
  }
}

template <typename C>
void FmaRow(const C* a, const C* b, C alpha, const C* s, bool scaled, C k, C* out, int64_t n) {
  static const bool hardware = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (hardware) return FmaRowHardware(a, b, alpha, s, scaled, k, out, n);
  for (int64_t i = 0; i < n; ++i) {
    const C base = scaled ? a[i] * k : a[i];
    out[i] = std::fma(s == nullptr ? alpha : s[i], b[i], base);
  }
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

// fn(len, a, b, c, out) over the n elements of a, b and c (c may be null; of a's type) in
// parallel runs of at most kBlock elements, in C, a's compute type: an operand of another type is
// widened first (exactly), and out, when not of type C, gets the results rounded once.
template <typename TA, typename TB, typename TO, typename Fn>
void ForEachRun(int64_t n, const TA* a, const TB* b, const TA* c, TO* out, Fn&& fn) {
  using C = ComputeType<TA>;
  constexpr int64_t kBlock = 1024;
  ParallelFor(n, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
    C wa[kBlock], wb[kBlock], wc[kBlock], wo[kBlock];
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      C* o = wo;
      if constexpr (std::is_same_v<TO, C>) o = out + i;
      fn(len, RowAs<C>(a + i, len, wa), RowAs<C>(b + i, len, wb),
         c == nullptr ? nullptr : RowAs<C>(c + i, len, wc), o);
      if constexpr (!std::is_same_v<TO, C>) StoreRow(wo, len, out + i, 1);
    }
  });
}

}  // namespace

KernelStatus Lerp(const RawTensor& out, const RawTensor& a, const RawTensor& b, double weight) {
  // Another result dtype in this pass from f32 or f64 values to a narrower one (one rounding);
  // the others (a bf16 lerp widened, f32 values to f64) are the composed form's exact casts.
  const bool full = a.dtype() == kF32 || a.dtype() == kF64;
  if (out.dtype() != a.dtype() && !(full && ElementSize(out.dtype()) < ElementSize(a.dtype()))) {
    return KernelStatus::kNoKernel;
  }
  VisitFloating("Lerp", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C w = static_cast<C>(weight);
    const bool from_b = !(std::abs(w) < C(0.5));
    const C s = from_b ? -(C(1) - w) : w;
    VisitFloating("Lerp", out.dtype(), [&](auto out_tag) {
      using O = decltype(out_tag);
      if constexpr (sizeof(O) <= sizeof(C)) {
        ForEachRun(out.numel(), static_cast<const T*>(a.raw_data()),
                   static_cast<const T*>(b.raw_data()), static_cast<const T*>(nullptr),
                   static_cast<O*>(out.raw_data()),
                   [&](int64_t len, const C* wa, const C* wb, const C*, C* wo) {
                     LerpRow(wa, wb, s, from_b, wo, len);
                   });
      }
    });
  });
  return KernelStatus::kDone;
}

KernelStatus AddScaled(const RawTensor& out, const RawTensor& a, const RawTensor& b, double alpha,
                       const RawTensor& factor, double a_scale) {
  // A scaled f16/bf16 a (its product rounded to T first) is the composed form's.
  if (a_scale != 1 && a.dtype() != kF32 && a.dtype() != kF64) return KernelStatus::kNoKernel;
  VisitFloating("AddScaled", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C s = static_cast<C>(alpha), k = static_cast<C>(a_scale);
    const bool scaled = a_scale != 1;
    VisitFloating("AddScaled", b.dtype(), [&](auto b_tag) {
      using B = decltype(b_tag);
      if constexpr (sizeof(B) <= sizeof(T)) {  // (the op passes b of T or narrower)
        ForEachRun(out.numel(), static_cast<const T*>(a.raw_data()),
                   static_cast<const B*>(b.raw_data()),
                   factor.defined() ? static_cast<const T*>(factor.raw_data()) : nullptr,
                   static_cast<T*>(out.raw_data()),
                   [&](int64_t len, const C* wa, const C* wb, const C* ws, C* wo) {
                     FmaRow(wa, wb, s, ws, scaled, k, wo, len);
                   });
      }
    });
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
