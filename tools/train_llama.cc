// Trains a Llama-family decoder (nn/models/llama.h: RMSNorm, rotary embeddings, grouped-query
// attention, a SwiGLU MLP) from random weights on a text file or llm.c token shards, evaluates on
// held-out tokens and prints a sample: the third trainer, on train::Run and
// train/language_model.h as train_gpt is (every shared flag works the same: precision with FP8,
// accumulation, DDP and ZeRO, checkpoints and --resume, metrics).
//
//   bazel run -c opt //tools:train_llama -- --data=data/tinyshakespeare.txt
//   bazel run -c opt //tools:train_llama -- --data=... --n_kv_head=1 --precision=bf16
//
// Not here yet: --init_from a transformers checkpoint and --export_hf.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nn/models/llama.h"
#include "train/flag_values.h"
#include "train/flags.h"
#include "train/language_model.h"
#include "train/run.h"
#include "train/run_main.h"

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

namespace tg {
namespace {

int Fail(const absl::Status& status) { return train::Fail("train_llama", status); }

nn::LlamaConfig MakeConfig(int64_t vocab, int64_t seq_len) {
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
  return c;
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
  if (absl::Status s = train::CheckLanguageModelFlags(own, /*steps_may_be_zero=*/false); !s.ok()) {
    return Fail(s);
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

  absl::StatusOr<std::unique_ptr<train::LanguageModelData>> data_or =
      train::LanguageModelData::Load();
  if (!data_or.ok()) return Fail(data_or.status());
  train::LanguageModelData& data = **data_or;
  absl::StatusOr<train::Precision> precision =
      train::ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return Fail(precision.status());
  const int64_t seq_len = train::SequenceLength(std::nullopt);
  const int64_t vocab = data.tokenizer() ? data.tokenizer()->vocab_size() : 50257;
  const int64_t batch_size = run.batch().global;
  if (absl::Status s = data.Batch(vocab, batch_size, seq_len); !s.ok()) return Fail(s);

  // Built on the CPU (the same initial weights on every device), then moved.
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  Generator init_gen(seed), dropout_gen(seed + 3);
  const nn::LlamaConfig config = MakeConfig(vocab, seq_len);
  auto model = std::make_shared<nn::LlamaForCausalLM>(config, init_gen);
  model->to(precision->dtype);
  model->to(run.device());

  train::RunSettings& settings = run.settings();
  settings.Add("vocab", static_cast<double>(vocab), /*fixed=*/true);
  settings.Add("n_layer", static_cast<double>(config.num_hidden_layers), true);
  settings.Add("n_head", static_cast<double>(heads), true);
  settings.Add("n_kv_head", static_cast<double>(kv), true);
  settings.Add("n_embd", static_cast<double>(embd), true);
  settings.Add("intermediate", static_cast<double>(config.intermediate_size), true);
  settings.Add("rope_theta", config.rope.theta, true);
  settings.Add("rms_norm_eps", config.rms_norm_eps, true);
  settings.Add("tie_embeddings", config.tie_word_embeddings ? "yes" : "no", true);
  train::AddLanguageModelSettings(settings, seq_len, seq_len, batch_size, *precision,
                                  /*dropout=*/0, {});

  train::PrepareOptions prepare;
  prepare.precision = *precision;
  train::SetLanguageModelOptimizer(prepare);  // weight decay on matrices only
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
  if (absl::Status s = run.Prepare(model, std::move(prepare)); !s.ok()) return Fail(s);

  double val_loss = NAN;
  if (std::optional<int> exit = train::TrainLanguageModel(run, *model, data, &val_loss)) {
    return *exit;
  }
  if (!run.evaluates_here()) return 0;
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
