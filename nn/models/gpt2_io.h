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
// save_pretrained files; when present it must equal wte), unless config.json says
// "tie_word_embeddings": false: then it is the model's own head (GptConfig::tie_word_embeddings).
// The causal-mask buffers older files hold (h.i.attn.bias, h.i.attn.masked_bias) are ignored; any
// other tensor is refused. Tensors may be F32, F16 or BF16 (converted to f32). n_layer, n_embd,
// vocabulary and n_positions come from the shapes; n_head from config.json next to the file (its
// other fields must agree with the shapes, and its activation, layer-norm epsilon and attention
// options, reorder_and_upcast_attn among them, must be the ones tapegrad's GPT computes), else from
// Gpt2LoadOptions::n_head. Without either the file is refused: the head count is not in the
// tensors' shapes, and a guess (n_embd / 64) that is wrong loads a different model without any
// error (logits off by 0.02 for a model of head size 32).
//
// Sharded files (save_pretrained(max_shard_size=...)): a directory with
// model.safetensors.index.json {"metadata": {...}, "weight_map": {tensor: shard file}} and its
// shards load as one file. Every shard must be a plain file name inside the directory (no '/',
// no ".."), every tensor of the map must be in the shard the map names, and every tensor of a
// shard must be in the map under that shard (so each tensor is in exactly one shard).
// A directory with only pytorch_model.bin (a PyTorch pickle, not read here: unpickling runs
// code) is refused with the transformers call that rewrites it as safetensors.
//
// llm.c layout (train_gpt2.c / train_gpt2.cu, gpt2_build_from_checkpoint): 256 little-endian
// int32 header {20240326, version, maxT, V, L, NH, C, Vp (versions 3 and 5), 0...}, then the
// parameters in the fixed order wte [Vp, C], wpe [maxT, C], ln1w [L, C], ln1b [L, C], qkvw
// [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C], ln2w [L, C], ln2b [L, C], fcw
// [L, 4C, C], fcb [L, 4C], fcprojw [L, C, 4C], fcprojb [L, C], lnfw [C], lnfb [C], and nothing
// after them. The version is the parameters' dtype: 3 is f32 with the padded vocabulary Vp in
// header[7]; 5 is bf16 (gpt2_124M_bf16.bin, what llm.c's CUDA trainer loads by default), also
// padded; 1 is f32 without Vp (Vp = V). bf16 values are widened to f32, which is exact: a bf16
// run rounds them back to the file's bits, an f32 run computes with exactly the file's values.
// Matrices are already [out, in]. Other versions are refused.
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
  // Heads, for a safetensors file without config.json (0: not given, and such a file is
  // refused). A config.json or an llm.c header that says otherwise is an error.
  int64_t n_head = 0;
};

// config.json settings that GptConfig does not hold, read from an imported config.json and
// written again by ExportGpt2Hf, so that a conversion keeps them.
struct Gpt2HfSettings {
  // resid_pdrop, embd_pdrop, attn_pdrop; negative: the model's GptConfig::dropout. Dropout does
  // not change inference, but transformers trains with these values.
  double resid_pdrop = -1, embd_pdrop = -1, attn_pdrop = -1;
  // bos_token_id / eos_token_id in [0, vocab_size); -1: GPT-2's <|endoftext|> (50256) when the
  // vocabulary is GPT-2's 50257 tokens, else none (null): for any other vocabulary tapegrad does
  // not know which token, if any, ends a text, and declaring a real one (a character-level
  // model's 'z') would make generate() stop at it.
  int64_t bos_token_id = -1, eos_token_id = -1;
};

struct Gpt2ExportOptions {
  Gpt2HfSettings settings;
  // A character-level model's vocabulary (token i is the byte char_vocab[i], as
  // data::CharTokenizer::vocab()); empty: none (a GPT-2 BPE model, whose tokenizer is GPT-2's).
  // When given, its size must be the model's vocab_size; the export adds a transformers
  // GPT2Tokenizer for it: vocab.json (GPT-2's byte-to-unicode character of each byte -> its id),
  // merges.txt with no merges (so every byte is a token) and tokenizer_config.json (no special
  // tokens), and config.json declares no bos/eos token. AutoTokenizer.from_pretrained(dir)
  // then encodes and decodes text with the model's ids.
  std::string char_vocab;
};

struct Gpt2Checkpoint {
  GptConfig config;
  // tapegrad parameter names ("blocks.0.attn.qkv.weight") -> f32 CPU tensors of the shapes
  // Gpt(config) has; wte.weight [padded_vocab, n_embd] with zero padding rows.
  StateDict weights;
  // "HuggingFace safetensors", "HuggingFace safetensors, 3 shards", "llm.c version 3" or
  // "llm.c version 5 (bf16)", for messages.
  std::string format;
  // From config.json (defaults for an llm.c file or a safetensors file without config.json).
  Gpt2HfSettings hf_settings;
  // A character-level model's vocabulary read back from the vocab.json an export wrote beside
  // it (token i is the byte char_vocab[i]): set when vocab.json maps vocab_size single bytes
  // (GPT-2's byte-level characters) to the ids 0..vocab_size-1; empty otherwise (a BPE
  // vocabulary, or no vocab.json). Lets a caller check that text data uses the same characters.
  std::string char_vocab;
};

// Reads `path`: an llm.c checkpoint (the file starts with kLlmcModelMagic, or its name ends in
// ".bin"), a directory (its model.safetensors, else its model.safetensors.index.json), a
// model.safetensors.index.json, or a safetensors file (config.json beside it is read when
// present). NotFound when a file is missing, InvalidArgument for wrong content, DataLoss
// for a file shorter or longer than its header says.
absl::StatusOr<Gpt2Checkpoint> LoadGpt2Checkpoint(const std::string& path,
                                                  const Gpt2LoadOptions& options = {});

// The HuggingFace state dict of `model` (names without "transformer.", Conv1D weights
// transposed, wte cut to vocab_size rows, lm_head.weight only for an untied head), f32 on the CPU.
StateDict Gpt2HfStateDict(const Gpt& model);
// The config.json transformers' GPT2Config reads for `model` (n_layer, n_head, n_embd,
// n_positions, n_ctx, vocab_size, activation_function "gelu_new", layer_norm_epsilon 1e-5,
// model_type "gpt2", architectures ["GPT2LMHeadModel"], tie_word_embeddings as the model's,
// resid/embd/attn_pdrop, bos/eos_token_id): the dropouts and token ids as `settings` says, no
// bos/eos when `char_level`.
std::string Gpt2HfConfigJson(const GptConfig& config, const Gpt2HfSettings& settings = {},
                             bool char_level = false);
// Writes <dir>/model.safetensors (metadata "format": "pt", which transformers requires) and
// <dir>/config.json, each to a temporary file renamed over the target; creates `dir` and the
// directories above it when missing, as save_pretrained does. The model may be on any device and in
// any dtype (written as f32). Requires a model without biases-off (config.bias) variants:
// InvalidArgument otherwise. With options.char_vocab also the tokenizer files (see
// Gpt2ExportOptions).
absl::Status ExportGpt2Hf(const Gpt& model, const std::string& dir,
                          const Gpt2ExportOptions& options = {});

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_MODELS_GPT2_IO_H_
