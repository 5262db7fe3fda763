#include "train/run_settings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tensor/error.h"

namespace tg::train {

namespace {
constexpr char kSettingPrefix[] = "setting.";
// Written beside a "loss_scaler" setting since --loss_scaler=deepspeed means DeepSpeed's engine
// defaults; a checkpoint without it that records loss_scaler=deepspeed was written with the
// class defaults (now deepspeed_class).
constexpr char kScalerMeaningKey[] = "loss_scaler_meaning";
constexpr char kScalerMeaning[] = "deepspeed=engine";
}  // namespace

void RunSettings::Add(const std::string& name, const std::string& value, bool fixed) {
  for (const Setting& s : items_) TG_CHECK(s.name != name, "RunSettings: '", name, "' added twice");
  items_.push_back({name, value, fixed});
}

std::map<std::string, std::string> RunSettings::ToMetadata() const {
  std::map<std::string, std::string> out;
  for (const Setting& s : items_) {
    out[absl::StrCat(kSettingPrefix, s.name)] = s.value;
    if (s.name == "loss_scaler") out[kScalerMeaningKey] = kScalerMeaning;
  }
  return out;
}

std::string RunSettings::ToString() const {
  return absl::StrJoin(items_, " ", [](std::string* out, const Setting& s) {
    absl::StrAppend(out, s.name, "=", s.value);
  });
}

absl::StatusOr<std::vector<std::string>> RunSettings::ParseOverrides(const std::string& flag,
                                                                     bool resume) const {
  std::vector<std::string> names = absl::StrSplit(flag, ',', absl::SkipEmpty());
  if (!names.empty() && !resume) {
    return absl::InvalidArgumentError(
        absl::StrCat("--override=", flag, " applies only with --resume"));
  }
  std::vector<std::string> overridable;
  for (const Setting& s : items_) {
    if (!s.fixed) overridable.push_back(s.name);
  }
  for (const std::string& name : names) {
    auto it = std::find_if(items_.begin(), items_.end(),
                           [&](const Setting& s) { return s.name == name; });
    if (it == items_.end() || it->fixed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--override=", flag, ": ",
          it == items_.end() ? absl::StrCat("there is no setting '", name, "'")
                             : absl::StrCat("'", name, "' cannot change when resuming"),
          " (settings that can: ", absl::StrJoin(overridable, ", "), ")"));
    }
  }
  return names;
}

absl::StatusOr<std::vector<std::string>> RunSettings::CheckResume(
    const std::string& dir, const std::map<std::string, std::string>& metadata,
    const std::vector<std::string>& overrides) const {
  std::vector<std::string> changes;
  for (const Setting& s : items_) {
    auto it = metadata.find(absl::StrCat(kSettingPrefix, s.name));
    if (it == metadata.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot resume from ", dir, ": the checkpoint does not record the setting '",
                       s.name, "' (written by another program or an older version)"));
    }
    std::string saved = it->second;
    if (s.name == "loss_scaler" && saved == "deepspeed" &&
        metadata.find(kScalerMeaningKey) == metadata.end()) {
      // Decision: an old "deepspeed" checkpoint maps to deepspeed_class, the rules it was
      // written with; resuming it under the engine's rules (another scale, hysteresis 2) would
      // continue another run silently, so that is refused naming the flag that continues it.
      if (s.value == "deepspeed") {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot resume from ", dir,
            ": the checkpoint was written with loss_scaler=deepspeed when it meant DeepSpeed's "
            "DynamicLossScaler class defaults (init 2^32, no hysteresis); --loss_scaler=deepspeed "
            "now means DeepSpeed's engine config defaults (init 2^16, hysteresis 2): resume with "
            "--loss_scaler=deepspeed_class, the rules the checkpoint was written with"));
      }
      saved = "deepspeed_class";
    }
    if (saved == s.value) continue;
    const bool allowed = std::find(overrides.begin(), overrides.end(), s.name) != overrides.end();
    if (!allowed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume from ", dir, ": the checkpoint was written with ", s.name, "=", it->second,
          ", this run has ", s.name, "=", s.value,
          s.fixed
              ? " (this setting cannot change when resuming)"
              : absl::StrCat(" (pass --override=", s.name, " to continue with the new value)")));
    }
    changes.push_back(absl::StrCat(s.name, " ", it->second, " -> ", s.value));
  }
  return changes;
}

std::vector<std::string> RunFingerprint(const RunSettings& settings, const nn::Module& model,
                                        const std::vector<std::string>& extra) {
  std::vector<std::string> lines;
  for (const RunSettings::Setting& s : settings.items()) {
    lines.push_back(absl::StrCat(s.name, "=", s.value));
  }
  for (const auto& [name, p] : model.named_parameters()) {
    lines.push_back(
        absl::StrCat("param ", name, " ", DTypeName(p.dtype()), " ", ShapeToString(p.shape())));
  }
  lines.insert(lines.end(), extra.begin(), extra.end());
  return lines;
}

}  // namespace tg::train
