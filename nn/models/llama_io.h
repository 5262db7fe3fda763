// Llama-family weights in and out: a transformers checkpoint directory of LlamaForCausalLM,
// Qwen2ForCausalLM or MistralForCausalLM (config.json + model.safetensors, or its shards) into a
// tapegrad LlamaForCausalLM, and the model back out as a directory transformers loads.
//
//   absl::StatusOr<tg::nn::LlamaCheckpoint> ckpt = tg::nn::LoadLlamaCheckpoint("SmolLM2-135M");
//   if (!ckpt.ok()) return ckpt.status();
//   tg::Generator gen(0);                                   // the initialisation is overwritten
//   tg::nn::LlamaForCausalLM model(ckpt->config, gen);
//   model.load_state_dict(ckpt->weights);
//   tg::nn::LlamaExportOptions out;
//   out.settings = ckpt->settings;                          // the family, the token ids
//   out.dtype = tg::kBF16;
//   absl::Status s = tg::nn::ExportLlamaHf(model, "out/dir", out);
//
// config.json (transformers 4.x and 5.x spellings) gives the model: model_type "llama", "qwen2" or
// "mistral" (architectures, when given, that family's *ForCausalLM); vocab_size, hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads and max_position_embeddings must be
// there; num_key_value_heads (default: num_attention_heads), head_dim (hidden_size /
// num_attention_heads), rms_norm_eps (1e-6), tie_word_embeddings (false), attention_bias and
// mlp_bias (false; Qwen2: biases on q, k and v, none on o) may be. Rotary embeddings: 5.x's
// rope_parameters {rope_type, rope_theta, ...}, or 4.x's rope_theta (10000) with rope_scaling
// (null, or {rope_type or type, ...}); rope_type "default" or "llama3" (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings). Settings that change what the model
// computes and that tapegrad does not compute are refused, naming the file and the field:
// hidden_act other than "silu", another rope_type, partial_rotary_factor other than 1, a nonzero
// attention_dropout, Qwen2's use_sliding_window true or a layer_types entry other than
// "full_attention". Mistral's sliding_window (null or a length) becomes
// LlamaConfig::sliding_window (full attention, sequences up to that length). Unknown fields
// (token ids, use_cache, transformers_version, ...) do not change the model and are not read,
// except bos/eos_token_id, kept for an export.
//
// Tensors (transformers' names, which are tapegrad's parameter names; F32, F16, BF16 or F64,
// converted to f32, which is exact for the first three): model.embed_tokens.weight [vocab,
// hidden]; per layer i model.layers.i.input_layernorm.weight and post_attention_layernorm.weight
// [hidden], self_attn.{q,k,v}_proj.weight [heads * head_dim or kv_heads * head_dim, hidden] and
// their biases, self_attn.o_proj.weight [hidden, heads * head_dim], mlp.gate_proj and up_proj
// [intermediate, hidden], mlp.down_proj [hidden, intermediate] (biases with mlp_bias);
// model.norm.weight [hidden]; lm_head.weight [vocab, hidden] unless tied (a tied file that holds
// one must hold the embedding's values). Older files' self_attn.rotary_emb.inv_freq buffers are
// ignored; every other tensor, a missing one, or a shape that disagrees with config.json is
// refused, naming the tensor, its shape and the config fields that fix it.
#ifndef TAPEGRAD_NN_MODELS_LLAMA_IO_H_
#define TAPEGRAD_NN_MODELS_LLAMA_IO_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nn/models/llama.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg::nn {

// The family a config.json names.
enum class LlamaFamily { kLlama, kQwen2, kMistral };
const char* LlamaFamilyModelType(LlamaFamily family);     // "llama", "qwen2", "mistral"
const char* LlamaFamilyArchitecture(LlamaFamily family);  // "LlamaForCausalLM", ...

// config.json fields carried from an import to an export that LlamaConfig does not hold.
struct LlamaHfSettings {
  LlamaFamily family = LlamaFamily::kLlama;
  // Token ids (each in [0, vocab_size)); empty: none (null). Llama 3 lists several eos ids.
  std::vector<int64_t> bos_token_id, eos_token_id;
};

struct LlamaCheckpoint {
  LlamaConfig config;
  LlamaHfSettings settings;
  // Parameter names -> f32 CPU tensors of the shapes LlamaForCausalLM(config) has.
  StateDict weights;
  // The tensors' dtype in the files (kF32, kBF16, kF16; kF32 when they differ).
  DType file_dtype = kF32;
  // "HuggingFace safetensors" or "HuggingFace safetensors, 2 shards", for messages.
  std::string format;
  // A character-level model's vocabulary, from the vocab.json an export wrote beside the weights
  // (token i is the byte char_vocab[i]); empty otherwise (a BPE tokenizer, or none).
  std::string char_vocab;
};

// Reads a checkpoint directory (config.json and model.safetensors or its index and shards), a
// model.safetensors.index.json, or a model.safetensors with config.json beside it. NotFound for a
// missing file, InvalidArgument for wrong content, DataLoss for a truncated file.
absl::StatusOr<LlamaCheckpoint> LoadLlamaCheckpoint(const std::string& path);

// The config of a config.json document's text; `where` names it in messages.
absl::StatusOr<std::pair<LlamaConfig, LlamaHfSettings>> ParseLlamaConfigJson(
    const std::string& text, const std::string& where);

// Every parameter of LlamaForCausalLM(config), in its order: the name, its shape and the
// config fields its shape comes from (for messages).
struct LlamaTensorShape {
  std::string name;
  Shape shape;
  std::string why;
};
std::vector<LlamaTensorShape> LlamaTensorShapes(const LlamaConfig& config);

// The config.json transformers reads back as `config` (model_type, architectures and the biases
// as settings.family says; rope_theta with rope_scaling, which transformers 4.x and 5.x both
// read; "dtype" `dtype`).
std::string LlamaHfConfigJson(const LlamaConfig& config, const LlamaHfSettings& settings,
                              DType dtype = kF32);

struct LlamaExportOptions {
  LlamaHfSettings settings;
  DType dtype = kF32;  // of the tensors written: kF32 (exact), kBF16 or kF16 (rounded to nearest)
  // A character-level model's vocabulary (data::CharTokenizer::vocab()), of vocab_size bytes:
  // the export adds its tokenizer files (hf_files.h: CharTokenizerFiles), so that
  // AutoTokenizer.from_pretrained(dir) encodes text with the model's ids. Empty: none.
  std::string char_vocab;
};
// Writes <dir>/model.safetensors (save_pretrained's names; no lm_head.weight for a tied head)
// and <dir>/config.json, each to a temporary file renamed over the target, creating `dir` and the
// directories above it as save_pretrained does (and a character-level model's tokenizer files).
// The model may be on any device and in any dtype.
// InvalidArgument for a config the family cannot express (Qwen2 without q, k, v biases or with
// an o_proj bias; Mistral with biases; Llama with o_proj_bias unlike attention_bias), a dtype
// other than the three, or a char_vocab whose size is not vocab_size.
absl::Status ExportLlamaHf(const LlamaForCausalLM& model, const std::string& dir,
                           const LlamaExportOptions& options = {});

}  // namespace tg::nn

#endif  // TAPEGRAD_NN_MODELS_LLAMA_IO_H_
