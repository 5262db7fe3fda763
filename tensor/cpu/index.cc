// Indexing kernels: gather / scatter-add along one dim and index-select / index-add of whole
// slices (PyTorch's torch.gather, scatter_add, index_select, index_add). Inputs may be strided;
// indices arrive as contiguous i64 and are range-checked here (they are data). Scatter kernels
// accumulate floating values in f64 and round each output element once, so repeated indices
// give the same result in every order and an f16 output only rounds at the end.
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"

namespace tg::cpu {
namespace {

// Calls fn(i, pos) for every position `pos` of `shape` in row-major order (i is its linear
// index). Nothing is called for an empty shape; a 0-d shape has one position.
template <typename Fn>
void ForEachPosition(const Shape& shape, Fn&& fn) {
  const int64_t n = NumElements(shape);
  std::vector<int64_t> pos(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    fn(i, pos);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++pos[d] < shape[d]) break;
      pos[d] = 0;
    }
  }
}

// Element offset of `pos` in a tensor with `strides`, with dim `skip` left out.
int64_t OffsetWithout(const std::vector<int64_t>& pos, const Shape& strides, int64_t skip) {
  int64_t off = 0;
  for (size_t d = 0; d < pos.size(); ++d) {
    if (static_cast<int64_t>(d) != skip) off += pos[d] * strides[d];
  }
  return off;
}

std::string PositionString(const std::vector<int64_t>& pos) { return ShapeToString(pos); }

// Throws unless every index lies in [0, size) (1-D index lists of index_select / index_add).
void CheckIndexList(const char* op, const RawTensor& index, int64_t dim, int64_t size) {
  const int64_t* idx = index.data<int64_t>();
  for (int64_t i = 0; i < index.numel(); ++i) {
    TG_CHECK(idx[i] >= 0 && idx[i] < size, op, ": index ", idx[i], " at position ", i,
             " is out of range for dim ", dim, " of size ", size);
  }
}

// The accumulator of scatter kernels: f64 for floating types, wrapping u64 for integers.
template <typename T>
using Accumulator = std::conditional_t<std::is_floating_point_v<ComputeType<T>>, double, uint64_t>;

// Adds `src` (strided) into `out` (contiguous) at the element offsets `dst_offset(i, pos)` for
// every position of src's shape `shape`, accumulating in f64/u64 and rounding once.
template <typename OffsetFn>
void AccumulateInto(const char* op, const RawTensor& out, const RawTensor& src, const Shape& shape,
                    OffsetFn&& dst_offset) {
  Visit(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      throw Error(absl::StrCat(op, ": not defined for bool tensors; cast them first"));
    } else {
      using A = Accumulator<T>;
      T* o = out.data<T>();
      const T* s = src.data<T>();
      const Shape& ss = src.strides();
      std::vector<A> acc(static_cast<size_t>(out.numel()));
      for (int64_t i = 0; i < out.numel(); ++i) acc[i] = static_cast<A>(Widen(o[i]));
      ForEachPosition(shape, [&](int64_t i, const std::vector<int64_t>& pos) {
        acc[dst_offset(i, pos)] += static_cast<A>(Widen(s[OffsetWithout(pos, ss, -1)]));
      });
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = Convert<T>(acc[i]);
    }
  });
}

}  // namespace

void Gather(const RawTensor& out, const RawTensor& x, const RawTensor& index, int64_t dim) {
  const int64_t size = x.size(dim);
  const int64_t* idx = index.data<int64_t>();
  const size_t es = x.element_size();
  const char* xb = static_cast<const char*>(x.raw_data());
  char* ob = static_cast<char*>(out.raw_data());
  const Shape& xs = x.strides();
  ForEachPosition(index.shape(), [&](int64_t i, const std::vector<int64_t>& pos) {
    const int64_t j = idx[i];
    TG_CHECK(j >= 0 && j < size, "gather: index ", j, " at position ", PositionString(pos),
             " is out of range for dim ", dim, " of size ", size);
    const int64_t off = OffsetWithout(pos, xs, dim) + j * xs[dim];
    std::memcpy(ob + i * es, xb + off * static_cast<int64_t>(es), es);
  });
}

void ScatterAdd(const RawTensor& out, const RawTensor& index, const RawTensor& src, int64_t dim) {
  const int64_t size = out.size(dim);
  const int64_t* idx = index.data<int64_t>();
  // Validate every index before touching out, so a bad index leaves no partial result.
  ForEachPosition(index.shape(), [&](int64_t i, const std::vector<int64_t>& pos) {
    TG_CHECK(idx[i] >= 0 && idx[i] < size, "scatter_add: index ", idx[i], " at position ",
             PositionString(pos), " is out of range for dim ", dim, " of size ", size);
  });
  const Shape os = ContiguousStrides(out.shape());
  // src is read only where index has elements (index may be smaller than src).
  const RawTensor src_view = [&] {
    RawTensor v = src;
    for (int64_t d = 0; d < index.dim(); ++d) v = v.slice(d, 0, index.size(d));
    return v;
  }();
  AccumulateInto("scatter_add", out, src_view, index.shape(),
                 [&](int64_t i, const std::vector<int64_t>& pos) {
                   return OffsetWithout(pos, os, dim) + idx[i] * os[dim];
                 });
}

void IndexSelect(const RawTensor& out, const RawTensor& x, const RawTensor& index, int64_t dim) {
  CheckIndexList("index_select", index, dim, x.size(dim));
  const int64_t* idx = index.data<int64_t>();
  const size_t es = x.element_size();
  const char* xb = static_cast<const char*>(x.raw_data());
  char* ob = static_cast<char*>(out.raw_data());
  const Shape& xs = x.strides();
  ForEachPosition(out.shape(), [&](int64_t i, const std::vector<int64_t>& pos) {
    const int64_t off = OffsetWithout(pos, xs, dim) + idx[pos[dim]] * xs[dim];
    std::memcpy(ob + i * es, xb + off * static_cast<int64_t>(es), es);
  });
}

void IndexAdd(const RawTensor& out, const RawTensor& index, const RawTensor& src, int64_t dim) {
  CheckIndexList("index_add", index, dim, out.size(dim));
  const int64_t* idx = index.data<int64_t>();
  const Shape os = ContiguousStrides(out.shape());
  AccumulateInto("index_add", out, src, src.shape(), [&](int64_t, const std::vector<int64_t>& pos) {
    return OffsetWithout(pos, os, dim) + idx[pos[dim]] * os[dim];
  });
}

}  // namespace tg::cpu
