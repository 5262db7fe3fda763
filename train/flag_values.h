// The training binaries' flag values: --device and --precision parsed, every numeric flag checked
// against its documented range, the defaults that depend on other flags, and the batch of one
// optimizer step (--batch_size, --micro_batch_size, --grad_accum_steps, the world size).
#ifndef TAPEGRAD_TRAIN_FLAG_VALUES_H_
#define TAPEGRAD_TRAIN_FLAG_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/device.h"
#include "tensor/dtype.h"

namespace tg::train {

// --device: "cpu", "cuda" (= cuda:0) or "cuda:N". InvalidArgument for another name,
// FailedPrecondition naming the reason when the CUDA device cannot be used (no GPU, no such
// device). The training binaries then build the model on the CPU, move it with Module::to and
// make the optimizer afterwards, so masters and moments live on the device too; batches are
// read on the host and copied per step.
absl::StatusOr<Device> CheckDevice(const std::string& device);

// --precision: the dtype the model and its autocast run in, and whether its Linear layers' GEMMs
// run in FP8 ("fp8": bf16 with FP8 GEMMs, Transformer Engine's fp8_autocast inside bf16
// autocast; the recipe comes from --fp8_recipe, train/fp8_setup.h).
struct Precision {
  DType dtype = kF32;
  bool fp8 = false;
};
// "f32" | "f16" | "bf16" | "fp8"; InvalidArgument naming the value otherwise.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

// A numeric flag and its documented valid range: [min, max], or with one bound excluded. NaN is
// outside every range, and infinity outside every range with a finite bound.
struct FlagRange {
  enum class Open { kNone, kMin, kMax };
  const char* name;  // without "--"
  double value;
  double min;
  double max;
  Open open = Open::kNone;
};
// InvalidArgument for the first flag outside its range: "--dropout=-0.1 is outside its valid
// range [0, 1)".
absl::Status CheckFlagRanges(const std::vector<FlagRange>& flags);

// Defaults that depend on other flags. A default never makes a valid command fail: a flag the
// user did not give keeps its old default where that fits the flags given (so no command that
// ran before changes its meaning) and adapts where it does not; an explicit value is still
// checked against its range, naming it. Each binary's --help says the rule.
//
// (train_gpt's --n_embd: 64, or the next multiple of --n_head; --block_size: 64, or the context
// of --init_from's file when shorter; the default --batch_size: see ResolveBatchSizes.)
// train_gpt's --warmup_steps when not given: 100, or steps / 10 when --steps is below 100
// (--steps=50 warms up for 5 steps instead of failing on a warmup longer than the run; nanoGPT's
// warmup_iters is a fixed 2000 that its loop never checks against max_iters).
int64_t DefaultWarmupSteps(int64_t steps);
// train_gpt's --min_lr when not given: 3e-4, or lr / 10 when --lr is below 3e-4 (nanoGPT's
// ratio, min_lr 6e-5 for lr 6e-4), so that it never exceeds the lr.
double DefaultMinLr(double lr);

// The batch of one optimizer step. --batch_size is the GLOBAL batch: the rows of one optimizer
// step, summed over the --grad_accum_steps micro-batches and the --world_size ranks (DeepSpeed's
// train_batch_size; nanoGPT's and transformers' batch_size is the micro-batch, which
// --micro_batch_size gives here). The first output line says which is which.
struct BatchSizes {
  int64_t global = 0;  // rows per optimizer step
  int64_t micro = 0;   // rows per forward/backward pass on one rank
  int64_t grad_accum_steps = 1;
  int64_t world_size = 1;
  // "batch: global 64 sequences per step = micro-batch 16 x 4 accumulation steps x 1 rank"
  std::string Describe(const char* rows) const;
};
// --batch_size and --micro_batch_size (each as given, nullopt when not), with the binary's
// default global batch. Both given: they must agree (global = micro x accumulation x ranks).
// Only --micro_batch_size: global = micro x accumulation x ranks. Only --batch_size: it must
// split into accumulation x ranks equal micro-batches. Neither: the default rounded down to a
// multiple of accumulation x ranks (at least one row per micro-batch). InvalidArgument naming the
// flags and values otherwise.
absl::StatusOr<BatchSizes> ResolveBatchSizes(std::optional<int64_t> batch_size,
                                             std::optional<int64_t> micro_batch_size,
                                             int64_t default_batch_size, int64_t grad_accum_steps,
                                             int64_t world_size);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_FLAG_VALUES_H_
