#include "nn/models/llama.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "nn/init.h"
#include "nn/sampling.h"
#include "tensor/error.h"

namespace tg::nn {
namespace {

Linear MakeLinear(int64_t in, int64_t out, bool bias, const LlamaConfig& c, Generator& gen) {
  Linear l(LinearOptions(in, out).bias(bias), gen);
  init::Normal(l->weight, gen, 0, c.initializer_range);
  if (bias) init::Zeros(l->bias);
  return l;
}

void Check(const LlamaConfig& c) {
  TG_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
               c.num_hidden_layers > 0 && c.num_attention_heads > 0,
           "LlamaConfig: vocab_size, hidden_size, intermediate_size, num_hidden_layers and "
           "num_attention_heads must be positive");
  TG_CHECK(c.num_key_value_heads >= 0 && c.num_attention_heads % c.kv_heads() == 0,
           "LlamaConfig: num_attention_heads ", c.num_attention_heads,
           " must be a multiple of num_key_value_heads ", c.kv_heads());
  TG_CHECK(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0,
           "LlamaConfig: hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ",
           c.num_attention_heads, " (give head_dim)");
  TG_CHECK(c.head_size() % 2 == 0, "LlamaConfig: head_dim ", c.head_size(),
           " must be even (rotary embeddings rotate pairs)");
  TG_CHECK(c.sliding_window >= 0, "LlamaConfig: sliding_window must be >= 0, got ",
           c.sliding_window);
  TG_CHECK(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps),
           "LlamaConfig: rms_norm_eps must be positive, got ", c.rms_norm_eps);
}

}  // namespace

LlamaRmsNorm::LlamaRmsNorm(int64_t dim, double eps) : Module("LlamaRMSNorm"), eps_(eps) {
  weight = register_parameter("weight", RawTensor::Ones({dim}));
}

Tensor LlamaRmsNorm::forward(const Tensor& x) { return ::tg::LlamaRmsNorm(x, weight, eps_); }

LlamaAttention::LlamaAttention(const LlamaConfig& c, std::shared_ptr<const LlamaRopeState> rope,
                               Generator& gen)
    : Module("LlamaAttention", /*autocast_scope=*/true), config_(c), rope_(std::move(rope)) {
  const int64_t d = c.head_size();
  q_proj_ = register_module(
      "q_proj", MakeLinear(c.hidden_size, c.num_attention_heads * d, c.attention_bias, c, gen));
  k_proj_ = register_module("k_proj",
                            MakeLinear(c.hidden_size, c.kv_heads() * d, c.attention_bias, c, gen));
  v_proj_ = register_module("v_proj",
                            MakeLinear(c.hidden_size, c.kv_heads() * d, c.attention_bias, c, gen));
  o_proj_ = register_module(
      "o_proj", MakeLinear(c.num_attention_heads * d, c.hidden_size, c.o_proj_bias, c, gen));
}

Tensor LlamaAttention::forward(const Tensor& x) {
  const RopeTables& rope = rope_->tables;
  const int64_t b = x.size(0), t = x.size(1), d = config_.head_size();
  const int64_t heads = config_.num_attention_heads, kv = config_.kv_heads();
  auto split = [&](const Tensor& y, int64_t n) {  // [b, t, n d] -> [b, n, t, d]
    return Transpose(Reshape(y, {b, t, n, d}), 1, 2);
  };
  const Tensor q = ApplyRotary(split(q_proj_(x), heads), rope);
  // Grouped-query attention: the attention op reads key/value head j for query heads j * rep ..
  // j * rep + rep - 1 (transformers' repeat_kv) without repeating them.
  const Tensor k = ApplyRotary(split(k_proj_(x), kv), rope);
  const Tensor v = split(v_proj_(x), kv);
  const Tensor out =
      ScaledDotProductAttention(q, k, v, /*causal=*/true, 1.0 / std::sqrt(static_cast<double>(d)));
  return o_proj_(Reshape(Transpose(out, 1, 2), {b, t, heads * d}));
}

LlamaMlp::LlamaMlp(const LlamaConfig& c, Generator& gen) : Module("LlamaMLP") {
  gate_proj_ = register_module("gate_proj",
                               MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, c, gen));
  up_proj_ = register_module("up_proj",
                             MakeLinear(c.hidden_size, c.intermediate_size, c.mlp_bias, c, gen));
  down_proj_ = register_module("down_proj",
                               MakeLinear(c.intermediate_size, c.hidden_size, c.mlp_bias, c, gen));
}

Tensor LlamaMlp::forward(const Tensor& x) { return down_proj_(Swiglu(gate_proj_(x), up_proj_(x))); }

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c,
                                     std::shared_ptr<const LlamaRopeState> rope, Generator& gen)
    : Module("LlamaDecoderLayer") {
  self_attn_ =
      register_module("self_attn", std::make_shared<LlamaAttention>(c, std::move(rope), gen));
  mlp_ = register_module("mlp", std::make_shared<LlamaMlp>(c, gen));
  input_layernorm_ = register_module("input_layernorm",
                                     std::make_shared<LlamaRmsNorm>(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm_ = register_module(
      "post_attention_layernorm", std::make_shared<LlamaRmsNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x) {
  const Tensor h = Add(x, (*self_attn_)((*input_layernorm_)(x)));
  return Add(h, (*mlp_)((*post_attention_layernorm_)(h)));
}

LlamaModel::LlamaModel(const LlamaConfig& c, Generator& gen)
    : Module("LlamaModel"),
      config_(c),
      inv_freq_(RopeInverseFrequencies(c.head_size(), c.rope)),
      rope_(std::make_shared<LlamaRopeState>()) {
  embed_tokens_ = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size, gen));
  init::Normal(embed_tokens_->weight, gen, 0, c.initializer_range);
  layers_ = register_module("layers", ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_->push_back(std::make_shared<LlamaDecoderLayer>(c, rope_, gen));
  }
  norm_ = register_module("norm", std::make_shared<LlamaRmsNorm>(c.hidden_size, c.rms_norm_eps));
}

Tensor LlamaModel::forward(const Tensor& tokens) {
  TG_CHECK(tokens.dim() == 2, "Llama: tokens must be [batch, seq], got ",
           ShapeToString(tokens.shape()));
  const int64_t seq = tokens.size(1);
  TG_CHECK(config_.sliding_window == 0 || seq <= config_.sliding_window, "Llama: sequence length ",
           seq, " exceeds sliding_window ", config_.sliding_window,
           " (full causal attention equals the sliding window only up to its length)");
  Tensor x = embed_tokens_(tokens);
  const Device device = x.data().device();
  RopeTables& t = rope_->tables;
  if (!t.cos.defined() || t.cos.size(0) != seq || t.cos.device() != device ||
      t.cos.dtype() != x.dtype()) {
    const RopeTables fresh = RopeCosSin(inv_freq_, seq, x.dtype());
    t = {fresh.cos.to(device), fresh.sin.to(device)};
  }
  for (const auto& layer : *layers_) x = (*layer)(x);
  return (*norm_)(x);
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& c, Generator& gen)
    : Module("LlamaForCausalLM"), config_(c) {
  Check(c);
  model_ = register_module("model", std::make_shared<LlamaModel>(c, gen));
  if (!c.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", MakeLinear(c.hidden_size, c.vocab_size, false, c, gen));
  }
}

Tensor LlamaForCausalLM::forward(const Tensor& tokens) {
  const Tensor h = (*model_)(tokens);
  return lm_head_.is_empty() ? tg::Linear(h, model_->embed_tokens()->weight) : lm_head_(h);
}

std::vector<int64_t> LlamaForCausalLM::Generate(const std::vector<int64_t>& prompt,
                                                int64_t new_tokens, Generator& gen,
                                                double temperature, int64_t top_k) {
  return SampleTokens(
      *this, [this](const Tensor& ids) { return forward(ids); },
      model_->embed_tokens()->weight.data().device(), config_.vocab_size,
      config_.max_position_embeddings, prompt, new_tokens, gen, temperature, top_k,
      "LlamaForCausalLM::Generate");
}

std::string LlamaForCausalLM::extra_repr() const {
  return absl::StrCat("vocab=", config_.vocab_size, ", hidden=", config_.hidden_size,
                      ", layers=", config_.num_hidden_layers,
                      ", heads=", config_.num_attention_heads, ", kv_heads=", config_.kv_heads(),
                      ", head_dim=", config_.head_size());
}

}  // namespace tg::nn
