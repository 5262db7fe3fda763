// GPT-2 weights in and out: read HuggingFace transformers' GPT-2 model.safetensors (+ config.json)
// and llm.c's gpt2_124M.bin into a tapegrad Gpt, and export a Gpt as a directory that
// transformers' GPT2LMHeadModel.from_pretrained loads.
//
//   absl::StatusOr<tg::nn::Gpt2Checkpoint> ckpt =
//   tg::nn::LoadGpt2Checkpoint("gpt2/model.safetensors"); if (!ckpt.ok()) return ckpt.status();
//   tg::Generator gen(0);                       // the initialisation is overwritten
//   tg::nn::Gpt model(ckpt->config, gen);
//   model.load_state_dict(ckpt->weights);
//   absl::Status s = tg::nn::ExportGpt2Hf(model, "out_dir");   // model.safetensors + config.json
//
// HuggingFace layout (GPT2Model / GPT2LMHeadModel state dicts, with or without "transformer."):
//   wte.weight [V, C], wpe.weight [P, C], ln_f.{weight,bias} [C], and per layer i
//   h.i.ln_1.{weight,bias} [C], h.i.attn.c_attn.weight [C, 3C] + bias [3C],
//   h.i.attn.c_proj.weight [C, C] + bias [C], h.i.ln_2.{weight,bias} [C],
//   h.i.mlp.c_fc.weight [C, 4C] + bias [4C], h.i.mlp.c_proj.weight [4C, C] + bias [C].
// transformers' Conv1D keeps its weight as [in, out], the transpose of our Linear's [out, in]:
// every c_* weight is transposed on the way in and out. lm_head.weight is tied to wte (absent in
// save_pretrained files; when present it must equal wte). The causal-mask buffers older files
// hold (h.i.attn.bias, h.i.attn.masked_bias) are ignored; any other tensor is refused. Tensors may
// be F32, F16 or BF16 (converted to f32). n_layer, n_embd, vocabulary and n_positions come from
// the shapes; n_head from config.json next to the file when there is one (its other fields must
// agree with the shapes, and its activation, layer-norm epsilon and attention options must be the
// ones tapegrad's GPT computes), else Gpt2LoadOptions::n_head, else n_embd / 64 (the head size of
// every GPT-2 release).
//
// llm.c layout (train_gpt2.c, gpt2_build_from_checkpoint): 256 little-endian int32 header
// {20240326, version, maxT, V, L, NH, C, Vp (version 3 only), 0...}, then the f32 parameters
// in the fixed order wte [Vp, C], wpe [maxT, C], ln1w [L, C], ln1b [L, C], qkvw [L, 3C, C],
// qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C], ln2w [L, C], ln2b [L, C], fcw [L, 4C, C],
// fcb [L, 4C], fcprojw [L, C, 4C], fcprojb [L, C], lnfw [C], lnfb [C], and nothing after them.
// Version 3 has the padded vocabulary Vp in header[7]; version 1 has none (Vp = V). Matrices are
// already [out, in]. Other versions (llm.c's bf16 version 5) are refused.
//
// Vocabulary padding: the embedding gets rows up to a multiple of Gpt2LoadOptions::pad_vocab_to
// (128: 50257 -> 50304, as llm.c), the new rows zero; GptConfig::vocab_size stays the real
// vocabulary, so logits have V columns. Export cuts the rows back to vocab_size.
//
// Every malformed input is an absl::Status naming the file and what was wrong (a missing or
// unexpected tensor, a wrong shape, a bad magic or version, a truncated or overlong file, a
// config.json field that disagrees); sizes are checked before anything is allocated or read.
#ifndef TAPEGRAD_NN_MODELS_GPT2_IO_H_
#define TAPEGRAD_NN_MODELS_GPT2_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/models/gpt.h"
#include "tensor/state_dict.h"

namespace tg {
namespace nn {

inline constexpr int32_t kLlmcModelMagic = 20240326;

struct Gpt2LoadOptions {
  // Rows of the embedding are rounded up to a multiple of this (>= 1; 1: no padding). A file
  // whose embedding already has more rows than the vocabulary (llm.c version 3) keeps its rows
  // when they are a multiple of this already.
  int64_t pad_vocab_to = 128;
  // Heads, when the file does not say (a safetensors file without config.json): 0 means
  // n_embd / 64. A config.json or an llm.c header that says otherwise is an error.
  int64_t n_head = 0;
};

struct Gpt2Checkpoint {
  GptConfig config;
  // tapegrad parameter names ("blocks.0.attn.qkv.weight") -> f32 CPU tensors of the shapes
  // Gpt(config) has; wte.weight [padded_vocab, n_embd] with zero padding rows.
  StateDict weights;
  // "HuggingFace safetensors" or "llm.c version 3", for messages.
  std::string format;
};

// Reads `path`: an llm.c checkpoint (the file starts with kLlmcModelMagic, or its name ends in
// ".bin"), a directory (its model.safetensors), or a safetensors file (config.json beside it is
// read when present). NotFound when a file is missing, InvalidArgument for wrong content, DataLoss
// for a file shorter or longer than its header says.
absl::StatusOr<Gpt2Checkpoint> LoadGpt2Checkpoint(const std::string& path,
                                                  const Gpt2LoadOptions& options = {});

// The HuggingFace state dict of `model` (names without "transformer.", Conv1D weights
// transposed, wte cut to vocab_size rows, no lm_head.weight), f32 on the CPU.
StateDict Gpt2HfStateDict(const Gpt& model);
// The config.json transformers' GPT2Config reads for `model` (n_layer, n_head, n_embd,
// n_positions, n_ctx, vocab_size, activation_function "gelu_new", layer_norm_epsilon 1e-5,
// model_type "gpt2", architectures ["GPT2LMHeadModel"], tie_word_embeddings true, dropouts 0...).
std::string Gpt2HfConfigJson(const GptConfig& config);
// Writes <dir>/model.safetensors (metadata "format": "pt", which transformers requires) and
// <dir>/config.json, each to a temporary file renamed over the target; creates `dir` (one level)
// when missing. The model may be on any device and in any dtype (written as f32). Requires a
// model without biases-off (config.bias) variants: InvalidArgument otherwise.
absl::Status ExportGpt2Hf(const Gpt& model, const std::string& dir);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_MODELS_GPT2_IO_H_
