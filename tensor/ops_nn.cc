// The row ops of neural networks in tensor/ops.h: softmax, layer norm (with the fused backward
// and add + layer norm), embedding and cross-entropy (with the fused softmax-cross-entropy).
// Each sees its input as contiguous [rows, last dim].
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

// Last-dim ops see x as contiguous [rows, n].
RawTensor AsRows(const RawTensor& x) {
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows =
      x.dim() == 0 ? 1 : NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  return x.contiguous().reshape({rows, n});
}

}  // namespace

using composed::ComputeDType;

namespace {

RawTensor SoftmaxImpl(const char* op, const RawTensor& x, bool log) {
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  CheckFloating(op, x.dtype());
  const RawTensor rows = AsRows(x);
  RawTensor out = RawTensor::Empty(rows.shape(), x.dtype(), device);
  KernelsFor(device).Softmax(out, rows, log);
  return out.reshape(x.shape());
}

}  // namespace

RawTensor Softmax(const RawTensor& x) { return SoftmaxImpl("softmax", x, false); }
RawTensor LogSoftmax(const RawTensor& x) { return SoftmaxImpl("log_softmax", x, true); }

namespace {

// eps, and weight / bias (each [last dim of x], x's dtype and device, or undefined).
void CheckLayerNormParams(const char* op, const RawTensor& x, const RawTensor& weight,
                          const RawTensor& bias, double eps) {
  TG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const int64_t n = x.size(-1);
  for (const RawTensor* p : {&weight, &bias}) {
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

LayerNormResult LayerNorm(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                          double eps) {
  CheckDefined("layer_norm", x, "the input");
  const Device device = CommonDevice("layer_norm", {&x});
  CheckFloating("layer_norm", x.dtype());
  TG_CHECK(x.dim() >= 1, "layer_norm: expected at least 1 dim, got a 0-d tensor");
  CheckLayerNormParams("layer_norm", x, weight, bias, eps);
  const RawTensor rows = AsRows(x);
  const DType stat_dtype = x.dtype() == kF64 ? kF64 : kF32;
  LayerNormResult r{RawTensor::Empty(rows.shape(), x.dtype(), device),
                    RawTensor::Empty({rows.size(0)}, stat_dtype, device),
                    RawTensor::Empty({rows.size(0)}, stat_dtype, device)};
  // An empty last dim gives NaN statistics (0/0), like a mean over nothing.
  KernelsFor(device).LayerNorm(r.output, r.mean, r.rstd, rows, weight, bias, eps);
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  r.output = r.output.reshape(x.shape());
  r.mean = r.mean.reshape(stat_shape);
  r.rstd = r.rstd.reshape(stat_shape);
  return r;
}

RawTensor Embedding(const RawTensor& weight, const RawTensor& indices) {
  CheckDefined("embedding", weight, "the weight");
  CheckDefined("embedding", indices, "the indices");
  const Device device = CommonDevice("embedding", {&weight, &indices});
  TG_CHECK(weight.dim() == 2, "embedding: expected a 2-D weight [rows, dim], got ",
           ShapeToString(weight.shape()));
  const RawTensor idx = IndicesI64("embedding", indices);
  RawTensor out = RawTensor::Empty({idx.numel(), weight.size(1)}, weight.dtype(), device);
  KernelsFor(device).Embedding(out, weight, idx);
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  return out.reshape(shape);
}

RawTensor EmbeddingBackward(const RawTensor& grad, const RawTensor& indices, int64_t num_rows) {
  CheckDefined("embedding_backward", grad, "the gradient");
  CheckDefined("embedding_backward", indices, "the indices");
  const Device device = CommonDevice("embedding_backward", {&grad, &indices});
  CheckFloating("embedding_backward", grad.dtype());
  TG_CHECK(num_rows >= 0, "embedding_backward: num_rows must be non-negative, got ", num_rows);
  TG_CHECK(grad.dim() == indices.dim() + 1 &&
               Shape(grad.shape().begin(), grad.shape().end() - 1) == indices.shape(),
           "embedding_backward: gradient shape ", ShapeToString(grad.shape()),
           " does not match indices shape ", ShapeToString(indices.shape()), " plus one dim");
  const RawTensor idx = IndicesI64("embedding_backward", indices);
  const int64_t dim = grad.size(-1);
  RawTensor out = RawTensor::Zeros({num_rows, dim}, grad.dtype(), device);
  KernelsFor(device).EmbeddingBackward(out, grad.contiguous().reshape({idx.numel(), dim}), idx);
  return out;
}

namespace {

void CheckCrossEntropyInputs(const char* op, const RawTensor& logits, const RawTensor& targets) {
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

RawTensor CrossEntropy(const RawTensor& logits, const RawTensor& targets, int64_t ignore_index,
                       Reduction reduction) {
  CheckCrossEntropyInputs("cross_entropy", logits, targets);
  const RawTensor t = IndicesI64("cross_entropy", targets);
  RawTensor losses = RawTensor::Empty({logits.size(0)}, logits.dtype(), logits.device());
  const int64_t counted =
      KernelsFor(logits.device()).CrossEntropy(losses, logits.contiguous(), t, ignore_index);
  if (reduction == Reduction::kNone) return losses;
  // Reduce in f64 from the per-row losses' compute values, then round once.
  // On the logits' device: the f64 product rounds once to the logits' dtype, as on the host.
  const RawTensor total = Sum(losses.to(kF64));
  const double scale = reduction == Reduction::kMean ? 1.0 / static_cast<double>(counted) : 1.0;
  return BinaryScalar(BinaryOp::kMul, total, scale).to(logits.dtype());
}

RawTensor CrossEntropyBackward(const RawTensor& logits, const RawTensor& targets,
                               const RawTensor& grad_loss, int64_t ignore_index,
                               Reduction reduction) {
  CheckCrossEntropyInputs("cross_entropy_backward", logits, targets);
  CheckDefined("cross_entropy_backward", grad_loss, "the loss gradient");
  // The row scales are built from grad_loss where it lives and read by the logits' kernel.
  CommonDevice("cross_entropy_backward", {&logits, &grad_loss});
  const int64_t n = logits.size(0);
  const RawTensor t = IndicesI64("cross_entropy_backward", targets);
  RawTensor row_scale;
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
    RawTensor g = grad_loss.to(kF64).reshape({1});
    if (reduction == Reduction::kMean) {
      const RawTensor ignore =
          RawTensor::Full({}, static_cast<double>(ignore_index), kI64, t.device());
      g = Div(g, Sum(Ne(t, ignore)).to(kF64));
    }
    row_scale = g.expand({n}).contiguous();
  }
  RawTensor grad = RawTensor::Empty(logits.shape(), logits.dtype(), logits.device());
  KernelsFor(logits.device())
      .CrossEntropyBackward(grad, logits.contiguous(), t, row_scale, ignore_index);
  return grad;
}

// ---- Layer norm ----

LayerNormGrads LayerNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                 const RawTensor& mean, const RawTensor& rstd,
                                 const RawTensor& weight, bool need_weight_bias) {
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
  for (const RawTensor* t : {&mean, &rstd}) {
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
  const RawTensor xr = AsRows(x), gr = AsRows(grad_out);
  const int64_t rows = xr.size(0);
  const RawTensor mean_r = mean.reshape({rows}).contiguous();
  const RawTensor rstd_r = rstd.reshape({rows}).contiguous();
  LayerNormGrads r{RawTensor::Empty(xr.shape(), x.dtype(), device), RawTensor(), RawTensor()};
  if (need_weight_bias) {
    r.grad_weight = RawTensor::Empty({n}, x.dtype(), device);
    r.grad_bias = RawTensor::Empty({n}, x.dtype(), device);
  }
  if (Declined(KernelsFor(device).LayerNormBackward(
          r.grad_input, r.grad_weight, r.grad_bias, gr, xr, mean_r, rstd_r,
          weight.defined() ? weight.contiguous() : RawTensor()))) {
    r = composed::LayerNormBackward(gr, xr, mean_r, rstd_r, weight, need_weight_bias);
  }
  r.grad_input = r.grad_input.reshape(x.shape());
  return r;
}

namespace {

// weight [n] floating of x's device for x [..., n] floating, eps > 0 finite.
void CheckLlamaRmsNorm(const char* op, const RawTensor& x, const RawTensor& weight, double eps) {
  CheckDefined(op, x, "the input");
  CheckDefined(op, weight, "the weight");
  CommonDevice(op, {&x, &weight});
  CheckFloating(op, x.dtype());
  CheckFloating(op, weight.dtype());
  TG_CHECK(x.dim() >= 1, op, ": expected at least 1 dim, got a 0-d tensor");
  TG_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": weight of shape ",
           ShapeToString(weight.shape()), " does not match the last dim of the input of shape ",
           ShapeToString(x.shape()));
  TG_CHECK(eps > 0 && std::isfinite(eps), op, ": eps must be positive and finite, got ", eps);
}

}  // namespace

LlamaRmsNormResult LlamaRmsNorm(const RawTensor& x, const RawTensor& weight, double eps) {
  const char* op = "llama_rms_norm";
  CheckLlamaRmsNorm(op, x, weight, eps);
  const Device device = x.device();
  const RawTensor rows = AsRows(x);
  LlamaRmsNormResult r;
  if (weight.dtype() == x.dtype()) {
    r = {RawTensor::Empty(rows.shape(), x.dtype(), device),
         RawTensor::Empty({rows.size(0)}, ComputeDType(x.dtype()), device)};
  }
  if (weight.dtype() != x.dtype() ||
      Declined(KernelsFor(device).LlamaRmsNorm(r.output, r.rstd, rows, weight.contiguous(), eps))) {
    r = composed::LlamaRmsNorm(rows, weight, eps);
  }
  r.output = r.output.reshape(x.shape());
  r.rstd = r.rstd.reshape(Shape(x.shape().begin(), x.shape().end() - 1));
  return r;
}

LlamaRmsNormGrads LlamaRmsNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                       const RawTensor& rstd, const RawTensor& weight,
                                       bool need_weight) {
  const char* op = "llama_rms_norm_backward";
  CheckLlamaRmsNorm(op, x, weight, 1.0);
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, rstd, "rstd");
  const Device device = CommonDevice(op, {&x, &grad_out, &rstd});
  const DType out_dtype = PromoteTypes(weight.dtype(), x.dtype());
  TG_CHECK(grad_out.shape() == x.shape() && grad_out.dtype() == out_dtype, op, ": gradient ",
           ShapeToString(grad_out.shape()), " ", DTypeName(grad_out.dtype()),
           " does not match the output ", ShapeToString(x.shape()), " ", DTypeName(out_dtype));
  const Shape stat_shape(x.shape().begin(), x.shape().end() - 1);
  const DType ct = ComputeDType(x.dtype());
  TG_CHECK(rstd.shape() == stat_shape && rstd.dtype() == ct, op, ": rstd ",
           ShapeToString(rstd.shape()), " ", DTypeName(rstd.dtype()),
           " does not match the input of shape ", ShapeToString(x.shape()), " (expected ",
           ShapeToString(stat_shape), " ", DTypeName(ct), ")");
  const RawTensor xr = AsRows(x), gr = AsRows(grad_out).contiguous();
  const RawTensor rstd_r = rstd.contiguous().reshape({xr.size(0)});
  LlamaRmsNormGrads r;
  if (weight.dtype() == x.dtype()) {
    r.grad_input = RawTensor::Empty(xr.shape(), x.dtype(), device);
    if (need_weight) r.grad_weight = RawTensor::Empty(weight.shape(), weight.dtype(), device);
  }
  if (weight.dtype() != x.dtype() ||
      Declined(KernelsFor(device).LlamaRmsNormBackward(r.grad_input, r.grad_weight, gr, xr, rstd_r,
                                                       weight.contiguous()))) {
    r = composed::LlamaRmsNormBackward(gr, xr, rstd_r, weight, need_weight);
  }
  r.grad_input = r.grad_input.reshape(x.shape());
  return r;
}

namespace {

// gate and up (and grad_out) defined, floating, of one shape and device; returns the dtype they
// promote to.
DType CheckSwiglu(const char* op, std::initializer_list<const RawTensor*> inputs) {
  static const char* const kNames[] = {"the gate", "the up projection", "the gradient"};
  size_t k = 0;
  for (const RawTensor* t : inputs) CheckDefined(op, *t, kNames[k++]);
  CommonDevice(op, inputs);
  const RawTensor& first = **inputs.begin();
  DType dtype = first.dtype();
  for (const RawTensor* t : inputs) {
    CheckFloating(op, t->dtype());
    TG_CHECK(t->shape() == first.shape(), op, ": expected inputs of one shape, got ",
             ShapeToString(first.shape()), " and ", ShapeToString(t->shape()));
    dtype = PromoteTypes(dtype, t->dtype());
  }
  return dtype;
}

}  // namespace

RawTensor Swiglu(const RawTensor& gate, const RawTensor& up) {
  const char* op = "swiglu";
  const DType dtype = CheckSwiglu(op, {&gate, &up});
  const RawTensor g = gate.to(dtype).contiguous(), u = up.to(dtype).contiguous();
  RawTensor out = RawTensor::Empty(g.shape(), dtype, g.device());
  if (Declined(KernelsFor(g.device()).Swiglu(out, g, u))) out = composed::Swiglu(g, u);
  return out;
}

SwigluGrads SwigluBackward(const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up) {
  const char* op = "swiglu_backward";
  const DType dtype = CheckSwiglu(op, {&gate, &up, &grad_out});
  const RawTensor g = gate.to(dtype).contiguous(), u = up.to(dtype).contiguous();
  const RawTensor dy = grad_out.to(dtype).contiguous();
  SwigluGrads r{RawTensor::Empty(g.shape(), dtype, g.device()),
                RawTensor::Empty(g.shape(), dtype, g.device())};
  if (Declined(KernelsFor(g.device()).SwigluBackward(r.grad_gate, r.grad_up, dy, g, u))) {
    r = composed::SwigluBackward(dy, g, u);
  }
  return {r.grad_gate.to(gate.dtype()), r.grad_up.to(up.dtype())};
}

namespace {

// x [..., T, d] floating with d even; cos and sin [T, d] of x's dtype and device.
void CheckRotary(const char* op, const RawTensor& x, const RawTensor& cos, const RawTensor& sin) {
  CheckDefined(op, x, "the input");
  CheckDefined(op, cos, "cos");
  CheckDefined(op, sin, "sin");
  CommonDevice(op, {&x, &cos, &sin});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, op, ": expected x [..., T, d] with d even, got ",
           ShapeToString(x.shape()));
  const Shape want = {x.size(-2), x.size(-1)};
  TG_CHECK(cos.shape() == want && sin.shape() == want && cos.dtype() == x.dtype() &&
               sin.dtype() == x.dtype(),
           op, ": cos and sin are ", ShapeToString(cos.shape()), " ", DTypeName(cos.dtype()),
           " and ", ShapeToString(sin.shape()), " ", DTypeName(sin.dtype()), "; x needs ",
           ShapeToString(want), " ", DTypeName(x.dtype()));
}

}  // namespace

RawTensor RotaryEmbedding(const RawTensor& x, const RawTensor& cos, const RawTensor& sin) {
  const char* op = "rotary_embedding";
  CheckRotary(op, x, cos, sin);
  // The kernel reads [lead, T, d] with a unit last stride; other layouts are made contiguous.
  const int64_t t = x.size(-2), d = x.size(-1);
  const RawTensor xs = x.strides().back() == 1 || d == 1 ? x : x.contiguous();
  RawTensor out = RawTensor::Empty(x.shape(), x.dtype(), x.device());
  const int64_t lead = x.numel() / std::max<int64_t>(1, t * d);
  if (x.numel() == 0) return out;
  if (Declined(KernelsFor(x.device())
                   .RotaryEmbedding(out.reshape({lead, t, d}), xs, cos.contiguous(),
                                    sin.contiguous()))) {
    out = composed::RotaryEmbedding(x, cos, sin);
  }
  return out;
}

RawTensor RotaryEmbeddingBackward(const RawTensor& grad_out, const RawTensor& cos,
                                  const RawTensor& sin) {
  const char* op = "rotary_embedding_backward";
  CheckRotary(op, grad_out, cos, sin);
  const int64_t t = grad_out.size(-2), d = grad_out.size(-1);
  if (grad_out.numel() == 0)
    return RawTensor::Empty(grad_out.shape(), grad_out.dtype(), grad_out.device());
  const int64_t lead = grad_out.numel() / (t * d);
  const RawTensor g = grad_out.contiguous().reshape({lead, t, d});
  RawTensor out = RawTensor::Empty(grad_out.shape(), grad_out.dtype(), grad_out.device());
  if (Declined(KernelsFor(grad_out.device())
                   .RotaryEmbeddingBackward(out.reshape({lead, t, d}), g, cos.contiguous(),
                                            sin.contiguous()))) {
    out = composed::RotaryEmbeddingBackward(grad_out, cos, sin);
  }
  return out;
}

AddLayerNormResult AddLayerNorm(const RawTensor& a, const RawTensor& b, const RawTensor& weight,
                                const RawTensor& bias, double eps) {
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
  const RawTensor ar = AsRows(a), br = AsRows(b);
  const int64_t rows = ar.size(0);
  const Shape stat_shape(a.shape().begin(), a.shape().end() - 1);
  const DType ct = ComputeDType(a.dtype());
  AddLayerNormResult r;
  r.residual = RawTensor::Empty(ar.shape(), a.dtype(), device);
  r.norm = {RawTensor::Empty(ar.shape(), a.dtype(), device), RawTensor::Empty({rows}, ct, device),
            RawTensor::Empty({rows}, ct, device)};
  if (Declined(
          KernelsFor(device).AddLayerNorm(r.residual, r.norm.output, r.norm.mean, r.norm.rstd, ar,
                                          br, weight.defined() ? weight.contiguous() : RawTensor(),
                                          bias.defined() ? bias.contiguous() : RawTensor(), eps))) {
    return composed::AddLayerNorm(a, b, weight, bias, eps);
  }
  r.residual = r.residual.reshape(a.shape());
  r.norm.output = r.norm.output.reshape(a.shape());
  r.norm.mean = r.norm.mean.reshape(stat_shape);
  r.norm.rstd = r.norm.rstd.reshape(stat_shape);
  return r;
}

// ---- Cross-entropy with its gradient ----

CrossEntropyResult CrossEntropyWithGrad(const RawTensor& logits, const RawTensor& targets,
                                        int64_t ignore_index, Reduction reduction,
                                        double grad_scale) {
  const char* op = "cross_entropy_with_grad";
  CheckCrossEntropyInputs(op, logits, targets);
  const RawTensor t = IndicesI64(op, targets);
  const Device device = logits.device();
  const int64_t n = logits.size(0);
  const RawTensor lg = logits.contiguous();
  // Row scales and the mean's divisor in f64 where the logits live, with the arithmetic of
  // CrossEntropy / CrossEntropyBackward: grad_scale / count, and total * (1 / count). The count
  // stays on the device (no host wait).
  RawTensor row_scale = RawTensor::Full({n}, grad_scale, kF64, device);
  RawTensor inv_count;
  if (reduction == Reduction::kMean) {
    const RawTensor ignore = RawTensor::Full({}, static_cast<double>(ignore_index), kI64, device);
    const RawTensor count = Sum(Ne(t, ignore)).to(kF64);
    row_scale = Div(row_scale, count);
    inv_count = Div(RawTensor::Full({}, 1.0, kF64, device), count);
  }
  CrossEntropyResult r{RawTensor::Empty({n}, logits.dtype(), device),
                       RawTensor::Empty(lg.shape(), logits.dtype(), device)};
  if (Declined(KernelsFor(device).SoftmaxCrossEntropy(r.loss, r.grad_logits, lg, t, row_scale,
                                                      ignore_index))) {
    r = composed::SoftmaxCrossEntropy(lg, t, row_scale, ignore_index);
  }
  if (reduction == Reduction::kSum) r.loss = Sum(r.loss.to(kF64)).to(logits.dtype());
  if (reduction == Reduction::kMean)
    r.loss = Mul(Sum(r.loss.to(kF64)), inv_count).to(logits.dtype());
  return r;
}

}  // namespace tg
