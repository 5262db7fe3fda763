// Trains a GPT (a tiny character-level one by default) on a text file or on llm.c token shards,
// evaluates on held-out tokens, and prints a sample at the end.
//
//   bazel run -c opt //tools:train_gpt -- --data=data/tinyshakespeare.txt
//   bazel run -c opt //tools:train_gpt -- --data=train.bin --val_data=val.bin --n_layer=12 ...
//   bazel run -c opt //tools:train_gpt -- --data=... --precision=bf16 --checkpoint_dir=ckpt
//   bazel run -c opt //tools:train_gpt -- --init_from=gpt2_124M.bin --data=train.bin
//       --export_hf=finetuned     # (one line) GPT-2 weights in (HF or llm.c), HF directory out
//
// A text file is tokenized by characters (vocabulary: its distinct bytes) and split 90/10 into
// train/val as nanoGPT does; a .bin file is an llm.c shard of GPT-2 tokens (vocabulary 50257,
// padded to 50304), with validation from --val_data or the shard's last 10%. Precision, loss
// scaling, checkpoints, resume, metrics, --device=cuda and data parallelism (--world_size under
// tools:launch) work as in train_mnist.
//
// --init_from starts from GPT-2 weights (nn/models/gpt2_io.h: a HuggingFace model.safetensors or
// its directory, sharded or not, or llm.c's gpt2_124M.bin / gpt2_124M_bf16.bin): the model's
// shape comes from the file and --n_layer, --n_embd are not used; --n_head, when given, is the
// head count of a model.safetensors without config.json (which is refused without it) and must
// agree with the file's otherwise; --block_size is the training context, at most the file's
// n_positions. --export_hf=DIR writes the trained model as model.safetensors + config.json that
// transformers' GPT2LMHeadModel.from_pretrained(DIR) loads; config.json keeps the dropouts and
// token ids of --init_from's config.json (--dropout, when given, sets the dropouts), and a
// character-level model's export adds its tokenizer (vocab.json, merges.txt,
// tokenizer_config.json: AutoTokenizer.from_pretrained(DIR)) and declares no end-of-text token.
// --steps=0 with --init_from converts only: no data is read and nothing is trained.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nn/models/gpt.h"
#include "nn/models/gpt2_io.h"
#include "train/checkpoint.h"
#include "train/flag_values.h"
#include "train/flags.h"
#include "train/language_model.h"
#include "train/run.h"
#include "train/run_main.h"
#include "train/user_path.h"

// This binary's own flags; those of every language-model trainer (--data, --steps, --lr,
// --eval_every, ...) are defined in train/language_model.cc, and those of every trainer
// (--optimizer, --precision, --device, --resume, --world_size, ...) in train/flags.cc.
ABSL_FLAG(int64_t, n_layer, 2, "transformer blocks, 1..1024");
ABSL_FLAG(int64_t, n_head, 4,
          "attention heads, 1..1024 (with --init_from: only for a model.safetensors without "
          "config.json, when given)");
ABSL_FLAG(std::optional<int64_t>, n_embd, std::nullopt,
          "width, 1..65536, a multiple of n_head (default 64, or the next multiple of n_head)");
ABSL_FLAG(
    std::string, init_from, "",
    "start from GPT-2 weights: a HuggingFace model.safetensors (config.json beside it) or its "
    "directory, or an llm.c gpt2_124M.bin; the model's shape comes from the file");
ABSL_FLAG(std::string, export_hf, "",
          "after training, write the model to this directory as model.safetensors + config.json "
          "for transformers' GPT2LMHeadModel.from_pretrained (empty: none)");
ABSL_FLAG(bool, fp8_head, false,
          "with --precision=fp8: the tied output head (x @ wte^T) in FP8 too (Transformer "
          "Engine's recipes leave it in bf16 by default)");
ABSL_FLAG(bool, cudnn_attention, true,
          "CUDA: cuDNN's fused attention where it applies (false: the cuBLASLt composition)");

namespace tg {
namespace {

int Fail(const absl::Status& status) { return train::Fail("train_gpt", status); }

// 64, or the next multiple of --n_head (64 with 3 heads would fail the divisibility check).
int64_t NEmbd() {
  const std::optional<int64_t> given = absl::GetFlag(FLAGS_n_embd);
  const int64_t heads = std::max<int64_t>(1, absl::GetFlag(FLAGS_n_head));
  return given ? *given : (64 + heads - 1) / heads * heads;
}

// --init_from read and checked (finite weights); its config.json's settings for an export, with
// --dropout's value when it is given.
absl::StatusOr<nn::Gpt2Checkpoint> LoadInit(const std::string& path,
                                            nn::Gpt2ExportOptions& export_options) {
  nn::Gpt2LoadOptions load_options;
  // --n_head's default is not a statement about the file: only a value the user gave counts.
  if (train::FlagGiven("n_head")) load_options.n_head = absl::GetFlag(FLAGS_n_head);
  absl::StatusOr<nn::Gpt2Checkpoint> init = nn::LoadGpt2Checkpoint(path, load_options);
  if (!init.ok()) return init.status();
  if (std::optional<std::string> bad = train::FindNonFinite(init->weights)) {
    return absl::DataLossError(
        absl::StrCat("--init_from=", path, ": ", *bad, " (a model's weights must be finite)"));
  }
  init->config.dropout = absl::GetFlag(FLAGS_dropout);
  export_options.settings = init->hf_settings;
  if (train::FlagGiven("dropout")) {
    export_options.settings.resid_pdrop = export_options.settings.embd_pdrop =
        export_options.settings.attn_pdrop = -1;  // the model's dropout
  }
  return init;
}

// --steps=0 with --init_from: the weights converted, no data read and nothing trained.
int Convert(const nn::Gpt2Checkpoint& init, const std::string& export_dir, bool is_main,
            const nn::Gpt2ExportOptions& export_options) {
  Generator gen(0), dropout_gen(0);  // dropout draws nothing here; a model with it needs one
  nn::Gpt model(init.config, gen, &dropout_gen);
  model.load_state_dict(init.weights);
  std::printf("read %s (%s): %s\n", absl::GetFlag(FLAGS_init_from).c_str(), init.format.c_str(),
              model.extra_repr().c_str());
  if (!export_dir.empty() && is_main) {
    if (absl::Status s = nn::ExportGpt2Hf(model, export_dir, export_options); !s.ok()) {
      return Fail(s);
    }
    std::printf("wrote %s/model.safetensors and config.json\n", export_dir.c_str());
  }
  return 0;
}

// The model's shape: --init_from's (checked against the data and --block_size), or the flags'.
absl::StatusOr<nn::GptConfig> MakeConfig(const std::optional<nn::Gpt2Checkpoint>& init,
                                         const train::LanguageModelData& data, int64_t seq_len) {
  nn::GptConfig config;
  if (init) {
    config = init->config;
    const std::string& init_from = absl::GetFlag(FLAGS_init_from);
    if (absl::Status s = data.CheckPretrained(init_from, config.vocab_size, init->char_vocab);
        !s.ok()) {
      return s;
    }
    if (seq_len > config.block_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--block_size=", seq_len, " exceeds the context of --init_from=", init_from,
                       " (", config.block_size, ")"));
    }
    return config;
  }
  if (data.tokenizer()) {
    config.vocab_size = data.tokenizer()->vocab_size();
  } else {
    config.vocab_size = 50257;  // GPT-2's BPE
    config.padded_vocab_size = 50304;
  }
  config.block_size = seq_len;
  config.n_layer = absl::GetFlag(FLAGS_n_layer);
  config.n_head = absl::GetFlag(FLAGS_n_head);
  config.n_embd = NEmbd();
  config.dropout = absl::GetFlag(FLAGS_dropout);
  if (config.n_embd % config.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--n_embd=", config.n_embd, " is not a multiple of --n_head=", config.n_head));
  }
  return config;
}

int Main() {
  std::vector<train::FlagRange> own = {{"n_layer", double(absl::GetFlag(FLAGS_n_layer)), 1, 1024},
                                       {"n_head", double(absl::GetFlag(FLAGS_n_head)), 1, 1024}};
  if (std::optional<int64_t> n_embd = absl::GetFlag(FLAGS_n_embd)) {
    own.push_back({"n_embd", static_cast<double>(*n_embd), 1, 65536});
  }
  const std::string init_from = train::ResolveUserPath(absl::GetFlag(FLAGS_init_from));
  if (absl::Status s = train::CheckLanguageModelFlags(own, !init_from.empty()); !s.ok()) {
    return Fail(s);
  }
  train::RunOptions run_options = train::LanguageModelRunOptions("train_gpt");
  run_options.kernels.cudnn_attention = absl::GetFlag(FLAGS_cudnn_attention);
  absl::StatusOr<std::unique_ptr<train::Run>> run_or = train::Run::Start(run_options);
  if (!run_or.ok()) return Fail(run_or.status());
  train::Run& run = **run_or;
  train::DataParallel& dp = run.dp();

  // ---- Pretrained weights (their shape fixes the model's).
  const std::string export_dir = train::ResolveUserPath(absl::GetFlag(FLAGS_export_hf));
  if (absl::Status s = train::CheckExportable(run, export_dir); !s.ok()) return Fail(s);
  nn::Gpt2ExportOptions export_options;
  std::optional<nn::Gpt2Checkpoint> init;
  if (!init_from.empty()) {
    absl::StatusOr<nn::Gpt2Checkpoint> loaded = LoadInit(init_from, export_options);
    if (!loaded.ok()) return Fail(loaded.status());
    init = std::move(*loaded);
    if (absl::GetFlag(FLAGS_steps) == 0) {
      return Convert(*init, export_dir, dp.is_main(), export_options);
    }
  }

  // ---- Data, and the model's shape.
  absl::StatusOr<std::unique_ptr<train::LanguageModelData>> data_or =
      train::LanguageModelData::Load();
  if (!data_or.ok()) return Fail(data_or.status());
  train::LanguageModelData& data = **data_or;
  absl::StatusOr<train::Precision> precision =
      train::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return Fail(precision.status());
  // Of training; the default never exceeds the context of --init_from's file.
  const int64_t seq_len =
      train::SequenceLength(init ? std::optional<int64_t>(init->config.block_size) : std::nullopt);
  absl::StatusOr<nn::GptConfig> config = MakeConfig(init, data, seq_len);
  if (!config.ok()) return Fail(config.status());
  const int64_t batch_size = run.batch().global;
  if (absl::Status s = data.Batch(config->vocab_size, batch_size, seq_len); !s.ok()) {
    return Fail(s);
  }

  // ---- Model, built on the CPU (the same initial weights on every device), then moved; the
  // optimizer made afterwards keeps its masters and moments on the device too.
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  Generator init_gen(seed), dropout_gen(seed + 3);
  auto model = std::make_shared<nn::Gpt>(*config, init_gen, &dropout_gen);
  if (init) model->load_state_dict(init->weights);
  model->to(precision->dtype);
  model->to(run.device());

  // The run's settings: what a checkpoint and the other ranks must agree with.
  train::RunSettings& settings = run.settings();
  settings.Add("vocab", static_cast<double>(config->vocab_size), /*fixed=*/true);
  settings.Add("n_layer", static_cast<double>(config->n_layer), true);
  settings.Add("n_head", static_cast<double>(config->n_head), true);
  settings.Add("n_embd", static_cast<double>(config->n_embd), true);
  const std::vector<std::pair<std::string, std::string>> fp8_settings = {
      {"fp8_head", absl::GetFlag(FLAGS_fp8_head) ? "yes" : "no"}};  // an FP8 run's only
  train::AddLanguageModelSettings(settings, seq_len, config->block_size, batch_size, *precision,
                                  config->dropout, fp8_settings);

  train::PrepareOptions prepare;
  prepare.precision = *precision;
  train::SetLanguageModelOptimizer(prepare);  // weight decay on matrices only, as nanoGPT
  // --optimizer=muon: the embeddings and the head stay with AdamW.
  for (const auto& [name, p] : model->named_parameters()) {
    if (name == "wte.weight" || name == "wpe.weight" || name == "lm_head.weight") {
      prepare.optimizer.adamw_matrices.push_back(p);
    }
  }
  data.Install(run, dropout_gen, prepare);
  // ZeRO stage 3 units: each transformer block, then the model (the embeddings, whose wte is
  // also the tied output head, and the final norm, gathered around the whole forward).
  for (const auto& [name, m] : model->named_modules()) {
    if (absl::StartsWith(name, "blocks.") && name.find('.', 7) == std::string::npos) {
      prepare.zero_units.push_back(m);
    }
  }
  prepare.zero_units.push_back(model);
  // --precision=fp8: the Linear weights of the blocks in FP8; the head (wte, also the token
  // embedding's table, which stays a lookup; or an untied lm_head) only with --fp8_head, as
  // Transformer Engine's recipes leave the output layer in higher precision.
  const bool fp8_precision = precision->fp8;
  prepare.fp8_weights = [&model, fp8_precision]() -> absl::StatusOr<std::vector<Tensor>> {
    const bool fp8_head = absl::GetFlag(FLAGS_fp8_head);
    if (fp8_head && !fp8_precision) {
      return absl::InvalidArgumentError("--fp8_head needs --precision=fp8");
    }
    const Tensor head =
        model->named_parameters()[model->config().tie_word_embeddings ? "wte.weight"
                                                                      : "lm_head.weight"];
    std::vector<Tensor> weights;
    for (const Tensor& w : nn::LinearWeights(*model)) {
      if (!w.is_same(head)) weights.push_back(w);
    }
    if (fp8_head) weights.push_back(head);
    return weights;
  };
  prepare.loaded_from = init_from;
  if (absl::Status s = run.Prepare(model, std::move(prepare)); !s.ok()) return Fail(s);

  // ---- Training (train/language_model.cc: the loop, the validation loss, the checkpoints).
  double val_loss = NAN;
  if (std::optional<int> exit = train::TrainLanguageModel(run, *model, data, &val_loss)) {
    return *exit;
  }
  if (!run.evaluates_here()) return 0;
  if (dp.is_main() && !export_dir.empty()) {
    if (data.tokenizer()) export_options.char_vocab = data.tokenizer()->vocab();
    if (absl::Status s = nn::ExportGpt2Hf(*model, export_dir, export_options); !s.ok()) {
      return Fail(s);
    }
    std::printf("exported %s/model.safetensors and config.json%s\n", export_dir.c_str(),
                data.tokenizer() ? " (with the characters' tokenizer: vocab.json)" : "");
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
      "Trains a GPT on a text file or llm.c token shards and prints a sample. Flags:", __FILE__);
  return tg::train::RunMain("train_gpt", tg::Main);
}
