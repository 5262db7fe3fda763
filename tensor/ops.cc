// The dispatch point of every tensor op: validate (shapes, dtypes, devices), promote, allocate
// the output, then call the kernel of the inputs' device.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/composed.h"
#include "tensor/kernel_table.h"

namespace tg {
namespace {

void CheckDefined(const char* op, const Tensor& t, const char* what) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// The device all inputs share (no implicit transfers).
Device CommonDevice(const char* op, std::initializer_list<const Tensor*> inputs) {
  const Device d = (*inputs.begin())->device();
  for (const Tensor* t : inputs) {
    TG_CHECK(t->device() == d, op, ": expected all tensors on one device, got ", d.ToString(),
             " and ", t->device().ToString());
  }
  return d;
}

// Whether a fused kernel declined the case (KernelStatus::kNoKernel): the op then composes it.
bool Declined(KernelStatus status) { return status != KernelStatus::kDone; }

void CheckFloating(const char* op, DType dtype) {
  TG_CHECK(IsFloating(dtype), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           DTypeName(dtype));
}

bool IsFloatingOnly(UnaryOp op) {
  return op != UnaryOp::kNeg && op != UnaryOp::kAbs && op != UnaryOp::kRelu;
}

// x with `dims` moved last and flattened: contiguous [rows, reduced]; also the result shape.
struct RowsView {
  Tensor rows;
  Shape out_shape;
};

RowsView ReduceToRows(const char* op, const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  const Tensor src = x.dim() == 0 ? x.reshape({1}) : x;
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

// Last-dim ops see x as contiguous [rows, n].
Tensor AsRows(const Tensor& x) {
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows =
      x.dim() == 0 ? 1 : NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  return x.contiguous().reshape({rows, n});
}

}  // namespace

Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = BinaryOpName(op);
  CheckDefined(name, a, "the first input");
  CheckDefined(name, b, "the second input");
  const Device device = CommonDevice(name, {&a, &b});
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  TG_CHECK(dtype != kBool, name, ": not defined for bool tensors; cast them first");
  if (op == BinaryOp::kDiv || op == BinaryOp::kPow) {
    TG_CHECK(IsFloating(dtype), name, ": expected floating inputs, got ", DTypeName(a.dtype()),
             " and ", DTypeName(b.dtype()), "; cast them first");
  }
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.shape(), b.shape()), dtype, device);
  KernelsFor(device).Binary(op, out, a.to(dtype), b.to(dtype));
  return out;
}

Tensor BinaryScalar(BinaryOp op, const Tensor& x, double scalar) {
  const char* name = BinaryOpName(op);
  CheckDefined(name, x, "the input");
  const Device device = CommonDevice(name, {&x});
  TG_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors; cast them first");
  if (IsIntegral(x.dtype())) {
    TG_CHECK(op != BinaryOp::kDiv && op != BinaryOp::kPow, name,
             ": expected a floating tensor, got ", DTypeName(x.dtype()), "; cast it first");
    TG_CHECK(std::trunc(scalar) == scalar && std::abs(scalar) < 9.2e18, name, ": scalar ", scalar,
             " is not an integer, and the tensor is ", DTypeName(x.dtype()), "; cast it first");
  }
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), device);
  KernelsFor(device).BinaryScalar(op, out, x, scalar);
  return out;
}

Tensor Compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const char* name = CompareOpName(op);
  CheckDefined(name, a, "the first input");
  CheckDefined(name, b, "the second input");
  const Device device = CommonDevice(name, {&a, &b});
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.shape(), b.shape()), kBool, device);
  KernelsFor(device).Compare(op, out, a.to(dtype), b.to(dtype));
  return out;
}

Tensor Unary(UnaryOp op, const Tensor& x) {
  const char* name = UnaryOpName(op);
  CheckDefined(name, x, "the input");
  const Device device = CommonDevice(name, {&x});
  if (IsFloatingOnly(op)) CheckFloating(name, x.dtype());
  TG_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors; cast them first");
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), device);
  KernelsFor(device).Unary(op, out, x);
  return out;
}

Tensor Where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  CheckDefined("where", cond, "the condition");
  CheckDefined("where", a, "the first input");
  CheckDefined("where", b, "the second input");
  const Device device = CommonDevice("where", {&cond, &a, &b});
  TG_CHECK(cond.dtype() == kBool || cond.dtype() == kU8,
           "where: the condition must be bool or u8, got ", DTypeName(cond.dtype()));
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  const Shape shape =
      BroadcastShapes("where", cond.shape(), BroadcastShapes("where", a.shape(), b.shape()));
  Tensor out = Tensor::Empty(shape, dtype, device);
  KernelsFor(device).Where(out, cond, a.to(dtype), b.to(dtype));
  return out;
}

Tensor DropoutMask(const Shape& shape, double p, Generator& gen, DType dtype, Device device) {
  TG_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  CheckFloating("dropout", dtype);
  Tensor out = Tensor::Empty(shape, dtype, device);
  const Generator::State start = gen.Reserve(static_cast<uint64_t>(out.numel()));
  KernelsFor(device).DropoutMask(out, start.seed, start.offset, p);
  return out;
}

Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined("sum", x, "the input");
  const Device device = CommonDevice("sum", {&x});
  RowsView v = ReduceToRows("sum", x, dims, keepdim);
  const DType dtype = IsFloating(x.dtype()) ? x.dtype() : kI64;
  Tensor out = Tensor::Empty({v.rows.size(0)}, dtype, device);
  KernelsFor(device).SumRows(out, v.rows);
  return out.reshape(v.out_shape);
}

Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined("mean", x, "the input");
  const Device device = CommonDevice("mean", {&x});
  CheckFloating("mean", x.dtype());
  // Sum in f64 and divide before rounding: sum/count rounded once to x's dtype, so a f16 sum
  // that would overflow f16 still gives its finite mean; NaN for an empty reduction.
  RowsView v = ReduceToRows("mean", x, dims, keepdim);
  Tensor sum = Tensor::Empty({v.rows.size(0)}, kF64, device);
  KernelsFor(device).SumRows(sum, v.rows);  // the f64 sums, read from x's dtype
  const double count = static_cast<double>(v.rows.size(1));
  return BinaryScalar(BinaryOp::kDiv, sum, count).to(x.dtype()).reshape(v.out_shape);
}

namespace {

Tensor MaxImpl(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool values) {
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  const int64_t d = WrapDim(op, dim, x.dim());
  const int64_t size = x.dim() == 0 ? 1 : x.size(d);
  TG_CHECK(size > 0, op, ": dim ", d, " of shape ", ShapeToString(x.shape()),
           " is empty; there is no maximum");
  RowsView v = ReduceToRows(op, x, {d}, keepdim);
  Tensor out = Tensor::Empty({v.rows.size(0)}, values ? x.dtype() : kI64, device);
  KernelsFor(device).MaxRows(values ? out : Tensor(), values ? Tensor() : out,
                             v.rows.contiguous());
  return out.reshape(v.out_shape);
}

}  // namespace

Tensor Max(const Tensor& x, int64_t dim, bool keepdim) {
  return MaxImpl("max", x, dim, keepdim, true);
}

Tensor Argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return MaxImpl("argmax", x, dim, keepdim, false);
}

Tensor Matmul(const Tensor& a_in, const Tensor& b_in) {
  CheckDefined("matmul", a_in, "the first input");
  CheckDefined("matmul", b_in, "the second input");
  const Device device = CommonDevice("matmul", {&a_in, &b_in});
  TG_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: shapes ", ShapeToString(a_in.shape()),
           " and ", ShapeToString(b_in.shape()), ": 0-d tensors cannot be multiplied");
  TG_CHECK(a_in.dtype() == b_in.dtype(), "matmul: dtypes ", DTypeName(a_in.dtype()), " and ",
           DTypeName(b_in.dtype()), " differ");
  CheckFloating("matmul", a_in.dtype());
  // 1-D operands: a vector is a [1, k] row on the left and a [k, 1] column on the right.
  const Tensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const Tensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
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
  Tensor out = Tensor::Empty(out_shape, a.dtype(), device);
  KernelsFor(device).Matmul(out, a.expand(a_shape), b.expand(b_shape));
  if (a_in.dim() == 1) out = out.squeeze(-2);
  if (b_in.dim() == 1) out = out.squeeze(-1);
  return out;
}

Tensor Bmm(const Tensor& a, const Tensor& b) {
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

Tensor SoftmaxImpl(const char* op, const Tensor& x, bool log) {
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  CheckFloating(op, x.dtype());
  const Tensor rows = AsRows(x);
  Tensor out = Tensor::Empty(rows.shape(), x.dtype(), device);
  KernelsFor(device).Softmax(out, rows, log);
  return out.reshape(x.shape());
}

}  // namespace

Tensor Softmax(const Tensor& x) { return SoftmaxImpl("softmax", x, false); }
Tensor LogSoftmax(const Tensor& x) { return SoftmaxImpl("log_softmax", x, true); }

namespace {

// eps, and weight / bias (each [last dim of x], x's dtype and device, or undefined).
void CheckLayerNormParams(const char* op, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, double eps) {
  TG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const int64_t n = x.size(-1);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    TG_CHECK(p->shape() == Shape{n}, op, ": ", what, " of shape ", ShapeToString(p->shape()),
             " does not match the last dim of input ", ShapeToString(x.shape()));
    TG_CHECK(p->dtype() == x.dtype(), op, ": ", what, " dtype ", DTypeName(p->dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
    CommonDevice(op, {&x, p});
  }
}

}  // namespace

LayerNormResult LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  CheckDefined("layer_norm", x, "the input");
  const Device device = CommonDevice("layer_norm", {&x});
  CheckFloating("layer_norm", x.dtype());
  TG_CHECK(x.dim() >= 1, "layer_norm: expected at least 1 dim, got a 0-d tensor");
  CheckLayerNormParams("layer_norm", x, weight, bias, eps);
  const Tensor rows = AsRows(x);
  const DType stat_dtype = x.dtype() == kF64 ? kF64 : kF32;
  LayerNormResult r{Tensor::Empty(rows.shape(), x.dtype(), device),
                    Tensor::Empty({rows.size(0)}, stat_dtype, device),
                    Tensor::Empty({rows.size(0)}, stat_dtype, device)};
  // An empty last dim gives NaN statistics (0/0), like a mean over nothing.
  KernelsFor(device).LayerNorm(r.output, r.mean, r.rstd, rows, weight, bias, eps);
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  r.output = r.output.reshape(x.shape());
  r.mean = r.mean.reshape(stat_shape);
  r.rstd = r.rstd.reshape(stat_shape);
  return r;
}

namespace {

// Indices as contiguous i64 (validated dtype).
Tensor IndicesI64(const char* op, const Tensor& indices) {
  VisitIndex(op, indices.dtype(), [](auto) {});
  return indices.to(kI64).contiguous();
}

}  // namespace

Tensor Embedding(const Tensor& weight, const Tensor& indices) {
  CheckDefined("embedding", weight, "the weight");
  CheckDefined("embedding", indices, "the indices");
  const Device device = CommonDevice("embedding", {&weight, &indices});
  TG_CHECK(weight.dim() == 2, "embedding: expected a 2-D weight [rows, dim], got ",
           ShapeToString(weight.shape()));
  const Tensor idx = IndicesI64("embedding", indices);
  Tensor out = Tensor::Empty({idx.numel(), weight.size(1)}, weight.dtype(), device);
  KernelsFor(device).Embedding(out, weight, idx);
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  return out.reshape(shape);
}

Tensor EmbeddingBackward(const Tensor& grad, const Tensor& indices, int64_t num_rows) {
  CheckDefined("embedding_backward", grad, "the gradient");
  CheckDefined("embedding_backward", indices, "the indices");
  const Device device = CommonDevice("embedding_backward", {&grad, &indices});
  CheckFloating("embedding_backward", grad.dtype());
  TG_CHECK(num_rows >= 0, "embedding_backward: num_rows must be non-negative, got ", num_rows);
  TG_CHECK(grad.dim() == indices.dim() + 1 &&
               Shape(grad.shape().begin(), grad.shape().end() - 1) == indices.shape(),
           "embedding_backward: gradient shape ", ShapeToString(grad.shape()),
           " does not match indices shape ", ShapeToString(indices.shape()), " plus one dim");
  const Tensor idx = IndicesI64("embedding_backward", indices);
  const int64_t dim = grad.size(-1);
  Tensor out = Tensor::Zeros({num_rows, dim}, grad.dtype(), device);
  KernelsFor(device).EmbeddingBackward(out, grad.contiguous().reshape({idx.numel(), dim}), idx);
  return out;
}

namespace {

void CheckCrossEntropyInputs(const char* op, const Tensor& logits, const Tensor& targets) {
  CheckDefined(op, logits, "the logits");
  CheckDefined(op, targets, "the targets");
  CommonDevice(op, {&logits, &targets});
  CheckFloating(op, logits.dtype());
  TG_CHECK(logits.dim() == 2, op, ": expected logits [N, C], got ", ShapeToString(logits.shape()));
  TG_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), op, ": targets of shape ",
           ShapeToString(targets.shape()), " do not match logits of shape ",
           ShapeToString(logits.shape()), " (expected [", logits.size(0), "])");
}

}  // namespace

Tensor CrossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                    Reduction reduction) {
  CheckCrossEntropyInputs("cross_entropy", logits, targets);
  const Tensor t = IndicesI64("cross_entropy", targets);
  Tensor losses = Tensor::Empty({logits.size(0)}, logits.dtype(), logits.device());
  const int64_t counted =
      KernelsFor(logits.device()).CrossEntropy(losses, logits.contiguous(), t, ignore_index);
  if (reduction == Reduction::kNone) return losses;
  // Reduce in f64 from the per-row losses' compute values, then round once.
  // On the logits' device: the f64 product rounds once to the logits' dtype, as on the host.
  const Tensor total = Sum(losses.to(kF64));
  const double scale = reduction == Reduction::kMean ? 1.0 / static_cast<double>(counted) : 1.0;
  return BinaryScalar(BinaryOp::kMul, total, scale).to(logits.dtype());
}

Tensor CrossEntropyBackward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                            int64_t ignore_index, Reduction reduction) {
  CheckCrossEntropyInputs("cross_entropy_backward", logits, targets);
  CheckDefined("cross_entropy_backward", grad_loss, "the loss gradient");
  // The row scales are built from grad_loss where it lives and read by the logits' kernel.
  CommonDevice("cross_entropy_backward", {&logits, &grad_loss});
  const int64_t n = logits.size(0);
  const Tensor t = IndicesI64("cross_entropy_backward", targets);
  Tensor row_scale;
  if (reduction == Reduction::kNone) {
    TG_CHECK(grad_loss.shape() == Shape{n},
             "cross_entropy_backward: expected a loss gradient of shape [", n,
             "] for reduction none, got ", ShapeToString(grad_loss.shape()));
    row_scale = grad_loss.to(kF64).contiguous();
  } else {
    TG_CHECK(grad_loss.numel() == 1,
             "cross_entropy_backward: expected a one-element loss gradient, got shape ",
             ShapeToString(grad_loss.shape()));
    // The same double arithmetic as a host loop, kept on the logits' device: the count of rows
    // that are not ignored stays there too (no host read, so no wait for a CUDA device), and
    // g / count is the one IEEE division the host would do.
    Tensor g = grad_loss.to(kF64).reshape({1});
    if (reduction == Reduction::kMean) {
      const Tensor ignore = Tensor::Full({}, static_cast<double>(ignore_index), kI64, t.device());
      g = Div(g, Sum(Ne(t, ignore)).to(kF64));
    }
    row_scale = g.expand({n}).contiguous();
  }
  Tensor grad = Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  KernelsFor(logits.device()).CrossEntropyBackward(grad, logits.contiguous(), t, row_scale,
            ignore_index);
  return grad;
}

Tensor Gather(const Tensor& x, int64_t dim, const Tensor& index) {
  CheckDefined("gather", x, "the input");
  CheckDefined("gather", index, "the index");
  const Device device = CommonDevice("gather", {&x, &index});
  const Tensor idx = IndicesI64("gather", index);
  TG_CHECK(index.dim() == x.dim(), "gather: index of shape ", ShapeToString(index.shape()),
           " and input of shape ", ShapeToString(x.shape()), " differ in rank");
  const int64_t d = WrapDim("gather", dim, x.dim());
  for (int64_t k = 0; k < x.dim(); ++k) {
    TG_CHECK(k == d || index.size(k) <= x.size(k), "gather: index of shape ",
             ShapeToString(index.shape()), " is larger than input of shape ",
             ShapeToString(x.shape()), " at dim ", k, " (only dim ", d, " may be larger)");
  }
  Tensor out = Tensor::Empty(index.shape(), x.dtype(), device);
  if (x.dim() == 0) {  // a 0-d input is one element along dim 0
    KernelsFor(device).Gather(out.reshape({1}), x.reshape({1}), idx.reshape({1}), 0);
  } else {
    KernelsFor(device).Gather(out, x, idx, d);
  }
  return out;
}

Tensor ScatterAdd(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  CheckDefined(op, self, "self");
  CheckDefined(op, index, "the index");
  CheckDefined(op, src, "src");
  CommonDevice(op, {&self, &index, &src});
  const Tensor idx = IndicesI64(op, index);
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
  Tensor out = self.clone();
  if (self.dim() == 0) {
    KernelsFor(self.device()).ScatterAdd(out.reshape({1}), idx.reshape({1}), src.reshape({1}), 0);
  } else {
    KernelsFor(self.device()).ScatterAdd(out, idx, src, d);
  }
  return out;
}

namespace {

// The index of index_select / index_add: i32/i64, at most 1-D; returned as contiguous i64 [k].
Tensor IndexList(const char* op, const Tensor& index) {
  const Tensor idx = IndicesI64(op, index);
  TG_CHECK(index.dim() <= 1, op, ": expected a 1-D index, got shape ",
           ShapeToString(index.shape()));
  return idx.reshape({idx.numel()});
}

}  // namespace

Tensor IndexSelect(const Tensor& x, int64_t dim, const Tensor& index) {
  CheckDefined("index_select", x, "the input");
  CheckDefined("index_select", index, "the index");
  const Device device = CommonDevice("index_select", {&x, &index});
  TG_CHECK(x.dim() >= 1, "index_select: cannot index a 0-d tensor");
  const Tensor idx = IndexList("index_select", index);
  const int64_t d = WrapDim("index_select", dim, x.dim());
  Shape shape = x.shape();
  shape[d] = idx.numel();
  Tensor out = Tensor::Empty(shape, x.dtype(), device);
  KernelsFor(device).IndexSelect(out, x, idx, d);
  return out;
}

Tensor IndexAdd(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_add";
  CheckDefined(op, self, "self");
  CheckDefined(op, index, "the index");
  CheckDefined(op, src, "src");
  CommonDevice(op, {&self, &index, &src});
  TG_CHECK(self.dim() >= 1, op, ": cannot index a 0-d tensor");
  TG_CHECK(self.dtype() != kBool, op, ": not defined for bool tensors; cast them first");
  TG_CHECK(src.dtype() == self.dtype(), op, ": src dtype ", DTypeName(src.dtype()),
           " differs from self dtype ", DTypeName(self.dtype()));
  const Tensor idx = IndexList(op, index);
  const int64_t d = WrapDim(op, dim, self.dim());
  Shape expected = self.shape();
  expected[d] = idx.numel();
  TG_CHECK(src.shape() == expected, op, ": src of shape ", ShapeToString(src.shape()),
           " does not match self of shape ", ShapeToString(self.shape()), " with ", idx.numel(),
           " indices at dim ", d, " (expected ", ShapeToString(expected), ")");
  Tensor out = self.clone();
  KernelsFor(self.device()).IndexAdd(out, idx, src, d);
  return out;
}

namespace {

// One spatial size of a window op (PyTorch's formula), or an error when the (dilated) kernel
// spans more than the padded input. Computed in 128 bits: no overflow for any int64 parameters.
int64_t WindowOutSize(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                      int64_t dilation) {
  const __int128 padded = static_cast<__int128>(in) + 2 * static_cast<__int128>(padding);
  const __int128 span = static_cast<__int128>(dilation) * (kernel - 1) + 1;
  if (padded < span) return 0;
  const __int128 out = (padded - span) / stride + 1;
  return out > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max()
                                                   : static_cast<int64_t>(out);
}

std::string Pair(const std::array<int64_t, 2>& v) { return ShapeToString(v); }

// Positive (or non-negative) {height, width} parameters of a window op.
void CheckPair(const char* op, const char* what, const std::array<int64_t, 2>& v, int64_t min) {
  TG_CHECK(v[0] >= min && v[1] >= min, op, ": ", what, " must be ",
           min > 0 ? "positive" : "non-negative", ", got ", Pair(v));
}

// Validates the input [N, C, H, W] and the window of a conv/pool op and fills the sizes (o, kh,
// kw and, for pooling, dilation 1 are set by the caller first).
void FillWindow(const char* op, const Tensor& x, const std::array<int64_t, 2>& stride,
                const std::array<int64_t, 2>& padding, const std::array<int64_t, 2>& dilation,
                const std::string& kernel_owner, Window2d* g) {
  CheckPair(op, "stride", stride, 1);
  CheckPair(op, "padding", padding, 0);
  CheckPair(op, "dilation", dilation, 1);
  g->n = x.size(0);
  g->c = x.size(1);
  g->h = x.size(2);
  g->w = x.size(3);
  g->sh = stride[0];
  g->sw = stride[1];
  g->ph = padding[0];
  g->pw = padding[1];
  g->dh = dilation[0];
  g->dw = dilation[1];
  g->oh = WindowOutSize(g->h, g->kh, g->sh, g->ph, g->dh);
  g->ow = WindowOutSize(g->w, g->kw, g->sw, g->pw, g->dw);
  TG_CHECK(g->oh > 0 && g->ow > 0, op, ": ", kernel_owner, " is larger than the padded input (",
           "input ", ShapeToString(x.shape()), ", padding ", Pair(padding),
           dilation[0] == 1 && dilation[1] == 1 ? "" : absl::StrCat(", dilation ", Pair(dilation)),
           ")");
}

Window2d ConvWindow(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Conv2dParams& p) {
  CheckDefined(op, x, "the input");
  CheckDefined(op, weight, "the weight");
  CommonDevice(op, {&x, &weight});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W], got shape ", ShapeToString(x.shape()));
  TG_CHECK(weight.dim() == 4, op, ": expected weight [O, C, kh, kw], got shape ",
           ShapeToString(weight.shape()));
  TG_CHECK(weight.dtype() == x.dtype(), op, ": weight dtype ", DTypeName(weight.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  TG_CHECK(weight.size(1) == x.size(1), op, ": input ", ShapeToString(x.shape()), " has ",
           x.size(1), " channels but weight ", ShapeToString(weight.shape()), " expects ",
           weight.size(1));
  TG_CHECK(weight.size(2) > 0 && weight.size(3) > 0, op, ": weight ", ShapeToString(weight.shape()),
           " has an empty kernel");
  if (bias.defined()) {
    CommonDevice(op, {&x, &bias});
    TG_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias of shape ",
             ShapeToString(bias.shape()), " does not match weight ", ShapeToString(weight.shape()),
             " (expected [", weight.size(0), "])");
    TG_CHECK(bias.dtype() == x.dtype(), op, ": bias dtype ", DTypeName(bias.dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
  }
  Window2d g;
  g.o = weight.size(0);
  g.kh = weight.size(2);
  g.kw = weight.size(3);
  FillWindow(
      op, x, p.stride, p.padding, p.dilation,
      absl::StrCat("weight ", ShapeToString(weight.shape()), " (kernel [", g.kh, ", ", g.kw, "])"),
      &g);
  return g;
}

}  // namespace

Tensor Conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dParams p) {
  const Window2d g = ConvWindow("conv2d", x, weight, bias, p);
  Tensor out = Tensor::Empty({g.n, g.o, g.oh, g.ow}, x.dtype(), x.device());
  KernelsFor(x.device()).Conv2d(out, x.contiguous(), weight.contiguous(),
            bias.defined() ? bias.contiguous() : Tensor(), g);
  return out;
}

Conv2dGrads Conv2dBackward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                           Conv2dParams p, bool need_input, bool need_weight, bool need_bias) {
  const char* op = "conv2d_backward";
  const Window2d g = ConvWindow(op, x, weight, Tensor(), p);
  CheckDefined(op, grad_out, "the gradient");
  CommonDevice(op, {&x, &grad_out});
  const Shape out_shape = {g.n, g.o, g.oh, g.ow};
  TG_CHECK(grad_out.shape() == out_shape, op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " does not match the output shape ",
           ShapeToString(out_shape), " of input ", ShapeToString(x.shape()), " and weight ",
           ShapeToString(weight.shape()));
  TG_CHECK(grad_out.dtype() == x.dtype(), op, ": gradient dtype ", DTypeName(grad_out.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  Conv2dGrads r;
  const Device device = x.device();
  if (need_input) r.grad_input = Tensor::Empty(x.shape(), x.dtype(), device);
  if (need_weight) r.grad_weight = Tensor::Empty(weight.shape(), x.dtype(), device);
  if (need_bias) r.grad_bias = Tensor::Empty({g.o}, x.dtype(), device);
  if (need_input || need_weight || need_bias) {
    KernelsFor(device).Conv2dBackward(r.grad_input, r.grad_weight, r.grad_bias,
              grad_out.contiguous(), need_weight ? x.contiguous() : Tensor(),
              need_input ? weight.contiguous() : Tensor(), g);
  }
  return r;
}

MaxPool2dResult MaxPool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                          std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  const char* op = "max_pool2d";
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W], got shape ", ShapeToString(x.shape()));
  CheckPair(op, "kernel size", kernel, 1);
  CheckPair(op, "padding", padding, 0);
  // PyTorch's rule; it also guarantees that every window holds at least one input element.
  TG_CHECK(padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2, op, ": padding ",
           Pair(padding), " must be at most half the kernel size ", Pair(kernel));
  Window2d g;
  g.o = x.size(1);
  g.kh = kernel[0];
  g.kw = kernel[1];
  FillWindow(op, x, stride, padding, {1, 1}, absl::StrCat("kernel ", Pair(kernel)), &g);
  MaxPool2dResult r{Tensor::Empty({g.n, g.c, g.oh, g.ow}, x.dtype(), device),
                    Tensor::Empty({g.n, g.c, g.oh, g.ow}, kI64, device)};
  KernelsFor(device).MaxPool2d(r.output, r.indices, x.contiguous(), g);
  return r;
}

Tensor MaxPool2dBackward(const Tensor& grad_out, const Tensor& indices, const Shape& input_shape) {
  const char* op = "max_pool2d_backward";
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, indices, "the indices");
  const Device device = CommonDevice(op, {&grad_out, &indices});
  CheckFloating(op, grad_out.dtype());
  TG_CHECK(indices.dtype() == kI64, op, ": expected i64 indices, got ", DTypeName(indices.dtype()));
  TG_CHECK(grad_out.dim() == 4 && indices.shape() == grad_out.shape(), op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " and indices of shape ",
           ShapeToString(indices.shape()), " must be one [N, C, Ho, Wo] shape");
  TG_CHECK(input_shape.size() == 4 && input_shape[0] == grad_out.size(0) &&
               input_shape[1] == grad_out.size(1),
           op, ": input shape ", ShapeToString(input_shape), " does not match gradient of shape ",
           ShapeToString(grad_out.shape()), " (expected [", grad_out.size(0), ", ",
           grad_out.size(1), ", H, W])");
  Tensor out = Tensor::Empty(input_shape, grad_out.dtype(), device);
  KernelsFor(device).MaxPool2dBackward(out, grad_out.contiguous(), indices.contiguous());
  return out;
}

bool AnyNonFinite(const std::vector<Tensor>& tensors) {
  bool found = false;
  for (const Tensor& t : tensors) {
    CheckDefined("non_finite_check", t, "a list element");
    CommonDevice("non_finite_check", {&t});
    if (IsFloating(t.dtype()))
      found = found || KernelsFor(t.device()).AnyNonFinite(t);  // integers are finite
  }
  return found;
}

void MulScalarInPlace(const std::vector<Tensor>& tensors, double scale) {
  for (const Tensor& t : tensors) {
    CheckDefined("mul_scalar_", t, "a list element");
    CommonDevice("mul_scalar_", {&t});
    CheckFloating("mul_scalar_", t.dtype());
  }
  for (const Tensor& t : tensors) KernelsFor(t.device()).ScaleInPlace(t, scale, false);
}

void NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                              const Tensor& inv_scale) {
  const char* op = "non_finite_check_and_unscale";
  CheckDefined(op, found_inf, "found_inf");
  CheckDefined(op, inv_scale, "inv_scale");
  TG_CHECK(found_inf.numel() == 1 && found_inf.dtype() == kF32, op,
           ": found_inf must be a one-element f32 tensor, got ", DTypeName(found_inf.dtype()), " ",
           ShapeToString(found_inf.shape()));
  TG_CHECK(inv_scale.numel() == 1 && inv_scale.dtype() == kF32, op,
           ": inv_scale must be a one-element f32 tensor, got ", DTypeName(inv_scale.dtype()), " ",
           ShapeToString(inv_scale.shape()));
  for (const Tensor& t : tensors) {
    CheckDefined(op, t, "a list element");
    CommonDevice(op, {&t, &found_inf, &inv_scale});
    CheckFloating(op, t.dtype());
  }
  // The kernels take a non-empty list of contiguous, non-empty tensors: empty ones have nothing
  // to scale, and a strided one is scaled in a contiguous copy that is written back.
  std::vector<Tensor> dense;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // {view, its contiguous copy}
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;
    if (t.is_contiguous()) {
      dense.push_back(t);
    } else {
      write_back.emplace_back(t, t.clone());
      dense.push_back(write_back.back().second);
    }
  }
  if (dense.empty()) return;
  if (KernelsFor(found_inf.device()).NonFiniteCheckAndUnscale(dense, found_inf, inv_scale) !=
      KernelStatus::kDone) {
    composed::NonFiniteCheckAndUnscale(dense, found_inf, inv_scale);
  }
  for (const auto& [view, copy] : write_back) view.copy_(copy);
}

// ---- Loss scale ----

namespace {

constexpr int64_t kLossScaleStateBytes = static_cast<int64_t>(sizeof(LossScaleState));

void CheckLossScaleState(const char* op, const Tensor& state) {
  CheckDefined(op, state, "the loss-scale state");
  TG_CHECK(state.dtype() == kU8 && state.shape() == Shape{kLossScaleStateBytes} &&
               state.is_contiguous(),
           op, ": expected the loss-scale state of LossScaleStateTensor (contiguous u8 [",
           kLossScaleStateBytes, "]), got ", DTypeName(state.dtype()), " ",
           ShapeToString(state.shape()));
}

// A one-element f32 tensor on the state's device, or undefined.
void CheckScaleScalar(const char* op, const char* what, const Tensor& t, const Tensor& state) {
  if (!t.defined()) return;
  CommonDevice(op, {&state, &t});
  TG_CHECK(t.numel() == 1 && t.dtype() == kF32 && t.is_contiguous(), op, ": ", what,
           " must be a one-element f32 tensor, got ", DTypeName(t.dtype()), " ",
           ShapeToString(t.shape()));
}

}  // namespace

Tensor LossScaleStateTensor(const LossScaleState& state, Device device) {
  Tensor host = Tensor::Empty({kLossScaleStateBytes}, kU8);
  std::memcpy(host.raw_data(), &state, sizeof(state));
  return device.is_cpu() ? host : host.to(device);  // the bytes, copied to where they live
}

LossScaleState ReadLossScaleState(const Tensor& state) {
  CheckLossScaleState("read_loss_scale_state", state);
  const Tensor host = state.to(Device());
  LossScaleState s;
  std::memcpy(&s, host.raw_data(), sizeof(s));
  return s;
}

void StepLossScale(const Tensor& state, const Tensor& found_inf, const Tensor& scale,
                   const Tensor& inv_scale) {
  const char* op = "step_loss_scale";
  CheckLossScaleState(op, state);
  CheckScaleScalar(op, "found_inf", found_inf, state);
  CheckScaleScalar(op, "scale", scale, state);
  CheckScaleScalar(op, "inv_scale", inv_scale, state);
  // Every device implements it (no composed form: the state machine is not made of tensor ops).
  TG_CHECK(!Declined(KernelsFor(state.device()).LossScaleStep(state, found_inf, true, scale,
                                                              inv_scale)),
           op, ": no kernel on ", state.device().ToString());
}

void WriteLossScale(const Tensor& state, const Tensor& scale, const Tensor& inv_scale) {
  const char* op = "write_loss_scale";
  CheckLossScaleState(op, state);
  CheckScaleScalar(op, "scale", scale, state);
  CheckScaleScalar(op, "inv_scale", inv_scale, state);
  TG_CHECK(!Declined(KernelsFor(state.device()).LossScaleStep(state, Tensor(), false, scale,
                                                              inv_scale)),
           op, ": no kernel on ", state.device().ToString());
}

// ---- Fused ops --------------------------------------------------------------------------------
//
// Each op validates and allocates, then calls its device's fused kernel; a kernel that declines
// the case (KernelStatus::kNoKernel) leaves it to the composed form (tensor/composed.h), which
// gives the same result to within rounding order, only slower.

namespace {

using composed::ComputeDType;

// ---- Linear ----

void CheckLinearInputs(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
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
Tensor PaddedRows(int64_t rows, int64_t n, DType dtype, Device device) {
  return Tensor::Empty({rows, (n + 7) / 8 * 8}, dtype, device).narrow(1, 0, n);
}

}  // namespace

LinearResult Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  CheckLinearInputs("linear", x, weight, bias);
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t m = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  const Tensor x2 = x.reshape({m, k});
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  LinearResult r;
  // An empty reduction (k == 0) is the bias (or 0): the composition gives it.
  if (k > 0) {
    r.output = Tensor::Empty({m, n}, x.dtype(), x.device());
    if (act != Activation::kNone) r.pre_activation = PaddedRows(m, n, x.dtype(), x.device());
    if (Declined(KernelsFor(x.device()).LinearForward(r.output, r.pre_activation, x2.contiguous(),
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

LinearGrads LinearBackward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                           const Tensor& pre_activation, Activation act, bool need_input,
                           bool need_weight, bool need_bias) {
  const char* op = "linear_backward";
  CheckLinearInputs(op, x, weight, Tensor());
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
  const Tensor pre =
      act == Activation::kNone ? Tensor() : pre_activation.reshape({m, n});  // a view if padded
  const Tensor go = grad_out.reshape({m, n}).contiguous(), x2 = x.reshape({m, k}).contiguous();
  if (m > 0 && n > 0 && k > 0) {
    const Device device = x.device();
    if (need_input) r.grad_input = Tensor::Empty({m, k}, x.dtype(), device);
    if (need_weight) r.grad_weight = Tensor::Empty({n, k}, x.dtype(), device);
    if (need_bias) r.grad_bias = Tensor::Empty({n}, x.dtype(), device);
    if (Declined(KernelsFor(device).LinearBackward(r.grad_input, r.grad_weight, r.grad_bias, go,
                                                   x2, weight.contiguous(), pre, act))) {
      r = LinearGrads();
    }
  }
  if (!r.grad_input.defined() && !r.grad_weight.defined() && !r.grad_bias.defined()) {
    r = composed::LinearBackward(go, x2, weight, pre, act, need_input, need_weight, need_bias);
  }
  if (r.grad_input.defined()) r.grad_input = r.grad_input.reshape(x.shape());
  return r;
}

// ---- Scaled dot-product attention ----

namespace {

// Validates q, k, v of attention (shared by the backward).
void CheckAttentionInputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                          bool causal, double scale) {
  CheckDefined(op, q, "q");
  CheckDefined(op, k, "k");
  CheckDefined(op, v, "v");
  CommonDevice(op, {&q, &k, &v});
  CheckFloating(op, q.dtype());
  TG_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op, ": q, k and v dtypes ",
           DTypeName(q.dtype()), ", ", DTypeName(k.dtype()), " and ", DTypeName(v.dtype()),
           " differ");
  TG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
           ": expected q, k and v as [B, H, T, D], got ", ShapeToString(q.shape()), ", ",
           ShapeToString(k.shape()), " and ", ShapeToString(v.shape()));
  TG_CHECK(k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
               k.size(3) == q.size(3),
           op, ": q ", ShapeToString(q.shape()), ", k ", ShapeToString(k.shape()), " and v ",
           ShapeToString(v.shape()), " do not match (expected k and v [", q.size(0), ", ",
           q.size(1), ", Tk, ", q.size(3), "])");
  const int64_t tq = q.size(2), tk = k.size(2);
  TG_CHECK(!causal || tq == tk, op, ": causal attention needs as many queries as keys, got ", tq,
           " and ", tk);
  TG_CHECK(tk > 0 || tq == 0 || q.size(0) * q.size(1) == 0, op, ": ", tq,
           " queries attend to no keys (k is ", ShapeToString(k.shape()), ")");
  TG_CHECK(std::isfinite(scale), op, ": scale ", scale, " is not finite");
}

// A [B, H, T, D] tensor for attention's output or gradients, of `like`'s shape. On the CPU it
// is laid out [B, T, H, D] (a permuted view, as PyTorch's CPU flash attention lays out its
// output), so that merging the heads back into [B, T, H * D] (the output, and each of the q/k/v
// gradients on its way back to the projection) is a view rather than a copy. CUDA keeps
// [B, H, T, D], the layout its kernels were checked with on a GPU.
Tensor AttentionTensor(const Tensor& like, DType dtype) {
  if (!like.device().is_cpu()) return Tensor::Empty(like.shape(), dtype, like.device());
  return Tensor::Empty({like.size(0), like.size(2), like.size(1), like.size(3)}, dtype,
                       like.device())
      .permute({0, 2, 1, 3});
}

}  // namespace

AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal, double scale) {
  CheckAttentionInputs("scaled_dot_product_attention", q, k, v, causal, scale);
  if (q.size(0) * q.size(1) * q.size(2) > 0) {
    AttentionResult r{AttentionTensor(q, q.dtype()),
                      Tensor::Empty({q.size(0), q.size(1), q.size(2)}, ComputeDType(q.dtype()),
                                    q.device())};
    if (!Declined(KernelsFor(q.device()).ScaledDotProductAttention(r.output, r.stats, q, k, v,
                                                                   causal, scale))) {
      return r;
    }
  }
  return composed::Attention(q, k, v, causal, scale);
}

AttentionGrads ScaledDotProductAttentionBackward(const Tensor& grad_out, const Tensor& q,
                                                 const Tensor& k, const Tensor& v,
                                                 const Tensor& output, const Tensor& stats,
                                                 bool causal, double scale) {
  const char* op = "scaled_dot_product_attention_backward";
  CheckAttentionInputs(op, q, k, v, causal, scale);
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, output, "the output");
  CheckDefined(op, stats, "stats");
  CommonDevice(op, {&q, &grad_out, &output, &stats});
  for (const Tensor* t : {&grad_out, &output}) {
    const char* what = t == &grad_out ? "gradient" : "output";
    TG_CHECK(t->shape() == q.shape(), op, ": ", what, " of shape ", ShapeToString(t->shape()),
             " does not match q of shape ", ShapeToString(q.shape()));
    TG_CHECK(t->dtype() == q.dtype(), op, ": ", what, " dtype ", DTypeName(t->dtype()),
             " differs from q dtype ", DTypeName(q.dtype()));
  }
  const Shape stats_shape = {q.size(0), q.size(1), q.size(2)};
  const DType stats_dtype = ComputeDType(q.dtype());
  TG_CHECK(stats.shape() == stats_shape && stats.dtype() == stats_dtype, op, ": stats ",
           ShapeToString(stats.shape()), " ", DTypeName(stats.dtype()), " do not match ",
           ShapeToString(stats_shape), " ", DTypeName(stats_dtype),
           " (as the forward returns them)");
  // The CPU kernel reads any strides (each head's rows are gathered anyway); CUDA's is given the
  // contiguous layout it was checked with.
  const Tensor dout = q.device().is_cpu() ? grad_out : grad_out.contiguous();
  if (q.numel() > 0) {
    AttentionGrads r{AttentionTensor(q, q.dtype()), AttentionTensor(k, q.dtype()),
                     AttentionTensor(v, q.dtype())};
    if (!Declined(KernelsFor(q.device()).ScaledDotProductAttentionBackward(
            r.grad_q, r.grad_k, r.grad_v, dout, q, k, v, output, stats.contiguous(), causal,
            scale))) {
      return r;
    }
  }
  return composed::AttentionBackward(dout, q, k, v, output, stats, causal, scale);
}

// ---- Layer norm ----

LayerNormGrads LayerNormBackward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& weight, bool need_weight_bias) {
  const char* op = "layer_norm_backward";
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, x, "the input");
  CheckDefined(op, mean, "mean");
  CheckDefined(op, rstd, "rstd");
  const Device device = CommonDevice(op, {&x, &grad_out, &mean, &rstd});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() >= 1, op, ": expected at least 1 dim, got a 0-d tensor");
  TG_CHECK(grad_out.shape() == x.shape(), op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " does not match input of shape ",
           ShapeToString(x.shape()));
  TG_CHECK(grad_out.dtype() == x.dtype(), op, ": gradient dtype ", DTypeName(grad_out.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  const DType ct = ComputeDType(x.dtype());
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  for (const Tensor* t : {&mean, &rstd}) {
    TG_CHECK(t->shape() == stat_shape && t->dtype() == ct, op, ": ", t == &mean ? "mean" : "rstd",
             " ", ShapeToString(t->shape()), " ", DTypeName(t->dtype()),
             " does not match input of shape ", ShapeToString(x.shape()), " (expected ",
             ShapeToString(stat_shape), " ", DTypeName(ct), ")");
  }
  const int64_t n = x.size(-1);
  if (weight.defined()) {
    CommonDevice(op, {&x, &weight});
    TG_CHECK(weight.shape() == Shape{n}, op, ": weight of shape ", ShapeToString(weight.shape()),
             " does not match the last dim of input ", ShapeToString(x.shape()));
    TG_CHECK(weight.dtype() == x.dtype(), op, ": weight dtype ", DTypeName(weight.dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
  }
  const Tensor xr = AsRows(x), gr = AsRows(grad_out);
  const int64_t rows = xr.size(0);
  const Tensor mean_r = mean.reshape({rows}).contiguous();
  const Tensor rstd_r = rstd.reshape({rows}).contiguous();
  LayerNormGrads r{Tensor::Empty(xr.shape(), x.dtype(), device), Tensor(), Tensor()};
  if (need_weight_bias) {
    r.grad_weight = Tensor::Empty({n}, x.dtype(), device);
    r.grad_bias = Tensor::Empty({n}, x.dtype(), device);
  }
  if (Declined(KernelsFor(device).LayerNormBackward(
          r.grad_input, r.grad_weight, r.grad_bias, gr, xr, mean_r, rstd_r,
          weight.defined() ? weight.contiguous() : Tensor()))) {
    r = composed::LayerNormBackward(gr, xr, mean_r, rstd_r, weight, need_weight_bias);
  }
  r.grad_input = r.grad_input.reshape(x.shape());
  return r;
}

AddLayerNormResult AddLayerNorm(const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, double eps) {
  const char* op = "add_layer_norm";
  CheckDefined(op, a, "the first input");
  CheckDefined(op, b, "the second input");
  const Device device = CommonDevice(op, {&a, &b});
  TG_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), op, ": inputs ",
           ShapeToString(a.shape()), " ", DTypeName(a.dtype()), " and ", ShapeToString(b.shape()),
           " ", DTypeName(b.dtype()), " differ (expected one shape and dtype)");
  CheckFloating(op, a.dtype());
  TG_CHECK(a.dim() >= 1, op, ": expected at least 1 dim, got a 0-d tensor");
  CheckLayerNormParams(op, a, weight, bias, eps);
  const Tensor ar = AsRows(a), br = AsRows(b);
  const int64_t rows = ar.size(0);
  const Shape stat_shape(a.shape().begin(), a.shape().end() - 1);
  const DType ct = ComputeDType(a.dtype());
  AddLayerNormResult r;
  r.residual = Tensor::Empty(ar.shape(), a.dtype(), device);
  r.norm = {Tensor::Empty(ar.shape(), a.dtype(), device), Tensor::Empty({rows}, ct, device),
            Tensor::Empty({rows}, ct, device)};
  if (Declined(KernelsFor(device).AddLayerNorm(
          r.residual, r.norm.output, r.norm.mean, r.norm.rstd, ar, br,
          weight.defined() ? weight.contiguous() : Tensor(),
          bias.defined() ? bias.contiguous() : Tensor(), eps))) {
    return composed::AddLayerNorm(a, b, weight, bias, eps);
  }
  r.residual = r.residual.reshape(a.shape());
  r.norm.output = r.norm.output.reshape(a.shape());
  r.norm.mean = r.norm.mean.reshape(stat_shape);
  r.norm.rstd = r.norm.rstd.reshape(stat_shape);
  return r;
}

// ---- Cross-entropy with its gradient ----

CrossEntropyResult CrossEntropyWithGrad(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, Reduction reduction,
                                        double grad_scale) {
  const char* op = "cross_entropy_with_grad";
  CheckCrossEntropyInputs(op, logits, targets);
  const Tensor t = IndicesI64(op, targets);
  const Device device = logits.device();
  const int64_t n = logits.size(0);
  const Tensor lg = logits.contiguous();
  // Row scales and the mean's divisor in f64 where the logits live, with the arithmetic of
  // CrossEntropy / CrossEntropyBackward: grad_scale / count, and total * (1 / count). The count
  // stays on the device (no host wait).
  Tensor row_scale = Tensor::Full({n}, grad_scale, kF64, device);
  Tensor inv_count;
  if (reduction == Reduction::kMean) {
    const Tensor ignore = Tensor::Full({}, static_cast<double>(ignore_index), kI64, device);
    const Tensor count = Sum(Ne(t, ignore)).to(kF64);
    row_scale = Div(row_scale, count);
    inv_count = Div(Tensor::Full({}, 1.0, kF64, device), count);
  }
  CrossEntropyResult r{Tensor::Empty({n}, logits.dtype(), device),
                       Tensor::Empty(lg.shape(), logits.dtype(), device)};
  if (Declined(KernelsFor(device).SoftmaxCrossEntropy(r.loss, r.grad_logits, lg, t, row_scale,
                                                      ignore_index))) {
    r = composed::SoftmaxCrossEntropy(lg, t, row_scale, ignore_index);
  }
  if (reduction == Reduction::kSum) r.loss = Sum(r.loss.to(kF64)).to(logits.dtype());
  if (reduction == Reduction::kMean)
    r.loss = Mul(Sum(r.loss.to(kF64)), inv_count).to(logits.dtype());
  return r;
}

// ---- Optimizer multi-tensor ops ----

namespace {

// Checks list `what` (`n` tensors, defined, floating, on `device`, of the shapes of `params`).
void CheckParamList(const char* op, const char* what, const std::vector<Tensor>& list,
                    const std::vector<Tensor>& params, Device device, bool allow_undefined) {
  TG_CHECK(list.size() == params.size(), op, ": ", what, " has ", list.size(),
           " tensors, params has ", params.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const Tensor& t = list[i];
    if (allow_undefined && !t.defined()) continue;
    TG_CHECK(t.defined(), op, ": ", what, "[", i, "] is an undefined tensor");
    TG_CHECK(t.device() == device, op, ": ", what, "[", i, "] is on ", t.device().ToString(),
             ", params on ", device.ToString());
    TG_CHECK(IsFloating(t.dtype()), op, ": ", what, "[", i, "] has dtype ", DTypeName(t.dtype()),
             "; expected f32, f64, f16 or bf16");
    TG_CHECK(t.shape() == params[i].shape(), op, ": ", what, "[", i, "] has shape ",
             ShapeToString(t.shape()), ", its parameter ", ShapeToString(params[i].shape()));
  }
}

// State tensors hold the compute dtype of their parameter.
void CheckStateDTypes(const char* op, const char* what, const std::vector<Tensor>& list,
                      const std::vector<Tensor>& params) {
  for (size_t i = 0; i < list.size(); ++i) {
    const DType cd = ComputeDType(params[i].dtype());
    TG_CHECK(list[i].dtype() == cd, op, ": ", what, "[", i, "] is ", DTypeName(list[i].dtype()),
             "; expected ", DTypeName(cd), " for a ", DTypeName(params[i].dtype()), " parameter");
  }
}

// A one-element tensor of `dtype` on `device`, or undefined.
void CheckOptionalScalar(const char* op, const char* what, const Tensor& t, Device device,
                         DType dtype) {
  if (!t.defined()) return;
  TG_CHECK(t.numel() == 1 && t.dtype() == dtype, op, ": ", what, " must be a one-element ",
           DTypeName(dtype), " tensor, got ", DTypeName(t.dtype()), " ", ShapeToString(t.shape()));
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(),
           ", params on ", device.ToString());
}

}  // namespace

void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  const char* op = "FusedAdam";
  const std::vector<Tensor>& params = lists.params;
  TG_CHECK(o.lr >= 0 && o.eps >= 0 && o.weight_decay >= 0 && o.beta1 >= 0 && o.beta1 < 1 &&
               o.beta2 >= 0 && o.beta2 < 1,
           op, ": invalid options lr ", o.lr, ", betas (", o.beta1, ", ", o.beta2, "), eps ", o.eps,
           ", weight_decay ", o.weight_decay);
  TG_CHECK(o.device_step.defined() || o.step >= 1, op,
           ": step must be >= 1 (the update's step number), got ", o.step);
  if (params.empty()) return;
  CheckDefined(op, params[0], "params[0]");
  const Device device = params[0].device();
  CheckParamList(op, "params", params, params, device, false);
  CheckParamList(op, "grads", lists.grads, params, device, false);
  CheckParamList(op, "exp_avgs", lists.exp_avgs, params, device, false);
  CheckParamList(op, "exp_avg_sqs", lists.exp_avg_sqs, params, device, false);
  CheckStateDTypes(op, "exp_avgs", lists.exp_avgs, params);
  CheckStateDTypes(op, "exp_avg_sqs", lists.exp_avg_sqs, params);
  if (o.amsgrad) {
    CheckParamList(op, "max_exp_avg_sqs (amsgrad)", lists.max_exp_avg_sqs, params, device, false);
    CheckStateDTypes(op, "max_exp_avg_sqs", lists.max_exp_avg_sqs, params);
  }
  if (!lists.model_params.empty()) {
    CheckParamList(op, "model_params", lists.model_params, params, device, true);
  }
  CheckOptionalScalar(op, "device_step", o.device_step, device, kF64);
  CheckOptionalScalar(op, "inv_scale", o.inv_scale, device, kF32);
  CheckOptionalScalar(op, "found_inf", o.found_inf, device, kF32);
  const KernelTable& kernels = KernelsFor(device);
  if (!Declined(kernels.FusedAdam(lists, o))) return;
  if (o.device_step.defined() || params.size() == 1) {
    composed::FusedAdam(lists, o);  // device_step moves once per call: no split
    return;
  }
  // A list the kernel declines as a whole may hold parameters it handles (f32 masters next to a
  // f64 parameter): each parameter on its own.
  for (size_t i = 0; i < params.size(); ++i) {
    AdamTensorLists one;
    one.params = {params[i]};
    one.grads = {lists.grads[i]};
    one.exp_avgs = {lists.exp_avgs[i]};
    one.exp_avg_sqs = {lists.exp_avg_sqs[i]};
    if (o.amsgrad) one.max_exp_avg_sqs = {lists.max_exp_avg_sqs[i]};
    if (!lists.model_params.empty()) one.model_params = {lists.model_params[i]};
    if (Declined(kernels.FusedAdam(one, o))) composed::FusedAdam(one, o);
  }
}

void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& o) {
  const char* op = "FusedSgd";
  const std::vector<Tensor>& params = lists.params;
  TG_CHECK(o.lr >= 0 && o.momentum >= 0 && o.weight_decay >= 0, op, ": invalid options lr ",
           o.lr, ", momentum ", o.momentum, ", weight_decay ", o.weight_decay);
  TG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), op,
           ": nesterov momentum requires a momentum > 0 and zero dampening");
  if (params.empty()) return;
  CheckDefined(op, params[0], "params[0]");
  const Device device = params[0].device();
  CheckParamList(op, "params", params, params, device, false);
  CheckParamList(op, "grads", lists.grads, params, device, false);
  if (o.momentum != 0) {
    CheckParamList(op, "momentum_buffers", lists.momentum_buffers, params, device, false);
    CheckStateDTypes(op, "momentum_buffers", lists.momentum_buffers, params);
  }
  if (Declined(KernelsFor(device).FusedSgd(lists, o))) composed::FusedSgd(lists, o);
}

Tensor GlobalGradNorm(const std::vector<Tensor>& tensors, double norm_type, DType dtype) {
  const char* op = "GlobalGradNorm";
  TG_CHECK(norm_type > 0, op, ": norm_type must be > 0 (or inf), got ", norm_type);
  TG_CHECK(dtype == kF64 || dtype == kF32, op, ": the norm's dtype must be f64 or f32, got ",
           DTypeName(dtype));
  TG_CHECK(!tensors.empty(), op, ": tensors is empty");
  for (size_t i = 0; i < tensors.size(); ++i) {
    CheckDefined(op, tensors[i], "a list element");
    CommonDevice(op, {&tensors[0], &tensors[i]});
    CheckFloating(op, tensors[i].dtype());
  }
  Tensor norm = Tensor::Empty({}, dtype, tensors[0].device());
  if (Declined(KernelsFor(norm.device()).GlobalGradNorm(norm, tensors, norm_type))) {
    composed::GlobalGradNorm(norm, tensors, norm_type);
  }
  return norm;
}

void ClipByNorm(const std::vector<Tensor>& tensors, const Tensor& total_norm, double max_norm) {
  const char* op = "ClipByNorm";
  TG_CHECK(max_norm >= 0, op, ": max_norm must be >= 0, got ", max_norm);
  CheckDefined(op, total_norm, "total_norm");
  TG_CHECK(total_norm.numel() == 1 && (total_norm.dtype() == kF64 || total_norm.dtype() == kF32),
           op, ": total_norm must be a one-element f64 or f32 tensor, got ",
           DTypeName(total_norm.dtype()), " ", ShapeToString(total_norm.shape()));
  if (tensors.empty()) return;
  for (const Tensor& t : tensors) {
    CheckDefined(op, t, "a list element");
    CommonDevice(op, {&total_norm, &t});
    CheckFloating(op, t.dtype());
  }
  if (Declined(KernelsFor(total_norm.device()).ClipByNorm(tensors, total_norm, max_norm))) {
    composed::ClipByNorm(tensors, total_norm, max_norm);
  }
}

}  // namespace tg
