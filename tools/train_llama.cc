// Trains a Llama-family decoder (nn/models/llama.h: RMSNorm, rotary embeddings, grouped-query
// attention, a SwiGLU MLP) on a text file or llm.c token shards, from random weights or from a
// transformers checkpoint, evaluates on held-out tokens and prints a sample: the third trainer,
// on train::Run and train/language_model.h as train_gpt is (every shared flag works the same:
// precision with FP8, accumulation, DDP and ZeRO, checkpoints and --resume, metrics).
//
//   bazel run -c opt //tools:train_llama -- --data=data/tinyshakespeare.txt
//   bazel run -c opt //tools:train_llama -- --data=... --n_kv_head=1 --precision=bf16
//   bazel run -c opt //tools:train_llama -- --init_from=SmolLM2-135M --data=tokens.bin
//       --export_hf=out/finetuned --export_dtype=bf16    # (one line)
//
// --init_from reads a transformers checkpoint directory of LlamaForCausalLM, Qwen2ForCausalLM or
// MistralForCausalLM (nn/models/llama_io.h: config.json with model.safetensors or its shards;
// f32, bf16 or f16): the model's shape and family come from config.json, and the shape flags
// (--n_layer, --n_head, --n_kv_head, --n_embd, --intermediate, --rope_theta, --rms_norm_eps,
// --tie_embeddings) are refused with it; --arch, when given, must be the file's family;
// --block_size is the training context, at most max_position_embeddings (and Mistral's
// sliding_window). Token shards must be in the checkpoint's tokenizer (a shard does not say
// which; ids past its vocabulary are refused). --export_hf=DIR writes the trained model as
// config.json + model.safetensors in --export_dtype that transformers'
// AutoModelForCausalLM.from_pretrained(DIR) loads, creating DIR and its parents; a
// character-level model's export adds its tokenizer files. --steps=0 with --init_from converts
// only: no data is read and nothing is trained.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nn/models/llama.h"
#include "nn/models/llama_io.h"
#include "train/checkpoint.h"
#include "train/flag_values.h"
#include "train/flags.h"
#include "train/language_model.h"
#include "train/run.h"
#include "train/run_main.h"
#include "train/user_path.h"

// This binary's own flags (the model's shape); the rest are train/language_model.cc's and
// train/flags.cc's.
ABSL_FLAG(int64_t, n_layer, 2, "decoder layers, 1..1024");
ABSL_FLAG(int64_t, n_head, 4, "query heads, 1..1024");
ABSL_FLAG(int64_t, n_kv_head, 2,
          "key/value heads (grouped-query attention), 1..n_head, dividing n_head; 1: multi-query");
ABSL_FLAG(int64_t, n_embd, 64, "hidden size, 1..65536, a multiple of n_head with an even quotient");
ABSL_FLAG(int64_t, intermediate, 0,
          "the SwiGLU MLP's width, 0..1000000 (0: 8/3 n_embd rounded up to a multiple of 32)");
ABSL_FLAG(double, rope_theta, 10000.0, "the rotary embeddings' base, (1, 1e9]");
ABSL_FLAG(double, rms_norm_eps, 1e-5, "RMSNorm's epsilon, (0, 1]");
ABSL_FLAG(bool, tie_embeddings, false, "the head is the token embedding's weight");
ABSL_FLAG(std::string, arch, "llama",
          "the family: llama, qwen2 (biases on q, k, v) or mistral; with --init_from: the "
          "file's, which this must equal when given");
ABSL_FLAG(std::string, init_from, "",
          "start from a transformers checkpoint directory of the family (config.json + "
          "model.safetensors or its shards); the model's shape comes from it");
ABSL_FLAG(std::string, export_hf, "",
          "after training, write the model to this directory (created with its parents) as "
          "config.json + model.safetensors for transformers (empty: none)");
ABSL_FLAG(std::string, export_dtype, "f32", "the dtype of --export_hf's tensors: f32, bf16, f16");

namespace tg {
namespace {

int Fail(const absl::Status& status) { return train::Fail("train_llama", status); }

// The shape flags, which --init_from's config.json replaces.
constexpr const char* kShapeFlags[] = {"n_layer",      "n_head",        "n_kv_head",
                                       "n_embd",       "intermediate",  "rope_theta",
                                       "rms_norm_eps", "tie_embeddings"};

absl::StatusOr<nn::LlamaFamily> ParseArch(const std::string& arch) {
  for (nn::LlamaFamily f :
       {nn::LlamaFamily::kLlama, nn::LlamaFamily::kQwen2, nn::LlamaFamily::kMistral}) {
    if (arch == nn::LlamaFamilyModelType(f)) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--arch=", arch, ": expected llama, qwen2 or mistral"));
}

absl::StatusOr<DType> ParseExportDtype(const std::string& name) {
  if (name == "f32") return kF32;
  if (name == "bf16") return kBF16;
  if (name == "f16") return kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--export_dtype=", name, ": expected f32, bf16 or f16"));
}

nn::LlamaConfig MakeConfig(int64_t vocab, int64_t seq_len, nn::LlamaFamily family) {
  nn::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = absl::GetFlag(FLAGS_n_embd);
  const int64_t width = absl::GetFlag(FLAGS_intermediate);
  c.intermediate_size = width > 0 ? width : (8 * c.hidden_size / 3 + 31) / 32 * 32;
  c.num_hidden_layers = absl::GetFlag(FLAGS_n_layer);
  c.num_attention_heads = absl::GetFlag(FLAGS_n_head);
  c.num_key_value_heads = absl::GetFlag(FLAGS_n_kv_head);
  c.max_position_embeddings = seq_len;
  c.rms_norm_eps = absl::GetFlag(FLAGS_rms_norm_eps);
  c.rope.theta = absl::GetFlag(FLAGS_rope_theta);
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tie_embeddings);
  c.attention_bias = family == nn::LlamaFamily::kQwen2;  // Qwen2: q, k, v; never o
  return c;
}

// --init_from read and checked (finite weights, the family --arch names, no shape flags).
absl::StatusOr<nn::LlamaCheckpoint> LoadInit(const std::string& path) {
  for (const char* flag : kShapeFlags) {
    if (train::FlagGiven(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " is given with --init_from=", path,
                       ", whose config.json sets the model's shape; leave it out"));
    }
  }
  absl::StatusOr<nn::LlamaCheckpoint> init = nn::LoadLlamaCheckpoint(path);
  if (!init.ok()) return init.status();
  if (std::optional<std::string> bad = train::FindNonFinite(init->weights)) {
    return absl::DataLossError(
        absl::StrCat("--init_from=", path, ": ", *bad, " (a model's weights must be finite)"));
  }
  const char* family = nn::LlamaFamilyModelType(init->settings.family);
  if (train::FlagGiven("arch") && absl::GetFlag(FLAGS_arch) != family) {
    return absl::InvalidArgumentError(absl::StrCat("--arch=", absl::GetFlag(FLAGS_arch),
                                                   " but --init_from=", path, " is model_type \"",
                                                   family, "\""));
  }
  return init;
}

absl::Status Export(const nn::LlamaForCausalLM& model, const std::string& dir,
                    nn::LlamaExportOptions options, const train::LanguageModelData* data) {
  absl::StatusOr<DType> dtype = ParseExportDtype(absl::GetFlag(FLAGS_export_dtype));
  if (!dtype.ok()) return dtype.status();
  options.dtype = *dtype;
  if (data != nullptr && data->tokenizer()) options.char_vocab = data->tokenizer()->vocab();
  if (absl::Status s = nn::ExportLlamaHf(model, dir, options); !s.ok()) return s;
  std::printf("exported %s/config.json and model.safetensors (%s)%s\n", dir.c_str(),
              DTypeName(options.dtype),
              options.char_vocab.empty() ? "" : " with the characters' tokenizer: vocab.json");
  return absl::OkStatus();
}

int Main() {
  const int64_t heads = absl::GetFlag(FLAGS_n_head), kv = absl::GetFlag(FLAGS_n_kv_head);
  const int64_t embd = absl::GetFlag(FLAGS_n_embd);
  std::vector<train::FlagRange> own = {
      {"n_layer", static_cast<double>(absl::GetFlag(FLAGS_n_layer)), 1, 1024},
      {"n_head", static_cast<double>(heads), 1, 1024},
      {"n_kv_head", static_cast<double>(kv), 1, static_cast<double>(heads)},
      {"n_embd", static_cast<double>(embd), 1, 65536},
      {"intermediate", static_cast<double>(absl::GetFlag(FLAGS_intermediate)), 0, 1e6},
      {"rope_theta", absl::GetFlag(FLAGS_rope_theta), 1, 1e9, train::FlagRange::Open::kMin},
      {"rms_norm_eps", absl::GetFlag(FLAGS_rms_norm_eps), 0, 1, train::FlagRange::Open::kMin}};
  const std::string init_from = train::ResolveUserPath(absl::GetFlag(FLAGS_init_from));
  if (absl::Status s = train::CheckLanguageModelFlags(own, !init_from.empty()); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<nn::LlamaFamily> arch = ParseArch(absl::GetFlag(FLAGS_arch));
  if (!arch.ok()) return Fail(arch.status());
  if (absl::StatusOr<DType> d = ParseExportDtype(absl::GetFlag(FLAGS_export_dtype)); !d.ok()) {
    return Fail(d.status());
  }
  if (heads % kv != 0 || embd % heads != 0 || (embd / heads) % 2 != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--n_head=", heads, " must be a multiple of --n_kv_head=", kv, ", and --n_embd=", embd,
        " a multiple of --n_head with an even head size (rotary embeddings rotate pairs)")));
  }
  if (absl::GetFlag(FLAGS_dropout) != 0) {
    return Fail(absl::InvalidArgumentError(
        "--dropout: the Llama decoder has no dropout (transformers' attention_dropout is 0)"));
  }
  absl::StatusOr<std::unique_ptr<train::Run>> run_or =
      train::Run::Start(train::LanguageModelRunOptions("train_llama"));
  if (!run_or.ok()) return Fail(run_or.status());
  train::Run& run = **run_or;

  train::DataParallel& dp = run.dp();
  const std::string export_dir = train::ResolveUserPath(absl::GetFlag(FLAGS_export_hf));
  if (absl::Status s = train::CheckExportable(run, export_dir); !s.ok()) return Fail(s);
  std::optional<nn::LlamaCheckpoint> init;
  nn::LlamaExportOptions export_options;
  export_options.settings.family = *arch;
  if (!init_from.empty()) {
    absl::StatusOr<nn::LlamaCheckpoint> loaded = LoadInit(init_from);
    if (!loaded.ok()) return Fail(loaded.status());
    init = std::move(*loaded);
    export_options.settings = init->settings;
    if (absl::GetFlag(FLAGS_steps) == 0) {  // convert only
      Generator gen(0);
      nn::LlamaForCausalLM model(init->config, gen);
      model.load_state_dict(init->weights);
      std::printf("read %s (%s, %s): %s\n", init_from.c_str(), init->format.c_str(),
                  DTypeName(init->file_dtype), model.extra_repr().c_str());
      if (!export_dir.empty() && dp.is_main()) {
        export_options.char_vocab = init->char_vocab;
        if (absl::Status s = Export(model, export_dir, export_options, nullptr); !s.ok()) {
          return Fail(s);
        }
      }
      return 0;
    }
  }

  absl::StatusOr<std::unique_ptr<train::LanguageModelData>> data_or =
      train::LanguageModelData::Load();
  if (!data_or.ok()) return Fail(data_or.status());
  train::LanguageModelData& data = **data_or;
  absl::StatusOr<train::Precision> precision =
      train::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return Fail(precision.status());
  // With --init_from, the default context never exceeds the file's (nor its sliding window).
  std::optional<int64_t> context;
  if (init) {
    context = init->config.max_position_embeddings;
    if (init->config.sliding_window > 0) {
      context = std::min(*context, init->config.sliding_window);
    }
  }
  const int64_t seq_len = train::SequenceLength(context);
  if (context && seq_len > *context) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--block_size=", seq_len, " exceeds the context of --init_from=", init_from, " (", *context,
        init->config.sliding_window > 0 ? ": its sliding_window" : "", ")")));
  }
  int64_t vocab = data.tokenizer() ? data.tokenizer()->vocab_size() : 50257;
  if (init) {
    vocab = init->config.vocab_size;
    if (absl::Status s = data.CheckPretrained(init_from, vocab, init->char_vocab); !s.ok()) {
      return Fail(s);
    }
  }
  const int64_t batch_size = run.batch().global;
  if (absl::Status s = data.Batch(vocab, batch_size, seq_len); !s.ok()) return Fail(s);

  // Built on the CPU (the same initial weights on every device), then moved.
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  Generator init_gen(seed), dropout_gen(seed + 3);
  const nn::LlamaConfig config = init ? init->config : MakeConfig(vocab, seq_len, *arch);
  auto model = std::make_shared<nn::LlamaForCausalLM>(config, init_gen);
  if (init) model->load_state_dict(init->weights);
  model->to(precision->dtype);
  model->to(run.device());

  train::RunSettings& settings = run.settings();
  settings.Add("vocab", static_cast<double>(vocab), /*fixed=*/true);
  settings.Add("n_layer", static_cast<double>(config.num_hidden_layers), true);
  settings.Add("arch", nn::LlamaFamilyModelType(export_options.settings.family), true);
  settings.Add("n_head", static_cast<double>(config.num_attention_heads), true);
  settings.Add("n_kv_head", static_cast<double>(config.kv_heads()), true);
  settings.Add("n_embd", static_cast<double>(config.hidden_size), true);
  settings.Add("head_dim", static_cast<double>(config.head_size()), true);
  settings.Add("intermediate", static_cast<double>(config.intermediate_size), true);
  settings.Add("rope_theta", config.rope.theta, true);
  settings.Add("rms_norm_eps", config.rms_norm_eps, true);
  settings.Add("tie_embeddings", config.tie_word_embeddings ? "yes" : "no", true);
  train::AddLanguageModelSettings(settings, seq_len, seq_len, batch_size, *precision,
                                  /*dropout=*/0, {});

  train::PrepareOptions prepare;
  prepare.precision = *precision;
  train::SetLanguageModelOptimizer(prepare);  // weight decay on matrices only
  // --optimizer=muon: the embedding and the head stay with AdamW.
  for (const auto& [name, p] : model->named_parameters()) {
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      prepare.optimizer.adamw_matrices.push_back(p);
    }
  }
  data.Install(run, dropout_gen, prepare);
  // ZeRO stage 3 units: each decoder layer, then the model (embedding, final norm, head).
  for (const auto& [name, m] : model->named_modules()) {
    if (absl::StartsWith(name, "model.layers.") && name.find('.', 13) == std::string::npos) {
      prepare.zero_units.push_back(m);
    }
  }
  prepare.zero_units.push_back(model);
  // --precision=fp8: the decoder layers' Linear weights; the head stays in bf16, as Transformer
  // Engine's recipes leave the output layer.
  prepare.fp8_weights = [&model]() -> absl::StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> weights = nn::LinearWeights(*model);
    for (const auto& [name, p] : model->named_parameters()) {
      if (name == "lm_head.weight") {
        weights.erase(std::remove_if(weights.begin(), weights.end(),
                                     [&p](const Tensor& w) { return w.is_same(p); }),
                      weights.end());
      }
    }
    return weights;
  };
  prepare.loaded_from = init_from;
  if (absl::Status s = run.Prepare(model, std::move(prepare)); !s.ok()) return Fail(s);

  double val_loss = NAN;
  if (std::optional<int> exit = train::TrainLanguageModel(run, *model, data, &val_loss)) {
    return *exit;
  }
  if (!run.evaluates_here()) return 0;
  if (dp.is_main() && !export_dir.empty()) {
    if (absl::Status s = Export(*model, export_dir, export_options, &data); !s.ok()) {
      return Fail(s);
    }
  }
  if (absl::Status s = train::FinishLanguageModel(
          run, data, val_loss,
          [&](const std::vector<int64_t>& prompt, int64_t n, Generator& gen, double temperature,
              int64_t top_k) { return model->Generate(prompt, n, gen, temperature, top_k); });
      !s.ok()) {
    return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  tg::train::ParseCommandLine(
      argc, argv,
      "Trains a Llama-family decoder on a text file or llm.c token shards and prints a sample. "
      "Flags:",
      __FILE__);
  return tg::train::RunMain("train_llama", tg::Main);
}
