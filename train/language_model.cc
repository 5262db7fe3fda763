#include "train/language_model.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "autograd/grad_mode.h"
#include "nn/loss.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/flags.h"
#include "train/fp8_setup.h"
#include "train/user_path.h"

ABSL_FLAG(std::string, data, "", "training text file, or llm.c token shard (.bin)");
ABSL_FLAG(std::string, val_data, "", "validation shard (default: the last 10% of --data)");
ABSL_FLAG(std::optional<int64_t>, block_size, std::nullopt,
          "context length, 1..1000000 (default 64; with --init_from: of training, at most the "
          "file's, default min(64, the file's))");
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

namespace tg::train {

absl::Status CheckLanguageModelFlags(std::vector<FlagRange> model_flags, bool steps_may_be_zero) {
  using Open = FlagRange::Open;
  constexpr double kMaxCount = 1e12;
  auto count = [](const absl::Flag<int64_t>& flag) {
    return static_cast<double>(absl::GetFlag(flag));
  };
  auto optional_count = [](const absl::Flag<std::optional<int64_t>>& flag) {
    const std::optional<int64_t> v = absl::GetFlag(flag);
    return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt;
  };
  const double steps = count(FLAGS_steps), lr = absl::GetFlag(FLAGS_lr);
  std::vector<FlagRange> ranges = std::move(model_flags);
  ranges.insert(ranges.end(),
                {
                    {"dropout", absl::GetFlag(FLAGS_dropout), 0, 1, Open::kMax},
                    {"steps", steps, steps_may_be_zero ? 0.0 : 1.0, kMaxCount},
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
                });
  // The flags whose default depends on others, when given.
  auto optional = [&](const char* name, std::optional<double> value, double min, double max) {
    if (value) ranges.push_back({name, *value, min, max});
  };
  optional("block_size", optional_count(FLAGS_block_size), 1, 1e6);
  optional("batch_size", optional_count(FLAGS_batch_size), 1, 1e6);
  optional("micro_batch_size", optional_count(FLAGS_micro_batch_size), 1, 1e6);
  optional("min_lr", absl::GetFlag(FLAGS_min_lr), 0, std::isfinite(lr) ? lr : 0);
  optional("warmup_steps", optional_count(FLAGS_warmup_steps), 0, steps > 0 ? steps : kMaxCount);
  return CheckFlagsAndShared(std::move(ranges));
}

RunOptions LanguageModelRunOptions(const char* program) {
  RunOptions options;
  options.program = program;
  options.default_batch_size = 32;
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  options.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  options.overrides = absl::GetFlag(FLAGS_override);
  return options;
}

int64_t WarmupSteps() {
  const std::optional<int64_t> given = absl::GetFlag(FLAGS_warmup_steps);
  return given ? *given : DefaultWarmupSteps(absl::GetFlag(FLAGS_steps));
}

double MinLr() {
  const std::optional<double> given = absl::GetFlag(FLAGS_min_lr);
  return given ? *given : DefaultMinLr(absl::GetFlag(FLAGS_lr));
}

int64_t SequenceLength(std::optional<int64_t> model_context) {
  return absl::GetFlag(FLAGS_block_size)
      .value_or(model_context ? std::min<int64_t>(64, *model_context) : 64);
}

absl::StatusOr<std::unique_ptr<LanguageModelData>> LanguageModelData::Load() {
  if (absl::GetFlag(FLAGS_data).empty()) {
    return absl::InvalidArgumentError("--data=<text file or .bin shard> is required");
  }
  std::unique_ptr<LanguageModelData> data(new LanguageModelData);
  data->path_ = ResolveUserPath(absl::GetFlag(FLAGS_data));
  // --val_data in the tokenizer of --data (text encoded with its characters; a shard with text
  // is refused), or the last 10% of --data.
  absl::StatusOr<data::TrainValData> loaded =
      data::LoadTrainVal(data->path_, ResolveUserPath(absl::GetFlag(FLAGS_val_data)));
  if (!loaded.ok()) return loaded.status();
  data->loaded_ = std::move(*loaded);
  return data;
}

absl::Status CheckExportable(Run& run, const std::string& export_dir) {
  if (export_dir.empty() || !run.dp().sharded_parameters()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--export_hf needs the whole model on rank 0, which --zero_stage=3 shards: train with "
      "--checkpoint_dir, then export from the checkpoint with --resume --zero_stage=0 "
      "--world_size=1");
}

absl::Status LanguageModelData::CheckPretrained(const std::string& init_from, int64_t vocab_size,
                                                const std::string& char_vocab) const {
  const std::optional<data::CharTokenizer>& text = tokenizer();
  if (text && text->vocab_size() != vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, " is text (", text->vocab_size(), " distinct bytes); --init_from=", init_from,
        " has a vocabulary of ", vocab_size, ": train it on token shards (.bin) of its tokenizer"));
  }
  // A character-level export (its vocab.json) says which byte each id stands for: text of other
  // characters, even as many, would give every id another meaning.
  if (text && !char_vocab.empty() && char_vocab != text->vocab()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, " is text whose characters differ from those of --init_from=", init_from,
        " (its vocab.json): its token ids would stand for other characters; train "
        "it on text made of the same characters"));
  }
  return absl::OkStatus();
}

absl::Status LanguageModelData::Batch(int64_t vocab_size, int64_t batch_size, int64_t seq_len) {
  if (absl::GetFlag(FLAGS_top_k) > vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("--top_k=", absl::GetFlag(FLAGS_top_k),
                                                   " is outside its valid range [0, ", vocab_size,
                                                   "] (the vocabulary)"));
  }
  // Every token of both splits, before anything trains (naming the file and the offset).
  if (absl::Status s = data::CheckVocabulary(loaded_, vocab_size); !s.ok()) return s;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  batches_.emplace(std::move(loaded_.tokens.train), batch_size, seq_len, seed + 1);
  val_.emplace(std::move(loaded_.tokens.val), batch_size, seq_len, seed + 2);
  return absl::OkStatus();
}

void LanguageModelData::Install(Run& run, Generator& dropout_gen, PrepareOptions& prepare) {
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  data::TokenBatcher& batches = *batches_;
  prepare.data_fingerprint = {absl::StrCat("train_tokens=", batches.num_tokens()),
                              absl::StrCat("val_tokens=", val_->num_tokens())};
  prepare.resume_data = [this, &run, &batches, &dropout_gen, seed](
                            const StateDict&, std::map<std::string, std::string>& meta) {
    const std::string& ckpt_dir = run.checkpoint_dir();
    const std::optional<data::CharTokenizer>& text = tokenizer();
    // A text run's ids are indices into its characters: text with other characters (allowed by
    // --override=data, and possible with the same count) would give every id another meaning.
    if (text && meta["vocab"] != text->vocab()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume from ", ckpt_dir, ": the checkpoint's characters (metadata 'vocab', ",
          meta["vocab"].size(), " bytes) differ from those of ", path_, " (", text->vocab().size(),
          " bytes): its token ids would stand for other characters; resume with text made of "
          "the same characters"));
    }
    // The generators' states; their seeds must be this run's (the offset is any position).
    auto generator_state = [&](const char* key,
                               uint64_t gen_seed) -> absl::StatusOr<Generator::State> {
      absl::StatusOr<Generator::State> state = GeneratorStateFromString(meta[key]);
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
                       GeneratorStateToString(batches.StateAfter(run.step())), "'"));
    }
    dropout_gen.set_state(*drop_state);
    return absl::OkStatus();
  };
  // The data order and dropout draws live in generators, saved as exact "seed:offset" text.
  prepare.metadata = [this, &batches, &dropout_gen] {
    std::map<std::string, std::string> meta = {
        {"batches", GeneratorStateToString(batches.state())},
        {"dropout", GeneratorStateToString(dropout_gen.state())}};
    if (tokenizer()) meta["vocab"] = tokenizer()->vocab();
    return meta;
  };
  prepare.metric_columns = {"val_loss"};
  prepare.throughput_unit = "tok/s";
  prepare.batch_items = "sequences";
  prepare.training_line_tail =
      absl::StrCat(" (", batches.num_tokens(), " train / ", val_->num_tokens(), " val tokens)");
}

void AddLanguageModelSettings(
    RunSettings& settings, int64_t seq_len, int64_t n_positions, int64_t batch_size,
    const Precision& precision, double dropout,
    const std::vector<std::pair<std::string, std::string>>& fp8_settings) {
  settings.Add("block_size", static_cast<double>(seq_len), /*fixed=*/true);
  settings.Add("n_positions", static_cast<double>(n_positions), true);
  settings.Add("batch_size", static_cast<double>(batch_size), true);
  AddPrecisionSettings(precision, settings, fp8_settings);
  settings.Add("seed", absl::StrCat(absl::GetFlag(FLAGS_seed)), true);
  settings.Add("data", ResolveUserPath(absl::GetFlag(FLAGS_data)), /*fixed=*/false);
  settings.Add("val_data", ResolveUserPath(absl::GetFlag(FLAGS_val_data)), false);
  settings.Add("dropout", dropout, false);
  settings.Add("steps", static_cast<double>(absl::GetFlag(FLAGS_steps)), false);
  settings.Add("lr", absl::GetFlag(FLAGS_lr), false);
  settings.Add("min_lr", MinLr(), false);
  settings.Add("warmup_steps", static_cast<double>(WarmupSteps()), false);
  settings.Add("weight_decay", absl::GetFlag(FLAGS_weight_decay), false);
  settings.Add("beta2", absl::GetFlag(FLAGS_beta2), false);
  settings.Add("grad_clip", absl::GetFlag(FLAGS_grad_clip), false);
}

void SetLanguageModelOptimizer(PrepareOptions& prepare) {
  prepare.optimizer.name = absl::GetFlag(FLAGS_optimizer);
  prepare.optimizer.lr = absl::GetFlag(FLAGS_lr);
  prepare.optimizer.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  prepare.optimizer.beta2 = absl::GetFlag(FLAGS_beta2);
  const int64_t total_steps = absl::GetFlag(FLAGS_steps);
  prepare.total_steps = total_steps;
  prepare.schedule = [total_steps](optim::Optimizer& opt) {
    return std::make_unique<optim::CosineWithWarmupLr>(opt, WarmupSteps(), total_steps, MinLr());
  };
}

double EvaluateLanguageModel(nn::Module& model, const data::TokenBatcher& val, int64_t batches,
                             const ForwardPrecision& precision, Device device) {
  NoGradGuard no_grad;
  model.eval();
  const int64_t n =
      batches > 0 ? std::min(batches, val.num_eval_batches()) : val.num_eval_batches();
  // The forward and the loss under the run's autocast: the loss in f32, summed in f64.
  CrossEntropyEval loss(precision);
  for (int64_t i = 0; i < n; ++i) {
    data::TokenBatcher::Batch b = val.EvalBatch(i);
    loss.Add([&] { return model(Tensor(b.x.to(device))); }, b.y.to(device));
  }
  model.train();
  return loss.mean();
}

std::optional<int> TrainLanguageModel(Run& run, nn::Module& model, LanguageModelData& data,
                                      double* val_loss) {
  // Each rank reads only its rows of the global batch, on the host; each micro-batch is copied
  // to the device.
  DataParallel& dp = run.dp();
  data::TokenBatcher& batches = data.batches();
  const int64_t tokens_per_step = batches.batch_size() * batches.block_size();
  const int64_t eval_every = absl::GetFlag(FLAGS_eval_every);
  *val_loss = NAN;
  while (run.step() < run.total_steps()) {
    data::TokenBatcher::Batch batch = batches.Next(dp.rank(), dp.world_size());
    StepRecord record = run.Step(
        [&](int64_t k) {
          return nn::CrossEntropyLoss(
              dp.Forward(model, Tensor(dp.Micro(batch.x, k).to(run.device()))),
              dp.Micro(batch.y, k).to(run.device()));
        },
        tokens_per_step, absl::GetFlag(FLAGS_grad_clip));
    const int64_t step = run.step();
    record.epoch = static_cast<double>(step * tokens_per_step) / batches.num_tokens();
    std::map<std::string, double> extras;
    if (run.evaluates_here() &&
        ((eval_every > 0 && step % eval_every == 0) || step == run.total_steps())) {
      *val_loss = EvaluateLanguageModel(model, data.val(), absl::GetFlag(FLAGS_eval_batches),
                                        run.forward_precision(), run.device());
      extras["val_loss"] = *val_loss;
      run.progress().Println(absl::StrFormat("step %d: val loss %.4f", step, *val_loss));
    }
    if (std::optional<int> exit = run.EndStep(record, extras, step == run.total_steps())) {
      return exit;
    }
  }
  run.FinishProgress();
  return std::nullopt;
}

namespace {

// --sample_tokens tokens printed by rank 0 (FinishLanguageModel).
void Sample(Run& run, const LanguageModelData& data, const GenerateFn& generate) {
  const int64_t n_sample = absl::GetFlag(FLAGS_sample_tokens);
  if (n_sample <= 0) return;
  Generator sample_gen(absl::GetFlag(FLAGS_seed) + 4);
  const std::vector<uint16_t>& val = data.val().tokens();
  std::vector<int64_t> prompt = {val.empty() ? 0 : val[0]};
  std::vector<int64_t> out;
  {
    // A low-precision model runs under autocast, as in training and evaluation.
    PrecisionScope precision(run.forward_precision(), /*update_fp8=*/false);
    out = generate(prompt, n_sample, sample_gen, absl::GetFlag(FLAGS_temperature),
                   absl::GetFlag(FLAGS_top_k));
  }
  // Stage 3: every rank samples the same tokens (a forward is a collective); rank 0 prints.
  if (!run.dp().is_main()) return;
  if (data.tokenizer()) {
    std::printf("---- sample ----\n%s\n----------------\n", data.tokenizer()->Decode(out).c_str());
  } else {
    std::printf("---- sample (GPT-2 token ids) ----\n");
    for (int64_t t : out) std::printf("%lld ", static_cast<long long>(t));
    std::printf("\n");
  }
}

}  // namespace

absl::Status FinishLanguageModel(Run& run, const LanguageModelData& data, double val_loss,
                                 const GenerateFn& generate) {
  if (run.dp().is_main()) {
    std::printf("val loss %.4f after %lld steps, %lld skipped\n", val_loss,
                static_cast<long long>(run.step()), static_cast<long long>(run.skipped()));
  }
  if (absl::Status s = run.CheckSkipped(); !s.ok()) return s;
  Sample(run, data, generate);
  return absl::OkStatus();
}

}  // namespace tg::train
