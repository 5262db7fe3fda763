#include "nn/models/gpt.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "nn/init.h"
#include "nn/sampling.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

GptConfig GptConfig::Tiny(int64_t vocab_size) {
  GptConfig c;
  c.vocab_size = vocab_size;
  c.block_size = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  return c;
}

GptConfig GptConfig::Gpt2Small() {
  GptConfig c;
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.block_size = 1024;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  return c;
}

int64_t GptConfig::NumParameters() const {
  const int64_t c = n_embd;
  const int64_t b = bias ? 1 : 0;
  // Per block: two LayerNorms (weight + bias), qkv, proj, and the 4x MLP.
  const int64_t block = 2 * 2 * c + (3 * c * c + b * 3 * c) + (c * c + b * c) +
                        (4 * c * c + b * 4 * c) + (4 * c * c + b * c);
  const int64_t head = tie_word_embeddings ? 0 : padded_vocab() * c;
  return padded_vocab() * c + block_size * c + n_layer * block + 2 * c + head;
}

Gpt::Gpt(const GptConfig& config, Generator& gen, Generator* dropout_gen)
    : Module("Gpt"), config_(config) {
  TG_CHECK(config.vocab_size > 0 && config.padded_vocab() >= config.vocab_size &&
               config.block_size > 0 && config.n_layer > 0,
           "Gpt: bad config (vocab ", config.vocab_size, ", padded ", config.padded_vocab(),
           ", block_size ", config.block_size, ", n_layer ", config.n_layer, ")");
  TG_CHECK(config.dropout == 0 || dropout_gen != nullptr, "Gpt: dropout ", config.dropout,
           " needs a dropout generator");
  wte_ = register_module("wte", Embedding(config.padded_vocab(), config.n_embd, gen));
  wpe_ = register_module("wpe", Embedding(config.block_size, config.n_embd, gen));
  if (config.dropout > 0) {
    drop_ = register_module("drop", Dropout(config.dropout, *dropout_gen));
  }
  AttentionOptions attn{config.n_embd, config.n_head, config.bias, config.dropout, dropout_gen};
  blocks_ = register_module("blocks", ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    blocks_->push_back(std::make_shared<TransformerBlock>(attn, gen));
  }
  ln_f_ = register_module("ln_f", LayerNorm(config.n_embd));
  if (!config.tie_word_embeddings) {
    lm_head_ = register_module(
        "lm_head", Linear(LinearOptions(config.n_embd, config.padded_vocab()).bias(false), gen));
  }

  // GPT-2's initialisation: N(0, 0.02) for every matrix and embedding, zero biases, and the two
  // projections that write into the residual stream scaled by 1/sqrt(2 n_layer).
  const double residual_std = 0.02 / std::sqrt(2.0 * config.n_layer);
  for (const auto& [name, p] : named_parameters()) {
    const bool is_norm = name.find(".ln") != std::string::npos || name.rfind("ln_f", 0) == 0;
    if (is_norm) continue;  // LayerNorms keep weight 1, bias 0
    if (p.dim() == 1) {
      init::Zeros(p);
    } else if (absl::EndsWith(name, "attn.proj.weight") || absl::EndsWith(name, "mlp.fc1.weight")) {
      init::Normal(p, gen, 0, residual_std);
    } else {
      init::Normal(p, gen, 0, 0.02);
    }
  }
}

const RawTensor& Gpt::Positions(int64_t t) {
  const Device device = wpe_->weight.data().device();
  if (!positions_.defined() || positions_.size(0) != t || positions_.device() != device) {
    // Made on the host and copied once per length and device: an upload in every step would
    // wait for the device each time.
    positions_ = RawTensor::Arange(0, static_cast<double>(t), 1, kI64).to(device);
  }
  return positions_;
}

Tensor Gpt::forward(const Tensor& tokens) {
  TG_CHECK(tokens.dim() == 2, "Gpt: tokens must be [batch, seq], got ",
           ShapeToString(tokens.shape()));
  const int64_t t = tokens.size(1);
  TG_CHECK(t >= 1 && t <= config_.block_size, "Gpt: sequence length ", t, " exceeds block_size ",
           config_.block_size);
  Tensor positions(Positions(t));
  Tensor x = Add(wte_(tokens), wpe_(positions));  // [b, t, c] + [t, c]
  if (!drop_.is_empty()) x = drop_(x);
  for (const auto& block : *blocks_) x = (*block)(x);
  x = ln_f_(x);
  // [b, t, padded_vocab]
  Tensor logits = tg::Linear(x, lm_head_.is_empty() ? wte_->weight : lm_head_->weight);
  if (config_.padded_vocab() != config_.vocab_size) {
    logits = Slice(logits, 2, 0, config_.vocab_size);
  }
  return logits;
}

std::string Gpt::extra_repr() const {
  return absl::StrCat("vocab=", config_.vocab_size, ", block_size=", config_.block_size,
                      ", n_layer=", config_.n_layer, ", n_head=", config_.n_head,
                      ", n_embd=", config_.n_embd,
                      config_.tie_word_embeddings ? "" : ", untied head");
}

std::vector<int64_t> Gpt::Generate(const std::vector<int64_t>& prompt, int64_t new_tokens,
                                   Generator& gen, double temperature, int64_t top_k) {
  return SampleTokens(
      *this, [this](const Tensor& ids) { return forward(ids); }, wte_->weight.data().device(),
      config_.vocab_size, config_.block_size, prompt, new_tokens, gen, temperature, top_k,
      "Gpt::Generate");
}

}  // namespace nn
}  // namespace tg
