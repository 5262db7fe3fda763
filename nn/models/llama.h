// The Llama family's decoder (transformers' LlamaForCausalLM; Qwen2's attention biases and tied
// heads as options): token embedding, num_hidden_layers blocks of
//   x = x + o_proj(attention(rope(q_proj(n1(x))), rope(k_proj(n1(x))), v_proj(n1(x))))
//   x = x + down_proj(silu(gate_proj(n2(x))) * up_proj(n2(x)))
// with grouped-query attention (num_key_value_heads <= num_attention_heads; each key/value head
// serves num_attention_heads / num_key_value_heads query heads), RMSNorm as LlamaRMSNorm computes
// it, rotary embeddings (nn/rotary.h), a final norm and the head (lm_head, or the embedding's
// weight when tie_word_embeddings). Parameter names are transformers' ("model.layers.0.self_attn.
// q_proj.weight", "lm_head.weight"), so its state_dict loads as it is.
//
//   tg::nn::LlamaConfig c;  c.vocab_size = 32000;  ...
//   tg::Generator gen(0);
//   auto model = std::make_shared<tg::nn::LlamaForCausalLM>(c, gen);
//   tg::Tensor logits = (*model)(tokens);   // tokens i64 [batch, seq] -> [batch, seq, vocab]
//
// tools/train_llama.cc trains it; nn/models/llama_io.h reads and writes transformers checkpoint
// directories. RMSNorm and the rotary embeddings are one op each (tg::LlamaRmsNorm,
// tg::RotaryEmbedding: CPU kernels forward and backward, the composed ops on CUDA); SwiGLU is
// composed of differentiable ops.
#ifndef TAPEGRAD_NN_MODELS_LLAMA_H_
#define TAPEGRAD_NN_MODELS_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/rotary.h"
#include "tensor/generator.h"

namespace tg::nn {

// config.json's fields, with transformers' LlamaConfig defaults where it has them.
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads (multi-head attention)
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;  // rope_theta, rope_scaling
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k, v and o projections (Llama); Qwen2: q, k, v only
  bool o_proj_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;  // N(0, initializer_range) for every Linear and the embedding
  // Mistral's sliding_window: a token attends to at most this many (itself included); 0: none.
  // Full causal attention equals it for sequences of at most this many tokens, and the forward
  // refuses longer ones (a banded mask is not computed here).
  int64_t sliding_window = 0;

  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

// LlamaRMSNorm: x in f32, x * rsqrt(mean(x^2) + eps), back to x's dtype, then times the weight
// (so a bf16 model rounds the normalised value and the product apart, as transformers does).
class LlamaRmsNorm : public Module {
 public:
  LlamaRmsNorm(int64_t dim, double eps);
  Tensor forward(const Tensor& x) override;
  Tensor weight;  // [dim], ones

 private:
  double eps_;
};

// The rotary tables of the sequence being run, which LlamaModel sets before its layers run and
// every attention reads (so that each module is called through operator(), with its hooks:
// ZeRO stage 3 gathers a layer's parameters in them).
struct LlamaRopeState {
  RopeTables tables;
};

class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& config, std::shared_ptr<const LlamaRopeState> rope,
                 Generator& gen);
  Tensor forward(const Tensor& x) override;  // [batch, seq, hidden] -> same

 private:
  LlamaConfig config_;
  std::shared_ptr<const LlamaRopeState> rope_;
  Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};

class LlamaMlp : public Module {
 public:
  LlamaMlp(const LlamaConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) override;  // down(silu(gate(x)) * up(x))

 private:
  Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, std::shared_ptr<const LlamaRopeState> rope,
                    Generator& gen);
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMlp> mlp_;
  std::shared_ptr<LlamaRmsNorm> input_layernorm_, post_attention_layernorm_;
};

// transformers' LlamaModel: embed_tokens, layers, norm.
class LlamaModel : public Module {
 public:
  LlamaModel(const LlamaConfig& config, Generator& gen);
  Tensor forward(const Tensor& tokens) override;  // -> the final norm's output
  const Embedding& embed_tokens() const { return embed_tokens_; }

 private:
  LlamaConfig config_;
  RawTensor inv_freq_;
  Embedding embed_tokens_{nullptr};
  ModuleList layers_{nullptr};
  std::shared_ptr<LlamaRmsNorm> norm_;
  std::shared_ptr<LlamaRopeState> rope_;  // for the last (seq, device, dtype)
};

class LlamaForCausalLM : public Module {
 public:
  // Validates the config (positive sizes, heads dividing, head_dim even) and draws the weights.
  LlamaForCausalLM(const LlamaConfig& config, Generator& gen);
  Tensor forward(const Tensor& tokens) override;  // i64 [batch, seq] -> [batch, seq, vocab]
  const LlamaConfig& config() const { return config_; }
  // As Gpt::Generate (nn/sampling.h), with a context of max_position_embeddings tokens.
  std::vector<int64_t> Generate(const std::vector<int64_t>& prompt, int64_t new_tokens,
                                Generator& gen, double temperature = 1.0, int64_t top_k = 0);
  std::string extra_repr() const override;

 private:
  LlamaConfig config_;
  std::shared_ptr<LlamaModel> model_;
  Linear lm_head_{nullptr};
};

}  // namespace tg::nn

#endif  // TAPEGRAD_NN_MODELS_LLAMA_H_
