// Row reductions over contiguous [rows, n] input.
#include <cmath>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"

namespace tg::cpu {

void SumRows(const Tensor& out, const Tensor& x) {
  const int64_t rows = x.size(0), n = x.size(1);
  Visit(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    if constexpr (std::is_floating_point_v<ComputeType<T>>) {
      const bool to_f64 = out.dtype() == kF64;  // the f64 sum itself (Mean divides it first)
      T* o = to_f64 ? nullptr : out.data<T>();
      double* o64 = to_f64 ? out.data<double>() : nullptr;
      for (int64_t r = 0; r < rows; ++r) {
        double acc = 0;  // f64 accumulation, one rounding at the end
        for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(Widen(in[r * n + i]));
        if (to_f64) {
          o64[r] = acc;
        } else {
          o[r] = Convert<T>(acc);
        }
      }
    } else {
      int64_t* o = out.data<int64_t>();  // integers and bool sum to i64, wrapping on overflow
      for (int64_t r = 0; r < rows; ++r) {
        uint64_t acc = 0;
        for (int64_t i = 0; i < n; ++i) acc += static_cast<uint64_t>(Widen(in[r * n + i]));
        o[r] = static_cast<int64_t>(acc);
      }
    }
  });
}

void MaxRows(const Tensor& values, const Tensor& indices, const Tensor& x) {
  const int64_t rows = x.size(0), n = x.size(1);
  Visit(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    T* vo = values.defined() ? values.data<T>() : nullptr;
    int64_t* io = indices.defined() ? indices.data<int64_t>() : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = in + r * n;
      int64_t best = 0;
      auto best_value = Widen(row[0]);
      for (int64_t i = 1; i < n; ++i) {
        const auto v = Widen(row[i]);
        if constexpr (std::is_floating_point_v<decltype(v)>) {
          if (std::isnan(best_value)) break;  // the first NaN wins
          if (std::isnan(v) || v > best_value) {
            best = i;
            best_value = v;
          }
        } else if (v > best_value) {
          best = i;
          best_value = v;
        }
      }
      if (vo) vo[r] = row[best];
      if (io) io[r] = best;
    }
  });
}

}  // namespace tg::cpu
