// Rows of values between a storage type T (f32, f64, f16, bf16) and the kernels' compute type C
// (float for f16/bf16/f32, double for f64): the vectorised conversions of vec_math.h for
// contiguous f16/bf16 rows, element by element otherwise. Internal to tensor/cpu.
//
//   LoadRow(src, stride, n, row);     // row[j] = src[j * stride] widened to C
//   StoreRow(row, n, dst, stride);    // dst[j * stride] = row[j] rounded to T
//   LoadRows(src, row_stride, stride, rows, n, block);  // the same for a [rows, n] block
//   StoreRows(block, rows, n, dst, row_stride, stride);
//   RoundRow<T>(row, n);              // row[j] = row[j] rounded to T, as C
//   const C* v = RowAs<C>(src, n, buf);  // src itself when T is C, else widened into buf
#ifndef TAPEGRAD_TENSOR_CPU_CONVERT_ROWS_H_
#define TAPEGRAD_TENSOR_CPU_CONVERT_ROWS_H_

#include <cstdint>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/vec_math.h"

namespace tg::cpu {

// One row of n values between storage T (element stride `stride`) and the compute type C: the
// vectorised conversions for contiguous f16/bf16 rows, element by element otherwise.
template <typename T, typename C>
void LoadRow(const T* src, int64_t stride, int64_t n, C* dst) {
  if constexpr (std::is_same_v<C, float>) {
    if (stride == 1) return WidenToF32(src, dst, n);
  }
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<C>(Widen(src[j * stride]));
}
template <typename T, typename C>
void StoreRow(const C* src, int64_t n, T* dst, int64_t stride) {
  if constexpr (std::is_same_v<C, float>) {
    if (stride == 1) return RoundFromF32(src, dst, n);
  }
  for (int64_t j = 0; j < n; ++j) dst[j * stride] = Convert<T>(src[j]);
}

// A [rows, n] block: src rows `row_stride` apart with element stride `stride`, dst dense (and
// the reverse): the vectorised block conversions when the elements are contiguous.
template <typename T, typename C>
void LoadRows(const T* src, int64_t row_stride, int64_t stride, int64_t rows, int64_t n, C* dst) {
  if constexpr (std::is_same_v<C, float>) {
    if (stride == 1) return WidenRowsToF32(src, row_stride, rows, n, dst);
  }
  for (int64_t r = 0; r < rows; ++r) LoadRow(src + r * row_stride, stride, n, dst + r * n);
}
template <typename T, typename C>
void StoreRows(const C* src, int64_t rows, int64_t n, T* dst, int64_t row_stride, int64_t stride) {
  if constexpr (std::is_same_v<C, float>) {
    if (stride == 1) return RoundRowsFromF32(src, rows, n, dst, row_stride);
  }
  for (int64_t r = 0; r < rows; ++r) StoreRow(src + r * n, n, dst + r * row_stride, stride);
}

// n contiguous values of T as C: src itself when T is C, else widened into `buffer` (n values).
template <typename C, typename T>
const C* RowAs(const T* src, int64_t n, C* buffer) {
  if constexpr (std::is_same_v<T, C>) {
    return src;
  } else {
    LoadRow(src, 1, n, buffer);
    return buffer;
  }
}

// x[j] = x[j] rounded to T and read back as C, the value it has as a product's operand of T (no
// change when T is C; C is float otherwise).
template <typename T, typename C>
void RoundRow(C* x, int64_t n) {
  if constexpr (!std::is_same_v<T, C>) RoundToPrecisionOf<T>(x, n);
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_CONVERT_ROWS_H_
