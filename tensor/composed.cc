#include "tensor/composed.h"

#include <cmath>
#include <limits>
#include <vector>

#include "tensor/optimizer_kernels.h"

namespace tg::composed {

DType ComputeDType(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// ---- Linear ----

// With u = k (x + c x^3): gelu'(x) = (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2).
RawTensor GeluTanhGrad(const RawTensor& x) {
  const double k = 0.7978845608028654, c = 0.044715;  // sqrt(2 / pi)
  const RawTensor x2 = Mul(x, x);
  const RawTensor t = Tanh(MulScalar(Add(x, MulScalar(Mul(x2, x), c)), k));
  const RawTensor left = MulScalar(AddScalar(t, 1), 0.5);
  const RawTensor du = MulScalar(AddScalar(MulScalar(x2, 3 * c), 1), k);
  const RawTensor right = Mul(MulScalar(x, 0.5), Mul(AddScalar(Neg(Mul(t, t)), 1), du));
  return Add(left, right);
}

LinearResult Linear(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                    Activation act) {
  const DType dtype = x.dtype(), ct = ComputeDType(dtype);
  RawTensor pre = Matmul(x.to(ct), weight.to(ct).transpose(0, 1));
  if (bias.defined()) pre = Add(pre, bias.to(ct));
  if (act == Activation::kNone) return {pre.to(dtype), RawTensor()};
  return {GeluTanh(pre).to(dtype), pre.to(dtype)};
}

LinearGrads LinearBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           const RawTensor& pre, Activation act, bool need_input, bool need_weight,
                           bool need_bias) {
  const DType dtype = x.dtype(), ct = ComputeDType(dtype);
  // g = grad_out * act'(pre) in the compute dtype, rounded to the dtype for the products; the
  // bias gradient sums g before rounding.
  RawTensor g = grad_out, g_sum;
  if (act == Activation::kNone) {
    if (need_bias) g_sum = Sum(grad_out, {0});
  } else {
    const RawTensor gc = Mul(grad_out.to(ct), GeluTanhGrad(pre.to(ct)));
    g = gc.to(dtype);
    if (need_bias) g_sum = Sum(gc, {0});
  }
  LinearGrads r;
  if (need_input) r.grad_input = Matmul(g, weight);
  if (need_weight) r.grad_weight = Matmul(g.transpose(0, 1), x);
  if (need_bias) r.grad_bias = g_sum.to(dtype);
  return r;
}

// ---- Attention ----

namespace {

// [t, t] of `dtype`: 0 on and below the diagonal, -inf above it (query i sees keys 0..i).
RawTensor CausalMask(int64_t t, DType dtype, Device device) {
  std::vector<double> host(static_cast<size_t>(t * t), 0.0);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) host[i * t + j] = -std::numeric_limits<double>::infinity();
  }
  return RawTensor::FromVector(host, {t, t}).to(device, dtype);
}

// scale * q @ k^T (+ the causal mask) [B, H, Tq, Tk] in the compute dtype.
RawTensor AttentionScores(const RawTensor& q, const RawTensor& k, bool causal, double scale) {
  const DType ct = ComputeDType(q.dtype());
  RawTensor s = MulScalar(Matmul(q.to(ct), k.to(ct).transpose(2, 3)), scale);
  if (causal) s = Add(s, CausalMask(q.size(2), ct, q.device()));
  return s;
}

// Grouped-query attention's key/value heads [B, Hkv, T, D] repeated for the `heads` query heads
// (head j serves query heads j * rep .. j * rep + rep - 1, transformers' repeat_kv).
RawTensor RepeatHeads(const RawTensor& x, int64_t heads) {
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, heads / kv, t, d}).reshape({b, heads, t, d});
}

}  // namespace

// Masked scores are -inf and give probability 0; the diagonal is never masked, so each row's
// maximum is finite.
AttentionResult Attention(const RawTensor& q, const RawTensor& k, const RawTensor& v, bool causal,
                          double scale) {
  if (k.size(1) != q.size(1)) {
    return Attention(q, RepeatHeads(k, q.size(1)), RepeatHeads(v, q.size(1)), causal, scale);
  }
  const DType dtype = q.dtype(), ct = ComputeDType(dtype);
  const int64_t b = q.size(0), h = q.size(1), tq = q.size(2);
  if (b * h * tq == 0)
    return {RawTensor::Zeros(q.shape(), dtype, q.device()),
            RawTensor::Zeros({b, h, tq}, ct, q.device())};
  const RawTensor s = AttentionScores(q, k, causal, scale);
  const RawTensor max = Max(s, -1, /*keepdim=*/true);
  const RawTensor e = Exp(Sub(s, max));
  const RawTensor sum = Sum(e, {-1}, /*keepdim=*/true);
  const RawTensor p = Div(e, sum);
  return {Matmul(p.to(dtype), v), Add(max, Log(sum)).squeeze(-1)};
}

AttentionGrads AttentionBackward(const RawTensor& grad_out, const RawTensor& q, const RawTensor& k,
                                 const RawTensor& v, const RawTensor& output,
                                 const RawTensor& stats, bool causal, double scale) {
  if (k.size(1) != q.size(1)) {  // the repeated heads' gradients summed per key/value head
    AttentionGrads r = AttentionBackward(grad_out, q, RepeatHeads(k, q.size(1)),
                                         RepeatHeads(v, q.size(1)), output, stats, causal, scale);
    const Shape grouped = {k.size(0), k.size(1), q.size(1) / k.size(1), k.size(2), k.size(3)};
    r.grad_k = Sum(r.grad_k.reshape(grouped), {2});
    r.grad_v = Sum(r.grad_v.reshape(grouped), {2});
    return r;
  }
  const DType dtype = q.dtype(), ct = ComputeDType(dtype);
  if (q.numel() == 0) {  // no queries (or empty heads): nothing flows back
    return {RawTensor::Zeros(q.shape(), dtype, q.device()),
            RawTensor::Zeros(k.shape(), dtype, q.device()),
            RawTensor::Zeros(v.shape(), dtype, q.device())};
  }
  const RawTensor p = Exp(Sub(AttentionScores(q, k, causal, scale), stats.to(ct).unsqueeze(-1)));
  AttentionGrads r;
  r.grad_v = Matmul(p.to(dtype).transpose(2, 3), grad_out);
  const RawTensor go = grad_out.to(ct);
  const RawTensor dp = Matmul(go, v.to(ct).transpose(2, 3));
  // The softmax backward's row term, sum_k p * dp, equals sum_d grad_out * output.
  const RawTensor delta = Sum(Mul(go, output.to(ct)), {-1}, /*keepdim=*/true);
  const RawTensor ds = MulScalar(Mul(p, Sub(dp, delta)), scale).to(dtype);
  r.grad_q = Matmul(ds, k);
  r.grad_k = Matmul(ds.transpose(2, 3), q);
  return r;
}

// ---- Layer norm ----

LayerNormGrads LayerNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                 const RawTensor& mean, const RawTensor& rstd,
                                 const RawTensor& weight, bool need_weight_bias) {
  const DType ct = ComputeDType(x.dtype());
  const int64_t rows = x.size(0);
  // The formulas in the compute dtype (rows of x against [rows, 1] statistics).
  const RawTensor mean_c = mean.reshape({rows, 1}).to(ct), rstd_c = rstd.reshape({rows, 1}).to(ct);
  const RawTensor go = grad_out.to(ct);
  const RawTensor xhat = Mul(Sub(x.to(ct), mean_c), rstd_c);
  const RawTensor dxhat = weight.defined() ? Mul(go, weight.to(ct)) : go;
  const RawTensor mean_dxhat = Mean(dxhat, {1}, /*keepdim=*/true);
  const RawTensor mean_dxhat_xhat = Mean(Mul(dxhat, xhat), {1}, /*keepdim=*/true);
  LayerNormGrads r;
  r.grad_input = Mul(rstd_c, Sub(Sub(dxhat, mean_dxhat), Mul(xhat, mean_dxhat_xhat))).to(x.dtype());
  if (need_weight_bias) {
    r.grad_weight = Sum(Mul(go, xhat), {0}).to(x.dtype());
    r.grad_bias = Sum(go, {0}).to(x.dtype());
  }
  return r;
}

LlamaRmsNormResult LlamaRmsNorm(const RawTensor& x, const RawTensor& weight, double eps) {
  const DType ct = ComputeDType(x.dtype());
  const RawTensor h64 = x.to(kF64);
  const RawTensor rstd =
      Pow(AddScalar(Mean(Mul(h64, h64), {1}, /*keepdim=*/true), eps), -0.5).to(ct);  // [rows, 1]
  const RawTensor normed = Mul(x.to(ct), rstd).to(x.dtype());
  const DType out = PromoteTypes(weight.dtype(), x.dtype());
  return {Mul(weight.to(out), normed.to(out)), rstd.reshape({x.size(0)})};
}

LlamaRmsNormGrads LlamaRmsNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                       const RawTensor& rstd, const RawTensor& weight,
                                       bool need_weight) {
  const DType ct = ComputeDType(x.dtype());
  const RawTensor h = x.to(ct), r = rstd.reshape({x.size(0), 1}).to(ct);
  const RawTensor g = grad_out.to(ct);
  const RawTensor dn = Mul(g, weight.to(ct));
  // sum(dn * h) / n in f64, then rstd^3 times it in ct.
  const RawTensor dot = Mean(Mul(dn.to(kF64), h.to(kF64)), {1}, /*keepdim=*/true).to(ct);
  const RawTensor s = Mul(Mul(Mul(r, r), r), dot);
  LlamaRmsNormGrads out;
  out.grad_input = Sub(Mul(r, dn), Mul(h, s)).to(x.dtype());
  if (need_weight) {
    const RawTensor normed = Mul(h, r).to(x.dtype()).to(ct);
    out.grad_weight = Sum(Mul(g.to(kF64), normed.to(kF64)), {0}).to(weight.dtype());
  }
  return out;
}

namespace {

// cat(-y[..., h:], y[..., :h]) for the last dim of 2h.
RawTensor RotateHalfRaw(const RawTensor& y) {
  const int64_t h = y.size(-1) / 2, last = y.dim() - 1;
  RawTensor out = RawTensor::Empty(y.shape(), y.dtype(), y.device());
  out.narrow(last, 0, h).copy_(Neg(y.narrow(last, h, h)));
  out.narrow(last, h, h).copy_(y.narrow(last, 0, h));
  return out;
}

}  // namespace

RawTensor Swiglu(const RawTensor& gate, const RawTensor& up) { return Mul(Silu(gate), up); }

// Mul's backward (grad_out * up, grad_out * silu(gate)), then Silu's: grad * s (1 + g (1 - s)).
SwigluGrads SwigluBackward(const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up) {
  const RawTensor s = Sigmoid(gate);
  const RawTensor silu_grad = Mul(s, AddScalar(Mul(gate, AddScalar(Neg(s), 1)), 1));
  return {Mul(Mul(grad_out, up), silu_grad), Mul(grad_out, Silu(gate))};
}

RawTensor RotaryEmbedding(const RawTensor& x, const RawTensor& cos, const RawTensor& sin) {
  return Add(Mul(x, cos), Mul(RotateHalfRaw(x), sin));
}

RawTensor RotaryEmbeddingBackward(const RawTensor& grad_out, const RawTensor& cos,
                                  const RawTensor& sin) {
  // rotate_half's transpose is -rotate_half: (y[h:], -y[:h]).
  return Add(Mul(grad_out, cos), Neg(RotateHalfRaw(Mul(grad_out, sin))));
}

AddLayerNormResult AddLayerNorm(const RawTensor& a, const RawTensor& b, const RawTensor& weight,
                                const RawTensor& bias, double eps) {
  AddLayerNormResult r;
  r.residual = Add(a, b);
  r.norm = LayerNorm(r.residual, weight, bias, eps);
  return r;
}

// ---- Cross-entropy ----

CrossEntropyResult SoftmaxCrossEntropy(const RawTensor& logits, const RawTensor& targets,
                                       const RawTensor& row_scale, int64_t ignore_index) {
  return {CrossEntropy(logits, targets, ignore_index, Reduction::kNone),
          CrossEntropyBackward(logits, targets, row_scale, ignore_index, Reduction::kNone)};
}

// ---- Mixed precision ----

void NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                              const RawTensor& inv_scale) {
  const double inv = inv_scale.item();
  if (AnyNonFinite(tensors)) found_inf.fill_(1);
  MulScalarInPlace(tensors, inv);
}

// ---- Optimizers ----

void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  if (o.found_inf.defined() && o.found_inf.item() != 0) return;
  const double step =
      o.device_step.defined() ? o.device_step.item() + 1 : static_cast<double>(o.step);
  const AdamStepScalars scalars = o.ScalarsAt(step);
  for (size_t i = 0; i < lists.params.size(); ++i) {
    const RawTensor& param = lists.params[i];
    const RawTensor& exp_avg = lists.exp_avgs[i];
    const RawTensor& exp_avg_sq = lists.exp_avg_sqs[i];
    const DType cd = ComputeDType(param.dtype());
    RawTensor p = param.to(cd);  // [param shape] compute dtype
    RawTensor g = lists.grads[i].to(cd);
    if (o.inv_scale.defined()) g = MulScalar(g, o.inv_scale.item());
    // The fused multiply-adds are the op tg::AddScaled (one rounding on every device with the
    // kernel), not this file's two-rounding form.
    if (o.decay == WeightDecay::kL2) g = tg::AddScaled(g, p, o.weight_decay);
    if (o.decay == WeightDecay::kDecoupled) p = MulScalar(p, scalars.decay);
    LerpInPlace(exp_avg, g, 1 - o.beta1);
    exp_avg_sq.copy_(tg::Addcmul(MulScalar(exp_avg_sq, o.beta2), g, g, 1 - o.beta2));
    RawTensor v = exp_avg_sq;
    if (o.amsgrad) {
      const RawTensor& max_exp_avg_sq = lists.max_exp_avg_sqs[i];
      max_exp_avg_sq.copy_(Maximum(max_exp_avg_sq, exp_avg_sq));
      v = max_exp_avg_sq;
    }
    const RawTensor denom =
        AddScalar(BinaryScalar(BinaryOp::kDiv, Sqrt(v), scalars.bias_correction2_sqrt), o.eps);
    param.copy_(Sub(p, Div(MulScalar(exp_avg, scalars.step_size), denom)));
    if (!lists.model_params.empty() && lists.model_params[i].defined()) {
      lists.model_params[i].copy_(param);
    }
  }
  if (o.device_step.defined()) o.device_step.fill_(step);
}

void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& o) {
  if (lists.params.empty()) return;
  // found_inf and momentum_buffers_valid are read where they live: each decision is a Where on
  // the device (no host wait), selecting between values computed as the host-decided form
  // computes them, so both forms give the same bits.
  const Device device = lists.params[0].device();
  RawTensor skip, init;  // bool 0-d, or undefined: decided on the host
  if (o.found_inf.defined()) skip = Ne(o.found_inf, RawTensor::Zeros({}, kF32, device));
  if (o.momentum_buffers_valid.defined()) {
    init = Eq(o.momentum_buffers_valid, RawTensor::Zeros({}, kF32, device));
  }
  for (size_t i = 0; i < lists.params.size(); ++i) {
    const RawTensor& param = lists.params[i];
    const DType cd = ComputeDType(param.dtype());
    const RawTensor p = param.to(cd);  // [param shape] compute dtype (param itself when f32/f64)
    RawTensor g = lists.grads[i].to(cd);
    if (o.weight_decay != 0) g = Add(g, MulScalar(p, o.weight_decay));
    if (o.momentum != 0) {
      const RawTensor& buf = lists.momentum_buffers[i];
      RawTensor b;
      if (init.defined()) {
        b = Where(init, g, Add(MulScalar(buf, o.momentum), MulScalar(g, 1 - o.dampening)));
      } else if (o.init_momentum_buffers) {
        b = g;
      } else {
        b = Add(MulScalar(buf, o.momentum), MulScalar(g, 1 - o.dampening));
      }
      g = o.nesterov ? Add(g, MulScalar(b, o.momentum)) : b;
      buf.copy_(skip.defined() ? Where(skip, buf, b) : b);
    }
    const RawTensor updated = Sub(p, MulScalar(g, o.lr));
    // Where(skip, param, updated) holds param's own value exactly (widened, then rounded back).
    param.copy_(skip.defined() ? Where(skip, param, updated) : updated);
  }
  if (o.momentum_buffers_valid.defined()) {
    const RawTensor one = RawTensor::Ones({}, kF32, device);
    o.momentum_buffers_valid.copy_(skip.defined() ? Where(skip, o.momentum_buffers_valid, one)
                                                  : one);
  }
}

void GlobalGradNorm(const RawTensor& norm, const std::vector<RawTensor>& tensors,
                    double norm_type) {
  const bool inf_norm = std::isinf(norm_type);
  RawTensor acc = RawTensor::Zeros({}, kF64, norm.device());  // sum of |x|^p, or max |x|
  for (const RawTensor& t : tensors) {
    if (t.numel() == 0) continue;
    const RawTensor x = Abs(t.to(kF64));
    if (inf_norm) {
      acc = Maximum(acc, Max(x.reshape({-1}), 0));  // both keep a NaN
    } else if (norm_type == 2) {
      acc = Add(acc, Sum(Mul(x, x)));
    } else if (norm_type == 1) {
      acc = Add(acc, Sum(x));
    } else {
      acc = Add(acc, Sum(Pow(x, norm_type)));
    }
  }
  if (!inf_norm && norm_type != 1) acc = norm_type == 2 ? Sqrt(acc) : Pow(acc, 1.0 / norm_type);
  norm.copy_(acc);
}

// The product and the sum rounded apart (no fused multiply-add among the tensor ops).
RawTensor AddScaled(const RawTensor& a, const RawTensor& b, double alpha) {
  return Add(a, MulScalar(b, alpha));
}
// torch's lerp in the compute dtype (f16/bf16 widened, rounded once at the end) with b - a
// rounded and the rest one tg::AddScaled (fused where the device has the kernel).
RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight) {
  const DType ct = ComputeDType(a.dtype());
  if (ct != a.dtype()) return composed::Lerp(a.to(ct), b.to(ct), weight).to(a.dtype());
  const double w = RawTensor::Scalar(weight, kF64).to(ct).item();
  const RawTensor diff = Sub(b, a);
  // 1 - w is exact in the compute dtype for w in [0.5, 1].
  return std::abs(w) < 0.5 ? tg::AddScaled(a, diff, w) : tg::AddScaled(b, diff, -(1 - w));
}
RawTensor Addcmul(const RawTensor& self, const RawTensor& t1, const RawTensor& t2, double value) {
  return Add(self, Mul(MulScalar(t1, value), t2));
}

// The kernel list's NewtonSchulz in tensor ops: every product of 16-bit matrices is a product of
// their exact f32 widenings (one rounding per element, as the kernel's), batched.
RawTensor NewtonSchulz(const RawTensor& x, double a, double b, double c, int64_t ns_steps,
                       double eps) {
  const DType dtype = x.dtype(), ct = ComputeDType(dtype);
  const RawTensor x64 = x.to(kF64);
  const RawTensor sum_sq = Sum(Mul(x64, x64), {1, 2}, /*keepdim=*/true).to(ct).to(kF64);
  const RawTensor floor = RawTensor::Scalar(eps, kF64).to(dtype).to(x.device());
  RawTensor ortho = Div(x, Maximum(Sqrt(sum_sq).to(dtype), floor));
  for (int64_t step = 0; step < ns_steps; ++step) {
    const RawTensor xs = ortho.to(ct);
    const RawTensor gram = Bmm(xs, xs.transpose(1, 2)).to(dtype).to(ct);
    const RawTensor update =
        Add(MulScalar(gram, b), MulScalar(Bmm(gram, gram), c)).to(dtype).to(ct);
    ortho = Add(MulScalar(xs, a), Bmm(update, xs)).to(dtype);
  }
  return ortho.contiguous();
}

void ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                double max_norm) {
  double clip_coef = 1;
  if (ClipCoefficient(total_norm.item(), max_norm, &clip_coef)) {
    MulScalarInPlace(tensors, clip_coef);
  }
}

}  // namespace tg::composed
