#include "nn/transformer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& options, Generator& gen)
    : Module("CausalSelfAttention", /*autocast_scope=*/true), options_(options) {
  TG_CHECK(options.n_embd > 0 && options.n_head > 0 && options.n_embd % options.n_head == 0,
           "CausalSelfAttention: n_embd ", options.n_embd,
           " must be a positive multiple of n_head ", options.n_head);
  qkv_ = register_module(
      "qkv", Linear(LinearOptions(options.n_embd, 3 * options.n_embd).bias(options.bias), gen));
  proj_ = register_module(
      "proj", Linear(LinearOptions(options.n_embd, options.n_embd).bias(options.bias), gen));
  if (options.dropout > 0) {
    TG_CHECK(options.dropout_gen != nullptr, "CausalSelfAttention: dropout ", options.dropout,
             " needs AttentionOptions::dropout_gen");
    attn_dropout_ = register_module("attn_dropout", Dropout(options.dropout, *options.dropout_gen));
    resid_dropout_ =
        register_module("resid_dropout", Dropout(options.dropout, *options.dropout_gen));
  }
}

const RawTensor& CausalSelfAttention::CausalMask(int64_t seq, Device device) {
  if (!mask_.defined() || mask_.size(0) != seq || mask_.device() != device) {
    RawTensor mask = RawTensor::Zeros({seq, seq});
    float* m = mask.data<float>();
    for (int64_t i = 0; i < seq; ++i) {
      for (int64_t j = i + 1; j < seq; ++j)
        m[i * seq + j] = -std::numeric_limits<float>::infinity();
    }
    // Built on the host, uploaded once per length and device (not once per step).
    mask_ = mask.to(device);
  }
  return mask_;
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  TG_CHECK(x.dim() == 3 && x.size(2) == options_.n_embd, "CausalSelfAttention: input ",
           ShapeToString(x.shape()), " is not [batch, seq, ", options_.n_embd, "]");
  const int64_t b = x.size(0), t = x.size(1), c = options_.n_embd, h = options_.n_head;
  const int64_t d = c / h;
  Tensor qkv = qkv_(x);  // [b, t, 3c]
  const bool attn_dropout = !attn_dropout_.is_empty() && is_training();
  if (!attn_dropout) {
    // One fused attention (the kernel list's ScaledDotProductAttention: cuDNN's flash attention on
    // CUDA where the heads qualify, a one-pass kernel per head on the CPU) on strided views of
    // the projection: q, k, v [b, h, t, d] = qkv [b, t, 3, h, d] split and permuted, no copies.
    // Attention dropout (training with p > 0) needs the probabilities, so it keeps the composed
    // path below on every device.
    const VariableList parts = Split(qkv, c, 2);  // 3 x [b, t, c]
    auto heads = [&](const Tensor& part) {
      return Permute(Reshape(part, {b, t, h, d}), {0, 2, 1, 3});  // [b, h, t, d]
    };
    Tensor y = ScaledDotProductAttention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                         /*causal=*/true, 1.0 / std::sqrt(double(d)));
    y = Reshape(Permute(y, {0, 2, 1, 3}), {b, t, c});
    y = proj_(y);
    if (!resid_dropout_.is_empty()) y = resid_dropout_(y);
    return y;
  }
  // [b, t, 3, h, d] -> [3, b, h, t, d]; each of q, k, v as [b*h, t, d].
  Tensor heads = Permute(Reshape(qkv, {b, t, 3, h, d}), {2, 0, 3, 1, 4});
  auto part = [&](int64_t i) { return Reshape(Select(heads, 0, i), {b * h, t, d}); };
  Tensor q = part(0), k = part(1), v = part(2);
  Tensor scores = MulScalar(Bmm(q, Transpose(k, 1, 2)), 1.0 / std::sqrt(double(d)));
  scores = Add(scores, Tensor(CausalMask(t, x.data().device())));  // [b*h, t, t]
  Tensor att = tg::Softmax(scores);
  if (!attn_dropout_.is_empty()) att = attn_dropout_(att);
  Tensor y = Bmm(att, v);  // [b*h, t, d]
  y = Reshape(Permute(Reshape(y, {b, h, t, d}), {0, 2, 1, 3}), {b, t, c});
  y = proj_(y);
  if (!resid_dropout_.is_empty()) y = resid_dropout_(y);
  return y;
}

std::string CausalSelfAttention::extra_repr() const {
  return absl::StrCat("n_embd=", options_.n_embd, ", n_head=", options_.n_head);
}

TransformerBlock::TransformerBlock(const AttentionOptions& options, Generator& gen)
    : Module("TransformerBlock") {
  ln1_ = register_module("ln1", LayerNorm(options.n_embd));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(options, gen));
  ln2_ = register_module("ln2", LayerNorm(options.n_embd));
  Mlp::Options mlp;
  mlp.activation = Activation::kGeluTanh;
  mlp.bias = options.bias;
  mlp_ = register_module(
      "mlp",
      std::make_shared<Mlp>(
          std::vector<int64_t>{options.n_embd, 4 * options.n_embd, options.n_embd}, gen, mlp));
  // GPT-2 applies dropout to the MLP output too; the attention owns its own.
  if (options.dropout > 0) {
    mlp_dropout_ = register_module("mlp_dropout", Dropout(options.dropout, *options.dropout_gen));
  }
}

Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = Add(x, (*attn_)(ln1_(x)));
  Tensor m = (*mlp_)(ln2_(h));
  if (!mlp_dropout_.is_empty()) m = mlp_dropout_(m);
  return Add(h, m);
}

}  // namespace nn
}  // namespace tg
