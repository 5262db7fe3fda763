// The indexing ops of tensor/ops.h: gather, scatter_add, index_select and index_add.
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

RawTensor Gather(const RawTensor& x, int64_t dim, const RawTensor& index) {
  CheckDefined("gather", x, "the input");
  CheckDefined("gather", index, "the index");
  const Device device = CommonDevice("gather", {&x, &index});
  const RawTensor idx = IndicesI64("gather", index);
  TG_CHECK(index.dim() == x.dim(), "gather: index of shape ", ShapeToString(index.shape()),
           " and input of shape ", ShapeToString(x.shape()), " differ in rank");
  const int64_t d = WrapDim("gather", dim, x.dim());
  for (int64_t k = 0; k < x.dim(); ++k) {
    TG_CHECK(k == d || index.size(k) <= x.size(k), "gather: index of shape ",
             ShapeToString(index.shape()), " is larger than input of shape ",
             ShapeToString(x.shape()), " at dim ", k, " (only dim ", d, " may be larger)");
  }
  RawTensor out = RawTensor::Empty(index.shape(), x.dtype(), device);
  if (x.dim() == 0) {  // a 0-d input is one element along dim 0
    KernelsFor(device).Gather(out.reshape({1}), x.reshape({1}), idx.reshape({1}), 0);
  } else {
    KernelsFor(device).Gather(out, x, idx, d);
  }
  return out;
}

RawTensor ScatterAdd(const RawTensor& self, int64_t dim, const RawTensor& index,
                     const RawTensor& src) {
  const char* op = "scatter_add";
  CheckDefined(op, self, "self");
  CheckDefined(op, index, "the index");
  CheckDefined(op, src, "src");
  CommonDevice(op, {&self, &index, &src});
  const RawTensor idx = IndicesI64(op, index);
  TG_CHECK(self.dtype() != kBool, op, ": not defined for bool tensors; cast them first");
  TG_CHECK(src.dtype() == self.dtype(), op, ": src dtype ", DTypeName(src.dtype()),
           " differs from self dtype ", DTypeName(self.dtype()));
  TG_CHECK(index.dim() == self.dim() && src.dim() == self.dim(), op, ": self ",
           ShapeToString(self.shape()), ", index ", ShapeToString(index.shape()), " and src ",
           ShapeToString(src.shape()), " must have the same rank");
  const int64_t d = WrapDim(op, dim, self.dim());
  for (int64_t k = 0; k < self.dim(); ++k) {
    TG_CHECK(index.size(k) <= src.size(k) && (k == d || index.size(k) <= self.size(k)), op,
             ": index of shape ", ShapeToString(index.shape()), " is larger than src of shape ",
             ShapeToString(src.shape()), " or self of shape ", ShapeToString(self.shape()),
             " at dim ", k);
  }
  RawTensor out = self.clone();
  if (self.dim() == 0) {
    KernelsFor(self.device()).ScatterAdd(out.reshape({1}), idx.reshape({1}), src.reshape({1}), 0);
  } else {
    KernelsFor(self.device()).ScatterAdd(out, idx, src, d);
  }
  return out;
}

namespace {

// The index of index_select / index_add: i32/i64, at most 1-D; returned as contiguous i64 [k].
RawTensor IndexList(const char* op, const RawTensor& index) {
  const RawTensor idx = IndicesI64(op, index);
  TG_CHECK(index.dim() <= 1, op, ": expected a 1-D index, got shape ",
           ShapeToString(index.shape()));
  return idx.reshape({idx.numel()});
}

}  // namespace

RawTensor IndexSelect(const RawTensor& x, int64_t dim, const RawTensor& index) {
  CheckDefined("index_select", x, "the input");
  CheckDefined("index_select", index, "the index");
  const Device device = CommonDevice("index_select", {&x, &index});
  TG_CHECK(x.dim() >= 1, "index_select: cannot index a 0-d tensor");
  const RawTensor idx = IndexList("index_select", index);
  const int64_t d = WrapDim("index_select", dim, x.dim());
  Shape shape = x.shape();
  shape[d] = idx.numel();
  RawTensor out = RawTensor::Empty(shape, x.dtype(), device);
  KernelsFor(device).IndexSelect(out, x, idx, d);
  return out;
}

RawTensor IndexAdd(const RawTensor& self, int64_t dim, const RawTensor& index,
                   const RawTensor& src) {
  const char* op = "index_add";
  CheckDefined(op, self, "self");
  CheckDefined(op, index, "the index");
  CheckDefined(op, src, "src");
  CommonDevice(op, {&self, &index, &src});
  TG_CHECK(self.dim() >= 1, op, ": cannot index a 0-d tensor");
  TG_CHECK(self.dtype() != kBool, op, ": not defined for bool tensors; cast them first");
  TG_CHECK(src.dtype() == self.dtype(), op, ": src dtype ", DTypeName(src.dtype()),
           " differs from self dtype ", DTypeName(self.dtype()));
  const RawTensor idx = IndexList(op, index);
  const int64_t d = WrapDim(op, dim, self.dim());
  Shape expected = self.shape();
  expected[d] = idx.numel();
  TG_CHECK(src.shape() == expected, op, ": src of shape ", ShapeToString(src.shape()),
           " does not match self of shape ", ShapeToString(self.shape()), " with ", idx.numel(),
           " indices at dim ", d, " (expected ", ShapeToString(expected), ")");
  RawTensor out = self.clone();
  KernelsFor(self.device()).IndexAdd(out, idx, src, d);
  return out;
}

}  // namespace tg
