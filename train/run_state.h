// What every run checkpoints and counts (RunState): the model, the optimizer with its masters and
// scaler, the schedule, the step and the skipped steps, saved to one checkpoint file and resumed
// bit for bit after its counters, settings and values are checked.
//
//   tg::train::RunState run(*model, *opt, schedule, std::move(settings), steps);
//   if (resume) { auto ckpt = run.Resume(dir, overrides, &metadata, &changes); ... }
//   for (...) {
//     record = run.Advance(tg::train::TrainStep(...), elapsed);
//     if (tg::train::StopSignal::requested()) return run.SaveAndStop(dir, extra, meta, progress,
//     stop);
//   }
#ifndef TAPEGRAD_TRAIN_RUN_STATE_H_
#define TAPEGRAD_TRAIN_RUN_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "amp/training_optimizer.h"
#include "nn/module.h"
#include "optim/lr_schedule.h"
#include "tensor/state_dict.h"
#include "train/progress.h"
#include "train/run_settings.h"
#include "train/step_record.h"
#include "train/stop_signal.h"
#include "train/train_step.h"

namespace tg::train {

// What every run checkpoints and counts: the model, the optimizer (masters, moments, scaler), the
// schedule, the step and the skipped steps, under the run's settings (see RunSettings). The
// binary adds its data state.
class RunState {
 public:
  RunState(nn::Module& model, amp::TrainingOptimizer& optimizer, optim::LrSchedule& schedule,
           RunSettings settings, int64_t total_steps)
      : model_(model),
        optimizer_(optimizer),
        schedule_(schedule),
        settings_(std::move(settings)),
        total_steps_(total_steps) {}

  // How a sharded optimizer (ZeRO) changes saving and resuming.
  struct Sharding {
    // The model's whole state_dict (ZeRO stage 3 gathers the parameters); null:
    // model.state_dict().
    std::function<StateDict()> model_state;
    // The optimizer's state_dict (and model_state) are collectives: Save calls them on every
    // rank, also on the ranks that write nothing (an empty dir).
    bool collective = false;
    // The model was loaded from the checkpoint before the optimizer sharded it
    // (LoadModelForResume; ZeRO stage 3): Resume does not load it again.
    bool model_preloaded = false;
  };
  void set_sharding(Sharding sharding) { sharding_ = std::move(sharding); }

  int64_t step() const { return step_; }
  int64_t skipped() const { return skipped_; }
  const RunSettings& settings() const { return settings_; }

  // Counts a finished step and returns its record (the caller fills epoch and throughput).
  StepRecord Advance(const StepStats& stats, double elapsed_seconds);

  // Writes <dir>/checkpoint.safetensors with "model.", "optim.", "schedule." and the counters,
  // plus the caller's `extra` entries and metadata (device tensors are copied to the host, so
  // a checkpoint of a CUDA run resumes on either device). Does nothing when dir is empty.
  // FailedPrecondition, writing nothing, when a weight, master or moment is not finite: the last
  // good checkpoint is never replaced by a diverged state (FindNonFinite, one pass over the host
  // copy).
  absl::Status Save(const std::string& dir, const StateDict& extra,
                    std::map<std::string, std::string> metadata) const;
  // Restores what Save wrote and returns the whole checkpoint (for the caller's entries) with its
  // metadata. First compares the settings (RunSettings::CheckResume with `overrides`; the allowed
  // changes go to *changes) and validates the counters: 'step' an integer in [0, total_steps],
  // 'skipped_steps' one in [0, step], the schedule's updates equal to step - skipped_steps and
  // the loss scaler's iterations equal to step. FailedPrecondition for changed settings,
  // DataLoss naming the key and value of a bad number or content that does not fit the model or
  // optimizer; nothing is half-restored in the model on error. Also before anything is restored:
  // every floating tensor is finite (weights, masters, moments; DataLoss naming the tensor and
  // the file), every optimizer option other than the lr equals this run's (beta1, eps, ...: no
  // setting changes them; weight_decay and beta2 may differ when --override names them), each
  // schedule base lr equals this run's lr (unless --override=lr), and every parameter's
  // optimizer step count equals the optimizer updates, 'step' - 'skipped_steps'.
  absl::StatusOr<StateDict> Resume(const std::string& dir,
                                   const std::vector<std::string>& overrides,
                                   std::map<std::string, std::string>* metadata,
                                   std::vector<std::string>* changes);

  // After a stop request: saves, prints why and where the checkpoint went (or that none was
  // written), ends the progress line and returns the exit code 128 + signal (1 if saving failed).
  // Data parallel, every rank prints its line ("rank 1: stopped by signal 15 (Terminated)
  // received by rank 0 after step 7"): rank 0 through `progress`, the others on stderr.
  int SaveAndStop(const std::string& dir, const StateDict& extra,
                  std::map<std::string, std::string> metadata, ProgressReporter& progress,
                  const StopRequest& stop) const;

 private:
  // Resume's checks of the values it restores (see Resume), before anything is restored.
  absl::Status CheckRestoredValues(const std::string& dir, const StateDict& ckpt, int64_t updates,
                                   const std::vector<std::string>& overrides) const;

  nn::Module& model_;
  amp::TrainingOptimizer& optimizer_;
  Sharding sharding_;
  optim::LrSchedule& schedule_;
  RunSettings settings_;
  int64_t total_steps_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
};

// For an optimizer that shards the model's parameters (ZeRO stage 3), which must see the
// checkpoint's weights when it is built: compares the settings as RunState::Resume does and
// loads the checkpoint's "model." entries into `model` (DataLoss when they do not fit).
absl::Status LoadModelForResume(const std::string& dir, const RunSettings& settings,
                                const std::vector<std::string>& overrides, nn::Module& model);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RUN_STATE_H_
