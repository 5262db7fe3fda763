// GPT: token + position embeddings, n_layer pre-LN transformer blocks, a final LayerNorm and an
// output head tied to the token embedding (GPT-2's architecture, as in nanoGPT and llm.c), or
// a head of its own ("lm_head.weight") with tie_word_embeddings false, as transformers allows.
// Configurable from a tiny character model up to GPT-2 124M.
//
//   tg::Generator gen(1337);
//   tg::nn::Gpt model(tg::nn::GptConfig::Tiny(/*vocab_size=*/65), gen);
//   tg::Tensor logits = model(tg::Tensor(tokens));   // tokens [batch, seq] i64
//   tg::Tensor loss = tg::nn::CrossEntropyLoss(logits, targets);
#ifndef TAPEGRAD_NN_MODELS_GPT_H_
#define TAPEGRAD_NN_MODELS_GPT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/module.h"
#include "nn/transformer.h"
#include "tensor/generator.h"

namespace tg {
namespace nn {

struct GptConfig {
  int64_t vocab_size = 65;
  // Rows of the embedding/output head; llm.c pads 50257 to 50304 (a multiple of 128) for faster
  // matmuls. Logits of the padding rows are dropped before they leave forward(). 0: vocab_size.
  int64_t padded_vocab_size = 0;
  int64_t block_size = 128;  // context length
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0;
  bool bias = true;
  // The output head is wte's weight (GPT-2); false: its own [padded_vocab, n_embd] matrix.
  bool tie_word_embeddings = true;

  // A character-level model that trains on a CPU in minutes.
  static GptConfig Tiny(int64_t vocab_size);
  // GPT-2 small: 12 layers, 12 heads, 768 wide, vocab 50257 padded to 50304, context 1024.
  static GptConfig Gpt2Small();
  int64_t padded_vocab() const { return padded_vocab_size > 0 ? padded_vocab_size : vocab_size; }
  // Parameters of the model this config builds (a tied head counted once): 124,475,904 for
  // Gpt2Small.
  int64_t NumParameters() const;
};

class Gpt : public Module {
 public:
  // `dropout_gen` is required when config.dropout > 0 and must outlive the model.
  Gpt(const GptConfig& config, Generator& gen, Generator* dropout_gen = nullptr);
  // tokens [batch, seq] i32/i64 (seq <= block_size) on the model's device -> logits
  // [batch, seq, vocab_size].
  Tensor forward(const Tensor& tokens) override;
  std::string extra_repr() const override;
  const GptConfig& config() const { return config_; }

  // Autoregressive sampling under no-grad in eval mode (the training mode is restored): appends
  // `new_tokens` tokens to `prompt` (non-empty) sampled from softmax(logits / temperature),
  // restricted to the top_k most likely tokens when top_k > 0. Returns prompt + new tokens.
  std::vector<int64_t> Generate(const std::vector<int64_t>& prompt, int64_t new_tokens,
                                Generator& gen, double temperature = 1.0, int64_t top_k = 0);

 private:
  // [t] i64 0, 1, ..., t - 1 on the model's device, cached for the last length.
  const RawTensor& Positions(int64_t t);

  GptConfig config_;
  RawTensor positions_;
  Embedding wte_{nullptr}, wpe_{nullptr};
  Dropout drop_{nullptr};
  ModuleList blocks_{nullptr};
  LayerNorm ln_f_{nullptr};
  Linear lm_head_{nullptr};  // untied configs only
};

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_MODELS_GPT_H_
