// Value conversion between element types, defined for every input (no undefined behaviour):
// float -> integer truncates toward zero and saturates at the type's range, NaN becomes 0;
// anything -> bool is `value != 0`; float and double -> f16/bf16 round once to nearest even
// (integers beyond 2^24 reach f16/bf16 through float and may round twice); anything -> f8e4m3 /
// f8e5m2 rounds once to nearest even and saturates (tensor/float8.h), and FP8 -> anything goes
// through its exact float value.
#ifndef TAPEGRAD_TENSOR_CONVERT_H_
#define TAPEGRAD_TENSOR_CONVERT_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/float8.h"
#include "tensor/half.h"

namespace tg {

template <typename T>
constexpr bool kIsReduced = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Widens a stored value to the type kernels compute in (float for f16/bf16).
template <typename T>
inline auto Widen(T v) {
  if constexpr (kIsReduced<T>) {
    return static_cast<float>(v);
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

template <typename T>
constexpr bool kIsFloat8 = std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>;

template <typename Dst, typename Src>
inline Dst Convert(Src v) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return v;
  } else if constexpr (kIsFloat8<Src>) {
    return Convert<Dst>(static_cast<float>(v));  // exact
  } else if constexpr (kIsFloat8<Dst>) {
    // One rounding, saturating (tensor/float8.h): doubles and integers are first rounded to odd
    // in float, which keeps the nearest-even rounding to 3 or 2 mantissa bits exact; integers
    // beyond 2^53 saturate anyway.
    if constexpr (std::is_same_v<Src, float> || kIsReduced<Src>) {
      return Dst(static_cast<float>(v));
    } else {
      return Dst(DoubleToFloatRoundToOdd(static_cast<double>(v)));
    }
  } else if constexpr (kIsReduced<Src>) {
    return Convert<Dst>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Dst, bool>) {
    return v != Src(0);
  } else if constexpr (kIsReduced<Dst> && std::is_same_v<Src, double>) {
    return Dst(DoubleToFloatRoundToOdd(v));  // one rounding, not two
  } else if constexpr (kIsReduced<Dst>) {
    return Dst(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<Dst> && std::is_floating_point_v<Src>) {
    if (std::isnan(v)) return Dst(0);
    // Compare in long double so that the bounds of int64 are represented exactly.
    const long double x = static_cast<long double>(v);
    if (x <= static_cast<long double>(std::numeric_limits<Dst>::min())) {
      return std::numeric_limits<Dst>::min();
    }
    if (x >= static_cast<long double>(std::numeric_limits<Dst>::max())) {
      return std::numeric_limits<Dst>::max();
    }
    return static_cast<Dst>(v);
  } else if constexpr (std::is_integral_v<Dst> && std::is_integral_v<Src> &&
                       !std::is_same_v<Src, bool>) {
    // Integer narrowing wraps modulo 2^bits, as in C++20 and PyTorch.
    return static_cast<Dst>(static_cast<std::make_unsigned_t<Dst>>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_CONVERT_H_
