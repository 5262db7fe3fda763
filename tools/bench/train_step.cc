// Training-step throughput of the models the training binaries train: the Fashion-MNIST MLP and
// CNN at batch 128 and the tiny character GPT (32 x 64 tokens), each in f32 and with f16 (dynamic
// loss scaling) and bf16 weights under autocast, through the same TrainStep as train_mnist and
// train_gpt. Prints ms per step, images/s or tokens/s, the share of the step spent in GEMM (with
// the GEMM rate), and each precision's speed relative to f32 measured in the same run.
//
//   bazel run -c opt //tools/bench:train_step
//   bazel run -c opt //tools/bench:train_step -- 20     # steps timed per configuration
//
// The inputs are random (same shapes and cost as the real data); the step median is reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/models/image.h"
#include "optim/lr_schedule.h"
#include "tensor/generator.h"
#include "tensor/profile.h"
#include "tools/train/run.h"

namespace tg {
namespace {

struct Result {
  double ms_per_step = 0;
  double items_per_second = 0;
  double gemm_share = 0;
  double gemm_gflops = 0;
};

// Median step time over `steps` timed steps after 3 warm-up steps; GEMM time over the timed steps.
Result Measure(nn::Module& model, DType dtype, int steps, int64_t items_per_step,
               const std::function<Variable()>& loss_fn) {
  model.to(dtype);
  train::OptimizerConfig opt_config;
  opt_config.lr = 1e-4;
  train::PrecisionConfig precision{dtype, "auto"};
  auto opt = train::MakeMixedPrecisionOptimizer(model.parameters(), opt_config, precision);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(opt.status().message()).c_str());
    std::exit(1);
  }
  optim::ConstantLr schedule((*opt)->optimizer());
  for (int i = 0; i < 3; ++i) train::TrainStep(**opt, schedule, dtype, 1.0, loss_fn);
  std::vector<double> times;
  GemmProfile gemm;
  double total = 0;
  {
    GemmProfileScope scope(&gemm);
    for (int i = 0; i < steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      train::TrainStep(**opt, schedule, dtype, 1.0, loss_fn);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      times.push_back(s);
      total += s;
    }
  }
  std::sort(times.begin(), times.end());
  Result r;
  const double median = times[times.size() / 2];
  r.ms_per_step = 1e3 * median;
  r.items_per_second = items_per_step / median;
  r.gemm_share = gemm.seconds / total;
  r.gemm_gflops = gemm.flops / std::max(gemm.seconds, 1e-12) / 1e9;
  return r;
}

void Row(const char* model, DType dtype, const Result& r, const Result& f32, const char* unit) {
  std::printf(
      "%-5s %-5s %9.2f ms/step %10.0f %s  x%.2f vs f32   GEMM %4.1f%% of the step (%.1f GFLOP/s)\n",
      model, DTypeName(dtype), r.ms_per_step, r.items_per_second, unit,
      f32.ms_per_step / r.ms_per_step, 100 * r.gemm_share, r.gemm_gflops);
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  using namespace tg;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  train::KeepFreedMemoryInProcess();  // as the training binaries do
  Generator data_gen(0);
  const int64_t batch = 128;
  Tensor images = RandNormal({batch, 1, 28, 28}, data_gen);
  Tensor labels = Tensor::Empty({batch}, kI64);
  for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = data_gen.NextU32() % 10;
  nn::GptConfig gpt_config = nn::GptConfig::Tiny(65);
  const int64_t gpt_batch = 32, t = gpt_config.block_size;
  Tensor tokens = Tensor::Empty({gpt_batch, t + 1}, kI64);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int64_t>()[i] = data_gen.NextU32() % 65;
  Tensor x = tokens.slice(1, 0, t).contiguous(), y = tokens.slice(1, 1, t + 1).contiguous();

  std::printf(
      "train_step: median of %d steps after 3 warm-up steps; MLP/CNN batch %lld, GPT %lld x %lld "
      "tokens\n",
      steps, static_cast<long long>(batch), static_cast<long long>(gpt_batch),
      static_cast<long long>(t));
  for (const char* name : {"mlp", "cnn", "gpt"}) {
    Result f32;
    for (DType dtype : {kF32, kF16, kBF16}) {
      Generator init(1);
      std::shared_ptr<nn::Module> model;
      std::function<Variable()> loss_fn;
      int64_t items;
      if (std::string(name) == "gpt") {
        model = std::make_shared<nn::Gpt>(gpt_config, init);
        loss_fn = [&] { return nn::CrossEntropyLoss((*model)(Variable(x)), y); };
        items = gpt_batch * t;
      } else {
        model = std::string(name) == "mlp"
                    ? std::static_pointer_cast<nn::Module>(nn::MakeImageMlp(init))
                    : nn::MakeImageCnn(init);
        loss_fn = [&, dtype] {
          return nn::CrossEntropyLoss((*model)(Variable(images.to(dtype))), labels);
        };
        items = batch;
      }
      Result r = Measure(*model, dtype, steps, items, loss_fn);
      if (dtype == kF32) f32 = r;
      Row(name, dtype, r, f32, name == std::string("gpt") ? "tok/s" : "img/s");
    }
  }
  return 0;
}
