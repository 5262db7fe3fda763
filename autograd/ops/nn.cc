// Differentiable neural-network ops: softmax, log_softmax, layer_norm, embedding,
// cross_entropy and dropout (over the last dim where it matters, as the tensor kernels).
//
// f16/bf16 backward formulas compute in f32 (f64 stays f64), like the forward kernels, and cast
// the gradient back to the input's dtype. Backwards that have a fused tensor kernel (layer_norm
// through LayerNormBackward, embedding, cross_entropy) use it on the plain path; when the
// backward itself is recorded (create_graph), they switch to the same formula written with
// differentiable ops so that second derivatives are right rather than silently missing terms.
#include <cmath>

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
Variable SumLeading(const Variable& v) {
  if (v.dim() <= 1) return v;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d + 1 < v.dim(); ++d) dims.push_back(d);
  return Sum(v, dims);
}

// The weight gradient of Embedding: `g` scatter-added into `rows` zero rows (the tensor kernel,
// accumulating in f64); recorded with Embedding as its backward, since it is linear in g.
Variable EmbeddingDense(const Variable& g, const Tensor& indices, int64_t rows) {
  return Record("EmbeddingDenseBackward", tg::EmbeddingBackward(g.data(), indices, rows), {g},
                {Variable(indices)}, [](const BackwardContext& ctx) -> VariableList {
                  return {Embedding(ctx.grads[0], ctx.saved[0].data())};
                });
}

}  // namespace

Variable Softmax(const Variable& x) {
  if (const auto in = AutocastInputs(OpId::kSoftmax, x)) return Softmax(in[0]);
  return Record(
      OpNodeName(OpId::kSoftmax), tg::Softmax(x.data()), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        // dx = y * (g - sum(g * y)) over the last dim.
        const DType ct = ComputeDType(ctx.saved[0].dtype());
        const Variable y = Cast(ctx.saved[0], ct);
        const Variable gy = Mul(Cast(ctx.grads[0], ct), y);
        const Variable dx = Sub(gy, Mul(y, Sum(gy, {-1}, /*keepdim=*/true)));
        return {Cast(dx, ctx.saved[0].dtype())};
      },
      /*save_output=*/true);
}

Variable LogSoftmax(const Variable& x) {
  if (const auto in = AutocastInputs(OpId::kLogSoftmax, x)) return LogSoftmax(in[0]);
  return Record(
      OpNodeName(OpId::kLogSoftmax), tg::LogSoftmax(x.data()), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        // dx = g - softmax(x) * sum(g) over the last dim; softmax = exp(y).
        const DType ct = ComputeDType(ctx.saved[0].dtype());
        const Variable y = Cast(ctx.saved[0], ct);
        const Variable g = Cast(ctx.grads[0], ct);
        const Variable dx = Sub(g, Mul(Exp(y), Sum(g, {-1}, /*keepdim=*/true)));
        return {Cast(dx, ctx.saved[0].dtype())};
      },
      /*save_output=*/true);
}

Variable LayerNorm(const Variable& x, const Variable& weight, const Variable& bias, double eps) {
  if (const auto in = AutocastInputs(OpId::kLayerNorm, x, weight, bias)) {
    return LayerNorm(in[0], in[1], in[2], eps);
  }
  LayerNormResult r = tg::LayerNorm(x.data(), weight.defined() ? weight.data() : Tensor(),
                                    bias.defined() ? bias.data() : Tensor(), eps);
  return Record(OpNodeName(OpId::kLayerNorm), r.output, {x, weight, bias},
                {x, weight, Variable(r.mean), Variable(r.rstd)},
                [eps](const BackwardContext& ctx) -> VariableList {
                  const Variable& x = ctx.saved[0];
                  const Variable& w = ctx.saved[1];
                  if (!GradMode::is_enabled()) {
                    // The fused tensor op: the formulas below in the same order of operations
                    // (so the same values on the CPU), one kernel on CUDA.
                    const LayerNormGrads r = tg::LayerNormBackward(
                        ctx.grads[0].data(), x.data(), ctx.saved[2].data(), ctx.saved[3].data(),
                        w.defined() ? w.data() : Tensor(), ctx.needs(1) || ctx.needs(2));
                    return {ctx.needs(0) ? Variable(r.grad_input) : Variable(),
                            ctx.needs(1) ? Variable(r.grad_weight) : Variable(),
                            ctx.needs(2) ? Variable(r.grad_bias) : Variable()};
                  }
                  const DType ct = ComputeDType(x.dtype());
                  const Variable xc = Cast(x, ct);
                  const Variable g = Cast(ctx.grads[0], ct);
                  // create_graph: recompute the statistics with differentiable ops, so that
                  // second derivatives see how they depend on x (the saved ones are constants).
                  const Variable mean = Mean(xc, {-1}, /*keepdim=*/true);
                  const Variable centered_x = Sub(xc, mean);
                  const Variable rstd =
                      Pow(AddScalar(Mean(Mul(centered_x, centered_x), {-1}, true), eps), -0.5);
                  const Variable xhat = Mul(Sub(xc, mean), rstd);
                  Variable gx, gw, gb;
                  if (ctx.needs(0)) {
                    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * w.
                    const Variable dxhat = w.defined() ? Mul(g, Cast(w, ct)) : g;
                    const Variable centered = Sub(dxhat, Mean(dxhat, {-1}, true));
                    const Variable dx =
                        Mul(rstd, Sub(centered, Mul(xhat, Mean(Mul(dxhat, xhat), {-1}, true))));
                    gx = Cast(dx, x.dtype());
                  }
                  if (ctx.needs(1)) gw = Cast(SumLeading(Mul(g, xhat)), x.dtype());
                  if (ctx.needs(2)) gb = Cast(SumLeading(g), x.dtype());
                  return {gx, gw, gb};
                });
}

Variable Embedding(const Variable& weight, const Tensor& indices) {
  const Tensor out = tg::Embedding(weight.data(), indices);  // validates
  const int64_t rows = weight.size(0);
  return Record(OpNodeName(OpId::kEmbedding), out, {weight}, {Variable(indices)},
                [rows](const BackwardContext& ctx) -> VariableList {
                  return {EmbeddingDense(ctx.grads[0], ctx.saved[0].data(), rows)};
                });
}

Variable CrossEntropy(const Variable& logits, const Tensor& targets, int64_t ignore_index,
                      Reduction reduction) {
  if (const auto in = AutocastInputs(OpId::kCrossEntropy, logits)) {
    return CrossEntropy(in[0], targets, ignore_index, reduction);
  }
  const Tensor loss = tg::CrossEntropy(logits.data(), targets, ignore_index, reduction);
  return Record(OpNodeName(OpId::kCrossEntropy), loss, {logits}, {logits, Variable(targets)},
                [ignore_index, reduction](const BackwardContext& ctx) -> VariableList {
                  const Variable& logits = ctx.saved[0];
                  const Tensor& targets = ctx.saved[1].data();
                  const Variable& g = ctx.grads[0];
                  if (!GradMode::is_enabled()) {
                    // The fused kernel: (softmax - onehot) * the loss gradient of each row.
                    return {Variable(tg::CrossEntropyBackward(logits.data(), targets, g.data(),
                                                              ignore_index, reduction))};
                  }
                  // create_graph: the same formula with differentiable ops (softmax depends on
                  // logits).
                  const DType ct = ComputeDType(logits.dtype());
                  const int64_t n = logits.size(0), c = logits.size(1);
                  const Tensor t = targets.to(kI64).reshape({n, 1});
                  const Device device = logits.data().device();
                  const Tensor valid =
                      tg::Ne(t, Tensor::Full({}, static_cast<double>(ignore_index), kI64, device));
                  const Tensor classes =
                      Tensor::Arange(0, static_cast<double>(c), 1, kI64).to(device).reshape({1, c});
                  const Tensor onehot = tg::Eq(classes, t).to(ct);
                  Variable scale = Cast(g, ct);
                  if (reduction == Reduction::kNone) {
                    scale = Reshape(scale, {n, 1});
                  } else if (reduction == Reduction::kMean) {
                    const double counted = tg::Sum(valid).item();
                    // No counted rows: every row is ignored and gets zeros, as in the kernel.
                    scale = MulScalar(scale, counted > 0 ? 1.0 / counted : 0.0);
                  }
                  const Variable p = Softmax(Cast(logits, ct));
                  const Variable grad =
                      Mul(Mul(Sub(p, Variable(onehot)), Variable(valid.to(ct))), scale);
                  return {Cast(grad, logits.dtype())};
                });
}

Variable Dropout(const Variable& x, double p, Generator& gen, bool training) {
  constexpr const char* kOp = OpTorchName(OpId::kDropout);
  TG_CHECK(p >= 0 && p < 1, kOp, ": p must be in [0, 1), got ", p);
  TG_CHECK(IsFloating(x.dtype()), kOp, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           DTypeName(x.dtype()));
  if (!training || p == 0) return x;  // identity, and no draws from the generator
  // One uniform per element in row-major order: u < p drops the element (tg::DropoutMask). The
  // mask is 0/1 in x's dtype; the 1/(1-p) scale is applied as a scalar in the compute precision.
  // The mask is drawn where x lives from the generator's stream, so a CUDA run drops exactly the
  // elements a CPU run drops (and checkpoints resume it), without an upload.
  const Tensor mask = tg::DropoutMask(x.shape(), p, gen, x.dtype(), x.data().device());
  const double scale = 1.0 / (1.0 - p);
  return Record(OpNodeName(OpId::kDropout), tg::MulScalar(tg::Mul(x.data(), mask), scale), {x},
                {Variable(mask)}, [scale](const BackwardContext& ctx) -> VariableList {
                  return {MulScalar(Mul(ctx.grads[0], ctx.saved[0]), scale)};
                });
}

}  // namespace tg
