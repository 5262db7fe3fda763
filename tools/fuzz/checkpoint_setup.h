// The training runs that the checkpoint fuzz target resumes into and that checkpoint_seed saves
// its valid seed checkpoints from: a Linear(3, 2) inside a Sequential, a MixedPrecisionOptimizer
// made by train::MakeMixedPrecisionOptimizer, a CosineWithWarmupLr and the train::RunState over
// them, as the training binaries build them (tools/train_mnist.cc).
//
//   tg::fuzz::FuzzRun run = tg::fuzz::MakeFuzzRun(tg::fuzz::RunKind::kF16AdamW);
//   absl::StatusOr<tg::StateDict> ckpt = run.state->Resume(dir, {"lr"}, &metadata, &changes);
#ifndef TAPEGRAD_TOOLS_FUZZ_CHECKPOINT_SETUP_H_
#define TAPEGRAD_TOOLS_FUZZ_CHECKPOINT_SETUP_H_

#include <memory>

#include "amp/mixed_precision_optimizer.h"
#include "nn/layers.h"
#include "optim/lr_schedule.h"
#include "train/optimizer_setup.h"
#include "train/run_state.h"
#include "train/train_step.h"

namespace tg::fuzz {

enum class RunKind {
  kF16AdamW,  // f16 parameters, f32 masters, AdamW, PyTorch's dynamic loss scaler
  kF32Sgd,    // f32 parameters (their own masters), SGD with momentum, constant scale
};
inline constexpr RunKind kRunKinds[] = {RunKind::kF16AdamW, RunKind::kF32Sgd};

struct FuzzRun {
  DType dtype = kF32;
  nn::Sequential model{nullptr};
  std::unique_ptr<amp::MixedPrecisionOptimizer> optimizer;
  std::unique_ptr<optim::CosineWithWarmupLr> schedule;
  // Settings: model (fixed), precision (fixed), optimizer (fixed), lr (overridable).
  std::unique_ptr<train::RunState> state;
};

// The runs' total steps (the schedule's horizon, the bound of a checkpoint's 'step').
inline constexpr int64_t kFuzzRunSteps = 10;

// A fresh run (deterministic weights). Aborts if the optimizer cannot be made.
FuzzRun MakeFuzzRun(RunKind kind);

// One TrainStep on a fixed batch of 4 rows (MSE loss), counted by the RunState.
train::StepStats TrainFuzzRun(FuzzRun& run);

}  // namespace tg::fuzz

#endif  // TAPEGRAD_TOOLS_FUZZ_CHECKPOINT_SETUP_H_
