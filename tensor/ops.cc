// The dispatch point of every tensor op: validate (shapes, dtypes, devices), promote, allocate
// the output, then call the kernel of the inputs' device.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cuda/amp_kernels.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_fused.h"

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

// Calls `kernel` of `device`'s list (tensor/cpu/kernels.h or tensor/cuda/kernels.h: the same
// names and signatures).
#define TG_KERNEL(device, kernel, ...) \
  ((device).is_cuda() ? cuda::kernel(__VA_ARGS__) : cpu::kernel(__VA_ARGS__))

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
  return {src.permute(perm).contiguous().reshape({rows, inner}), out_shape};
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
  TG_KERNEL(device, Binary, op, out, a.to(dtype), b.to(dtype));
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
  TG_KERNEL(device, BinaryScalar, op, out, x, scalar);
  return out;
}

Tensor Compare(CompareOp op, const Tensor& a, const Tensor& b) {
  const char* name = CompareOpName(op);
  CheckDefined(name, a, "the first input");
  CheckDefined(name, b, "the second input");
  const Device device = CommonDevice(name, {&a, &b});
  const DType dtype = PromoteTypes(a.dtype(), b.dtype());
  Tensor out = Tensor::Empty(BroadcastShapes(name, a.shape(), b.shape()), kBool, device);
  TG_KERNEL(device, Compare, op, out, a.to(dtype), b.to(dtype));
  return out;
}

Tensor Unary(UnaryOp op, const Tensor& x) {
  const char* name = UnaryOpName(op);
  CheckDefined(name, x, "the input");
  const Device device = CommonDevice(name, {&x});
  if (IsFloatingOnly(op)) CheckFloating(name, x.dtype());
  TG_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors; cast them first");
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), device);
  TG_KERNEL(device, Unary, op, out, x);
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
  TG_KERNEL(device, Where, out, cond, a.to(dtype), b.to(dtype));
  return out;
}

Tensor DropoutMask(const Shape& shape, double p, Generator& gen, DType dtype, Device device) {
  TG_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  CheckFloating("dropout", dtype);
  Tensor out = Tensor::Empty(shape, dtype, device);
  const Generator::State start = gen.Reserve(static_cast<uint64_t>(out.numel()));
  TG_KERNEL(device, DropoutMask, out, start.seed, start.offset, p);
  return out;
}

Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  CheckDefined("sum", x, "the input");
  const Device device = CommonDevice("sum", {&x});
  RowsView v = ReduceToRows("sum", x, dims, keepdim);
  const DType dtype = IsFloating(x.dtype()) ? x.dtype() : kI64;
  Tensor out = Tensor::Empty({v.rows.size(0)}, dtype, device);
  TG_KERNEL(device, SumRows, out, v.rows);
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
  TG_KERNEL(device, SumRows, sum, v.rows);  // the f64 sums, read from x's dtype
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
  TG_KERNEL(device, MaxRows, values ? out : Tensor(), values ? Tensor() : out, v.rows);
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
  TG_KERNEL(device, Matmul, out, a.expand(a_shape), b.expand(b_shape));
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
  TG_KERNEL(device, Softmax, out, rows, log);
  return out.reshape(x.shape());
}

}  // namespace

Tensor Softmax(const Tensor& x) { return SoftmaxImpl("softmax", x, false); }
Tensor LogSoftmax(const Tensor& x) { return SoftmaxImpl("log_softmax", x, true); }

LayerNormResult LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  CheckDefined("layer_norm", x, "the input");
  const Device device = CommonDevice("layer_norm", {&x});
  CheckFloating("layer_norm", x.dtype());
  TG_CHECK(x.dim() >= 1, "layer_norm: expected at least 1 dim, got a 0-d tensor");
  TG_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  const int64_t n = x.size(-1);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    TG_CHECK(p->shape() == Shape{n}, "layer_norm: ", what, " of shape ", ShapeToString(p->shape()),
             " does not match the last dim of input ", ShapeToString(x.shape()));
    TG_CHECK(p->dtype() == x.dtype(), "layer_norm: ", what, " dtype ", DTypeName(p->dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
    CommonDevice("layer_norm", {&x, p});
  }
  const Tensor rows = AsRows(x);
  const DType stat_dtype = x.dtype() == kF64 ? kF64 : kF32;
  LayerNormResult r{Tensor::Empty(rows.shape(), x.dtype(), device),
                    Tensor::Empty({rows.size(0)}, stat_dtype, device),
                    Tensor::Empty({rows.size(0)}, stat_dtype, device)};
  // An empty last dim gives NaN statistics (0/0), like a mean over nothing.
  TG_KERNEL(device, LayerNorm, r.output, r.mean, r.rstd, rows, weight, bias, eps);
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
  TG_KERNEL(device, Embedding, out, weight, idx);
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
  TG_KERNEL(device, EmbeddingBackward, out, grad.contiguous().reshape({idx.numel(), dim}), idx);
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
      TG_KERNEL(logits.device(), CrossEntropy, losses, logits.contiguous(), t, ignore_index);
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
  TG_KERNEL(logits.device(), CrossEntropyBackward, grad, logits.contiguous(), t, row_scale,
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
    TG_KERNEL(device, Gather, out.reshape({1}), x.reshape({1}), idx.reshape({1}), 0);
  } else {
    TG_KERNEL(device, Gather, out, x, idx, d);
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
    TG_KERNEL(self.device(), ScatterAdd, out.reshape({1}), idx.reshape({1}), src.reshape({1}), 0);
  } else {
    TG_KERNEL(self.device(), ScatterAdd, out, idx, src, d);
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
  TG_KERNEL(device, IndexSelect, out, x, idx, d);
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
  TG_KERNEL(self.device(), IndexAdd, out, idx, src, d);
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
  TG_KERNEL(x.device(), Conv2d, out, x.contiguous(), weight.contiguous(),
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
    TG_KERNEL(device, Conv2dBackward, r.grad_input, r.grad_weight, r.grad_bias,
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
  TG_KERNEL(device, MaxPool2d, r.output, r.indices, x.contiguous(), g);
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
  TG_KERNEL(device, MaxPool2dBackward, out, grad_out.contiguous(), indices.contiguous());
  return out;
}

bool AnyNonFinite(const std::vector<Tensor>& tensors) {
  bool found = false;
  for (const Tensor& t : tensors) {
    CheckDefined("non_finite_check", t, "a list element");
    CommonDevice("non_finite_check", {&t});
    if (IsFloating(t.dtype()))
      found = found || TG_KERNEL(t.device(), AnyNonFinite, t);  // integers are finite
  }
  return found;
}

void MulScalarInPlace(const std::vector<Tensor>& tensors, double scale) {
  for (const Tensor& t : tensors) {
    CheckDefined("mul_scalar_", t, "a list element");
    CommonDevice("mul_scalar_", {&t});
    CheckFloating("mul_scalar_", t.dtype());
  }
  for (const Tensor& t : tensors) TG_KERNEL(t.device(), ScaleInPlace, t, scale, false);
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
  if (found_inf.device().is_cuda()) {
    // One multi-tensor launch; found_inf and the scale stay on the device (no host sync). The
    // kernel takes a non-empty list of contiguous tensors: empty ones have nothing to scale, and
    // a strided one is scaled in a contiguous copy that is written back (the CPU scales views in
    // place, so both devices accept any list).
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
    cuda::NonFiniteCheckAndUnscale(dense, found_inf, inv_scale);
    for (const auto& [view, copy] : write_back) view.copy_(copy);
    return;
  }
  const double inv = inv_scale.item();
  bool found = false;
  for (const Tensor& t : tensors) found = cpu::ScaleInPlace(t, inv, true) || found;
  if (found) found_inf.fill_(1);
}

// ---- Fused ops --------------------------------------------------------------------------------
//
// Each op validates, then runs its CUDA kernels on CUDA tensors and otherwise its composition of
// the ops above in the compute dtype. A CUDA path that depends on a library having a kernel for
// the problem (a cuBLASLt GELU epilogue, a cuDNN attention engine) falls back to the composed
// version when the library says it has none: the result is the same to within rounding order,
// only slower.

namespace {

// The compute dtype of the fused ops: f64 for f64, f32 for f32/f16/bf16.
DType ComputeDType(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// Whether `e` is a library's "no kernel for this problem" (the only failures a fused path falls
// back from; anything else propagates).
bool IsNoKernel(const Error& e, const char* phrase) {
  return std::string(e.what()).find(phrase) != std::string::npos;
}
constexpr char kNoCublasLtAlgorithm[] = "cuBLASLt has no algorithm";
constexpr char kNoCudnnAttention[] = "cuDNN has no fused attention engine";

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

// Whether a [rows, n] tensor already has that layout (MatmulEx's check on aux).
bool HasAuxLayout(const Tensor& t) {
  const int64_t n = t.size(1), row = t.strides()[0];
  return (n == 1 || t.strides()[1] == 1) && row >= n && row % 8 == 0;
}

// d gelu_tanh(x) / dx for x in the compute dtype. With u = k (x + c x^3):
// gelu'(x) = (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2).
Tensor GeluTanhGrad(const Tensor& x) {
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2 / pi)
  const Tensor x2 = Mul(x, x);
  const Tensor t = Tanh(MulScalar(Add(x, MulScalar(Mul(x2, x), c)), k));
  const Tensor left = MulScalar(AddScalar(t, 1), 0.5);
  const Tensor du = MulScalar(AddScalar(MulScalar(x2, 3 * c), 1), k);
  const Tensor right = Mul(MulScalar(x, 0.5), Mul(AddScalar(Neg(Mul(t, t)), 1), du));
  return Add(left, right);
}

// Linear on x2 [m, in] as a composition of the ops above in the compute dtype (the CPU
// implementation; CUDA's for f64 GELU and where cuBLASLt has no fused kernel).
LinearResult LinearComposed(const Tensor& x2, const Tensor& weight, const Tensor& bias,
                            Activation act) {
  const DType dtype = x2.dtype(), ct = ComputeDType(dtype);
  Tensor pre = Matmul(x2.to(ct), weight.to(ct).transpose(0, 1));
  if (bias.defined()) pre = Add(pre, bias.to(ct));
  if (act == Activation::kNone) return {pre.to(dtype), Tensor()};
  return {GeluTanh(pre).to(dtype), pre.to(dtype)};
}

// Linear on CUDA: one cuBLASLt product with the bias (+ GELU) epilogue; the GELU epilogues also
// store the pre-activation (aux).
LinearResult LinearCuda(const Tensor& x2, const Tensor& weight, const Tensor& bias,
                        Activation act) {
  using cuda::Epilogue;
  const DType dtype = x2.dtype();
  const Device device = x2.device();
  const int64_t m = x2.size(0), n = weight.size(0);
  LinearResult r;
  r.output = Tensor::Empty({m, n}, dtype, device);
  if (act == Activation::kNone) {
    cuda::MatmulEx(r.output, x2, false, weight, true,
                   bias.defined() ? Epilogue::kBias : Epilogue::kNone, bias, Tensor());
    return r;
  }
  r.pre_activation = PaddedRows(m, n, dtype, device);
  if (dtype != kF64) {  // cuBLASLt has no GELU epilogue for f64
    try {
      cuda::MatmulEx(r.output, x2, false, weight, true,
                     bias.defined() ? Epilogue::kBiasGelu : Epilogue::kGelu, bias,
                     r.pre_activation);
      return r;
    } catch (const Error& e) {
      if (!IsNoKernel(e, kNoCublasLtAlgorithm)) throw;
    }
  }
  // Unfused: the pre-activation in the compute dtype (f16/bf16 products store their f32
  // accumulator), then GELU of the unrounded value, as the epilogue computes it.
  const DType ct = ComputeDType(dtype);
  const Tensor pre = Tensor::Empty({m, n}, ct, device);
  cuda::MatmulEx(pre, x2, false, weight, true, bias.defined() ? Epilogue::kBias : Epilogue::kNone,
                 bias.defined() ? bias.to(ct) : Tensor(), Tensor());
  r.output.copy_(GeluTanh(pre));
  r.pre_activation.copy_(pre);
  return r;
}

// The gradient of the pre-activation, g = grad_out * act'(pre), rounded to the dtype, and the
// column sums of g (the bias gradient, in the compute dtype) when want_sum; composed.
std::pair<Tensor, Tensor> PreActivationGradComposed(const Tensor& go, const Tensor& pre,
                                                    Activation act, bool want_sum) {
  if (act == Activation::kNone) return {go, want_sum ? Sum(go, {0}) : Tensor()};
  const DType ct = ComputeDType(go.dtype());
  const Tensor g = Mul(go.to(ct), GeluTanhGrad(pre.to(ct)));
  return {g.to(go.dtype()), want_sum ? Sum(g, {0}) : Tensor()};
}

LinearGrads LinearBackwardImpl(const Tensor& go, const Tensor& x2, const Tensor& weight,
                               const Tensor& pre, Activation act, bool need_input, bool need_weight,
                               bool need_bias) {
  using cuda::Epilogue;
  const DType dtype = x2.dtype();
  const Device device = x2.device();
  const int64_t m = x2.size(0), k = x2.size(1), n = weight.size(0);
  LinearGrads r;
  if (!device.is_cuda()) {
    const auto [g, g_sum] = PreActivationGradComposed(go, pre, act, need_bias);
    if (need_input) r.grad_input = Matmul(g, weight);
    if (need_weight) r.grad_weight = Matmul(g.transpose(0, 1), x2);
    if (need_bias) r.grad_bias = g_sum.to(dtype);
    return r;
  }
  // CUDA. g [m, n]: for GELU one cuBLASLt pass with the dGELU epilogue (plus, with kDGeluBgrad,
  // the bias gradient as its column sums). The epilogue multiplies a product's output by
  // gelu'(aux), and a layer's own backward has no product in front of its dGELU (the one that
  // precedes it belongs to the next layer), so it runs on a rank-1 product that contributes
  // zero: g = dgelu(zeros [m, 1] @ ones [1, n] + 1 * g) with grad_out copied into g first and
  // read back in place (beta = 1). That is one pass over grad_out and pre, like an elementwise
  // kernel, with cuBLASLt's own gelu' (the one the forward epilogue pairs with).
  Tensor g = go;
  if (act == Activation::kGeluTanh) {
    bool fused = false;
    if (dtype != kF64 && m > 0) {  // no dGELU epilogue for f64
      Tensor aux = pre;
      if (!HasAuxLayout(aux)) {
        aux = PaddedRows(m, n, dtype, device);
        aux.copy_(pre);
      }
      g = Tensor::Empty({m, n}, dtype, device);
      g.copy_(go);
      if (need_bias) r.grad_bias = Tensor::Empty({n}, dtype, device);
      try {
        cuda::MatmulEx(g, Tensor::Zeros({m, 1}, dtype, device), false,
                       cuda::OnesVector(n, dtype, device.index).view({1, n}), false,
                       need_bias ? Epilogue::kDGeluBgrad : Epilogue::kDGelu, r.grad_bias, aux, 1.0f,
                       1.0f);
        fused = true;
      } catch (const Error& e) {
        if (!IsNoKernel(e, kNoCublasLtAlgorithm)) throw;
      }
    }
    if (!fused) {
      const auto [g_composed, g_sum] = PreActivationGradComposed(go, pre, act, need_bias);
      g = g_composed.contiguous();
      if (need_bias) r.grad_bias = g_sum.to(dtype);
    }
  }
  if (need_weight) {
    r.grad_weight = Tensor::Empty({n, k}, dtype, device);
    // grad_weight = g^T @ x; without an activation the bias gradient (the row sums of g^T) comes
    // from the same product (kBgrad). That epilogue needs a non-empty product.
    if (need_bias && !r.grad_bias.defined() && m > 0 && k > 0 && n > 0) {
      r.grad_bias = Tensor::Empty({n}, dtype, device);
      cuda::MatmulEx(r.grad_weight, g, true, x2, false, Epilogue::kBgrad, r.grad_bias, Tensor());
    } else {
      cuda::MatmulEx(r.grad_weight, g, true, x2, false, Epilogue::kNone, Tensor(), Tensor());
    }
  }
  if (need_bias && !r.grad_bias.defined()) r.grad_bias = Sum(g, {0});
  if (need_input) {
    r.grad_input = Tensor::Empty({m, k}, dtype, device);
    cuda::MatmulEx(r.grad_input, g, false, weight, false, Epilogue::kNone, Tensor(), Tensor());
  }
  return r;
}

}  // namespace

LinearResult Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  CheckLinearInputs("linear", x, weight, bias);
  const int64_t n = weight.size(0), k = weight.size(1);
  const Tensor x2 = x.reshape({NumElements(Shape(x.shape().begin(), x.shape().end() - 1)), k});
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  // An empty reduction (k == 0) has no cuBLASLt epilogue; the composition gives bias (or 0).
  LinearResult r = x.device().is_cuda() && k > 0 ? LinearCuda(x2, weight, b, act)
                                                 : LinearComposed(x2, weight, b, act);
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
  r = LinearBackwardImpl(grad_out.reshape({m, n}), x.reshape({m, k}), weight, pre, act, need_input,
                         need_weight, need_bias);
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

// [t, t] of `dtype`: 0 on and below the diagonal, -inf above it (query i sees keys 0..i).
Tensor CausalMask(int64_t t, DType dtype, Device device) {
  std::vector<double> host(static_cast<size_t>(t * t), 0.0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) host[i * t + j] = -std::numeric_limits<double>::infinity();
  }
  return Tensor::FromVector(host, {t, t}).to(device, dtype);
}

// scale * q @ k^T (+ the causal mask) [B, H, Tq, Tk] in the compute dtype.
Tensor AttentionScores(const Tensor& q, const Tensor& k, bool causal, double scale) {
  const DType ct = ComputeDType(q.dtype());
  Tensor s = MulScalar(Matmul(q.to(ct), k.to(ct).transpose(2, 3)), scale);
  if (causal) s = Add(s, CausalMask(q.size(2), ct, q.device()));
  return s;
}

// The composition: the CPU implementation, and CUDA's for f64 (which neither CUDA
// implementation takes). Masked scores are -inf and give probability 0; the diagonal is never
// masked, so each row's maximum is finite.
AttentionResult AttentionComposed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                  double scale) {
  const DType dtype = q.dtype(), ct = ComputeDType(dtype);
  const int64_t b = q.size(0), h = q.size(1), tq = q.size(2);
  if (b * h * tq == 0)
    return {Tensor::Zeros(q.shape(), dtype, q.device()), Tensor::Zeros({b, h, tq}, ct, q.device())};
  const Tensor s = AttentionScores(q, k, causal, scale);
  const Tensor max = Max(s, -1, /*keepdim=*/true);
  const Tensor e = Exp(Sub(s, max));
  const Tensor sum = Sum(e, {-1}, /*keepdim=*/true);
  const Tensor p = Div(e, sum);
  return {Matmul(p.to(dtype), v), Add(max, Log(sum)).squeeze(-1)};
}

AttentionGrads AttentionBackwardComposed(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& output, const Tensor& stats,
                                         bool causal, double scale) {
  const DType dtype = q.dtype(), ct = ComputeDType(dtype);
  if (q.numel() == 0) {  // no queries (or empty heads): nothing flows back
    return {Tensor::Zeros(q.shape(), dtype, q.device()),
            Tensor::Zeros(k.shape(), dtype, q.device()),
            Tensor::Zeros(v.shape(), dtype, q.device())};
  }
  const Tensor p = Exp(Sub(AttentionScores(q, k, causal, scale), stats.to(ct).unsqueeze(-1)));
  AttentionGrads r;
  r.grad_v = Matmul(p.to(dtype).transpose(2, 3), grad_out);
  const Tensor go = grad_out.to(ct);
  const Tensor dp = Matmul(go, v.to(ct).transpose(2, 3));
  // The softmax backward's row term, sum_k p * dp, equals sum_d grad_out * output.
  const Tensor delta = Sum(Mul(go, output.to(ct)), {-1}, /*keepdim=*/true);
  const Tensor ds = MulScalar(Mul(p, Sub(dp, delta)), scale).to(dtype);
  r.grad_q = Matmul(ds, k);
  r.grad_k = Matmul(ds.transpose(2, 3), q);
  return r;
}

}  // namespace

AttentionResult ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          bool causal, double scale) {
  CheckAttentionInputs("scaled_dot_product_attention", q, k, v, causal, scale);
  if (!q.device().is_cuda() || q.dtype() == kF64) return AttentionComposed(q, k, v, causal, scale);
  AttentionResult r{Tensor::Empty(q.shape(), q.dtype(), q.device()),
                    Tensor::Empty({q.size(0), q.size(1), q.size(2)}, kF32, q.device())};
  const Tensor stats = r.stats.view({q.size(0), q.size(1), q.size(2), 1});
  if (cuda::CudnnAttentionEnabled() &&
      cuda::CudnnAttentionSupported({&r.output, &q, &k, &v}, nullptr)) {
    try {
      cuda::AttentionForward(r.output, stats, q, k, v, causal, scale, 0,
                             cuda::AttentionImpl::kCudnn);
      return r;
    } catch (const Error& e) {
      if (!IsNoKernel(e, kNoCudnnAttention)) throw;
    }
  }
  cuda::AttentionForward(r.output, stats, q, k, v, causal, scale, 0,
                         cuda::AttentionImpl::kComposed);
  return r;
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
  if (!q.device().is_cuda() || q.dtype() == kF64) {
    return AttentionBackwardComposed(grad_out, q, k, v, output, stats, causal, scale);
  }
  AttentionGrads r{Tensor::Empty(q.shape(), q.dtype(), q.device()),
                   Tensor::Empty(k.shape(), q.dtype(), q.device()),
                   Tensor::Empty(v.shape(), q.dtype(), q.device())};
  // A contiguous gradient qualifies for cuDNN more often than a strided one; the copy is small
  // next to the products.
  const Tensor dout = grad_out.contiguous();
  const Tensor stats4 = stats.contiguous().view({q.size(0), q.size(1), q.size(2), 1});
  if (cuda::CudnnAttentionEnabled() &&
      cuda::CudnnAttentionSupported({&r.grad_q, &r.grad_k, &r.grad_v, &dout, &q, &k, &v, &output},
                                    nullptr)) {
    try {
      cuda::AttentionBackward(r.grad_q, r.grad_k, r.grad_v, dout, q, k, v, output, stats4, causal,
                              scale, cuda::AttentionImpl::kCudnn);
      return r;
    } catch (const Error& e) {
      if (!IsNoKernel(e, kNoCudnnAttention)) throw;
    }
  }
  cuda::AttentionBackward(r.grad_q, r.grad_k, r.grad_v, dout, q, k, v, output, stats4, causal,
                          scale, cuda::AttentionImpl::kComposed);
  return r;
}

// ---- Layer norm backward ----

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
  LayerNormGrads r;
  if (device.is_cuda()) {
    r.grad_input = Tensor::Empty(xr.shape(), x.dtype(), device);
    if (need_weight_bias) {
      r.grad_weight = Tensor::Empty({n}, x.dtype(), device);
      r.grad_bias = Tensor::Empty({n}, x.dtype(), device);
    }
    cuda::LayerNormBackward(r.grad_input, r.grad_weight, r.grad_bias, gr, xr,
                            mean.reshape({rows}).contiguous(), rstd.reshape({rows}).contiguous(),
                            weight.defined() ? weight.contiguous() : Tensor());
    r.grad_input = r.grad_input.reshape(x.shape());
    return r;
  }
  // The formulas in the compute dtype (rows of x against [rows, 1] statistics).
  const Tensor mean_c = mean.reshape({rows, 1}).to(ct), rstd_c = rstd.reshape({rows, 1}).to(ct);
  const Tensor go = gr.to(ct);
  const Tensor xhat = Mul(Sub(xr.to(ct), mean_c), rstd_c);
  const Tensor dxhat = weight.defined() ? Mul(go, weight.to(ct)) : go;
  const Tensor mean_dxhat = Mean(dxhat, {1}, /*keepdim=*/true);
  const Tensor mean_dxhat_xhat = Mean(Mul(dxhat, xhat), {1}, /*keepdim=*/true);
  r.grad_input = Mul(rstd_c, Sub(Sub(dxhat, mean_dxhat), Mul(xhat, mean_dxhat_xhat)))
                     .to(x.dtype())
                     .reshape(x.shape());
  if (need_weight_bias) {
    r.grad_weight = Sum(Mul(go, xhat), {0}).to(x.dtype());
    r.grad_bias = Sum(go, {0}).to(x.dtype());
  }
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
  if (!device.is_cuda()) {
    const Tensor grad_loss = reduction == Reduction::kNone ? Tensor::Full({n}, grad_scale, kF64)
                                                           : Tensor::Scalar(grad_scale, kF64);
    return {CrossEntropy(logits, targets, ignore_index, reduction),
            CrossEntropyBackward(logits, targets, grad_loss, ignore_index, reduction)};
  }
  const Tensor lg = logits.contiguous();
  CrossEntropyResult r{Tensor::Empty({n}, logits.dtype(), device),
                       Tensor::Empty(lg.shape(), logits.dtype(), device)};
  // Row scales and the mean's divisor in f64 on the device, with the host's arithmetic
  // (CrossEntropy / CrossEntropyBackward): grad_scale / count, and total * (1 / count).
  Tensor row_scale = Tensor::Full({n}, grad_scale, kF64, device);
  Tensor inv_count;
  if (reduction == Reduction::kMean) {
    const Tensor ignore = Tensor::Full({}, static_cast<double>(ignore_index), kI64, device);
    const Tensor count = Sum(Ne(t, ignore)).to(kF64);
    row_scale = Div(row_scale, count);
    inv_count = Div(Tensor::Full({}, 1.0, kF64, device), count);
  }
  cuda::SoftmaxCrossEntropyFused(r.loss, r.grad_logits, lg, t, row_scale, ignore_index);
  if (reduction == Reduction::kSum) r.loss = Sum(r.loss.to(kF64)).to(logits.dtype());
  if (reduction == Reduction::kMean)
    r.loss = Mul(Sum(r.loss.to(kF64)), inv_count).to(logits.dtype());
  return r;
}

}  // namespace tg
