#include "train/run_state.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "train/checkpoint.h"
#include "train/format_number.h"

namespace tg::train {

StepRecord RunState::Advance(const StepStats& stats, double elapsed_seconds) {
  ++step_;
  skipped_ += stats.result.skipped ? 1 : 0;
  StepRecord record;
  record.step = step_;
  record.loss = stats.loss;
  record.lr = stats.lr;
  record.grad_norm = stats.grad_norm;
  record.loss_scale = stats.result.scale;
  record.loss_scale_next = stats.loss_scale_next;
  record.skipped_steps = skipped_;
  record.elapsed_seconds = elapsed_seconds;
  return record;
}

absl::Status RunState::Save(const std::string& dir, const StateDict& extra,
                            std::map<std::string, std::string> metadata) const {
  if (dir.empty() && !sharding_.collective) return absl::OkStatus();
  // A collective state is gathered on every rank; only the ranks with a dir write it.
  StateDict model_state = sharding_.model_state ? sharding_.model_state() : model_.state_dict();
  StateDict optimizer_state = optimizer_.state_dict();
  if (dir.empty()) return absl::OkStatus();
  StateDict state = extra;
  state.Merge("model.", model_state);
  state.Merge("optim.", optimizer_state);
  state.Merge("schedule.", schedule_.state_dict());
  state.scalars["step"] = static_cast<double>(step_);
  state.scalars["skipped_steps"] = static_cast<double>(skipped_);
  metadata.merge(settings_.ToMetadata());
  StateDict host = ToHost(state);
  // A non-finite state never replaces the last good checkpoint (whatever produced it: a bf16 or
  // f32 step on NaN gradients, a scaler read from a corrupt file).
  if (std::optional<std::string> bad = FindNonFinite(host)) {
    return absl::FailedPreconditionError(
        absl::StrCat("not writing a checkpoint to ", dir, " after step ", step_, ": ", *bad,
                     "; the run's state is not finite, so the last checkpoint is kept"));
  }
  return SaveCheckpoint(dir, host, metadata).status();
}

namespace {

// The checkpoint's scalar `key`, which must be an integer in [min, max]; DataLoss names the key
// and the value otherwise (`bound` says where max comes from).
absl::StatusOr<int64_t> IntegerScalar(const std::string& dir, const StateDict& ckpt,
                                      const std::string& key, int64_t min, int64_t max,
                                      const char* bound) {
  if (!ckpt.has_scalar(key)) {
    return absl::DataLossError(
        absl::StrCat("cannot resume from ", dir, ": the checkpoint has no scalar '", key, "'"));
  }
  const double v = ckpt.scalar(key);
  if (!(v >= static_cast<double>(min) && v <= static_cast<double>(max) && std::floor(v) == v)) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": '", key, "' is ",
                                            FormatNumber(v), "; expected an integer in [", min,
                                            ", ", max, "] (", bound, ")"));
  }
  return static_cast<int64_t>(v);
}

}  // namespace

absl::Status RunState::CheckRestoredValues(const std::string& dir, const StateDict& ckpt,
                                           int64_t updates,
                                           const std::vector<std::string>& overrides) const {
  const std::string where = absl::StrCat("cannot resume from ", dir, ": ");
  // A weight, master or moment that is NaN/inf cannot train (a NaN f16 master skipped every step,
  // an inf second moment froze its layer, an inf weight trained on): refused by name.
  if (std::optional<std::string> bad = FindNonFinite(ckpt)) {
    return absl::DataLossError(absl::StrCat(where, *bad, " in ", CheckpointPath(dir),
                                            " (a checkpoint's weights, master weights and "
                                            "optimizer moments must be finite)"));
  }
  auto overridden = [&](const std::string& name) {
    return std::find(overrides.begin(), overrides.end(), name) != overrides.end();
  };
  // The optimizer's options: the checkpoint records them next to the settings, and none of them
  // (beta1, eps, amsgrad, momentum, ...) is changed by training; the lr is the schedule's (its
  // base lr is checked below), weight_decay and beta2 change with --override.
  const std::vector<optim::ParamGroup>& groups = optimizer_.optimizer().param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& [name, value] : groups[g].options().named()) {
      const std::string key = absl::StrCat("optim.optimizer.param_groups.", g, ".", name);
      if (name == "lr" || overridden(name) || !ckpt.has_scalar(key)) continue;
      const double saved = ckpt.scalar(key);
      if (!(saved == value)) {
        bool overridable = false;
        for (const RunSettings::Setting& setting : settings_.items()) {
          overridable = overridable || (setting.name == name && !setting.fixed);
        }
        return absl::DataLossError(absl::StrCat(
            where, "'", key, "' is ", FormatNumber(saved), " but this run's ", name, " is ",
            FormatNumber(value), " (training never changes it: the checkpoint is corrupt",
            overridable ? absl::StrCat("; --override=", name, " changes it on purpose") : "", ")"));
      }
    }
  }
  if (!overridden("lr")) {
    const std::vector<double>& base = schedule_.base_lrs();
    for (size_t g = 0; g < base.size(); ++g) {
      const std::string key = absl::StrCat("schedule.base_lrs.", g);
      if (!ckpt.has_scalar(key)) continue;  // LrSchedule::load_state_dict names a missing one
      const double saved = ckpt.scalar(key);
      if (!(saved == base[g])) {
        return absl::DataLossError(
            absl::StrCat(where, "'", key, "' is ", FormatNumber(saved), " but this run's lr is ",
                         FormatNumber(base[g]),
                         " (the setting 'lr' agrees, so the checkpoint is corrupt; "
                         "--override=lr changes the lr on purpose)"));
      }
    }
  }
  // Every parameter's step count (Adam's bias correction) is the number of optimizer updates.
  for (const auto& [key, value] : ckpt.scalars) {
    if (!absl::StartsWith(key, "optim.optimizer.state.") || !absl::EndsWith(key, ".step")) continue;
    if (!(value == static_cast<double>(updates))) {
      return absl::DataLossError(absl::StrCat(
          where, "'", key, "' is ", FormatNumber(value), " but the run made ", updates,
          " optimizer updates ('step' - 'skipped_steps'; the counters of the checkpoint "
          "disagree)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateDict> RunState::Resume(const std::string& dir,
                                           const std::vector<std::string>& overrides,
                                           std::map<std::string, std::string>* metadata,
                                           std::vector<std::string>* changes) {
  if (dir.empty()) return absl::InvalidArgumentError("--resume needs --checkpoint_dir");
  absl::StatusOr<StateDict> ckpt = LoadCheckpoint(dir, metadata);
  if (!ckpt.ok()) return ckpt.status();
  absl::StatusOr<std::vector<std::string>> changed =
      settings_.CheckResume(dir, *metadata, overrides);
  if (!changed.ok()) return changed.status();

  // The counters, before anything is restored.
  absl::StatusOr<int64_t> step =
      IntegerScalar(dir, *ckpt, "step", 0, total_steps_, "the run's step count");
  if (!step.ok()) return step.status();
  absl::StatusOr<int64_t> skipped =
      IntegerScalar(dir, *ckpt, "skipped_steps", 0, *step, "at most 'step'");
  if (!skipped.ok()) return skipped.status();
  for (const auto& [key, expected, what] :
       {std::tuple<const char*, int64_t, const char*>{"schedule.last_step", *step - *skipped,
                                                      "'step' - 'skipped_steps'"},
        {"optim.scaler.iteration", *step, "'step'"}}) {
    absl::StatusOr<int64_t> value = IntegerScalar(dir, *ckpt, key, 0, *step, "at most 'step'");
    if (!value.ok()) return value.status();
    if (*value != expected) {
      return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": '", key, "' is ",
                                              *value, " but ", what, " is ", expected,
                                              " (the counters of the checkpoint disagree)"));
    }
  }
  if (absl::Status s = CheckRestoredValues(dir, *ckpt, *step - *skipped, overrides); !s.ok()) {
    return s;
  }
  try {
    if (!sharding_.model_preloaded) model_.load_state_dict(ckpt->Sub("model."));
    optimizer_.load_state_dict(ckpt->Sub("optim."));
    schedule_.load_state_dict(ckpt->Sub("schedule."));
  } catch (const Error& e) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": ", e.what()));
  }
  step_ = *step;
  skipped_ = *skipped;
  *changes = std::move(*changed);
  return ckpt;
}

absl::Status LoadModelForResume(const std::string& dir, const RunSettings& settings,
                                const std::vector<std::string>& overrides, nn::Module& model) {
  if (dir.empty()) return absl::InvalidArgumentError("--resume needs --checkpoint_dir");
  std::map<std::string, std::string> metadata;
  absl::StatusOr<StateDict> ckpt = LoadCheckpoint(dir, &metadata);
  if (!ckpt.ok()) return ckpt.status();
  absl::StatusOr<std::vector<std::string>> changed = settings.CheckResume(dir, metadata, overrides);
  if (!changed.ok()) return changed.status();
  if (std::optional<std::string> bad = FindNonFinite(*ckpt)) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": ", *bad, " in ",
                                            CheckpointPath(dir),
                                            " (a checkpoint's weights, master weights and "
                                            "optimizer moments must be finite)"));
  }
  try {
    model.load_state_dict(ckpt->Sub("model."));
  } catch (const Error& e) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": ", e.what()));
  }
  return absl::OkStatus();
}

int RunState::SaveAndStop(const std::string& dir, const StateDict& extra,
                          std::map<std::string, std::string> metadata, ProgressReporter& progress,
                          const StopRequest& stop) const {
  absl::Status saved = Save(dir, extra, std::move(metadata));
  const bool distributed = stop.received_by >= 0;
  std::string line = absl::StrCat(distributed ? absl::StrCat("rank ", stop.this_rank, ": ") : "",
                                  "stopped by ", stop.Describe(), " after step ", step_);
  if (!saved.ok()) {
    absl::StrAppend(&line, "; the checkpoint could not be written: ", saved.message());
  } else if (!dir.empty()) {
    absl::StrAppend(&line, "; checkpoint in ", dir, ", continue with --resume");
  } else if (!distributed || stop.this_rank == 0) {
    absl::StrAppend(&line, " (no --checkpoint_dir: nothing saved)");
  }
  progress.Println(line);
  progress.Finish();
  if (distributed && stop.this_rank != 0) std::fprintf(stderr, "%s\n", line.c_str());
  return saved.ok() ? 128 + stop.signal : 1;
}

}  // namespace tg::train
