// What every training binary shares: resolving user paths under `bazel run`, the precision and
// loss-scaler choice, the optimizer by name, stop requests from Ctrl-C / SIGTERM, and checkpoints
// (one safetensors file holding the model, the optimizer with its masters and scaler, the data
// order and the generators, so a resumed run continues bit for bit).
//
//   tg::train::StopSignal::Install();
//   auto mp = tg::train::MakeMixedPrecisionOptimizer(model->parameters(), {...});
//   for (...) {
//     ...
//     if (tg::train::StopSignal::requested()) { SaveCheckpoint(...); return 128 + signal; }
//   }
#ifndef TAPEGRAD_TOOLS_TRAIN_RUN_H_
#define TAPEGRAD_TOOLS_TRAIN_RUN_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "amp/autocast.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/variable.h"
#include "nn/module.h"
#include "optim/lr_schedule.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/generator.h"
#include "tensor/state_dict.h"
#include "tools/train/metrics.h"
#include "tools/train/progress.h"
#include "tools/train/step_record.h"

namespace tg::train {

// Allocator policy for a training process: glibc returns large freed blocks (activations,
// gradients) to the kernel and page-faults them back in on the next step; this keeps them in the
// process (the mmap threshold raised to glibc's 32 MiB maximum, the trim threshold to 1 GiB), which
// removes most of the system time of a CPU training step. Call once at the start of main().
void KeepFreedMemoryInProcess();

// A path given on the command line, made absolute against the directory where `bazel run` was
// typed (BUILD_WORKING_DIRECTORY), or the current directory outside bazel run.
std::string ResolveUserPath(const std::string& path);

// --device: "cpu", "cuda" (= cuda:0) or "cuda:N". InvalidArgument for another name,
// FailedPrecondition naming the reason when the CUDA device cannot be used (no GPU, no such
// device). The training binaries then build the model on the CPU, move it with Module::to and
// make the optimizer afterwards, so masters and moments live on the device too; batches are
// read on the host and copied per step.
absl::StatusOr<Device> CheckDevice(const std::string& device);

// The same tensors on the CPU (device tensors copied, host ones shared): what checkpoints write.
StateDict ToHost(const StateDict& state);

// Opens the metrics CSV `path` (a user path; empty: leaves *out empty). When resuming, rows after
// `resume_step` are dropped first.
absl::Status OpenMetrics(const std::string& path, std::optional<int64_t> resume_step,
                         const std::vector<std::string>& extra_columns,
                         std::optional<MetricsWriter>* out);

// "f32" | "f16" | "bf16".
absl::StatusOr<DType> ParsePrecision(const std::string& name);

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | adam | sgd
  double lr = 1e-3;
  double weight_decay = 0;
  double momentum = 0.9;  // sgd
  double beta2 = 0.999;   // adam, adamw
  // Weight decay only on parameters with 2 or more dims (matrices, embeddings, conv kernels),
  // none on biases and norm weights: nanoGPT's and llm.c's grouping. Group 0 holds the decayed.
  bool decay_matrices_only = true;
};

struct PrecisionConfig {
  DType dtype = kF32;
  // "auto" (pytorch for f16, none otherwise) | "pytorch" | "megatron" | "deepspeed" | "none";
  // each with its library's default settings.
  std::string loss_scaler = "auto";
  // Data-parallel runs: makes found_inf the max over the ranks (DataParallel::ReduceFoundInf).
  std::function<void(const Tensor& found_inf)> reduce_found_inf;
};

// The optimizer over `params` wrapped in a MixedPrecisionOptimizer (f32 masters for f16/bf16
// parameters; f32 parameters are their own masters), with the scaler preset. InvalidArgument
// names an unknown optimizer or scaler.
absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Variable>& params, const OptimizerConfig& optimizer,
    const PrecisionConfig& precision);

// Autocast to `dtype` for the forward pass of a low-precision run; nothing for f32.
class PrecisionScope {
 public:
  explicit PrecisionScope(DType dtype) {
    if (dtype != kF32) guard_.emplace(dtype);
  }

 private:
  std::optional<amp::AutocastGuard> guard_;
};

struct StepStats {
  double loss = 0;  // unscaled
  double lr = 0;    // of parameter group 0, used by this step
  double grad_norm =
      0;  // total norm of the unscaled gradients before clipping (inf/NaN on overflow)
  amp::StepResult result;
};

// One optimizer step: zero_grad, `loss_fn()` under PrecisionScope(dtype), backward through the
// mixed-precision optimizer, clipping to `max_grad_norm` (> 0; 0 only measures the norm), step,
// and the schedule's step (which does not advance when the optimizer step was skipped).
StepStats TrainStep(amp::MixedPrecisionOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable()>& loss_fn);

// SIGINT / SIGTERM set a flag (the first signal only; a second one kills the process as usual)
// that the training loop polls between steps, so it can save a checkpoint and exit cleanly.
class StopSignal {
 public:
  static void Install();
  static bool requested();
  static int signal_number();  // 0 while none was received
};

// The generator state as metadata text ("seed:offset", exact for every 64-bit value).
std::string GeneratorStateToString(const Generator::State& state);
absl::StatusOr<Generator::State> GeneratorStateFromString(const std::string& text);

// One checkpoint file: tensors and scalars of `state` (prefixed by the caller: "model.",
// "optim.", "data.", ...) and string metadata (configuration, generator states). Written to a
// temporary file and renamed, creating `dir` if needed. Returns the file's path.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const StateDict& state,
                                           const std::map<std::string, std::string>& metadata);
// Reads "<dir>/checkpoint.safetensors"; NotFound when there is none.
absl::StatusOr<StateDict> LoadCheckpoint(const std::string& dir,
                                         std::map<std::string, std::string>* metadata);
std::string CheckpointPath(const std::string& dir);

// What every run checkpoints and counts: the model, the optimizer (masters, moments, scaler), the
// schedule, the step and the skipped steps, under the run's configuration text (its identity: a
// checkpoint of another configuration is refused). The binary adds its data state.
class RunState {
 public:
  RunState(nn::Module& model, amp::MixedPrecisionOptimizer& optimizer, optim::LrSchedule& schedule,
           std::string config)
      : model_(model), optimizer_(optimizer), schedule_(schedule), config_(std::move(config)) {}

  int64_t step() const { return step_; }
  int64_t skipped() const { return skipped_; }
  const std::string& config() const { return config_; }

  // Counts a finished step and returns its record (the caller fills epoch and throughput).
  StepRecord Advance(const StepStats& stats, double elapsed_seconds);

  // Writes <dir>/checkpoint.safetensors with "model.", "optim.", "schedule." and the counters,
  // plus the caller's `extra` entries and metadata (device tensors are copied to the host, so
  // a checkpoint of a CUDA run resumes on either device). Does nothing when dir is empty.
  absl::Status Save(const std::string& dir, const StateDict& extra,
                    std::map<std::string, std::string> metadata) const;
  // Restores what Save wrote and returns the whole checkpoint (for the caller's entries) with its
  // metadata. FailedPrecondition for another configuration, DataLoss for content that does not
  // fit the model or optimizer; nothing is half-restored in the model on error.
  absl::StatusOr<StateDict> Resume(const std::string& dir,
                                   std::map<std::string, std::string>* metadata);

  // After a stop signal: saves, prints where the checkpoint went (or that none was written), ends
  // the progress line and returns the exit code 128 + signal (1 if saving failed).
  int SaveAndStop(const std::string& dir, const StateDict& extra,
                  std::map<std::string, std::string> metadata, ProgressReporter& progress) const;

 private:
  nn::Module& model_;
  amp::MixedPrecisionOptimizer& optimizer_;
  optim::LrSchedule& schedule_;
  std::string config_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
};

// Prints "<name>: <message>" for a failed status and returns exit code 1.
int Fail(const char* name, const absl::Status& status);
// Runs a training binary's body; a tg::Error escaping it becomes Fail(name, ...).
int RunMain(const char* name, const std::function<int()>& body);

}  // namespace tg::train

#endif  // TAPEGRAD_TOOLS_TRAIN_RUN_H_
