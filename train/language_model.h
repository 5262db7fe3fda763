// What every language-model trainer shares (tools:train_gpt today; a trainer of another decoder
// family is its model, its weights' format and these): the flags of a token run, their checks,
// the token data, its settings, the run's data state in a checkpoint, the training loop with its
// validation loss, and the sample at the end.
//
//   if (absl::Status s = train::CheckLanguageModelFlags(model_ranges, steps_may_be_zero); ...)
//   auto run = train::Run::Start(train::LanguageModelRunOptions("train_gpt"));
//   auto data = train::LanguageModelData::Load();          // --data, --val_data
//   ... the model's config (data->vocab_size() for a fresh one) ...
//   data->Batch(vocab_size, run.batch().global, seq_len);  // every token checked, then batched
//   train::AddLanguageModelSettings(settings, ...);        // after the model's own settings
//   data->Install(run, dropout_gen, prepare);              // resume, metadata, metric columns
//   run.Prepare(model, prepare);
//   std::optional<int> exit = train::TrainLanguageModel(run, *model, *data, &val_loss);
//
// The flags are defined once (language_model.cc) and linked only into language-model binaries,
// so train_mnist has no --steps it would ignore.
#ifndef TAPEGRAD_TRAIN_LANGUAGE_MODEL_H_
#define TAPEGRAD_TRAIN_LANGUAGE_MODEL_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dataset/loader.h"
#include "dataset/token_shard.h"
#include "nn/module.h"
#include "tensor/generator.h"
#include "train/flag_values.h"
#include "train/run.h"
#include "train/run_settings.h"

ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, val_data);
ABSL_DECLARE_FLAG(std::optional<int64_t>, block_size);
ABSL_DECLARE_FLAG(double, dropout);
ABSL_DECLARE_FLAG(std::optional<int64_t>, batch_size);
ABSL_DECLARE_FLAG(std::optional<int64_t>, micro_batch_size);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(std::optional<double>, min_lr);
ABSL_DECLARE_FLAG(std::optional<int64_t>, warmup_steps);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(double, beta2);
ABSL_DECLARE_FLAG(double, grad_clip);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int64_t, eval_every);
ABSL_DECLARE_FLAG(int64_t, eval_batches);
ABSL_DECLARE_FLAG(int64_t, sample_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(int64_t, top_k);
ABSL_DECLARE_FLAG(int64_t, checkpoint_every);
ABSL_DECLARE_FLAG(std::string, override);

namespace tg::train {

// Every numeric flag of the run against its documented range: the model's own `model_flags`
// first, then these, then the shared ones (CheckSharedFlags). A flag left at a default that
// depends on others is not checked (the default fits); top_k's upper bound, the vocabulary, is
// checked by LanguageModelData::Batch. --steps may be 0 only when `steps_may_be_zero` (a
// conversion of pretrained weights).
absl::Status CheckLanguageModelFlags(std::vector<FlagRange> model_flags, bool steps_may_be_zero);

// --export_hf=`export_dir` (empty: none) against the run: InvalidArgument under ZeRO stage 3,
// which leaves no rank with the whole model, naming the way to export from a checkpoint.
absl::Status CheckExportable(Run& run, const std::string& export_dir);

// Run::Start's options from the flags (the global batch of 32 sequences by default).
RunOptions LanguageModelRunOptions(const char* program);

// The schedule's values when their flags are not given (train::DefaultWarmupSteps, DefaultMinLr).
int64_t WarmupSteps();
double MinLr();

// The context of training: --block_size, or 64 (at most `model_context`, the pretrained
// weights' context, when there are weights).
int64_t SequenceLength(std::optional<int64_t> model_context);

// The token data of the run: --data (a text file, tokenized by characters, or an llm.c shard)
// and --val_data (or the last 10% of --data), checked and batched.
class LanguageModelData {
 public:
  // InvalidArgument without --data; the reader's errors otherwise.
  static absl::StatusOr<std::unique_ptr<LanguageModelData>> Load();

  const std::string& path() const { return path_; }  // --data, resolved
  const std::optional<data::CharTokenizer>& tokenizer() const { return loaded_.tokenizer; }

  // Pretrained weights against the data: text must have as many distinct bytes as the weights'
  // vocabulary, and the same characters when the weights name them (`char_vocab`, from a
  // character-level export; "" when they do not); InvalidArgument naming both otherwise.
  absl::Status CheckPretrained(const std::string& init_from, int64_t vocab_size,
                               const std::string& char_vocab) const;

  // Checks --top_k and every token of both splits against `vocab_size` (naming the file and the
  // offset), then batches them: `batch_size` windows of `seq_len` tokens, drawn from --seed + 1
  // (training) and + 2 (validation).
  absl::Status Batch(int64_t vocab_size, int64_t batch_size, int64_t seq_len);
  data::TokenBatcher& batches() { return *batches_; }
  const data::TokenBatcher& val() const { return *val_; }

  // What the run keeps of the data: its fingerprint, the resume of the batches' and dropout's
  // generators (with their seeds' check, --seed + 1 and + 3) and of a text run's characters,
  // the checkpoint metadata, the metric columns, the progress line's units.
  void Install(Run& run, Generator& dropout_gen, PrepareOptions& prepare);

 private:
  LanguageModelData() = default;

  std::string path_;
  data::TrainValData loaded_;
  std::optional<data::TokenBatcher> batches_;
  std::optional<data::TokenBatcher> val_;
};

// The settings of a language-model run, after the model's shape (which the model adds first):
// the context (block_size) and the model's (n_positions), the batch, the precision with FP8's
// settings and the model's `fp8_settings` (name, value; fixed), the scaler, the optimizer, the
// seed; then the overridable ones (data, val_data, dropout, steps, lr, min_lr, warmup_steps,
// weight_decay, beta2, grad_clip).
void AddLanguageModelSettings(RunSettings& settings, int64_t seq_len, int64_t n_positions,
                              int64_t batch_size, const Precision& precision, double dropout,
                              const std::vector<std::pair<std::string, std::string>>& fp8_settings);

// The optimizer and schedule of the flags: AdamW-style (--lr, --weight_decay, --beta2), cosine
// with linear warmup over --steps.
void SetLanguageModelOptimizer(PrepareOptions& prepare);

// Mean next-token loss (nats per token) over the first `batches` sequential validation batches
// (0: all), under the run's precision, in eval mode and without recording.
double EvaluateLanguageModel(nn::Module& model, const data::TokenBatcher& val, int64_t batches,
                             const ForwardPrecision& precision, Device device);

// The training loop: --steps optimizer steps on `model` (tokens [B, T] -> logits [B, T, V]),
// the validation loss every --eval_every steps and at the end (progress line and metrics
// column), a checkpoint at the end. Returns the exit code when the run ends early (a stop, a
// divergence); `val_loss` is the last validation loss (NaN when none ran here).
std::optional<int> TrainLanguageModel(Run& run, nn::Module& model, LanguageModelData& data,
                                      double* val_loss);

// The end of a language-model run that trained here (after the model's own exports): rank 0
// prints "val loss X after N steps, K skipped"; a run that skipped most of its steps did not
// train and returns the error (no successful exit); otherwise --sample_tokens tokens from the
// first validation token (--temperature, --top_k, --seed + 4), under the run's precision, which
// rank 0 prints as text or as GPT-2 token ids. `generate`: (prompt, tokens, generator,
// temperature, top_k) -> the sampled tokens.
using GenerateFn = std::function<std::vector<int64_t>(const std::vector<int64_t>&, int64_t,
                                                      Generator&, double, int64_t)>;
absl::Status FinishLanguageModel(Run& run, const LanguageModelData& data, double val_loss,
                                 const GenerateFn& generate);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_LANGUAGE_MODEL_H_
