// Scaled dot-product attention of tensor/ops.h, forward and backward: the device's fused
// kernel in the layout its backend prefers, or the composed form of tensor/composed.h.
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

using composed::ComputeDType;

// ---- Scaled dot-product attention ----

namespace {

// Validates q, k, v of attention (shared by the backward).
void CheckAttentionInputs(const char* op, const RawTensor& q, const RawTensor& k,
                          const RawTensor& v, bool causal, double scale) {
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
  // Grouped-query attention: k and v may have fewer heads, a divisor of q's.
  const bool heads_ok = k.size(1) == q.size(1) || (k.size(1) > 0 && q.size(1) % k.size(1) == 0);
  TG_CHECK(k.shape() == v.shape() && k.size(0) == q.size(0) && heads_ok && k.size(3) == q.size(3),
           op, ": q ", ShapeToString(q.shape()), ", k ", ShapeToString(k.shape()), " and v ",
           ShapeToString(v.shape()), " do not match (expected k and v [", q.size(0), ", Hkv, Tk, ",
           q.size(3), "] with Hkv dividing ", q.size(1), ")");
  const int64_t tq = q.size(2), tk = k.size(2);
  TG_CHECK(!causal || tq == tk, op, ": causal attention needs as many queries as keys, got ", tq,
           " and ", tk);
  TG_CHECK(tk > 0 || tq == 0 || q.size(0) * q.size(1) == 0, op, ": ", tq,
           " queries attend to no keys (k is ", ShapeToString(k.shape()), ")");
  TG_CHECK(std::isfinite(scale), op, ": scale ", scale, " is not finite");
}

// A [B, H, T, D] tensor for attention's output or gradients, of `like`'s shape, in the memory
// order its device's backend prefers (DevicePreferences::attention_layout).
RawTensor AttentionTensor(const RawTensor& like, DType dtype) {
  const Device device = like.device();
  switch (PreferencesFor(device).attention_layout) {
    case DevicePreferences::AttentionLayout::kHeadsMajor:
      return RawTensor::Empty(like.shape(), dtype, device);
    case DevicePreferences::AttentionLayout::kTokensMajor:
      return RawTensor::Empty({like.size(0), like.size(2), like.size(1), like.size(3)}, dtype,
                              device)
          .permute({0, 2, 1, 3});
  }
  throw Error("scaled_dot_product_attention: unknown attention layout");
}

}  // namespace

AttentionResult ScaledDotProductAttention(const RawTensor& q, const RawTensor& k,
                                          const RawTensor& v, bool causal, double scale) {
  CheckAttentionInputs("scaled_dot_product_attention", q, k, v, causal, scale);
  if (q.size(0) * q.size(1) * q.size(2) > 0) {
    AttentionResult r{
        AttentionTensor(q, q.dtype()),
        RawTensor::Empty({q.size(0), q.size(1), q.size(2)}, ComputeDType(q.dtype()), q.device())};
    if (!Declined(KernelsFor(q.device())
                      .ScaledDotProductAttention(r.output, r.stats, q, k, v, causal, scale))) {
      return r;
    }
  }
  return composed::Attention(q, k, v, causal, scale);
}

AttentionGrads ScaledDotProductAttentionBackward(const RawTensor& grad_out, const RawTensor& q,
                                                 const RawTensor& k, const RawTensor& v,
                                                 const RawTensor& output, const RawTensor& stats,
                                                 bool causal, double scale) {
  const char* op = "scaled_dot_product_attention_backward";
  CheckAttentionInputs(op, q, k, v, causal, scale);
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, output, "the output");
  CheckDefined(op, stats, "stats");
  CommonDevice(op, {&q, &grad_out, &output, &stats});
  for (const RawTensor* t : {&grad_out, &output}) {
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
  // Contiguous when the device's kernel asks for it (DevicePreferences), else any strides.
  const RawTensor dout =
      PreferencesFor(q.device()).attention_grad_out_contiguous ? grad_out.contiguous() : grad_out;
  if (q.numel() > 0) {
    AttentionGrads r{AttentionTensor(q, q.dtype()), AttentionTensor(k, q.dtype()),
                     AttentionTensor(v, q.dtype())};
    if (!Declined(KernelsFor(q.device())
                      .ScaledDotProductAttentionBackward(r.grad_q, r.grad_k, r.grad_v, dout, q, k,
                                                         v, output, stats.contiguous(), causal,
                                                         scale))) {
      return r;
    }
  }
  return composed::AttentionBackward(dout, q, k, v, output, stats, causal, scale);
}

}  // namespace tg
