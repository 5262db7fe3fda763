// Matrix products of tensor/ops.h: Matmul / Bmm with batch broadcasting, and the fused Linear
// layer (the device's epilogue kernels, or the composed form of tensor/composed.h).
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

RawTensor Matmul(const RawTensor& a_in, const RawTensor& b_in) {
  CheckDefined("matmul", a_in, "the first input");
  CheckDefined("matmul", b_in, "the second input");
  const Device device = CommonDevice("matmul", {&a_in, &b_in});
  TG_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: shapes ", ShapeToString(a_in.shape()),
           " and ", ShapeToString(b_in.shape()), ": 0-d tensors cannot be multiplied");
  TG_CHECK(a_in.dtype() == b_in.dtype(), "matmul: dtypes ", DTypeName(a_in.dtype()), " and ",
           DTypeName(b_in.dtype()), " differ");
  CheckFloating("matmul", a_in.dtype());
  // 1-D operands: a vector is a [1, k] row on the left and a [k, 1] column on the right.
  const RawTensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const RawTensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), k2 = b.size(-2), n = b.size(-1);
  TG_CHECK(k == k2, "matmul: shapes ", ShapeToString(a_in.shape()), " and ",
           ShapeToString(b_in.shape()), " cannot be multiplied (", k, " != ", k2, ")");
  const Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  const Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = BroadcastShapes("matmul", a_batch, b_batch);
  } catch (const Error&) {
    throw Error(absl::StrCat("matmul: the batch dims of shapes ", ShapeToString(a_in.shape()),
                             " and ", ShapeToString(b_in.shape()), " cannot be broadcast"));
  }
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  RawTensor out = RawTensor::Empty(out_shape, a.dtype(), device);
  KernelsFor(device).Matmul(out, a.expand(a_shape), b.expand(b_shape));
  if (a_in.dim() == 1) out = out.squeeze(-2);
  if (b_in.dim() == 1) out = out.squeeze(-1);
  return out;
}

RawTensor Bmm(const RawTensor& a, const RawTensor& b) {
  CheckDefined("bmm", a, "the first input");
  CheckDefined("bmm", b, "the second input");
  TG_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
           "bmm: expected [b, m, k] and [b, k, n], got ", ShapeToString(a.shape()), " and ",
           ShapeToString(b.shape()));
  TG_CHECK(a.dtype() == b.dtype(), "bmm: dtypes ", DTypeName(a.dtype()), " and ",
           DTypeName(b.dtype()), " differ");
  return Matmul(a, b);
}

namespace {

using composed::ComputeDType;

// ---- Linear ----

void CheckLinearInputs(const char* op, const RawTensor& x, const RawTensor& weight,
                       const RawTensor& bias) {
  CheckDefined(op, x, "the input");
  CheckDefined(op, weight, "the weight");
  CommonDevice(op, {&x, &weight});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() >= 1, op, ": expected input [..., in_features], got a 0-d tensor");
  TG_CHECK(weight.dim() == 2 && weight.size(1) == x.size(-1), op, ": input of shape ",
           ShapeToString(x.shape()), " and weight of shape ", ShapeToString(weight.shape()),
           " do not match (expected weight [out_features, ", x.size(-1), "])");
  TG_CHECK(weight.dtype() == x.dtype(), op, ": weight dtype ", DTypeName(weight.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  if (bias.defined()) {
    CommonDevice(op, {&x, &bias});
    TG_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias of shape ",
             ShapeToString(bias.shape()), " does not match weight of shape ",
             ShapeToString(weight.shape()), " (expected [", weight.size(0), "])");
    TG_CHECK(bias.dtype() == x.dtype(), op, ": bias dtype ", DTypeName(bias.dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
  }
}

// x's shape with the last dim replaced by `last`.
Shape WithLastDim(const Shape& shape, int64_t last) {
  Shape s(shape.begin(), shape.end() - 1);
  s.push_back(last);
  return s;
}

// A [rows, n] view of a buffer whose row stride is n rounded up to a multiple of 8: cuBLASLt's
// layout rule for the GELU input its epilogues save and read back (aux in tensor/cuda/blas.h).
RawTensor PaddedRows(int64_t rows, int64_t n, DType dtype, Device device) {
  return RawTensor::Empty({rows, (n + 7) / 8 * 8}, dtype, device).narrow(1, 0, n);
}

}  // namespace

LinearResult Linear(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                    Activation act) {
  CheckLinearInputs("linear", x, weight, bias);
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t m = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  const RawTensor x2 = x.reshape({m, k});
  const RawTensor b = bias.defined() ? bias.contiguous() : RawTensor();
  LinearResult r;
  // An empty reduction (k == 0) is the bias (or 0): the composition gives it.
  if (k > 0) {
    r.output = RawTensor::Empty({m, n}, x.dtype(), x.device());
    if (act != Activation::kNone) r.pre_activation = PaddedRows(m, n, x.dtype(), x.device());
    if (Declined(KernelsFor(x.device())
                     .LinearForward(r.output, r.pre_activation, x2.contiguous(),
                                    weight.contiguous(), b, act))) {
      r = LinearResult();
    }
  }
  if (!r.output.defined()) r = composed::Linear(x2, weight, b, act);
  const Shape shape = WithLastDim(x.shape(), n);
  r.output = r.output.view(shape);
  if (r.pre_activation.defined()) r.pre_activation = r.pre_activation.view(shape);
  return r;
}

LinearGrads LinearBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           const RawTensor& pre_activation, Activation act, bool need_input,
                           bool need_weight, bool need_bias) {
  const char* op = "linear_backward";
  CheckLinearInputs(op, x, weight, RawTensor());
  CheckDefined(op, grad_out, "the gradient");
  CommonDevice(op, {&x, &grad_out});
  const int64_t n = weight.size(0), k = weight.size(1);
  const Shape out_shape = WithLastDim(x.shape(), n);
  TG_CHECK(grad_out.shape() == out_shape, op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " does not match the output shape ",
           ShapeToString(out_shape), " of input ", ShapeToString(x.shape()), " and weight ",
           ShapeToString(weight.shape()));
  TG_CHECK(grad_out.dtype() == x.dtype(), op, ": gradient dtype ", DTypeName(grad_out.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  if (act != Activation::kNone) {
    CheckDefined(op, pre_activation, "the pre-activation");
    CommonDevice(op, {&x, &pre_activation});
    TG_CHECK(pre_activation.shape() == out_shape && pre_activation.dtype() == x.dtype(), op,
             ": pre-activation ", ShapeToString(pre_activation.shape()), " ",
             DTypeName(pre_activation.dtype()), " does not match the output ",
             ShapeToString(out_shape), " ", DTypeName(x.dtype()));
  }
  LinearGrads r;
  if (!need_input && !need_weight && !need_bias) return r;
  const int64_t m = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  const RawTensor pre =
      act == Activation::kNone ? RawTensor() : pre_activation.reshape({m, n});  // a view if padded
  const RawTensor go = grad_out.reshape({m, n}).contiguous(), x2 = x.reshape({m, k}).contiguous();
  if (m > 0 && n > 0 && k > 0) {
    const Device device = x.device();
    if (need_input) r.grad_input = RawTensor::Empty({m, k}, x.dtype(), device);
    if (need_weight) r.grad_weight = RawTensor::Empty({n, k}, x.dtype(), device);
    if (need_bias) r.grad_bias = RawTensor::Empty({n}, x.dtype(), device);
    if (Declined(KernelsFor(device).LinearBackward(r.grad_input, r.grad_weight, r.grad_bias, go, x2,
                                                   weight.contiguous(), pre, act))) {
      r = LinearGrads();
    }
  }
  if (!r.grad_input.defined() && !r.grad_weight.defined() && !r.grad_bias.defined()) {
    r = composed::LinearBackward(go, x2, weight, pre, act, need_input, need_weight, need_bias);
  }
  if (r.grad_input.defined()) r.grad_input = r.grad_input.reshape(x.shape());
  return r;
}

}  // namespace tg
