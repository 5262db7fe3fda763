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
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "dataset/loader.h"
#include "dataset/token_shard.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/models/gpt2_io.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/flag_values.h"
#include "train/flags.h"
#include "train/fp8_setup.h"
#include "train/resume_flag.h"
#include "train/run.h"
#include "train/run_main.h"
#include "train/run_settings.h"
#include "train/train_step.h"
#include "train/user_path.h"

// This binary's own flags; the ones it shares with train_mnist (--optimizer, --precision, --device,
// --resume, --world_size, ...) are defined once in train/flags.cc (train/flags.h says which).
ABSL_FLAG(std::string, data, "", "training text file, or llm.c token shard (.bin)");
ABSL_FLAG(std::string, val_data, "", "validation shard (default: the last 10% of --data)");
ABSL_FLAG(int64_t, n_layer, 2, "transformer blocks, 1..1024");
ABSL_FLAG(int64_t, n_head, 4,
          "attention heads, 1..1024 (with --init_from: only for a model.safetensors without "
          "config.json, when given)");
ABSL_FLAG(std::optional<int64_t>, n_embd, std::nullopt,
          "width, 1..65536, a multiple of n_head (default 64, or the next multiple of n_head)");
ABSL_FLAG(std::optional<int64_t>, block_size, std::nullopt,
          "context length, 1..1000000 (default 64; with --init_from: of training, at most the "
          "file's, default min(64, the file's))");
ABSL_FLAG(
    std::string, init_from, "",
    "start from GPT-2 weights: a HuggingFace model.safetensors (config.json beside it) or its "
    "directory, or an llm.c gpt2_124M.bin; the model's shape comes from the file");
ABSL_FLAG(std::string, export_hf, "",
          "after training, write the model to this directory as model.safetensors + config.json "
          "for transformers' GPT2LMHeadModel.from_pretrained (empty: none)");
ABSL_FLAG(double, dropout, 0, "dropout probability, [0, 1)");
ABSL_FLAG(std::optional<int64_t>, batch_size, std::nullopt,
          "GLOBAL batch: sequences per optimizer step, summed over the --grad_accum_steps "
          "micro-batches and the --world_size ranks (DeepSpeed's train_batch_size), 1..1000000 "
          "(default 32, rounded down to a multiple of grad_accum_steps x world_size). nanoGPT's "
          "and transformers' batch_size is the micro-batch: give --micro_batch_size instead");
ABSL_FLAG(std::optional<int64_t>, micro_batch_size, std::nullopt,
          "sequences per forward/backward pass on one rank (nanoGPT's batch_size, transformers' "
          "per_device_train_batch_size), 1..1000000; the global batch is then micro_batch_size x "
          "grad_accum_steps x world_size (default: from --batch_size)");
ABSL_FLAG(int64_t, steps, 1500,
          "optimizer steps, 1..1e12 (0 with --init_from: convert only, no training)");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate, (0, 1e3]");
ABSL_FLAG(std::optional<double>, min_lr, std::nullopt,
          "final learning rate of the cosine schedule, [0, lr] (default 3e-4, or lr / 10 when "
          "--lr is below 3e-4)");
ABSL_FLAG(std::optional<int64_t>, warmup_steps, std::nullopt,
          "linear warmup steps, 0..steps (default 100, or steps / 10 when --steps is below 100)");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW weight decay, [0, 1e3]");
ABSL_FLAG(double, beta2, 0.99, "AdamW beta2, [0, 1)");
ABSL_FLAG(double, grad_clip, 1.0,
          "clip the global gradient norm to this, [0, 1e12] (0: no clipping)");
ABSL_FLAG(uint64_t, seed, 1337, "seed of the initialisation, the batches and dropout");
ABSL_FLAG(int64_t, eval_every, 250,
          "evaluate on the validation tokens every N >= 0 steps (0: at the end only)");
ABSL_FLAG(int64_t, eval_batches, 16,
          "validation batches per evaluation, >= 0 (0: the whole split)");
ABSL_FLAG(int64_t, sample_tokens, 300, "tokens sampled at the end, 0..1000000");
ABSL_FLAG(double, temperature, 0.8, "sampling temperature, (0, 100]");
ABSL_FLAG(int64_t, top_k, 0, "sample from the k most likely tokens, 0..vocabulary (0: all)");
ABSL_FLAG(int64_t, checkpoint_every, 500,
          "checkpoint every N >= 0 steps and at the end (0: at the end only)");
ABSL_FLAG(std::string, override, "",
          "with --resume: settings that may differ from the checkpoint's, comma-separated (of "
          "data, val_data, dropout, steps, lr, min_lr, warmup_steps, weight_decay, beta2, "
          "grad_clip); any other difference is refused");
ABSL_FLAG(bool, fp8_head, false,
          "with --precision=fp8: the tied output head (x @ wte^T) in FP8 too (Transformer "
          "Engine's recipes leave it in bf16 by default)");
ABSL_FLAG(bool, cudnn_attention, true,
          "CUDA: cuDNN's fused attention where it applies (false: the cuBLASLt composition)");

namespace tg {
namespace {

int Fail(const absl::Status& status) { return train::Fail("train_gpt", status); }

// Whether a flag was given on the command line, not just left at its default: --n_head with
// --init_from is the head count of a file without config.json only when the user gave it, and an
// explicit --dropout replaces the file's dropouts in an export. Read from argv before absl parses
// it (this abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine private); a value from
// --flagfile counts as not given.
std::vector<std::string>& GivenFlags() {
  static std::vector<std::string> given;
  return given;
}
void RecordGivenFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    GivenFlags().emplace_back(arg.substr(0, arg.find('=')));
  }
}
bool FlagGiven(absl::string_view name) {
  for (const std::string& given : GivenFlags()) {
    if (given == name) return true;
  }
  return false;
}

// Mean next-token loss (nats per token) over the first `batches` sequential validation batches.
double Evaluate(nn::Gpt& model, const data::TokenBatcher& val, int64_t batches,
                const train::ForwardPrecision& precision, Device device) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t n =
      batches > 0 ? std::min(batches, val.num_eval_batches()) : val.num_eval_batches();
  // The forward and the loss under the run's autocast: the loss in f32, summed in f64.
  train::CrossEntropyEval loss(precision);
  for (int64_t i = 0; i < n; ++i) {
    data::TokenBatcher::Batch b = val.EvalBatch(i);
    loss.Add([&] { return model(Tensor(b.x.to(device))); }, b.y.to(device));
  }
  model.train();
  return loss.mean();
}

// The flags whose defaults depend on other flags (train::DefaultWarmupSteps): a default never
// makes a valid command fail.
int64_t WarmupSteps() {
  const std::optional<int64_t> given = absl::GetFlag(FLAGS_warmup_steps);
  return given ? *given : train::DefaultWarmupSteps(absl::GetFlag(FLAGS_steps));
}
double MinLr() {
  const std::optional<double> given = absl::GetFlag(FLAGS_min_lr);
  return given ? *given : train::DefaultMinLr(absl::GetFlag(FLAGS_lr));
}
// 64, or the next multiple of --n_head (64 with 3 heads would fail the divisibility check).
int64_t NEmbd() {
  const std::optional<int64_t> given = absl::GetFlag(FLAGS_n_embd);
  const int64_t heads = std::max<int64_t>(1, absl::GetFlag(FLAGS_n_head));
  return given ? *given : (64 + heads - 1) / heads * heads;
}

// Every numeric flag against its documented range (the flags' help texts); a flag left at a
// default that depends on others is not checked (the default fits). top_k's upper bound, the
// vocabulary, is checked once the data is read.
absl::Status CheckFlags() {
  using Open = train::FlagRange::Open;
  constexpr double kMaxCount = 1e12;
  auto count = [](const absl::Flag<int64_t>& flag) {
    return static_cast<double>(absl::GetFlag(flag));
  };
  const double steps = count(FLAGS_steps), lr = absl::GetFlag(FLAGS_lr);
  std::vector<train::FlagRange> given;  // the flags whose default depends on others, if given
  auto optional = [&](const char* name, std::optional<double> value, double min, double max) {
    if (value) given.push_back({name, *value, min, max});
  };
  auto optional_count = [](const absl::Flag<std::optional<int64_t>>& flag) {
    const std::optional<int64_t> v = absl::GetFlag(flag);
    return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
  };
  optional("n_embd", optional_count(FLAGS_n_embd), 1, 65536);
  optional("block_size", optional_count(FLAGS_block_size), 1, 1e6);
  optional("batch_size", optional_count(FLAGS_batch_size), 1, 1e6);
  optional("micro_batch_size", optional_count(FLAGS_micro_batch_size), 1, 1e6);
  optional("min_lr", absl::GetFlag(FLAGS_min_lr), 0, std::isfinite(lr) ? lr : 0);
  optional("warmup_steps", optional_count(FLAGS_warmup_steps), 0, steps > 0 ? steps : kMaxCount);
  std::vector<train::FlagRange> ranges = {
      {"n_layer", count(FLAGS_n_layer), 1, 1024},
      {"n_head", count(FLAGS_n_head), 1, 1024},
      {"dropout", absl::GetFlag(FLAGS_dropout), 0, 1, Open::kMax},
      {"steps", steps, absl::GetFlag(FLAGS_init_from).empty() ? 1.0 : 0.0, kMaxCount},
      {"lr", lr, 0, 1e3, Open::kMin},
      {"weight_decay", absl::GetFlag(FLAGS_weight_decay), 0, 1e3},
      {"beta2", absl::GetFlag(FLAGS_beta2), 0, 1, Open::kMax},
      {"grad_clip", absl::GetFlag(FLAGS_grad_clip), 0, kMaxCount},
      {"eval_every", count(FLAGS_eval_every), 0, kMaxCount},
      {"eval_batches", count(FLAGS_eval_batches), 0, kMaxCount},
      {"sample_tokens", count(FLAGS_sample_tokens), 0, 1e6},
      {"temperature", absl::GetFlag(FLAGS_temperature), 0, 100, Open::kMin},
      {"top_k", count(FLAGS_top_k), 0, kMaxCount},
      {"checkpoint_every", count(FLAGS_checkpoint_every), 0, kMaxCount},
      {"max_skipped_in_a_row", count(FLAGS_max_skipped_in_a_row), 0, kMaxCount},
      {"max_skipped_fraction", absl::GetFlag(FLAGS_max_skipped_fraction), 0, 1},
      {"world_size", count(FLAGS_world_size), 0, 65536},
      {"rank", count(FLAGS_rank), -1, 65535},
      {"zero_stage", count(FLAGS_zero_stage), 0, 3},
      {"grad_accum_steps", count(FLAGS_grad_accum_steps), 1, 1e6},
      {"print_every", count(FLAGS_print_every), 1, kMaxCount},
      {"stop_at_step", count(FLAGS_stop_at_step), 0, kMaxCount},
  };
  ranges.insert(ranges.end(), given.begin(), given.end());
  return train::CheckFlagRanges(ranges);
}

int Main() {
  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(s);
  train::RunOptions run_options;
  run_options.program = "train_gpt";
  run_options.kernels.cudnn_attention = absl::GetFlag(FLAGS_cudnn_attention);
  run_options.default_batch_size = 32;
  run_options.batch_size = absl::GetFlag(FLAGS_batch_size);
  run_options.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  run_options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  run_options.overrides = absl::GetFlag(FLAGS_override);
  absl::StatusOr<std::unique_ptr<train::Run>> run_or = train::Run::Start(run_options);
  if (!run_or.ok()) return Fail(run_or.status());
  train::Run& run = **run_or;
  train::DataParallel& dp = run.dp();
  const Device device = run.device();

  // ---- Pretrained weights (their shape fixes the model's).
  std::optional<nn::Gpt2Checkpoint> init;
  const std::string export_dir = train::ResolveUserPath(absl::GetFlag(FLAGS_export_hf));
  if (!export_dir.empty() && dp.sharded_parameters()) {
    return Fail(absl::InvalidArgumentError(
        "--export_hf needs the whole model on rank 0, which --zero_stage=3 shards: train with "
        "--checkpoint_dir, then export from the checkpoint with --resume --zero_stage=0 "
        "--world_size=1"));
  }
  // config.json settings an export writes: --init_from's, with --dropout's value when it is given.
  nn::Gpt2ExportOptions export_options;
  if (!absl::GetFlag(FLAGS_init_from).empty()) {
    nn::Gpt2LoadOptions load_options;
    // --n_head's default is not a statement about the file: only a value the user gave counts.
    if (FlagGiven("n_head")) {
      load_options.n_head = absl::GetFlag(FLAGS_n_head);
    }
    absl::StatusOr<nn::Gpt2Checkpoint> loaded = nn::LoadGpt2Checkpoint(
        train::ResolveUserPath(absl::GetFlag(FLAGS_init_from)), load_options);
    if (!loaded.ok()) return Fail(loaded.status());
    init = std::move(*loaded);
    if (std::optional<std::string> bad = train::FindNonFinite(init->weights)) {
      return Fail(absl::DataLossError(
          absl::StrCat("--init_from=", train::ResolveUserPath(absl::GetFlag(FLAGS_init_from)), ": ",
                       *bad, " (a model's weights must be finite)")));
    }
    init->config.dropout = absl::GetFlag(FLAGS_dropout);
    export_options.settings = init->hf_settings;
    if (FlagGiven("dropout")) {
      export_options.settings.resid_pdrop = export_options.settings.embd_pdrop =
          export_options.settings.attn_pdrop = -1;  // the model's dropout
    }
    if (absl::GetFlag(FLAGS_steps) == 0) {  // convert only
      Generator gen(0), dropout_gen(0);     // dropout draws nothing here; a model with it needs one
      nn::Gpt model(init->config, gen, &dropout_gen);
      model.load_state_dict(init->weights);
      std::printf("read %s (%s): %s\n", absl::GetFlag(FLAGS_init_from).c_str(),
                  init->format.c_str(), model.extra_repr().c_str());
      if (!export_dir.empty() && dp.is_main()) {
        if (absl::Status s = nn::ExportGpt2Hf(model, export_dir, export_options); !s.ok()) {
          return Fail(s);
        }
        std::printf("wrote %s/model.safetensors and config.json\n", export_dir.c_str());
      }
      return 0;
    }
  }
  if (absl::GetFlag(FLAGS_data).empty()) {
    return Fail(absl::InvalidArgumentError("--data=<text file or .bin shard> is required"));
  }
  absl::StatusOr<train::Precision> precision_or =
      train::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision_or.ok()) return Fail(precision_or.status());
  const DType dtype = precision_or->dtype;

  // ---- Data.
  const std::string data_path = train::ResolveUserPath(absl::GetFlag(FLAGS_data));
  // --val_data in the tokenizer of --data (text encoded with its characters; a shard with text
  // is refused), or the last 10% of --data.
  absl::StatusOr<data::TrainValData> loaded =
      data::LoadTrainVal(data_path, train::ResolveUserPath(absl::GetFlag(FLAGS_val_data)));
  if (!loaded.ok()) return Fail(loaded.status());
  data::TrainValTokens& split = loaded->tokens;
  const std::optional<data::CharTokenizer>& tokenizer = loaded->tokenizer;

  nn::GptConfig config;
  // Of training; the default never exceeds the context of --init_from's file.
  const int64_t seq_len = absl::GetFlag(FLAGS_block_size)
                              .value_or(init ? std::min<int64_t>(64, init->config.block_size) : 64);
  if (init) {
    config = init->config;
    if (tokenizer && tokenizer->vocab_size() != config.vocab_size) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          data_path, " is text (", tokenizer->vocab_size(),
          " distinct bytes); --init_from=", absl::GetFlag(FLAGS_init_from), " has a vocabulary of ",
          config.vocab_size, ": train it on token shards (.bin) of its tokenizer")));
    }
    // A character-level export (its vocab.json) says which byte each id stands for: text of other
    // characters, even as many, would give every id another meaning.
    if (tokenizer && !init->char_vocab.empty() && init->char_vocab != tokenizer->vocab()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          data_path, " is text whose characters differ from those of --init_from=",
          absl::GetFlag(FLAGS_init_from),
          " (its vocab.json): its token ids would stand for other characters; train it on text "
          "made of the same characters")));
    }
    if (seq_len > config.block_size) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--block_size=", seq_len, " exceeds the context of --init_from=",
                       absl::GetFlag(FLAGS_init_from), " (", config.block_size, ")")));
    }
  } else if (tokenizer) {
    config.vocab_size = tokenizer->vocab_size();
  } else {
    config.vocab_size = 50257;  // GPT-2's BPE
    config.padded_vocab_size = 50304;
  }
  if (!init) {
    config.block_size = seq_len;
    config.n_layer = absl::GetFlag(FLAGS_n_layer);
    config.n_head = absl::GetFlag(FLAGS_n_head);
    config.n_embd = NEmbd();
    config.dropout = absl::GetFlag(FLAGS_dropout);
  }
  if (absl::GetFlag(FLAGS_top_k) > config.vocab_size) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--top_k=", absl::GetFlag(FLAGS_top_k),
                                                        " is outside its valid range [0, ",
                                                        config.vocab_size, "] (the vocabulary)")));
  }
  if (config.n_embd % config.n_head != 0) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--n_embd=", config.n_embd, " is not a multiple of --n_head=", config.n_head)));
  }
  // Every token of both splits, before anything trains (naming the file and the offset).
  if (absl::Status s = data::CheckVocabulary(*loaded, config.vocab_size); !s.ok()) return Fail(s);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t batch_size = run.batch().global;
  data::TokenBatcher batches(std::move(split.train), batch_size, seq_len, seed + 1);
  data::TokenBatcher val(std::move(split.val), batch_size, seq_len, seed + 2);

  // ---- Model and optimizer (weight decay on matrices only, as nanoGPT).
  Generator init_gen(seed), dropout_gen(seed + 3);
  // Built on the CPU (the same initial weights on every device), then moved; the optimizer
  // made afterwards keeps its masters and moments on the device too.
  auto model = std::make_shared<nn::Gpt>(config, init_gen, &dropout_gen);
  if (init) model->load_state_dict(init->weights);
  model->to(dtype);
  model->to(device);
  train::PrepareOptions prepare;
  prepare.precision = *precision_or;
  prepare.optimizer.name = absl::GetFlag(FLAGS_optimizer);
  prepare.optimizer.lr = absl::GetFlag(FLAGS_lr);
  prepare.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  prepare.optimizer.beta2 = absl::GetFlag(FLAGS_beta2);
  const int64_t total_steps = absl::GetFlag(FLAGS_steps);
  prepare.total_steps = total_steps;
  prepare.schedule = [total_steps](optim::Optimizer& opt) {
    return std::make_unique<optim::CosineWithWarmupLr>(opt, WarmupSteps(), total_steps, MinLr());
  };

  // The run's settings: what a checkpoint and the other ranks must agree with.
  train::RunSettings& settings = run.settings();
  settings.Add("vocab", static_cast<double>(config.vocab_size), /*fixed=*/true);
  settings.Add("n_layer", static_cast<double>(config.n_layer), true);
  settings.Add("n_head", static_cast<double>(config.n_head), true);
  settings.Add("n_embd", static_cast<double>(config.n_embd), true);
  settings.Add("block_size", static_cast<double>(seq_len), true);
  settings.Add("n_positions", static_cast<double>(config.block_size), true);
  settings.Add("batch_size", static_cast<double>(batch_size), true);
  settings.Add("precision", absl::GetFlag(FLAGS_precision), true);
  train::AddFp8Settings(*precision_or, settings);
  if (precision_or->fp8) {
    settings.Add("fp8_head", absl::GetFlag(FLAGS_fp8_head) ? "yes" : "no", true);
  }
  settings.Add("loss_scaler", absl::GetFlag(FLAGS_loss_scaler), true);
  settings.Add("optimizer", prepare.optimizer.name, true);
  settings.Add("seed", absl::StrCat(seed), true);
  settings.Add("data", data_path, /*fixed=*/false);
  settings.Add("val_data", train::ResolveUserPath(absl::GetFlag(FLAGS_val_data)), false);
  settings.Add("dropout", config.dropout, false);
  settings.Add("steps", static_cast<double>(total_steps), false);
  settings.Add("lr", prepare.optimizer.lr, false);
  settings.Add("min_lr", MinLr(), false);
  settings.Add("warmup_steps", static_cast<double>(WarmupSteps()), false);
  settings.Add("weight_decay", prepare.optimizer.weight_decay, false);
  settings.Add("beta2", prepare.optimizer.beta2, false);
  settings.Add("grad_clip", absl::GetFlag(FLAGS_grad_clip), false);
  prepare.data_fingerprint = {absl::StrCat("train_tokens=", batches.num_tokens()),
                              absl::StrCat("val_tokens=", val.num_tokens())};
  // ZeRO stage 3 units: each transformer block, then the model (the embeddings, whose wte is
  // also the tied output head, and the final norm, gathered around the whole forward).
  for (const auto& [name, m] : model->named_modules()) {
    if (absl::StartsWith(name, "blocks.") && name.find('.', 7) == std::string::npos) {
      prepare.zero_units.push_back(m);
    }
  }
  prepare.zero_units.push_back(model);
  // --precision=fp8: the Linear weights of the blocks in FP8; the tied head (wte, also the token
  // embedding's table, which stays a lookup) only with --fp8_head, as Transformer Engine's recipes
  // leave the output layer in higher precision.
  const bool fp8_precision = precision_or->fp8;
  prepare.fp8_weights = [&model, fp8_precision]() -> absl::StatusOr<std::vector<Tensor>> {
    std::vector<Tensor> weights = nn::LinearWeights(*model);
    if (absl::GetFlag(FLAGS_fp8_head)) {
      if (!fp8_precision) return absl::InvalidArgumentError("--fp8_head needs --precision=fp8");
      for (const auto& [name, p] : model->named_parameters()) {
        if (name == "wte.weight") weights.push_back(p);
      }
    }
    return weights;
  };
  prepare.resume_data = [&](const StateDict&, std::map<std::string, std::string>& meta) {
    const std::string& ckpt_dir = run.checkpoint_dir();
    // A text run's ids are indices into its characters: text with other characters (allowed by
    // --override=data, and possible with the same count) would give every id another meaning.
    if (tokenizer && meta["vocab"] != tokenizer->vocab()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume from ", ckpt_dir, ": the checkpoint's characters (metadata 'vocab', ",
          meta["vocab"].size(), " bytes) differ from those of ", data_path, " (",
          tokenizer->vocab().size(),
          " bytes): its token ids would stand for other characters; resume with text made of "
          "the same characters"));
    }
    // The generators' states; their seeds must be this run's (the offset is any position).
    auto generator_state = [&](const char* key,
                               uint64_t gen_seed) -> absl::StatusOr<Generator::State> {
      absl::StatusOr<Generator::State> state = train::GeneratorStateFromString(meta[key]);
      if (state.ok() && state->seed == gen_seed) return state;
      return absl::DataLossError(
          absl::StrCat("cannot resume from ", ckpt_dir, ": metadata '", key, "' is '", meta[key],
                       "'; expected a generator state <seed>:<offset> with seed ", gen_seed));
    };
    absl::StatusOr<Generator::State> batch_state = generator_state("batches", seed + 1);
    if (!batch_state.ok()) return batch_state.status();
    absl::StatusOr<Generator::State> drop_state = generator_state("dropout", seed + 3);
    if (!drop_state.ok()) return drop_state.status();
    batches.set_state(*batch_state);
    // The data generator must stand where this step's batch begins (a replay from the seed).
    if (!(batches.state() == batches.StateAfter(run.step()))) {
      return absl::DataLossError(
          absl::StrCat("cannot resume from ", ckpt_dir, ": metadata 'batches' is '",
                       meta["batches"], "', but step ", run.step(), " begins at '",
                       train::GeneratorStateToString(batches.StateAfter(run.step())), "'"));
    }
    dropout_gen.set_state(*drop_state);
    return absl::OkStatus();
  };
  // The data order and dropout draws live in generators, saved as exact "seed:offset" text.
  prepare.metadata = [&] {
    std::map<std::string, std::string> meta = {
        {"batches", train::GeneratorStateToString(batches.state())},
        {"dropout", train::GeneratorStateToString(dropout_gen.state())}};
    if (tokenizer) meta["vocab"] = tokenizer->vocab();
    return meta;
  };
  prepare.metric_columns = {"val_loss"};
  prepare.throughput_unit = "tok/s";
  prepare.batch_items = "sequences";
  prepare.training_line_tail =
      absl::StrCat(" (", batches.num_tokens(), " train / ", val.num_tokens(), " val tokens)");
  prepare.loaded_from = train::ResolveUserPath(absl::GetFlag(FLAGS_init_from));
  if (absl::Status s = run.Prepare(model, std::move(prepare)); !s.ok()) return Fail(s);

  // ---- Training: each rank reads only its rows of the global batch, on the host; each
  // micro-batch is copied to the device.
  const int64_t tokens_per_step = batch_size * seq_len;
  const int64_t eval_every = absl::GetFlag(FLAGS_eval_every);
  double val_loss = NAN;
  while (run.step() < total_steps) {
    data::TokenBatcher::Batch batch = batches.Next(dp.rank(), dp.world_size());
    train::StepRecord record = run.Step(
        [&](int64_t k) {
          return nn::CrossEntropyLoss(dp.Forward(*model, Tensor(dp.Micro(batch.x, k).to(device))),
                                      dp.Micro(batch.y, k).to(device));
        },
        tokens_per_step, absl::GetFlag(FLAGS_grad_clip));
    const int64_t step = run.step();
    record.epoch = static_cast<double>(step * tokens_per_step) / batches.num_tokens();
    std::map<std::string, double> extras;
    if (run.evaluates_here() &&
        ((eval_every > 0 && step % eval_every == 0) || step == total_steps)) {
      val_loss =
          Evaluate(*model, val, absl::GetFlag(FLAGS_eval_batches), run.forward_precision(), device);
      extras["val_loss"] = val_loss;
      run.progress().Println(absl::StrFormat("step %d: val loss %.4f", step, val_loss));
    }
    if (std::optional<int> exit = run.EndStep(record, extras, /*save=*/step == total_steps)) {
      return *exit;
    }
  }
  run.FinishProgress();
  if (!run.evaluates_here()) return 0;
  if (dp.is_main()) {
    if (!export_dir.empty()) {
      if (tokenizer) export_options.char_vocab = tokenizer->vocab();
      if (absl::Status s = nn::ExportGpt2Hf(*model, export_dir, export_options); !s.ok()) {
        return Fail(s);
      }
      std::printf("exported %s/model.safetensors and config.json%s\n", export_dir.c_str(),
                  tokenizer ? " (with the characters' tokenizer: vocab.json)" : "");
    }
    std::printf("val loss %.4f after %lld steps, %lld skipped\n", val_loss,
                static_cast<long long>(run.step()), static_cast<long long>(run.skipped()));
  }
  // A run that skipped most of its steps did not train: no successful exit.
  if (absl::Status s = run.CheckSkipped(); !s.ok()) return Fail(s);

  // ---- Sample, starting from the first validation token.
  const int64_t n_sample = absl::GetFlag(FLAGS_sample_tokens);
  if (n_sample > 0) {
    Generator sample_gen(seed + 4);
    std::vector<int64_t> prompt = {val.tokens().empty() ? 0 : val.tokens()[0]};
    std::vector<int64_t> out;
    {
      // A low-precision model runs under autocast, as in training and evaluation.
      train::PrecisionScope precision(run.forward_precision(), /*update_fp8=*/false);
      out = model->Generate(prompt, n_sample, sample_gen, absl::GetFlag(FLAGS_temperature),
                            absl::GetFlag(FLAGS_top_k));
    }
    // Stage 3: every rank samples the same tokens (a forward is a collective); rank 0 prints.
    if (!dp.is_main()) return 0;
    if (tokenizer) {
      std::printf("---- sample ----\n%s\n----------------\n", tokenizer->Decode(out).c_str());
    } else {
      std::printf("---- sample (GPT-2 token ids) ----\n");
      for (int64_t t : out) std::printf("%lld ", static_cast<long long>(t));
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a GPT on a text file or llm.c token shards and prints a sample. Flags:");
  tg::train::ShowSharedFlagsInHelp(__FILE__);  // --help lists train/flags.cc's flags too
  tg::train::NormalizeResumeArgs(argc, argv);  // a bare --resume (a ResumeFlag, not a bool)
  tg::RecordGivenFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return tg::train::RunMain("train_gpt", tg::Main);
}
