// The reductions of tensor/ops.h (Sum, Mean, Max, Argmax): the reduced dims are moved last
// and flattened into rows, which the device's row kernels reduce.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/composed.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace tg {

using ops_internal::CheckDefined;
using ops_internal::CheckFloating;
using ops_internal::CommonDevice;
using ops_internal::Declined;
using ops_internal::IndicesI64;

namespace {

// x with `dims` moved last and flattened: contiguous [rows, reduced]; also the result shape.
struct RowsView {
  RawTensor rows;
  Shape out_shape;
};

RowsView ReduceToRows(const char* op, const RawTensor& x, std::vector<int64_t> dims, bool keepdim) {
  const RawTensor src = x.dim() == 0 ? x.reshape({1}) : x;
  const int64_t nd = src.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = WrapDim(op, d, nd);
    TG_CHECK(!reduced[w], op, ": dim ", w, " appears more than once in ", ShapeToString(dims));
    reduced[w] = true;
  }
  Shape perm, out_shape;
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) {
      perm.push_back(d);
      rows *= src.size(d);
    }
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[d]) {
      perm.push_back(d);
      inner *= src.size(d);
    }
    if (!reduced[d])
      out_shape.push_back(src.size(d));
    else if (keepdim)
      out_shape.push_back(1);
  }
  if (x.dim() == 0) out_shape = {};  // a 0-d input reduces to 0-d, keepdim or not
  // A view when the kept and the reduced dims each merge into one stride (a bias gradient's sum
  // over the rows of [m, n] reads x in place as the columns [n, m]); a copy otherwise.
  return {src.permute(perm).reshape({rows, inner}), out_shape};
}

}  // namespace

RawTensor Sum(const RawTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined("sum", x, "the input");
  const Device device = CommonDevice("sum", {&x});
  RowsView v = ReduceToRows("sum", x, dims, keepdim);
  const DType dtype = IsFloating(x.dtype()) ? x.dtype() : kI64;
  RawTensor out = RawTensor::Empty({v.rows.size(0)}, dtype, device);
  KernelsFor(device).SumRows(out, v.rows);
  return out.reshape(v.out_shape);
}

RawTensor Mean(const RawTensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined("mean", x, "the input");
  const Device device = CommonDevice("mean", {&x});
  CheckFloating("mean", x.dtype());
  // Sum in f64 and divide before rounding: sum/count rounded once to x's dtype, so a f16 sum
  // that would overflow f16 still gives its finite mean; NaN for an empty reduction.
  RowsView v = ReduceToRows("mean", x, dims, keepdim);
  RawTensor sum = RawTensor::Empty({v.rows.size(0)}, kF64, device);
  KernelsFor(device).SumRows(sum, v.rows);  // the f64 sums, read from x's dtype
  const double count = static_cast<double>(v.rows.size(1));
  return BinaryScalar(BinaryOp::kDiv, sum, count).to(x.dtype()).reshape(v.out_shape);
}

namespace {

RawTensor MaxImpl(const char* op, const RawTensor& x, int64_t dim, bool keepdim, bool values) {
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  const int64_t d = WrapDim(op, dim, x.dim());
  const int64_t size = x.dim() == 0 ? 1 : x.size(d);
  TG_CHECK(size > 0, op, ": dim ", d, " of shape ", ShapeToString(x.shape()),
           " is empty; there is no maximum");
  RowsView v = ReduceToRows(op, x, {d}, keepdim);
  RawTensor out = RawTensor::Empty({v.rows.size(0)}, values ? x.dtype() : kI64, device);
  KernelsFor(device).MaxRows(values ? out : RawTensor(), values ? RawTensor() : out,
                             v.rows.contiguous());
  return out.reshape(v.out_shape);
}

}  // namespace

RawTensor Max(const RawTensor& x, int64_t dim, bool keepdim) {
  return MaxImpl("max", x, dim, keepdim, true);
}

RawTensor Argmax(const RawTensor& x, int64_t dim, bool keepdim) {
  return MaxImpl("argmax", x, dim, keepdim, false);
}

}  // namespace tg
