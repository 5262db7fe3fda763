// Training-step throughput of the models the training binaries train: the Fashion-MNIST MLP and
// CNN at batch 128 and the tiny character GPT (32 x 64 tokens), each in f32 and with f16 (dynamic
// loss scaling) and bf16 weights under autocast, through the same TrainStep as train_mnist and
// train_gpt. Prints ms per step, images/s or tokens/s, the share of the step spent in GEMM (with
// the GEMM rate), and each precision's speed relative to f32 measured in the same run.
//
//   bazel run -c opt //tools/bench:train_step
//   bazel run -c opt //tools/bench:train_step -- --steps=20     # steps timed per configuration
//
// With --pytorch_json=FILE (JSON lines from tools/bench/train_step_pytorch.py: the same models,
// batches, optimizer and step), each row also shows PyTorch's FASTEST variant at this run's thread
// count (OMP_NUM_THREADS) -- eager, eager_composed_attention or compile, whichever lines the file
// has -- with its name, the ratio tapegrad / that variant (below 1: tapegrad is faster), and every
// variant's ms/step in brackets when there is more than one:
//   ...   PyTorch best     9.87 ms/step (compile)  ratio 0.81  [eager=12.30 compile=9.87]
// A line without "variant" (files from before variants) counts as "eager". Comparing with the
// fastest is the fair baseline: which PyTorch variant wins depends on the CPU and the dtype (the
// bf16 SDPA kernel on a CPU without AMX is slower than the same attention from plain ops).
// tools/bench/compare_pytorch.sh runs both, interleaved, at 1 and 2 threads.
//
// Each row's timing is bracketed by the cache-line round trip between two CPUs (core_latency.h),
// printed as "cores 68/70 ns". A virtual machine's host moves its vCPUs, and 2-thread steps are
// slower while the vCPUs sit far apart; a ratio is only meaningful when both sides were timed in
// one placement, so a row whose probes and PyTorch's (the "core_ns" of its lines) are not all
// within 2x of each other says "phases differ". --json_out=FILE appends one JSON line per row
// (ms, probes, each PyTorch variant's ms, the best, ratio, same_phase) for compare_pytorch.sh's
// summary.
//
// The inputs are random (same shapes and cost as the real data); the step median is reported.
#include "train/train_step.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "amp/fp8.h"
#include "autograd/ops.h"
#include "nlohmann/json.hpp"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/models/image.h"
#include "nn/models/llama.h"
#include "optim/lr_schedule.h"
#include "tensor/generator.h"
#include "tensor/kernel_options.h"
#include "tensor/profile.h"
#include "tools/bench/core_latency.h"
#include "train/flag_values.h"
#include "train/optimizer_setup.h"
#include "train/run_main.h"

ABSL_FLAG(int, steps, 10, "timed steps per configuration (after 3 warm-up steps)");
ABSL_FLAG(bool, cpu_thread_governor, true,
          "the CPU thread governor (KernelOptions::cpu_thread_governor; false: every parallel "
          "region uses OMP_NUM_THREADS threads)");
ABSL_FLAG(std::vector<std::string>, models, std::vector<std::string>({"mlp", "cnn", "gpt"}),
          "models to time (mlp, cnn, gpt, llama: train_llama's default decoder)");
ABSL_FLAG(std::vector<std::string>, dtypes, std::vector<std::string>({"f32", "f16", "bf16"}),
          "precisions to time (f32, f16, bf16, fp8/delayed, fp8/current, fp8/block); f32 is the "
          "reference of the 'vs f32' column when timed");
ABSL_FLAG(std::string, json_out, "",
          "append one JSON line per row to this file (for compare_pytorch.sh's summary)");
ABSL_FLAG(std::string, pytorch_json, "",
          "JSON lines from tools/bench/train_step_pytorch.py: adds PyTorch's fastest variant's "
          "ms/step at this thread count (and its name) and the ratio to each row");

namespace tg {
namespace {

struct Result {
  double ms_per_step = 0;
  std::vector<double> core_ns;  // the round trip between two CPUs before and after the timing
  double items_per_second = 0;
  double gemm_share = 0;
  double gemm_gflops = 0;
};

// Median step time over `steps` timed steps after 3 warm-up steps; the GEMM share over `steps`
// more.
// fp8_recipe: "" for the dtype alone, else --precision=fp8 with that recipe (the model's Linear
// weights in FP8, inside bf16 autocast).
Result Measure(nn::Module& model, DType dtype, const std::string& fp8_recipe, int steps,
               int64_t items_per_step, const std::function<Tensor()>& loss_fn) {
  model.to(dtype);
  std::unique_ptr<amp::Fp8Training> fp8;
  if (!fp8_recipe.empty()) {
    amp::Fp8TrainingOptions o;
    o.recipe = amp::ParseFp8Recipe(fp8_recipe);
    fp8 = std::make_unique<amp::Fp8Training>(nn::LinearWeights(model), o);
  }
  const train::ForwardPrecision forward(dtype, fp8.get());
  train::OptimizerConfig opt_config;
  opt_config.lr = 1e-4;
  train::PrecisionConfig precision{dtype, "auto"};
  auto opt = train::MakeMixedPrecisionOptimizer(model.parameters(), opt_config, precision);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(opt.status().message()).c_str());
    std::exit(1);
  }
  optim::ConstantLr schedule((*opt)->optimizer());
  for (int i = 0; i < 3; ++i) train::TrainStep(**opt, schedule, forward, 1.0, loss_fn);
  auto timed_steps = [&](std::vector<double>* times) {
    double total = 0;
    for (int i = 0; i < steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      train::TrainStep(**opt, schedule, forward, 1.0, loss_fn);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (times != nullptr) times->push_back(s);
      total += s;
    }
    return total;
  };
  // The step time without the GEMM accounting (two clock reads per product), then as many steps
  // again with it for the GEMM share.
  std::vector<double> times;
  Result r;
  r.core_ns.push_back(bench::CoreRoundTripNs());
  timed_steps(&times);
  r.core_ns.push_back(bench::CoreRoundTripNs());
  GemmProfile gemm;
  double total = 0;
  {
    GemmProfileScope scope(&gemm);
    total = timed_steps(nullptr);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  r.ms_per_step = 1e3 * median;
  r.items_per_second = items_per_step / median;
  r.gemm_share = gemm.seconds / total;
  r.gemm_gflops = gemm.flops / std::max(gemm.seconds, 1e-12) / 1e9;
  return r;
}

// One PyTorch variant's timing: ms/step and the core round trips around it (none in files from
// before the probes).
struct PyTorchTiming {
  double ms = 0;
  std::vector<double> core_ns;
};
// PyTorch's timings by variant, for one "model/dtype" row.
using PyTorchRow = std::map<std::string, PyTorchTiming>;

// A "core_ns" field: an array of positive numbers, or nulls for probes on one CPU.
bool ProbesValid(const nlohmann::json& ns) {
  return ns.is_array() && std::all_of(ns.begin(), ns.end(), [](const nlohmann::json& x) {
           return (x.is_number() && x.get<double>() > 0) || x.is_null();
         });
}

// PyTorch's timings by "model/dtype" and variant at `threads` threads, from
// train_step_pytorch.py's lines; a line without "variant" is "eager", and a repeated
// (row, variant) keeps the last line.
std::map<std::string, PyTorchRow> ReadPyTorchJson(const std::string& path, int threads) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "train_step: cannot read --pytorch_json=%s\n", path.c_str());
    std::exit(1);
  }
  std::map<std::string, PyTorchRow> ms;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_string() || !j.contains("dtype") ||
        !j["dtype"].is_string() || !j.contains("threads") || !j["threads"].is_number_integer() ||
        !j.contains("ms_per_step") || !j["ms_per_step"].is_number() ||
        !(j["ms_per_step"].get<double>() > 0) ||
        (j.contains("variant") && !j["variant"].is_string()) ||
        (j.contains("core_ns") && !ProbesValid(j["core_ns"]))) {
      std::fprintf(stderr, "train_step: %s line %d is not a train_step_pytorch.py record\n",
                   path.c_str(), number);
      std::exit(1);
    }
    if (j["threads"].get<int>() != threads) continue;
    const std::string variant = j.contains("variant") ? j["variant"].get<std::string>() : "eager";
    PyTorchTiming timing{j["ms_per_step"].get<double>(), {}};
    if (j.contains("core_ns")) {
      for (const nlohmann::json& ns : j["core_ns"]) {
        timing.core_ns.push_back(ns.is_number() ? ns.get<double>()
                                                : std::numeric_limits<double>::quiet_NaN());
      }
    }
    ms[j["model"].get<std::string>() + "/" + j["dtype"].get<std::string>()][variant] = timing;
  }
  return ms;
}

// NaN (a probe on one CPU) as JSON null.
nlohmann::json ProbesJson(const std::vector<double>& ns) {
  nlohmann::json out = nlohmann::json::array();
  for (double x : ns) out.push_back(std::isnan(x) ? nlohmann::json(nullptr) : nlohmann::json(x));
  return out;
}

// Prints the row and, when `json_out` is open, appends it as a JSON line.
// `precision`: the row's --dtypes entry ("bf16", "fp8/delayed", ...).
void Row(const char* model, const std::string& precision, int threads, const Result& r,
         const Result& f32, const char* unit, const std::map<std::string, PyTorchRow>& pytorch,
         std::ofstream* json_out) {
  std::printf(
      "%-5s %-12s %9.2f ms/step %10.0f %s  x%.2f vs f32   GEMM %4.1f%% (%.1f GFLOP/s)"
      "  cores %.0f/%.0f ns",
      model, precision.c_str(), r.ms_per_step, r.items_per_second, unit,
      f32.ms_per_step / r.ms_per_step, 100 * r.gemm_share, r.gemm_gflops, r.core_ns[0],
      r.core_ns[1]);
  nlohmann::json record = {{"model", model},
                           {"dtype", precision},
                           {"threads", threads},
                           {"ms_per_step", r.ms_per_step},
                           {"core_ns", ProbesJson(r.core_ns)}};
  const auto it = pytorch.find(std::string(model) + "/" + precision);
  if (it != pytorch.end() && !it->second.empty()) {
    const auto best =
        std::min_element(it->second.begin(), it->second.end(),
                         [](const auto& a, const auto& b) { return a.second.ms < b.second.ms; });
    const double ratio = r.ms_per_step / best->second.ms;
    // Every variant's probes with ours: a variant timed in the other placement could have been
    // the fastest, or not, in ours.
    std::vector<double> probes = r.core_ns;
    for (const auto& [variant, timing] : it->second) {
      probes.insert(probes.end(), timing.core_ns.begin(), timing.core_ns.end());
    }
    const bool same_phase = bench::SameCorePhase(probes);
    std::printf("   PyTorch best %8.2f ms/step (%s)  ratio %.2f%s", best->second.ms,
                best->first.c_str(), ratio, same_phase ? "" : " (phases differ)");
    if (it->second.size() > 1) {
      const char* sep = "  [";
      for (const auto& [variant, timing] : it->second) {
        std::printf("%s%s=%.2f", sep, variant.c_str(), timing.ms);
        sep = " ";
      }
      std::printf("]");
    }
    nlohmann::json variants = nlohmann::json::object();
    for (const auto& [variant, timing] : it->second) variants[variant] = timing.ms;
    record["pytorch_ms_per_step_by_variant"] = variants;
    record["pytorch_best"] = best->first;
    record["pytorch_ms_per_step"] = best->second.ms;
    record["ratio"] = ratio;
    record["same_phase"] = same_phase;
  }
  std::printf("\n");
  if (json_out != nullptr && json_out->is_open()) *json_out << record.dump() << "\n" << std::flush;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  using namespace tg;
  absl::ParseCommandLine(argc, argv);
  tg::KernelOptions kernel_options = tg::GetKernelOptions();
  kernel_options.cpu_thread_governor = absl::GetFlag(FLAGS_cpu_thread_governor);
  tg::SetKernelOptions(kernel_options);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int threads = omp_get_max_threads();
  for (const std::string& name : absl::GetFlag(FLAGS_models)) {
    if (name != "mlp" && name != "cnn" && name != "gpt" && name != "llama") {
      std::fprintf(stderr, "train_step: unknown model '%s' (expected mlp, cnn, gpt or llama)\n",
                   name.c_str());
      return 1;
    }
  }
  std::map<std::string, PyTorchRow> pytorch;
  if (!absl::GetFlag(FLAGS_pytorch_json).empty()) {
    pytorch = ReadPyTorchJson(absl::GetFlag(FLAGS_pytorch_json), threads);
    if (pytorch.empty()) {
      std::fprintf(stderr, "train_step: %s has no records at %d threads (OMP_NUM_THREADS)\n",
                   absl::GetFlag(FLAGS_pytorch_json).c_str(), threads);
      return 1;
    }
  }
  std::ofstream json_out;
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    json_out.open(absl::GetFlag(FLAGS_json_out), std::ios::app);
    if (!json_out) {
      std::fprintf(stderr, "train_step: cannot open --json_out=%s for appending\n",
                   absl::GetFlag(FLAGS_json_out).c_str());
      return 1;
    }
  }
  train::KeepFreedMemoryInProcess();  // as the training binaries do
  Generator data_gen(0);
  const int64_t batch = 128;
  RawTensor images = RandNormal({batch, 1, 28, 28}, data_gen);
  RawTensor labels = RawTensor::Empty({batch}, kI64);
  for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = data_gen.NextU32() % 10;
  nn::GptConfig gpt_config = nn::GptConfig::Tiny(65);
  const int64_t gpt_batch = 32, t = gpt_config.block_size;
  RawTensor tokens = RawTensor::Empty({gpt_batch, t + 1}, kI64);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int64_t>()[i] = data_gen.NextU32() % 65;
  RawTensor x = tokens.slice(1, 0, t).contiguous(), y = tokens.slice(1, 1, t + 1).contiguous();
  // train_llama's default decoder: 2 layers, 64 wide, 4 query heads on 2 key/value heads, SwiGLU
  // 192, RMSNorm eps 1e-5, untied head (tools/bench/train_step_pytorch.py's TinyLlama).
  nn::LlamaConfig llama_config;
  llama_config.vocab_size = 65;
  llama_config.hidden_size = 64;
  llama_config.intermediate_size = 192;
  llama_config.num_hidden_layers = 2;
  llama_config.num_attention_heads = 4;
  llama_config.num_key_value_heads = 2;
  llama_config.max_position_embeddings = t;
  llama_config.rms_norm_eps = 1e-5;

  std::printf(
      "train_step: median of %d steps after 3 warm-up steps, %d threads; MLP/CNN batch %lld, GPT "
      "%lld x %lld tokens\n",
      steps, threads, static_cast<long long>(batch), static_cast<long long>(gpt_batch),
      static_cast<long long>(t));
  for (const std::string& model_name : absl::GetFlag(FLAGS_models)) {
    const char* name = model_name.c_str();
    Result f32;
    for (const std::string& dtype_name : absl::GetFlag(FLAGS_dtypes)) {
      // "fp8/<recipe>" (or "fp8": delayed) measures --precision=fp8 with that recipe.
      const size_t slash = dtype_name.find('/');
      const absl::StatusOr<train::Precision> parsed =
          train::ParsePrecision(dtype_name.substr(0, slash));
      if (!parsed.ok()) {
        std::fprintf(stderr, "train_step: %s\n", std::string(parsed.status().message()).c_str());
        return 1;
      }
      const DType dtype = parsed->dtype;
      const std::string fp8_recipe = !parsed->fp8                 ? ""
                                     : slash == std::string::npos ? "delayed"
                                                                  : dtype_name.substr(slash + 1);
      if (!fp8_recipe.empty() && fp8_recipe != "delayed" && fp8_recipe != "current" &&
          fp8_recipe != "block") {
        std::fprintf(stderr,
                     "train_step: unknown FP8 recipe in '%s' (expected delayed, current "
                     "or block)\n",
                     dtype_name.c_str());
        return 1;
      }
      Generator init(1);
      std::shared_ptr<nn::Module> model;
      std::function<Tensor()> loss_fn;
      int64_t items;
      const bool language = std::string(name) == "gpt" || std::string(name) == "llama";
      if (language) {
        if (std::string(name) == "gpt") {
          model = std::make_shared<nn::Gpt>(gpt_config, init);
        } else {
          model = std::make_shared<nn::LlamaForCausalLM>(llama_config, init);
        }
        loss_fn = [&] { return nn::CrossEntropyLoss((*model)(Tensor(x)), y); };
        items = gpt_batch * t;
      } else {
        model =
            (std::string(name) == "mlp" ? nn::MakeImageMlp(init) : nn::MakeImageCnn(init)).ptr();
        loss_fn = [&, dtype] {
          return nn::CrossEntropyLoss((*model)(Tensor(images.to(dtype))), labels);
        };
        items = batch;
      }
      Result r = Measure(*model, dtype, fp8_recipe, steps, items, loss_fn);
      if (dtype == kF32) f32 = r;
      Row(name, dtype_name, threads, r, f32, language ? "tok/s" : "img/s", pytorch, &json_out);
    }
  }
  return 0;
}
