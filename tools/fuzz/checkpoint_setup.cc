#include "tools/fuzz/checkpoint_setup.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "nn/loss.h"
#include "tensor/generator.h"

namespace tg::fuzz {

FuzzRun MakeFuzzRun(RunKind kind) {
  const bool f16 = kind == RunKind::kF16AdamW;
  FuzzRun run;
  run.dtype = f16 ? kF16 : kF32;
  Generator gen(7);
  run.model = nn::Sequential(nn::Linear(3, 2, gen));
  run.model->to(run.dtype);
  train::OptimizerConfig opt;
  opt.name = f16 ? "adamw" : "sgd";
  opt.lr = 0.01;
  opt.weight_decay = 0.1;
  train::PrecisionConfig precision;
  precision.dtype = run.dtype;
  precision.loss_scaler = f16 ? "pytorch" : "none";
  auto made = train::MakeMixedPrecisionOptimizer(run.model->parameters(), opt, precision);
  if (!made.ok()) {
    std::fprintf(stderr, "MakeFuzzRun: %s\n", made.status().ToString().c_str());
    std::abort();
  }
  run.optimizer = *std::move(made);
  run.schedule = std::make_unique<optim::CosineWithWarmupLr>(
      run.optimizer->optimizer(), /*warmup_steps=*/2, kFuzzRunSteps, /*min_lr=*/0.001);
  train::RunSettings settings;
  settings.Add("model", "linear_3_2", /*fixed=*/true);
  settings.Add("precision", f16 ? "f16" : "f32", true);
  settings.Add("optimizer", opt.name, true);
  settings.Add("lr", opt.lr, /*fixed=*/false);
  run.state = std::make_unique<train::RunState>(*run.model, *run.optimizer, *run.schedule,
                                                std::move(settings), kFuzzRunSteps);
  return run;
}

train::StepStats TrainFuzzRun(FuzzRun& run) {
  // Small values: f16 gradients times PyTorch's initial scale (65536) stay finite, so the steps
  // are taken and AdamW has moments to checkpoint.
  const RawTensor x = RawTensor::FromVector<float>(
      {0.1f, 0.2f, 0.3f, -0.1f, 0, 0.1f, 0.2f, 0.2f, -0.2f, 0.05f, 0, -0.1f}, {4, 3});
  const RawTensor y =
      RawTensor::FromVector<float>({0.1f, 0, 0, 0.1f, 0.1f, 0.1f, -0.1f, 0}, {4, 2});
  train::StepStats stats =
      train::TrainStep(*run.optimizer, *run.schedule, run.dtype, /*max_grad_norm=*/1.0,
                       [&] { return nn::MseLoss((*run.model)(Tensor(x.to(run.dtype))), y); });
  run.state->Advance(stats, 0);
  return stats;
}

}  // namespace tg::fuzz
