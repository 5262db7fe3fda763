// One training run's protocol, in one place: a training binary brings its model, its data and
// its evaluation; Run does the rest in the order every run needs (the device, the world and the
// batch split, the settings checks, data parallelism, FP8, the optimizer and schedule, the
// checkpoint directory, resume, metrics, the progress line, divergence, checkpoints and stops).
//
//   absl::StatusOr<std::unique_ptr<train::Run>> run_or = train::Run::Start(options);
//   train::Run& run = **run_or;
//   ... the data, the model (to run.dtype(), run.device()), run.settings().Add(...) ...
//   if (absl::Status s = run.Prepare(model, prepare); !s.ok()) return run.Fail(s);
//   while (run.step() < run.total_steps()) {
//     auto batch = batches.Next(run.dp().rank(), run.dp().world_size());
//     train::StepRecord record = run.Step(loss_of_micro_batch, items, max_grad_norm);
//     record.epoch = ...;
//     std::map<std::string, double> extras;
//     if (run.evaluates_here() && eval_now) extras = {{"val_loss", Evaluate(...)}};
//     if (std::optional<int> exit = run.EndStep(record, extras, save_now)) return *exit;
//   }
//   run.FinishProgress();
//
// The binaries' own flags with other defaults (--batch_size, --micro_batch_size,
// --checkpoint_every, --override) come in RunOptions; the shared ones (train/flags.h) are read
// here.
#ifndef TAPEGRAD_TRAIN_RUN_H_
#define TAPEGRAD_TRAIN_RUN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "amp/fp8.h"
#include "amp/training_optimizer.h"
#include "nn/module.h"
#include "optim/lr_schedule.h"
#include "tensor/device.h"
#include "tensor/kernel_options.h"
#include "tensor/state_dict.h"
#include "train/data_parallel.h"
#include "train/divergence.h"
#include "train/flag_values.h"
#include "train/metrics.h"
#include "train/optimizer_setup.h"
#include "train/progress.h"
#include "train/run_settings.h"
#include "train/run_state.h"
#include "train/step_record.h"
#include "train/train_step.h"

namespace tg::train {

// What a binary tells Run::Start about itself.
struct RunOptions {
  const char* program = "";  // names failures: "train_gpt: ..."
  KernelOptions kernels;     // allow_tf32 is set from --tf32
  int64_t default_batch_size = 1;
  std::optional<int64_t> batch_size;        // its --batch_size (global)
  std::optional<int64_t> micro_batch_size;  // its --micro_batch_size
  int64_t checkpoint_every = 0;             // its --checkpoint_every (0: only where it says)
  std::string overrides;                    // its --override
};

// What Run::Prepare needs besides the model.
struct PrepareOptions {
  Precision precision;  // --precision, parsed by the binary where it checks it
  std::vector<std::shared_ptr<nn::Module>> zero_units;  // ZeRO stage 3 (DataParallel::Wrap)
  // The weights whose GEMMs FP8 runs (asked after the model is wrapped: ZeRO stage 3 replaces
  // them); an error ends the run.
  std::function<absl::StatusOr<std::vector<Tensor>>()> fp8_weights;
  OptimizerConfig optimizer;
  // The schedule over the optimizer's groups (the run keeps it).
  std::function<std::unique_ptr<optim::LrSchedule>(optim::Optimizer&)> schedule;
  int64_t total_steps = 0;
  // Fingerprint lines of the data (DataParallel::CheckSameRun), after "resume=".
  std::vector<std::string> data_fingerprint;
  // Restores the binary's own state (data position, generators) from a resumed checkpoint and its
  // metadata; what it writes into a checkpoint: entries (beside the FP8 state) and metadata.
  std::function<absl::Status(const StateDict& checkpoint,
                             std::map<std::string, std::string>& metadata)>
      resume_data;
  std::function<StateDict()> data_state;
  std::function<std::map<std::string, std::string>()> metadata;
  std::vector<std::string> metric_columns;  // beside the FP8 columns
  std::string throughput_unit;              // "img/s"
  std::string batch_items;                  // "images": what the batch line counts
  std::string training_line_tail;           // after "training <settings>" on the first lines
  std::string loaded_from;  // the file the weights came from (divergence advice), or ""
};

class Run {
 public:
  // The start every run shares, in the order of its checks and first lines: the allocator
  // policy and the stop signals, --device, the kernel options, the world, the batch split and
  // --resume (StartRun).
  static absl::StatusOr<std::unique_ptr<Run>> Start(const RunOptions& options);

  DataParallel& dp() { return *dp_; }
  Device device() const { return dp_->device(); }
  bool resume() const { return resume_; }
  const BatchSizes& batch() const { return batch_; }
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  // The settings a checkpoint and the other ranks must agree with; the binary adds them before
  // Prepare.
  RunSettings& settings() { return settings_; }

  // Everything between the model and the first step: --override parsed against the settings,
  // the ranks' fingerprints compared, the model wrapped (DDP or ZeRO; stage 3 loads a resumed
  // checkpoint's weights first), FP8, the optimizer and schedule, the checkpoint directory, the
  // resume (the binary's state through resume_data, then optimizer overrides), the metrics file,
  // the progress line and its first lines, the divergence check. The model is on device() in its
  // training dtype.
  absl::Status Prepare(std::shared_ptr<nn::Module> model, PrepareOptions options);

  int64_t step() const { return state_->step(); }
  int64_t skipped() const { return state_->skipped(); }
  int64_t total_steps() const { return options_.total_steps; }
  const ForwardPrecision& forward_precision() const { return *forward_precision_; }
  amp::Fp8Training* fp8() const { return fp8_.get(); }
  ProgressReporter& progress() { return *progress_; }
  // Stage 3: a forward is a collective, so every rank evaluates (rank 0 reports).
  bool evaluates_here() const { return dp_->is_main() || dp_->sharded_parameters(); }

  // One optimizer step over the micro-batches (`loss(k)`: the loss of micro-batch k), the loss
  // averaged over the ranks; `items` (this step's images or tokens) sets the throughput.
  StepRecord Step(const std::function<Tensor(int64_t)>& loss, int64_t items, double max_grad_norm);
  // After the binary's evaluation: the progress line, the metrics row (with `extras` and the FP8
  // columns), the divergence check, a checkpoint (when `save`, or every checkpoint_every steps),
  // --stop_at_step and stop signals. Returns the exit code when the run ends here.
  std::optional<int> EndStep(const StepRecord& record, std::map<std::string, double> extras,
                             bool save);
  // The end of the loop: the summary line.
  void FinishProgress() { progress_->Finish(); }
  // A run that skipped most of its steps did not train (--max_skipped_fraction).
  absl::Status CheckSkipped() const;
  int Fail(const absl::Status& status) const;

 private:
  explicit Run(RunOptions options) : run_options_(std::move(options)) {}
  StateDict CheckpointEntries() const;
  std::map<std::string, std::string> CheckpointMetadata() const;

  RunOptions run_options_;
  PrepareOptions options_;
  std::unique_ptr<DataParallel> dp_;
  BatchSizes batch_;
  bool resume_ = false;
  std::string checkpoint_dir_;
  std::string save_dir_;  // checkpoint_dir_ on rank 0, "" elsewhere
  RunSettings settings_;
  std::unique_ptr<amp::Fp8Training> fp8_;
  std::optional<ForwardPrecision> forward_precision_;
  std::unique_ptr<amp::TrainingOptimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<RunState> state_;
  std::optional<MetricsWriter> metrics_;
  std::unique_ptr<ProgressReporter> progress_;
  std::optional<DivergenceCheck> divergence_;
  std::optional<DataParallel::Agreement> agreed_;  // of the last Step
  bool last_skipped_ = false;                      // the last Step skipped its update
  double last_report_ = 0;
};

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RUN_H_
