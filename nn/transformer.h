// Causal multi-head self-attention and the pre-LN transformer block of GPT-2.
//
//   tg::Generator gen(0);
//   tg::nn::TransformerBlock block({/*n_embd=*/64, /*n_head=*/4}, gen);
//   tg::Tensor y = block(x);   // x, y: [batch, seq, 64]
#ifndef TAPEGRAD_NN_TRANSFORMER_H_
#define TAPEGRAD_NN_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "nn/layers.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace tg {
namespace nn {

struct AttentionOptions {
  int64_t n_embd = 0;
  int64_t n_head = 0;
  bool bias = true;
  double dropout = 0;                // on the attention weights and the output (training only)
  Generator* dropout_gen = nullptr;  // required when dropout > 0; must outlive the module
};

// softmax(q k^T / sqrt(d) + causal mask) v over n_head heads of size d = n_embd / n_head, with
// children "qkv" (Linear n_embd -> 3 n_embd, q|k|v along the output) and "proj" (n_embd ->
// n_embd). Under autocast the score and value matmuls run in the low dtype and the masked softmax
// in f32. On the CPU scores and probabilities are materialised ([batch * n_head, seq, seq]); on
// CUDA one ScaledDotProductAttention op (cuDNN's fused attention) replaces them, except with
// attention dropout in training, which needs the probabilities.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const AttentionOptions& options, Generator& gen);
  Tensor forward(const Tensor& x) override;  // [batch, seq, n_embd] -> same
  std::string extra_repr() const override;
  const Linear& qkv() const { return qkv_; }
  const Linear& proj() const { return proj_; }

 private:
  // [seq, seq] f32 on `device`: 0 on and below the diagonal, -inf above.
  const RawTensor& CausalMask(int64_t seq, Device device);

  AttentionOptions options_;
  Linear qkv_{nullptr}, proj_{nullptr};
  Dropout attn_dropout_{nullptr}, resid_dropout_{nullptr};
  RawTensor mask_;  // cached for the last sequence length and device
};

// x + attn(ln1(x)), then + mlp(ln2(x)) with Mlp({n_embd, 4 n_embd, n_embd}, gelu_tanh).
class TransformerBlock : public Module {
 public:
  TransformerBlock(const AttentionOptions& options, Generator& gen);
  Tensor forward(const Tensor& x) override;  // [batch, seq, n_embd] -> same
  const std::shared_ptr<CausalSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<Mlp>& mlp() const { return mlp_; }

 private:
  LayerNorm ln1_{nullptr}, ln2_{nullptr};
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Mlp> mlp_;
  Dropout mlp_dropout_{nullptr};
};

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_TRANSFORMER_H_
