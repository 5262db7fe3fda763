// GPT-2 124M training throughput on one GPU: tapegrad's end-to-end step (forward, backward,
// optimizer) at llm.c's / nanoGPT's configuration, next to PyTorch's on the same machine.
//
//   bazel run -c opt //tools/bench:gpt2_gpu                       # micro-batches 4, 16, 32
//   bazel run -c opt //tools/bench:gpt2_gpu -- --batches=8,16 --steps=30
//   bazel run -c opt //tools/bench:gpt2_gpu -- --pytorch_json=pytorch.jsonl   # side by side
//
// The model: GPT-2 small (12 layers, 12 heads, width 768, vocabulary 50304 -- GPT-2's 50257
// padded, used whole as the PyTorch baseline does -- context 1024, tied embedding, tanh GELU,
// pre-LN; nn::GptConfig::Gpt2Small()), built on the CPU
// from a seed and moved to the GPU. The step: bf16 autocast (matmuls and attention in bf16,
// layer norm and the loss in f32), the loss on synthetic random tokens (made once, on the
// device), backward, and AdamW (lr 6e-4, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on the
// 2-D parameters, none on biases and norm weights) over f32 master weights. With
// --weights=bf16 (the default) the model's weights are bf16 copies of the masters, written by
// the fused AdamW pass (amp::MixedPrecisionOptimizer, as train_gpt --precision=bf16 runs);
// --weights=f32 keeps f32 weights that autocast casts every step (PyTorch's usual recipe, which
// the PyTorch baseline uses: run both to compare the same recipe and to see what bf16 weights
// save). No loss scaling (bf16), no gradient clipping (neither does the
// baseline), no host synchronisation inside a step.
//
// Each micro-batch size runs `--warmup` untimed steps, then `--steps` steps between two device
// synchronisations, and prints tokens/s, ms/step, the caching allocator's peak of allocated
// memory and the model FLOPs utilisation
//   MFU = tokens/s * (6 N + 6 L C T) / 989e12
// with N all parameters (the tied embedding once), L layers, C width, T context: llm.c's
// convention (6 N per token for the matmuls forward and backward, 6 L C T for attention's
// scores and weighted sums), against the H100 SXM's dense bf16 peak (989 TFLOP/s; the H200 has
// the same). A micro-batch that runs out of device memory is reported as such, larger ones are
// not tried, and the last line names the largest that fit.
//
// PyTorch: tools/bench/gpt2_pytorch.py measures the same model and step (eager and
// torch.compile) on the GPU machine and prints one JSON line per micro-batch; --pytorch_json
// reads those lines and prints tapegrad / PyTorch ratios. tools/gpu/README.md says how both run
// there (tools/gpu/stage.sh carries this binary, tools/gpu/run_on_device.sh runs it).
//
// Without a CUDA device it prints "gpt2_gpu: no CUDA device: skipped" and exits 0.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "amp/fp8.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nlohmann/json.hpp"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/generator.h"

ABSL_FLAG(std::string, batches, "4,16,32", "micro-batch sizes to measure, comma-separated");
ABSL_FLAG(int64_t, seq, 1024, "tokens per sequence (at most the context, 1024)");
ABSL_FLAG(int64_t, warmup, 5, "untimed steps per micro-batch size");
ABSL_FLAG(int64_t, steps, 20, "timed steps per micro-batch size");
ABSL_FLAG(std::string, weights, "bf16",
          "bf16: bf16 model weights written from f32 masters by the fused AdamW; f32: f32 "
          "weights cast by autocast every step");
ABSL_FLAG(std::string, fp8_recipe, "",
          "empty: bf16 GEMMs; delayed, current or block: the Linear layers' GEMMs in FP8 with that "
          "recipe (amp/fp8.h; the tied head stays bf16), inside bf16 autocast");
ABSL_FLAG(int, device, 0, "CUDA device index");
ABSL_FLAG(std::string, pytorch_json, "",
          "JSON lines of tools/bench/gpt2_pytorch.py to compare with (empty: none)");

namespace tg {
namespace {

constexpr double kPeakBf16Flops = 989e12;  // H100 SXM dense bf16 (as gpt2_pytorch.py)

struct Result {
  int64_t batch = 0;
  bool oom = false;
  std::string error;  // an out-of-memory message
  double tokens_per_s = 0;
  double ms_per_step = 0;
  double peak_gib = 0;
  double mfu = 0;
  double loss = 0;
  double host_syncs_per_step = 0;  // waits of the host for the device (cuda::HostSyncCount)
};

// One micro-batch size: a fresh model and optimizer, warm-up, timed steps.
Result Measure(int64_t batch, int64_t seq, bool bf16_weights, Device device) {
  const std::string fp8_recipe = absl::GetFlag(FLAGS_fp8_recipe);
  Result r;
  r.batch = batch;
  nn::GptConfig config = nn::GptConfig::Gpt2Small();
  // All 50304 rows are the vocabulary, as in gpt2_pytorch.py (and nanoGPT's benchmark): no
  // slice of the logits to 50257 before the loss, so both sides do exactly the same work.
  config.vocab_size = config.padded_vocab();
  config.padded_vocab_size = 0;
  Generator init(1337);
  nn::Gpt model(config, init);  // on the CPU: the same initial weights as a CPU run
  if (bf16_weights) model.to(kBF16);
  model.to(device);
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  optim::AdamWOptions o;
  o.lr(6e-4);
  o.beta1(0.9);
  o.beta2(0.95);
  o.eps(1e-8);
  o.weight_decay(0.1);
  optim::AdamWOptions no_decay_options = o;
  no_decay_options.weight_decay(0);
  // f32 masters for bf16 weights (f32 weights are their own); bf16 gets a constant scale of 1
  // and no overflow check, so a step never reads anything back from the device.
  amp::MixedPrecisionOptimizer opt(std::make_unique<optim::AdamW>(
      std::vector<optim::ParamGroup>{optim::ParamGroup(decay),
                                     optim::ParamGroup(no_decay, no_decay_options)},
      o));

  // Synthetic tokens, uploaded once: the loop measures the step, not the data path.
  Generator data(7);
  std::vector<int64_t> tokens(static_cast<size_t>(batch * (seq + 1)));
  for (int64_t& t : tokens) t = data.NextU32() % config.vocab_size;
  const RawTensor all = RawTensor::FromVector(tokens, {batch, seq + 1});
  const RawTensor x = all.slice(1, 0, seq).contiguous().to(device);
  const RawTensor y = all.slice(1, 1, seq + 1).contiguous().to(device);

  // --fp8_recipe: FP8 GEMMs for the blocks' Linear layers (TE's fp8_autocast inside bf16).
  std::unique_ptr<amp::Fp8Training> fp8;
  if (!fp8_recipe.empty()) {
    amp::Fp8TrainingOptions fo;
    fo.recipe = amp::ParseFp8Recipe(fp8_recipe);
    fp8 = std::make_unique<amp::Fp8Training>(nn::LinearWeights(model), fo);
  }
  Tensor loss;
  auto step = [&] {
    opt.zero_grad();
    {
      amp::AutocastGuard autocast(kBF16);
      amp::Fp8Autocast fp8_scope(fp8.get());  // none without --fp8_recipe
      loss = nn::CrossEntropyLoss(model(Tensor(x)), y);
      fp8_scope.Finish();
    }
    opt.backward(loss);
    opt.step();
  };
  const int64_t warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  for (int64_t i = 0; i < warmup; ++i) step();
  cuda::Synchronize(device.index);
  const auto start = std::chrono::steady_clock::now();
  const int64_t syncs_before = cuda::HostSyncCount();
  for (int64_t i = 0; i < steps; ++i) step();
  r.host_syncs_per_step = static_cast<double>(cuda::HostSyncCount() - syncs_before) /
                          static_cast<double>(std::max<int64_t>(steps, 1));
  cuda::Synchronize(device.index);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(std::max<int64_t>(steps, 1));
  r.ms_per_step = 1e3 * seconds;
  r.tokens_per_s = static_cast<double>(batch * seq) / seconds;
  const double n = static_cast<double>(model.num_parameters());
  const double flops_per_token =
      6 * n + 6.0 * config.n_layer * config.n_embd * static_cast<double>(seq);
  r.mfu = r.tokens_per_s * flops_per_token / kPeakBf16Flops;
  r.peak_gib =
      static_cast<double>(cuda::MemoryStats(device.index).peak_allocated_bytes) / (1 << 30);
  r.loss = loss.item();
  return r;
}

// Runs Measure, turning the caching allocator's out-of-memory error into a result; every other
// error propagates. The failed run's tensors are freed by the unwinding; the cache is emptied so
// the next size starts from the same free memory.
Result MeasureOrOom(int64_t batch, int64_t seq, bool bf16_weights, Device device) {
  cuda::EmptyCache(device.index);
  cuda::ResetPeakMemoryStats(device.index);
  Result r;
  try {
    r = Measure(batch, seq, bf16_weights, device);
  } catch (const Error& e) {
    if (!absl::StrContains(e.what(), "out of memory")) throw;
    r.batch = batch;
    r.oom = true;
    r.error = e.what();
  }
  cuda::EmptyCache(device.index);
  return r;
}

// PyTorch's records by mode ("eager", "compile") and micro-batch, from gpt2_pytorch.py's lines.
using PyTorchRecords = std::map<std::string, std::map<int64_t, nlohmann::json>>;

PyTorchRecords ReadPyTorchJson(const std::string& path) {
  PyTorchRecords out;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "gpt2_gpu: cannot read --pytorch_json=%s\n", path.c_str());
    return out;
  }
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("mode") || !j.contains("batch")) continue;
    if (!j["mode"].is_string() || !j["batch"].is_number_integer()) continue;
    out[j["mode"].get<std::string>()][j["batch"].get<int64_t>()] = j;
  }
  return out;
}

// " | eager x0.87 tok/s, 1.10 mem" for each PyTorch mode that measured this micro-batch.
std::string Ratios(const Result& r, const PyTorchRecords& pytorch) {
  std::string out;
  for (const auto& [mode, by_batch] : pytorch) {
    auto it = by_batch.find(r.batch);
    if (it == by_batch.end()) continue;
    const nlohmann::json& j = it->second;
    if (j.value("oom", false)) {
      absl::StrAppend(&out, " | ", mode, ": out of memory");
      continue;
    }
    const double tps = j.value("tokens_per_s", 0.0), mem = j.value("peak_mem_gib", 0.0);
    if (r.oom || tps <= 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), " | %s %.0f tok/s: x%.2f speed, x%.2f memory", mode.c_str(),
                  tps, r.tokens_per_s / tps, mem > 0 ? r.peak_gib / mem : 0.0);
    out += buf;
  }
  return out;
}

std::vector<int64_t> ParseBatches(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(part, &b) || b <= 0) {
      std::fprintf(stderr, "gpt2_gpu: --batches: '%s' is not a positive integer\n",
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(b);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int Main() {
  if (!cuda::Available()) {
    std::printf("gpt2_gpu: no CUDA device: skipped\n");
    return 0;
  }
  const int index = absl::GetFlag(FLAGS_device);
  if (index < 0 || index >= cuda::DeviceCount()) {
    std::fprintf(stderr, "gpt2_gpu: --device=%d: there are %d CUDA devices\n", index,
                 cuda::DeviceCount());
    return 2;
  }
  const Device device = Device::Cuda(index);
  cuda::DeviceGuard guard(index);
  const std::string weights = absl::GetFlag(FLAGS_weights);
  if (weights != "bf16" && weights != "f32") {
    std::fprintf(stderr, "gpt2_gpu: --weights=%s: expected bf16 or f32\n", weights.c_str());
    return 2;
  }
  const int64_t seq = absl::GetFlag(FLAGS_seq);
  if (seq < 1 || seq > nn::GptConfig::Gpt2Small().block_size) {
    std::fprintf(stderr, "gpt2_gpu: --seq=%lld: expected 1..1024\n", static_cast<long long>(seq));
    return 2;
  }
  const std::string fp8_recipe = absl::GetFlag(FLAGS_fp8_recipe);
  if (!fp8_recipe.empty() && fp8_recipe != "delayed" && fp8_recipe != "current" &&
      fp8_recipe != "block") {
    std::fprintf(stderr, "gpt2_gpu: --fp8_recipe=%s: expected delayed, current or block\n",
                 fp8_recipe.c_str());
    return 2;
  }
  const std::vector<int64_t> batches = ParseBatches(absl::GetFlag(FLAGS_batches));
  PyTorchRecords pytorch;
  if (!absl::GetFlag(FLAGS_pytorch_json).empty()) {
    pytorch = ReadPyTorchJson(absl::GetFlag(FLAGS_pytorch_json));
  }
  cudaDeviceProp prop;
  TG_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  std::printf(
      "gpt2_gpu: GPT-2 124M (%lld params), bf16 autocast%s, %s weights + f32 masters, fused "
      "AdamW, seq %lld, %lld warm-up + %lld timed steps, on %s (%s)\n",
      static_cast<long long>(nn::GptConfig::Gpt2Small().NumParameters()),
      fp8_recipe.empty() ? "" : (" with FP8 Linear GEMMs (" + fp8_recipe + " scaling)").c_str(),
      weights.c_str(),
      static_cast<long long>(seq), static_cast<long long>(absl::GetFlag(FLAGS_warmup)),
      static_cast<long long>(absl::GetFlag(FLAGS_steps)), prop.name, device.ToString().c_str());
  std::optional<int64_t> largest;
  for (int64_t batch : batches) {
    const Result r = MeasureOrOom(batch, seq, weights == "bf16", device);
    if (r.oom) {
      std::printf("  batch %3lld: out of memory (%s)%s\n", static_cast<long long>(batch),
                  r.error.c_str(), Ratios(r, pytorch).c_str());
      break;  // larger micro-batches need more memory still
    }
    largest = batch;
    std::printf(
        "  batch %3lld: %9.0f tok/s %9.2f ms/step  peak %6.2f GiB  MFU %5.1f%%  host syncs/step "
        "%.2f  (loss %.3f)%s\n",
        static_cast<long long>(batch), r.tokens_per_s, r.ms_per_step, r.peak_gib, 100 * r.mfu,
        r.host_syncs_per_step, r.loss, Ratios(r, pytorch).c_str());
    // The same record as gpt2_pytorch.py's, for scripts.
    nlohmann::json j = {{"mode", "tapegrad"},
                        {"batch", batch},
                        {"seq", seq},
                        {"tokens_per_s", std::round(r.tokens_per_s)},
                        {"ms_per_step", std::round(r.ms_per_step * 100) / 100},
                        {"peak_mem_gib", std::round(r.peak_gib * 100) / 100},
                        {"mfu", std::round(r.mfu * 1e4) / 1e4},
                        {"host_syncs_per_step", r.host_syncs_per_step},
                        {"weights", weights},
                        {"fp8_recipe", fp8_recipe.empty() ? "none" : fp8_recipe},
                        {"device", prop.name}};
    std::printf("  %s\n", j.dump().c_str());
  }
  std::printf("largest micro-batch that fits: %s\n",
              largest ? std::to_string(*largest).c_str() : "none");
  std::printf(
      "MFU = tokens/s * (6 N + 6 L C T) / 989e12: llm.c's convention (N = all parameters, the "
      "tied embedding once; 6 L C T for attention), against the H100 SXM dense bf16 peak\n");
  return 0;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "GPT-2 124M training throughput on one GPU (bf16 autocast, f32 masters, AdamW). Flags:");
  absl::ParseCommandLine(argc, argv);
  try {
    return tg::Main();
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "gpt2_gpu: %s\n", e.what());
    return 1;
  }
}
