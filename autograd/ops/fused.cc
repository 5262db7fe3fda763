// Differentiable fused ops over the fused tensor ops of tensor/ops.h: Linear with its bias and
// tanh-GELU, scaled dot-product attention, and cross-entropy computed together with its
// gradient. Each records one node. Its first-order backward is the fused tensor backward (on
// CUDA: cuBLASLt's dGELU/bias-gradient epilogues, cuDNN's attention backward); when the backward
// itself is recorded (create_graph) it is written with differentiable ops instead, so second
// derivatives are exact, as for the fused kernels of autograd/ops/nn.cc. FusedCrossEntropy is the
// exception: it keeps d loss / d logits instead of the logits (the memory of one [N, C] buffer,
// not two), so it has no second derivative and says so.
//
// nn::Linear, nn::Mlp, CausalSelfAttention and nn::CrossEntropyLoss use them on every device, so
// the same model records the same graph on the CPU and on CUDA.
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/autocast_inputs.h"
#include "autograd/ops/fp8_linear.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

DType ComputeDType(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

Tensor Wrap(const RawTensor& t) { return t.defined() ? Tensor(t) : Tensor(); }

// d gelu_tanh(x) / dx with differentiable ops (the formula of GeluTanh's backward).
Tensor GeluTanhDerivative(const Tensor& x) {
  const double k = 0.7978845608028654, c = 0.044715;
  const Tensor x2 = Mul(x, x);
  const Tensor t = Tanh(MulScalar(Add(x, MulScalar(Mul(x2, x), c)), k));
  const Tensor left = MulScalar(AddScalar(t, 1), 0.5);
  const Tensor du = MulScalar(AddScalar(MulScalar(x2, 3 * c), 1), k);
  const Tensor right = Mul(MulScalar(x, 0.5), Mul(AddScalar(Neg(Mul(t, t)), 1), du));
  return Add(left, right);
}

// [t, t] of `dtype` on `device`: 0 on and below the diagonal, -inf above it.
RawTensor CausalMaskTensor(int64_t t, DType dtype, Device device) {
  RawTensor mask = RawTensor::Zeros({t, t}, kF64);
  double* m = mask.data<double>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) m[i * t + j] = -std::numeric_limits<double>::infinity();
  }
  return mask.to(device, dtype);
}

}  // namespace

Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act) {
  if (auto fp8 = MaybeFp8Linear(x, weight, bias, act)) return *fp8;
  if (const auto in = AutocastInputs(OpId::kLinear, x, weight, bias)) {
    return Linear(in[0], in[1], in[2], act);
  }
  const LinearResult r = Dispatch<OpId::kLinear>(
      [&] {
        return tg::Linear(x.data(), weight.data(), bias.defined() ? bias.data() : RawTensor(),
                          act);  // validates
      },
      x, weight, bias);
  // Edges in PyTorch's addmm order (bias, input, weight): the engine runs a ready AccumulateGrad
  // first, in the order its node lists them, so a layer's bias gradient arrives before its
  // weight's, as in PyTorch (DDP and ZeRO lay their buckets out in that order).
  return Record(
      OpNodeName(OpId::kLinear), r.output, {bias, x, weight},
      {x, weight, bias, Wrap(r.pre_activation)}, [act](const BackwardContext& ctx) -> VariableList {
        const bool needs_bias = ctx.needs(0), needs_x = ctx.needs(1), needs_w = ctx.needs(2);
        const Tensor& x = ctx.saved[0];
        const Tensor& w = ctx.saved[1];
        const Tensor& b = ctx.saved[2];
        const Tensor& g = ctx.grads[0];
        if (!GradMode::is_enabled()) {
          // One fused backward: g * act'(pre) (with the bias gradient) in one pass, then the
          // input and weight products.
          const Tensor& pre = ctx.saved[3];
          const LinearGrads r = tg::LinearBackward(g.data(), x.data(), w.data(),
                                                   pre.defined() ? pre.data() : RawTensor(), act,
                                                   needs_x, needs_w, needs_bias);
          return {Wrap(r.grad_bias), Wrap(r.grad_input), Wrap(r.grad_weight)};
        }
        // create_graph: the same gradients with differentiable ops; the pre-activation is
        // recomputed so that second derivatives see how it depends on x, w and b.
        const int64_t n = w.size(0), k = w.size(1), m = x.numel() / std::max<int64_t>(k, 1);
        Tensor gpre = g;
        if (act == Activation::kGeluTanh) {
          Tensor pre = Matmul(x, Transpose(w, 0, 1));
          if (b.defined()) pre = Add(pre, b);
          gpre = Mul(g, GeluTanhDerivative(pre));
        }
        Tensor gx, gw, gb;
        if (needs_x) gx = Matmul(gpre, w);
        if (needs_w) gw = Matmul(Transpose(Reshape(gpre, {m, n}), 0, 1), Reshape(x, {m, k}));
        if (needs_bias) gb = Sum(Reshape(gpre, {m, n}), {0});
        return {gb, gx, gw};
      });
}

Tensor ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                 double scale) {
  if (const auto in = AutocastInputs(OpId::kScaledDotProductAttention, q, k, v)) {
    return ScaledDotProductAttention(in[0], in[1], in[2], causal, scale);
  }
  const AttentionResult r = Dispatch<OpId::kScaledDotProductAttention>(
      [&] { return tg::ScaledDotProductAttention(q.data(), k.data(), v.data(), causal, scale); }, q,
      k, v);
  return Record(
      OpNodeName(OpId::kScaledDotProductAttention), r.output, {q, k, v}, {q, k, v, Tensor(r.stats)},
      [causal, scale](const BackwardContext& ctx) -> VariableList {
        const Tensor& q = ctx.saved[0];
        const Tensor& k = ctx.saved[1];
        const Tensor& v = ctx.saved[2];
        const Tensor& g = ctx.grads[0];
        if (!GradMode::is_enabled()) {
          // The probabilities are recomputed from the saved log-sum-exps (flash attention's
          // backward; cuDNN's fused kernel on CUDA).
          const AttentionGrads r = tg::ScaledDotProductAttentionBackward(
              g.data(), q.data(), k.data(), v.data(), ctx.saved[4].data(), ctx.saved[3].data(),
              causal, scale);
          return {ctx.needs(0) ? Tensor(r.grad_q) : Tensor(),
                  ctx.needs(1) ? Tensor(r.grad_k) : Tensor(),
                  ctx.needs(2) ? Tensor(r.grad_v) : Tensor()};
        }
        // create_graph: softmax attention's backward with differentiable ops, in the compute
        // dtype, from probabilities recomputed with differentiable ops.
        const DType dtype = q.dtype(), ct = ComputeDType(dtype);
        const int64_t nb = q.size(0), nh = q.size(1), nkv = k.size(1), tk = k.size(2),
                      d = k.size(3);
        // Grouped-query heads: k and v repeated for their query heads, the gradients summed
        // back over each group.
        auto repeat = [&](const Tensor& x) {
          if (nkv == nh) return x;
          return Reshape(Expand(Unsqueeze(x, 2), {nb, nkv, nh / nkv, tk, d}), {nb, nh, tk, d});
        };
        auto group_sum = [&](const Tensor& x) {
          if (nkv == nh) return x;
          return Sum(Reshape(x, {nb, nkv, nh / nkv, tk, d}), {2});
        };
        const Tensor qc = Cast(q, ct), kc = repeat(Cast(k, ct)), vc = repeat(Cast(v, ct)),
                     gc = Cast(g, ct);
        Tensor s = MulScalar(Matmul(qc, Transpose(kc, 2, 3)), scale);
        if (causal) s = Add(s, Tensor(CausalMaskTensor(q.size(2), ct, q.data().device())));
        const Tensor p = Softmax(s);
        const Tensor dp = Matmul(gc, Transpose(vc, 2, 3));
        const Tensor ds =
            MulScalar(Mul(p, Sub(dp, Sum(Mul(dp, p), {-1}, /*keepdim=*/true))), scale);
        return {Cast(Matmul(ds, kc), dtype),
                Cast(group_sum(Matmul(Transpose(ds, 2, 3), qc)), dtype),
                Cast(group_sum(Matmul(Transpose(p, 2, 3), gc)), dtype)};
      },
      /*save_output=*/true);
}

Tensor FusedCrossEntropy(const Tensor& logits, const RawTensor& targets, int64_t ignore_index,
                         Reduction reduction) {
  if (const auto in = AutocastInputs(OpId::kFusedCrossEntropy, logits)) {
    return FusedCrossEntropy(in[0], targets, ignore_index, reduction);
  }
  // Without a gradient to compute this is the plain loss.
  if (!ShouldRecord({logits})) {
    return Tensor(Dispatch<OpId::kFusedCrossEntropy>(
        [&] { return tg::CrossEntropy(logits.data(), targets, ignore_index, reduction); }, logits,
        Tensor(targets)));
  }
  // d loss / d logits for a loss gradient of 1, computed by the same pass as the loss; the
  // backward only scales it. Saving it instead of the logits lets the logits go right away.
  const CrossEntropyResult r = Dispatch<OpId::kFusedCrossEntropy>(
      [&] {
        return tg::CrossEntropyWithGrad(logits.data(), targets, ignore_index, reduction, 1.0);
      },
      logits, Tensor(targets));
  return Record(
      OpNodeName(OpId::kFusedCrossEntropy), r.loss, {logits}, {Tensor(r.grad_logits)},
      [reduction](const BackwardContext& ctx) -> VariableList {
        TG_CHECK(!GradMode::is_enabled(), OpNodeName(OpId::kFusedCrossEntropy),
                 ": a create_graph backward needs the logits, "
                 "which the fused loss does not keep; use tg::CrossEntropy (or "
                 "nn::CrossEntropyLoss with CrossEntropyOptions::fused = false)");
        const RawTensor& unit = ctx.saved[0].data();  // [N, C]
        const RawTensor& g = ctx.grads[0].data();     // 0-d, or [N] for kNone
        return {Tensor(tg::Mul(unit, reduction == Reduction::kNone ? g.unsqueeze(1) : g))};
      });
}

}  // namespace tg
