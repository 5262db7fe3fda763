// Differentiable neural-network ops: softmax, log_softmax, layer_norm, embedding,
// cross_entropy and dropout (over the last dim where it matters, as the tensor kernels).
//
// f16/bf16 backward formulas compute in f32 (f64 stays f64), like the forward kernels, and cast
// the gradient back to the input's dtype. Backwards that have a fused tensor kernel (layer_norm
// through LayerNormBackward, embedding, cross_entropy) use it on the plain path; when the
// backward itself is recorded (create_graph), they switch to the same formula written with
// differentiable ops so that second derivatives are right rather than silently missing terms.
#include <cmath>

#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/autocast_inputs.h"
#include "tensor/generator.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

// The dtype a backward formula computes in: f32 for f16/bf16/f32, f64 for f64.
DType ComputeDType(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// Sums over every dim but the last (the affine parameters' gradient); a 1-D input has none.
Tensor SumLeading(const Tensor& v) {
  if (v.dim() <= 1) return v;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d + 1 < v.dim(); ++d) dims.push_back(d);
  return Sum(v, dims);
}

// The weight gradient of Embedding: `g` scatter-added into `rows` zero rows (the tensor kernel,
// accumulating in f64); recorded with Embedding as its backward, since it is linear in g.
Tensor EmbeddingDense(const Tensor& g, const RawTensor& indices, int64_t rows) {
  return Record("EmbeddingDenseBackward", tg::EmbeddingBackward(g.data(), indices, rows), {g},
                {Tensor(indices)}, [](const BackwardContext& ctx) -> VariableList {
                  return {Embedding(ctx.grads[0], ctx.saved[0].data())};
                });
}

}  // namespace

Tensor Softmax(const Tensor& x) {
  if (const auto in = AutocastInputs(OpId::kSoftmax, x)) return Softmax(in[0]);
  return Record(
      OpNodeName(OpId::kSoftmax),
      Dispatch<OpId::kSoftmax>([&] { return tg::Softmax(x.data()); }, x), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        // dx = y * (g - sum(g * y)) over the last dim.
        const DType ct = ComputeDType(ctx.saved[0].dtype());
        const Tensor y = Cast(ctx.saved[0], ct);
        const Tensor gy = Mul(Cast(ctx.grads[0], ct), y);
        const Tensor dx = Sub(gy, Mul(y, Sum(gy, {-1}, /*keepdim=*/true)));
        return {Cast(dx, ctx.saved[0].dtype())};
      },
      /*save_output=*/true);
}

Tensor LogSoftmax(const Tensor& x) {
  if (const auto in = AutocastInputs(OpId::kLogSoftmax, x)) return LogSoftmax(in[0]);
  return Record(
      OpNodeName(OpId::kLogSoftmax),
      Dispatch<OpId::kLogSoftmax>([&] { return tg::LogSoftmax(x.data()); }, x), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        // dx = g - softmax(x) * sum(g) over the last dim; softmax = exp(y).
        const DType ct = ComputeDType(ctx.saved[0].dtype());
        const Tensor y = Cast(ctx.saved[0], ct);
        const Tensor g = Cast(ctx.grads[0], ct);
        const Tensor dx = Sub(g, Mul(Exp(y), Sum(g, {-1}, /*keepdim=*/true)));
        return {Cast(dx, ctx.saved[0].dtype())};
      },
      /*save_output=*/true);
}

Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  if (const auto in = AutocastInputs(OpId::kLayerNorm, x, weight, bias)) {
    return LayerNorm(in[0], in[1], in[2], eps);
  }
  const LayerNormResult r = Dispatch<OpId::kLayerNorm>(
      [&] {
        return tg::LayerNorm(x.data(), weight.defined() ? weight.data() : RawTensor(),
                             bias.defined() ? bias.data() : RawTensor(), eps);
      },
      x, weight, bias);
  return Record(OpNodeName(OpId::kLayerNorm), r.output, {x, weight, bias},
                {x, weight, Tensor(r.mean), Tensor(r.rstd)},
                [eps](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  const Tensor& w = ctx.saved[1];
                  if (!GradMode::is_enabled()) {
                    // The fused tensor op: the formulas below in the same order of operations
                    // (so the same values on the CPU), one kernel on CUDA.
                    const LayerNormGrads r = tg::LayerNormBackward(
                        ctx.grads[0].data(), x.data(), ctx.saved[2].data(), ctx.saved[3].data(),
                        w.defined() ? w.data() : RawTensor(), ctx.needs(1) || ctx.needs(2));
                    return {ctx.needs(0) ? Tensor(r.grad_input) : Tensor(),
                            ctx.needs(1) ? Tensor(r.grad_weight) : Tensor(),
                            ctx.needs(2) ? Tensor(r.grad_bias) : Tensor()};
                  }
                  const DType ct = ComputeDType(x.dtype());
                  const Tensor xc = Cast(x, ct);
                  const Tensor g = Cast(ctx.grads[0], ct);
                  // create_graph: recompute the statistics with differentiable ops, so that
                  // second derivatives see how they depend on x (the saved ones are constants).
                  const Tensor mean = Mean(xc, {-1}, /*keepdim=*/true);
                  const Tensor centered_x = Sub(xc, mean);
                  const Tensor rstd =
                      Pow(AddScalar(Mean(Mul(centered_x, centered_x), {-1}, true), eps), -0.5);
                  const Tensor xhat = Mul(Sub(xc, mean), rstd);
                  Tensor gx, gw, gb;
                  if (ctx.needs(0)) {
                    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w.
                    const Tensor dxhat = w.defined() ? Mul(g, Cast(w, ct)) : g;
                    const Tensor centered = Sub(dxhat, Mean(dxhat, {-1}, true));
                    const Tensor dx =
                        Mul(rstd, Sub(centered, Mul(xhat, Mean(Mul(dxhat, xhat), {-1}, true))));
                    gx = Cast(dx, x.dtype());
                  }
                  if (ctx.needs(1)) gw = Cast(SumLeading(Mul(g, xhat)), x.dtype());
                  if (ctx.needs(2)) gb = Cast(SumLeading(g), x.dtype());
                  return {gx, gw, gb};
                });
}

Tensor LlamaRmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  TG_CHECK(x.defined() && weight.defined(), OpTorchName(OpId::kLlamaRmsNorm),
           ": the input and the weight must be defined");
  const LlamaRmsNormResult r = Dispatch<OpId::kLlamaRmsNorm>(
      [&] { return tg::LlamaRmsNorm(x.data(), weight.data(), eps); }, x, weight);
  return Record(OpNodeName(OpId::kLlamaRmsNorm), r.output, {x, weight}, {x, weight, Tensor(r.rstd)},
                [eps](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  const Tensor& w = ctx.saved[1];
                  if (!GradMode::is_enabled()) {
                    // The fused tensor op: the formulas below in one pass per row where the device
                    // has it.
                    const LlamaRmsNormGrads g = tg::LlamaRmsNormBackward(
                        ctx.grads[0].data(), x.data(), ctx.saved[2].data(), w.data(), ctx.needs(1));
                    return {ctx.needs(0) ? Tensor(g.grad_input) : Tensor(),
                            ctx.needs(1) ? Tensor(g.grad_weight) : Tensor()};
                  }
                  // create_graph: rstd recomputed with differentiable ops, so that second
                  // derivatives see how it depends on x (the saved one is a constant).
                  const DType ct = ComputeDType(x.dtype());
                  const Tensor h = Cast(x, ct);
                  const Tensor g = Cast(ctx.grads[0], ct);
                  const Tensor rstd =
                      Pow(AddScalar(Mean(Mul(h, h), {-1}, /*keepdim=*/true), eps), -0.5);
                  Tensor gx, gw;
                  if (ctx.needs(0)) {
                    // dx = rstd * dn - h * rstd^3 * mean(dn * h), dn = g * w.
                    const Tensor dn = Mul(g, Cast(w, ct));
                    const Tensor dot = Mean(Mul(dn, h), {-1}, true);
                    gx = Cast(Sub(Mul(rstd, dn), Mul(h, Mul(Pow(rstd, 3), dot))), x.dtype());
                  }
                  if (ctx.needs(1)) {
                    const Tensor normed = Cast(Cast(Mul(h, rstd), x.dtype()), ct);
                    gw = Cast(SumLeading(Mul(g, normed)), w.dtype());
                  }
                  return {gx, gw};
                });
}

Tensor Swiglu(const Tensor& gate, const Tensor& up) {
  TG_CHECK(gate.defined() && up.defined(), OpTorchName(OpId::kSwiglu),
           ": the gate and the up projection must be defined");
  const RawTensor out =
      Dispatch<OpId::kSwiglu>([&] { return tg::Swiglu(gate.data(), up.data()); }, gate, up);
  return Record(OpNodeName(OpId::kSwiglu), out, {gate, up}, {gate, up},
                [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& gate = ctx.saved[0];
                  const Tensor& up = ctx.saved[1];
                  const Tensor& grad = ctx.grads[0];
                  if (!GradMode::is_enabled()) {  // the fused tensor op, the same bits
                    const SwigluGrads g = tg::SwigluBackward(grad.data(), gate.data(), up.data());
                    return {ctx.needs(0) ? Tensor(g.grad_gate) : Tensor(),
                            ctx.needs(1) ? Tensor(g.grad_up) : Tensor()};
                  }
                  // create_graph: Mul's and Silu's backward in differentiable ops.
                  const DType dtype = PromoteTypes(gate.dtype(), up.dtype());
                  const Tensor g = Cast(gate, dtype), u = Cast(up, dtype);
                  Tensor gg, gu;
                  if (ctx.needs(0)) {
                    const Tensor s = Sigmoid(g);
                    gg = Mul(Mul(grad, u), Mul(s, AddScalar(Mul(g, AddScalar(Neg(s), 1)), 1)));
                    gg = Cast(gg, gate.dtype());
                  }
                  if (ctx.needs(1)) gu = Cast(Mul(grad, Silu(g)), up.dtype());
                  return {gg, gu};
                });
}

Tensor RotaryEmbedding(const Tensor& x, const RawTensor& cos, const RawTensor& sin) {
  TG_CHECK(x.defined(), OpTorchName(OpId::kRotaryEmbedding), ": the input must be defined");
  const RawTensor out = Dispatch<OpId::kRotaryEmbedding>(
      [&] { return tg::RotaryEmbedding(x.data(), cos, sin); }, x, Tensor(cos), Tensor(sin));
  return Record(
      OpNodeName(OpId::kRotaryEmbedding), out, {x}, {Tensor(cos), Tensor(sin)},
      [](const BackwardContext& ctx) -> VariableList {
        const Tensor& cos = ctx.saved[0];
        const Tensor& sin = ctx.saved[1];
        if (!GradMode::is_enabled()) {
          return {Tensor(tg::RotaryEmbeddingBackward(ctx.grads[0].data(), cos.data(), sin.data()))};
        }
        // create_graph: the gradient is linear in g, g * cos - rotate_half(g * sin),
        // written with differentiable ops.
        const Tensor& g = ctx.grads[0];
        const Tensor gs = Mul(g, sin);
        const int64_t h = g.size(-1) / 2;
        const Tensor rot = Cat({Neg(Narrow(gs, -1, h, h)), Narrow(gs, -1, 0, h)}, -1);
        return {Sub(Mul(g, cos), rot)};
      });
}

Tensor Embedding(const Tensor& weight, const RawTensor& indices) {
  const RawTensor out = Dispatch<OpId::kEmbedding>(
      [&] { return tg::Embedding(weight.data(), indices); }, weight, Tensor(indices));  // validates
  const int64_t rows = weight.size(0);
  return Record(OpNodeName(OpId::kEmbedding), out, {weight}, {Tensor(indices)},
                [rows](const BackwardContext& ctx) -> VariableList {
                  return {EmbeddingDense(ctx.grads[0], ctx.saved[0].data(), rows)};
                });
}

Tensor CrossEntropy(const Tensor& logits, const RawTensor& targets, int64_t ignore_index,
                    Reduction reduction) {
  if (const auto in = AutocastInputs(OpId::kCrossEntropy, logits)) {
    return CrossEntropy(in[0], targets, ignore_index, reduction);
  }
  const RawTensor loss = Dispatch<OpId::kCrossEntropy>(
      [&] { return tg::CrossEntropy(logits.data(), targets, ignore_index, reduction); }, logits,
      Tensor(targets));
  return Record(
      OpNodeName(OpId::kCrossEntropy), loss, {logits}, {logits, Tensor(targets)},
      [ignore_index, reduction](const BackwardContext& ctx) -> VariableList {
        const Tensor& logits = ctx.saved[0];
        const RawTensor& targets = ctx.saved[1].data();
        const Tensor& g = ctx.grads[0];
        if (!GradMode::is_enabled()) {
          // The fused kernel: (softmax - onehot) * the loss gradient of each row.
          return {Tensor(
              tg::CrossEntropyBackward(logits.data(), targets, g.data(), ignore_index, reduction))};
        }
        // create_graph: the same formula with differentiable ops (softmax depends on
        // logits).
        const DType ct = ComputeDType(logits.dtype());
        const int64_t n = logits.size(0), c = logits.size(1);
        const RawTensor t = targets.to(kI64).reshape({n, 1});
        const Device device = logits.data().device();
        const RawTensor valid =
            tg::Ne(t, RawTensor::Full({}, static_cast<double>(ignore_index), kI64, device));
        const RawTensor classes =
            RawTensor::Arange(0, static_cast<double>(c), 1, kI64).to(device).reshape({1, c});
        const RawTensor onehot = tg::Eq(classes, t).to(ct);
        Tensor scale = Cast(g, ct);
        if (reduction == Reduction::kNone) {
          scale = Reshape(scale, {n, 1});
        } else if (reduction == Reduction::kMean) {
          const double counted = tg::Sum(valid).item();
          // No counted rows: every row is ignored and gets zeros, as in the kernel.
          scale = MulScalar(scale, counted > 0 ? 1.0 / counted : 0.0);
        }
        const Tensor p = Softmax(Cast(logits, ct));
        const Tensor grad = Mul(Mul(Sub(p, Tensor(onehot)), Tensor(valid.to(ct))), scale);
        return {Cast(grad, logits.dtype())};
      });
}

Tensor Dropout(const Tensor& x, double p, Generator& gen, bool training) {
  constexpr const char* kOp = OpTorchName(OpId::kDropout);
  TG_CHECK(p >= 0 && p < 1, kOp, ": p must be in [0, 1), got ", p);
  TG_CHECK(IsFloating(x.dtype()), kOp, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           DTypeName(x.dtype()));
  if (!training || p == 0) return x;  // identity, and no draws from the generator
  // One uniform per element in row-major order: u < p drops the element (tg::DropoutMask). The
  // mask is 0/1 in x's dtype; the 1/(1-p) scale is applied as a scalar in the compute precision.
  // The mask is drawn where x lives from the generator's stream, so a CUDA run drops exactly the
  // elements a CPU run drops (and checkpoints resume it), without an upload.
  const RawTensor mask = tg::DropoutMask(x.shape(), p, gen, x.dtype(), x.data().device());
  const double scale = 1.0 / (1.0 - p);
  return Record(
      OpNodeName(OpId::kDropout),
      Dispatch<OpId::kDropout>([&] { return tg::MulScalar(tg::Mul(x.data(), mask), scale); }, x),
      {x}, {Tensor(mask)}, [scale](const BackwardContext& ctx) -> VariableList {
        return {MulScalar(Mul(ctx.grads[0], ctx.saved[0]), scale)};
      });
}

}  // namespace tg
