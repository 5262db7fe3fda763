#include "train/run.h"

#include <algorithm>
#include <csignal>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "train/checkpoint.h"
#include "train/flags.h"
#include "train/fp8_setup.h"
#include "train/run_main.h"
#include "train/stop_signal.h"
#include "train/user_path.h"

namespace tg::train {

absl::StatusOr<std::unique_ptr<Run>> Run::Start(const RunOptions& options) {
  KeepFreedMemoryInProcess();
  StopSignal::Install();
  absl::StatusOr<Device> device = CheckDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  KernelOptions kernels = options.kernels;
  kernels.allow_tf32 = absl::GetFlag(FLAGS_tf32);
  SetKernelOptions(kernels);
  std::unique_ptr<Run> run(new Run(options));
  run->checkpoint_dir_ = ResolveUserPath(absl::GetFlag(FLAGS_checkpoint_dir));
  RunStartOptions start;
  start.parallel = {absl::GetFlag(FLAGS_world_size), absl::GetFlag(FLAGS_rank),
                    absl::GetFlag(FLAGS_rdzv), absl::GetFlag(FLAGS_zero_stage),
                    absl::GetFlag(FLAGS_grad_accum_steps)};
  start.batch_size = options.batch_size;
  start.micro_batch_size = options.micro_batch_size;
  start.default_batch_size = options.default_batch_size;
  start.resume = absl::GetFlag(FLAGS_resume);
  start.checkpoint_dir = run->checkpoint_dir_;
  absl::StatusOr<RunStart> started = StartRun(start, *device);
  if (!started.ok()) return started.status();
  run->dp_ = std::move(started->dp);
  run->batch_ = started->batch;
  run->resume_ = started->resume;
  return run;
}

absl::Status Run::Prepare(std::shared_ptr<nn::Module> model, PrepareOptions options) {
  options_ = std::move(options);
  DataParallel& dp = *dp_;
  absl::StatusOr<std::vector<std::string>> overrides =
      settings_.ParseOverrides(run_options_.overrides, resume_);
  if (!overrides.ok()) return overrides.status();
  // Ranks that disagree would fail inside a collective (or train different things): compared
  // before DDP's first broadcast.
  std::vector<std::string> fingerprint = {absl::StrCat("resume=", resume_ ? "yes" : "no")};
  fingerprint.insert(fingerprint.end(), options_.data_fingerprint.begin(),
                     options_.data_fingerprint.end());
  fingerprint.push_back(absl::StrCat("zero_stage=", dp.zero_stage()));
  fingerprint.push_back(absl::StrCat("grad_accum_steps=", dp.grad_accum_steps()));
  if (absl::Status s = dp.CheckSameRun(RunFingerprint(settings_, *model, fingerprint)); !s.ok()) {
    return s;
  }
  dp.Wrap(model, options_.zero_units);  // before the optimizer: DDP's epilogue runs first
  if (resume_ && dp.sharded_parameters()) {
    // ZeRO stage 3 shards the weights it is built with: the checkpoint's come first.
    if (absl::Status s = LoadModelForResume(checkpoint_dir_, settings_, *overrides, *model);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::vector<Tensor>> fp8_weights =
      options_.fp8_weights ? options_.fp8_weights() : std::vector<Tensor>{};
  if (!fp8_weights.ok()) return fp8_weights.status();
  absl::StatusOr<std::unique_ptr<amp::Fp8Training>> fp8 =
      MakeFp8Training(options_.precision, std::move(*fp8_weights), dp.AmaxReducer());
  if (!fp8.ok()) return fp8.status();
  fp8_ = std::move(*fp8);
  forward_precision_.emplace(options_.precision.dtype, fp8_.get());
  PrecisionConfig precision{options_.precision.dtype, absl::GetFlag(FLAGS_loss_scaler),
                            dp.ReduceFoundInf()};
  options_.optimizer.muon = MuonFlags();
  absl::StatusOr<std::unique_ptr<amp::TrainingOptimizer>> opt =
      dp.MakeOptimizer(options_.optimizer, precision);
  if (!opt.ok()) return opt.status();
  optimizer_ = std::move(*opt);
  schedule_ = options_.schedule(optimizer_->optimizer());

  // Checkpoints and resume: every rank resumes from the checkpoint; only rank 0 writes them,
  // into a directory checked before the first step.
  save_dir_ = dp.is_main() ? checkpoint_dir_ : "";
  if (absl::Status s = PrepareCheckpointDir(save_dir_); !s.ok()) return s;
  state_ =
      std::make_unique<RunState>(*model, *optimizer_, *schedule_, settings_, options_.total_steps);
  state_->set_sharding(dp.sharding());
  std::vector<std::string> changes;
  if (resume_) {
    std::map<std::string, std::string> meta;
    absl::StatusOr<StateDict> ckpt = state_->Resume(checkpoint_dir_, *overrides, &meta, &changes);
    if (!ckpt.ok()) return ckpt.status();
    if (fp8_ != nullptr) {
      if (absl::Status s = LoadFp8State(*ckpt, checkpoint_dir_, *fp8_); !s.ok()) return s;
    }
    if (options_.resume_data) {
      if (absl::Status s = options_.resume_data(*ckpt, meta); !s.ok()) return s;
    }
    ApplyOptimizerOverrides(options_.optimizer, *overrides, *optimizer_, *schedule_);
  }

  // Metrics and progress.
  if (absl::Status s = OpenMetrics(dp.is_main() ? absl::GetFlag(FLAGS_metrics) : "",
                                   resume_ ? std::optional<int64_t>(step()) : std::nullopt,
                                   WithFp8Columns(options_.metric_columns, fp8_.get()), &metrics_);
      !s.ok()) {
    return s;
  }
  ProgressOptions progress;
  progress.total_steps = options_.total_steps;
  progress.print_every = absl::GetFlag(FLAGS_print_every);
  progress.unit = options_.throughput_unit;
  progress.out = dp.log();
  progress_ = std::make_unique<ProgressReporter>(progress);
  if (!changes.empty()) {
    progress_->Println(absl::StrCat("resuming with changed settings (--override): ",
                                    absl::StrJoin(changes, ", ")));
  }
  // What --batch_size means (the global batch, not a per-pass micro-batch): the first output
  // line, or the second after the --override changes of a resumed run.
  progress_->Println(batch_.Describe(options_.batch_items.c_str()));
  progress_->Println(absl::StrCat(
      model->to_string(), "training ", settings_.ToString(), options_.training_line_tail,
      step() > 0 ? absl::StrCat(", resuming after step ", step()) : ""));
  divergence_.emplace(optimizer_->scaler().options().dynamic,
                      absl::GetFlag(FLAGS_max_skipped_in_a_row));
  if (resume_) {
    divergence_->set_loaded_from(CheckpointPath(checkpoint_dir_), step());
  } else if (!options_.loaded_from.empty()) {
    divergence_->set_loaded_from(options_.loaded_from, 0);
  }
  last_report_ = progress_->ElapsedSeconds();
  return absl::OkStatus();
}

StepRecord Run::Step(const std::function<Tensor(int64_t)>& loss, int64_t items,
                     double max_grad_norm) {
  StepStats stats = TrainStep(*optimizer_, *schedule_, *forward_precision_, max_grad_norm, loss,
                              dp_->accumulation());
  agreed_ = dp_->Agree(stats.loss, StopSignal::signal_number());
  stats.loss = agreed_->mean_loss;
  last_skipped_ = stats.result.skipped;
  StepRecord record = state_->Advance(stats, progress_->ElapsedSeconds());
  record.items_per_second =
      static_cast<double>(items) / std::max(1e-9, record.elapsed_seconds - last_report_);
  return record;
}

StateDict Run::CheckpointEntries() const {
  StateDict entries = Fp8State(fp8_.get());
  if (options_.data_state) entries.Merge("", options_.data_state());
  return entries;
}

std::map<std::string, std::string> Run::CheckpointMetadata() const {
  return options_.metadata ? options_.metadata() : std::map<std::string, std::string>{};
}

std::optional<int> Run::EndStep(const StepRecord& record, std::map<std::string, double> extras,
                                bool save) {
  progress_->Report(record);
  last_report_ = progress_->ElapsedSeconds();  // evaluation time is not training throughput
  if (fp8_ != nullptr) AddFp8Metrics(*fp8_, extras);
  if (metrics_) {
    if (absl::Status s = metrics_->Write(record, extras); !s.ok()) return Fail(s);
  }
  const int64_t at = step();
  // A diverged run stops before its state could overwrite the last good checkpoint.
  if (absl::Status s = divergence_->Check(at, record.loss, last_skipped_); !s.ok()) {
    progress_->Finish();
    return Fail(s);
  }
  const int64_t every = run_options_.checkpoint_every;
  if (save || (every > 0 && at % every == 0)) {
    if (absl::Status s = state_->Save(save_dir_, CheckpointEntries(), CheckpointMetadata());
        !s.ok()) {
      return Fail(s);
    }
  }
  const int64_t stop_at = absl::GetFlag(FLAGS_stop_at_step);
  if (stop_at > 0 && at == stop_at) raise(SIGTERM);
  StopRequest stop = agreed_->stop;  // a single process also stops at once on its own
  if (!dp_->distributed()) stop.signal = StopSignal::signal_number();
  if (stop.signal != 0) {
    return state_->SaveAndStop(save_dir_, CheckpointEntries(), CheckpointMetadata(), *progress_,
                               stop);
  }
  return std::nullopt;
}

absl::Status Run::CheckSkipped() const {
  return CheckSkippedFraction(step(), skipped(), absl::GetFlag(FLAGS_max_skipped_fraction));
}

int Run::Fail(const absl::Status& status) const {
  return train::Fail(run_options_.program, status);
}

}  // namespace tg::train
