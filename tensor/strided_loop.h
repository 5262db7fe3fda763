// ForEachRow: the one loop nest every CPU kernel uses to walk N strided operands together.
//
// The operands share a shape (inputs already broadcast: stride 0 on broadcast dims). Dims of
// size 1 are dropped and neighbouring dims that are contiguous for every operand are merged, so
// a contiguous tensor is walked as a single row. `fn(ptrs, n, steps)` is called once per
// innermost row with each operand's address of the row's first element, the row length, and
// each operand's step between elements, in bytes. Nothing is called for empty shapes.
//
//   ForEachRow<2>(shape, {dst_ptr, src_ptr}, {dst_byte_strides, src_byte_strides},
//                 [](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> step) { ... });
#ifndef TAPEGRAD_TENSOR_STRIDED_LOOP_H_
#define TAPEGRAD_TENSOR_STRIDED_LOOP_H_

#include <array>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace tg {

// Strides of `t` in bytes after broadcasting it to `shape` (0 on broadcast dims).
Shape BroadcastByteStrides(const RawTensor& t, const Shape& shape);

template <size_t N, typename Fn>
void ForEachRow(const Shape& shape, std::array<char*, N> base,
                const std::array<Shape, N>& byte_strides, Fn&& fn) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  // Kept dims, outermost first.
  absl::InlinedVector<int64_t, 6> sizes;
  absl::InlinedVector<std::array<int64_t, N>, 6> strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s;
    for (size_t k = 0; k < N; ++k) s[k] = byte_strides[k][d];
    if (!sizes.empty()) {
      bool mergeable = true;
      for (size_t k = 0; k < N; ++k) mergeable &= strides.back()[k] == s[k] * shape[d];
      if (mergeable) {
        sizes.back() *= shape[d];
        strides.back() = s;
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(s);
  }
  if (sizes.empty()) {  // a single element
    fn(base, int64_t{1}, std::array<int64_t, N>{});
    return;
  }
  const size_t inner = sizes.size() - 1;
  const int64_t n = sizes[inner];
  const std::array<int64_t, N> step = strides[inner];
  absl::InlinedVector<int64_t, 6> index(inner, 0);
  std::array<char*, N> ptr = base;
  while (true) {
    fn(ptr, n, step);
    // Advance the outer index like an odometer, moving pointers incrementally.
    size_t d = inner;
    while (d > 0) {
      --d;
      for (size_t k = 0; k < N; ++k) ptr[k] += strides[d][k];
      if (++index[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k) ptr[k] -= strides[d][k] * sizes[d];
      index[d] = 0;
      if (d == 0) return;
    }
    if (inner == 0) return;
  }
}

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_STRIDED_LOOP_H_
