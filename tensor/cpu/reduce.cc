// Row reductions: sums over [rows, n] of any strides, maxima over contiguous [rows, n].
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"

namespace tg::cpu {

namespace {

// out[r] = the sum over i of x[r * rs + i * cs], accumulated in Acc over i in order, for rows
// [begin, end). Rows with unit column stride are summed one after the other; otherwise (the
// columns of a row-major matrix: rs == 1) the rows' accumulators advance together, one pass over
// each column, so memory is read in order. The sums are the same either way.
template <typename Acc, typename T, typename Store>
void SumRowRange(const T* x, int64_t begin, int64_t end, int64_t n, int64_t rs, int64_t cs,
                 Store store) {
  if (cs == 1 || n <= 1 || std::abs(rs) > std::abs(cs)) {
    for (int64_t r = begin; r < end; ++r) {
      Acc acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += static_cast<Acc>(Widen(x[r * rs + i * cs]));
      store(r, acc);
    }
    return;
  }
  constexpr int64_t kRows = 256;
  Acc acc[kRows];
  for (int64_t r0 = begin; r0 < end; r0 += kRows) {
    const int64_t len = std::min(kRows, end - r0);
    std::fill(acc, acc + len, Acc(0));
    for (int64_t i = 0; i < n; ++i) {
      const T* col = x + r0 * rs + i * cs;
      for (int64_t j = 0; j < len; ++j) acc[j] += static_cast<Acc>(Widen(col[j * rs]));
    }
    for (int64_t j = 0; j < len; ++j) store(r0 + j, acc[j]);
  }
}

}  // namespace

void SumRows(const RawTensor& out, const RawTensor& x) {
  const int64_t rows = x.size(0), n = x.size(1);
  const int64_t rs = x.strides()[0], cs = x.strides()[1];
  Visit(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = x.data<T>();
    const int64_t per_thread = RowsPerThread(n);
    if constexpr (std::is_floating_point_v<ComputeType<T>>) {
      const bool to_f64 = out.dtype() == kF64;  // the f64 sum itself (Mean divides it first)
      T* o = to_f64 ? nullptr : out.data<T>();
      double* o64 = to_f64 ? out.data<double>() : nullptr;
      // f64 accumulation, one rounding at the end.
      ParallelFor(rows, per_thread, [&](int64_t begin, int64_t end) {
        SumRowRange<double>(in, begin, end, n, rs, cs, [&](int64_t r, double acc) {
          if (to_f64) {
            o64[r] = acc;
          } else {
            o[r] = Convert<T>(acc);
          }
        });
      });
    } else {
      int64_t* o = out.data<int64_t>();  // integers and bool sum to i64, wrapping on overflow
      ParallelFor(rows, per_thread, [&](int64_t begin, int64_t end) {
        SumRowRange<uint64_t>(in, begin, end, n, rs, cs,
                              [&](int64_t r, uint64_t acc) { o[r] = static_cast<int64_t>(acc); });
      });
    }
  });
}

void MaxRows(const RawTensor& values, const RawTensor& indices, const RawTensor& x) {
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
