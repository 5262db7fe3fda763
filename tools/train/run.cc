#include "tools/train/run.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "amp/loss_scaler.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/io/safetensors.h"
#include "tensor/ops.h"

namespace tg::train {

void KeepFreedMemoryInProcess() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

std::string ResolveUserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* base = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`
  if (base != nullptr && base[0] != '\0') return absl::StrCat(base, "/", path);
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) != nullptr) return absl::StrCat(cwd, "/", path);
  return path;
}

absl::StatusOr<Device> CheckDevice(const std::string& device) {
  if (device == "cpu") return Device::Cpu();
  int index = 0;
  if (device != "cuda") {
    const absl::string_view prefix = "cuda:";
    const absl::string_view rest = absl::string_view(device).substr(
        absl::StartsWith(device, prefix) ? prefix.size() : device.size());
    if (!absl::StartsWith(device, prefix) || rest.empty() || rest.size() > 4 ||
        !absl::SimpleAtoi(rest, &index) || index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", device, ": expected cpu, cuda or cuda:N"));
    }
  }
  const Device d = Device::Cuda(index);
  try {
    GetDeviceBackend(DeviceType::kCuda)->allocator(index);  // throws naming why not
  } catch (const Error& e) {
    return absl::FailedPreconditionError(absl::StrCat("--device=", device, ": ", e.what()));
  }
  return d;
}

StateDict ToHost(const StateDict& state) {
  StateDict out;
  out.scalars = state.scalars;
  for (const auto& [key, t] : state.tensors) out.tensors[key] = t.to(Device::Cpu());
  return out;
}

absl::Status OpenMetrics(const std::string& path, std::optional<int64_t> resume_step,
                         const std::vector<std::string>& extra_columns,
                         std::optional<MetricsWriter>* out) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<MetricsWriter> writer =
      MetricsWriter::Open(ResolveUserPath(path), resume_step, extra_columns);
  if (!writer.ok()) return writer.status();
  out->emplace(std::move(*writer));
  return absl::OkStatus();
}

absl::StatusOr<DType> ParsePrecision(const std::string& name) {
  if (name == "f32") return kF32;
  if (name == "f16") return kF16;
  if (name == "bf16") return kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (expected f32, f16 or bf16)"));
}

std::string FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Whole numbers of up to 15 digits as integers ("100000", not "1e+05").
  if (std::floor(value) == value && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

absl::Status CheckFlagRanges(const std::vector<FlagRange>& flags) {
  for (const FlagRange& f : flags) {
    const bool min_open = f.open == FlagRange::Open::kMin;
    const bool max_open = f.open == FlagRange::Open::kMax;
    const bool ok = (min_open ? f.value > f.min : f.value >= f.min) &&
                    (max_open ? f.value < f.max : f.value <= f.max);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", f.name, "=", FormatNumber(f.value), " is outside its valid range ",
                       min_open ? "(" : "[", FormatNumber(f.min), ", ", FormatNumber(f.max),
                       max_open ? ")" : "]"));
    }
  }
  return absl::OkStatus();
}

int64_t DefaultWarmupSteps(int64_t steps) { return steps >= 100 ? 100 : steps / 10; }

double DefaultMinLr(double lr) { return lr >= 3e-4 ? 3e-4 : lr / 10; }

std::string BatchSizes::Describe(const char* rows) const {
  return absl::StrCat("batch: global ", global, " ", rows, " per optimizer step = micro-batch ",
                      micro, " x ", grad_accum_steps, " accumulation step",
                      grad_accum_steps == 1 ? "" : "s", " x ", world_size,
                      world_size == 1 ? " rank" : " ranks");
}

absl::StatusOr<BatchSizes> ResolveBatchSizes(std::optional<int64_t> batch_size,
                                             std::optional<int64_t> micro_batch_size,
                                             int64_t default_batch_size, int64_t grad_accum_steps,
                                             int64_t world_size) {
  BatchSizes b;
  b.grad_accum_steps = grad_accum_steps;
  b.world_size = world_size;
  if (grad_accum_steps < 1 || world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch splits into --grad_accum_steps x ranks micro-batches, which need "
                     "to be >= 1: got ", grad_accum_steps, " x ", world_size));
  }
  const int64_t parts = grad_accum_steps * world_size;  // micro-batches per optimizer step
  const std::string split =
      absl::StrCat("--grad_accum_steps=", grad_accum_steps, " x --world_size=", world_size);
  if (micro_batch_size.has_value()) {
    b.micro = *micro_batch_size;
    b.global = b.micro * parts;
    if (batch_size.has_value() && *batch_size != b.global) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--batch_size=", *batch_size, " (the global batch of an optimizer step) is not ",
          "--micro_batch_size=", b.micro, " x ", split, " = ", b.global, "; give one of the two"));
    }
    return b;
  }
  if (batch_size.has_value()) {
    if (*batch_size % parts != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--batch_size=", *batch_size,
                       " (the global batch of an optimizer step) does not split into ", split,
                       " = ", parts, " equal micro-batches: give a multiple of ", parts,
                       ", or --micro_batch_size=N for N x ", parts, " rows per step"));
    }
    b.global = *batch_size;
  } else {
    // The default never fails: rounded down to a multiple of the micro-batch count.
    b.global = std::max(parts, default_batch_size - default_batch_size % parts);
  }
  b.micro = b.global / parts;
  return b;
}

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

void ApplyOptimizerOverrides(const OptimizerConfig& config,
                             const std::vector<std::string>& overrides, amp::TrainingOptimizer& opt,
                             optim::LrSchedule& schedule) {
  auto overridden = [&](const char* name) {
    return std::find(overrides.begin(), overrides.end(), name) != overrides.end();
  };
  std::vector<optim::ParamGroup>& groups = opt.optimizer().param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    // With decay_matrices_only, group 1 holds the parameters that are never decayed.
    if (overridden("weight_decay") && !(config.decay_matrices_only && g > 0)) {
      groups[g].options().set_named("weight_decay", config.weight_decay);
    }
    // Only optimizers with a beta2 (set_named changes nothing for the others).
    if (overridden("beta2")) groups[g].options().set_named("beta2", config.beta2);
  }
  if (overridden("lr")) schedule.set_base_lrs(std::vector<double>(groups.size(), config.lr));
}

bool AbslParseFlag(absl::string_view text, ResumeFlag* flag, std::string* error) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "true" || t == "1" || t == "yes" || t == "t" || t == "y") {
    flag->mode = ResumeFlag::Mode::kYes;
  } else if (t == "false" || t == "0" || t == "no" || t == "f" || t == "n") {
    flag->mode = ResumeFlag::Mode::kNo;
  } else if (t == "auto") {
    flag->mode = ResumeFlag::Mode::kAuto;
  } else {
    *error = "expected true, false or auto (resume when the checkpoint exists, else start fresh)";
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(ResumeFlag flag) {
  switch (flag.mode) {
    case ResumeFlag::Mode::kYes:
      return "true";
    case ResumeFlag::Mode::kAuto:
      return "auto";
    case ResumeFlag::Mode::kNo:
      break;
  }
  return "false";
}

void NormalizeResumeArgs(int argc, char** argv) {
  static char kTrue[] = "--resume=true";
  static char kFalse[] = "--resume=false";
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--resume" || arg == "-resume") argv[i] = kTrue;
    if (arg == "--noresume" || arg == "-noresume") argv[i] = kFalse;
  }
}

absl::StatusOr<int> ElasticRestartCount() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (v == nullptr || *v == '\0') return 0;
  int n;
  if (!absl::SimpleAtoi(v, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("TORCHELASTIC_RESTART_COUNT='", v,
                                                   "' is not a restart count (an integer >= 0)"));
  }
  return n;
}

absl::StatusOr<bool> DecideResume(ResumeFlag flag, const std::string& checkpoint_dir,
                                  int restart_count, std::string* line) {
  line->clear();
  if (flag.mode == ResumeFlag::Mode::kYes) return true;
  if (flag.mode == ResumeFlag::Mode::kAuto && checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--resume=auto needs --checkpoint_dir (where the checkpoint is looked for)");
  }
  if (checkpoint_dir.empty()) return false;
  const std::string path = CheckpointPath(checkpoint_dir);
  struct stat info;
  const bool exists = stat(path.c_str(), &info) == 0;
  if (flag.mode == ResumeFlag::Mode::kAuto) {
    *line = exists ? absl::StrCat("--resume=auto: resuming from ", path)
                   : absl::StrCat("--resume=auto: no checkpoint at ", path, ", starting fresh");
    return exists;
  }
  if (restart_count > 0 && exists) {
    return absl::FailedPreconditionError(absl::StrCat(
        "restart ", restart_count, " of an elastic run (TORCHELASTIC_RESTART_COUNT=", restart_count,
        ") would start at step 0 and overwrite ", path,
        ": pass --resume=auto to resume from it when it exists"));
  }
  return false;
}

absl::Status PrepareCheckpointDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  // mkdir -p: each prefix ending before a '/', then the whole path.
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string prefix = dir.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("--checkpoint_dir=", dir, ": cannot create ", prefix));
    }
  }
  struct stat info;
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--checkpoint_dir=", dir, ": exists and is not a directory"));
  }
  // Writable: a probe file is created and removed (access() says yes to root on a read-only
  // mount).
  const std::string probe = absl::StrCat(dir, "/.write_test.", getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("--checkpoint_dir=", dir, ": cannot write a file in it"));
  }
  close(fd);
  unlink(probe.c_str());
  absl::StatusOr<int> removed = io::RemoveStaleTemporaries(CheckpointPath(dir));
  if (!removed.ok()) return removed.status();
  return absl::OkStatus();
}

std::string DivergenceCheck::Advice(int64_t first_bad_step) const {
  if (!loaded_from_.empty() && first_bad_step == loaded_step_ + 1) {
    return absl::StrCat("it began at the first step after loading ", loaded_from_,
                        ": the weights or optimizer state of that file do not train (finite, but "
                        "not a state this run can continue from)");
  }
  return "lower --lr or use another precision";
}

absl::Status DivergenceCheck::Check(int64_t step, double loss, bool skipped) {
  skipped_in_a_row_ = skipped ? skipped_in_a_row_ + 1 : 0;
  if (!std::isfinite(loss) && !dynamic_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the run diverged: the loss of step ", step, " is ", FormatNumber(loss),
        " and no dynamic loss scaler can absorb it (the weights are not updated from a "
        "non-finite gradient, but training cannot recover; ",
        Advice(step), ")"));
  }
  if (skipped && !dynamic_) {
    // A finite loss with non-finite gradients (the optimizer's overflow check skipped the step):
    // nothing lowers a constant scale, so the next steps would be skipped too.
    return absl::FailedPreconditionError(absl::StrCat(
        "the run diverged: the gradients of step ", step, " are not finite (its loss is ",
        FormatNumber(loss),
        ") and no dynamic loss scaler can absorb them (the step was skipped, no weight changed, "
        "but training cannot recover; ",
        Advice(step), ")"));
  }
  if (max_skipped_ > 0 && skipped_in_a_row_ >= max_skipped_) {
    const int64_t first = step - skipped_in_a_row_ + 1;
    const bool from_file = !loaded_from_.empty() && first == loaded_step_ + 1;
    return absl::FailedPreconditionError(
        absl::StrCat("the run diverged: ", skipped_in_a_row_,
                     " consecutive steps were skipped (steps ", first, " to ", step,
                     " had non-finite gradients at every loss scale tried; --max_skipped_in_a_row=",
                     max_skipped_, from_file ? absl::StrCat("; ", Advice(first)) : "", ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckSkippedFraction(int64_t steps, int64_t skipped, double max_fraction,
                                  const char* flag) {
  if (steps <= 0 || static_cast<double>(skipped) <= max_fraction * static_cast<double>(steps)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the run skipped ", skipped, " of its ", steps, " steps (",
      absl::StrFormat("%.1f", 100.0 * static_cast<double>(skipped) / static_cast<double>(steps)),
      "%) for non-finite gradients, more than ", flag, "=", FormatNumber(max_fraction),
      " of them: it did not train (lower --lr, or use bf16 or f32)"));
}

std::optional<std::string> FindNonFinite(const StateDict& state) {
  for (const auto& [key, t] : state.tensors) {
    if (!t.defined() || !IsFloating(t.dtype()) || t.numel() == 0 || !AnyNonFinite({t})) continue;
    const std::vector<double> values =
        t.to(Device::Cpu()).to(kF64).contiguous().to_vector<double>();
    int64_t first = -1, count = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::isfinite(values[i])) continue;
      if (first < 0) first = static_cast<int64_t>(i);
      ++count;
    }
    if (first < 0) continue;  // AnyNonFinite and the f64 copy disagree: cannot happen
    return absl::StrCat("tensor '", key, "' holds ", FormatNumber(values[first]), " at element ",
                        first, " of ", values.size(), " (", count, " of its elements ",
                        count == 1 ? "is" : "are", " not finite)");
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>> MakeOptimizer(const std::vector<Variable>& params,
                                                                const OptimizerConfig& config) {
  std::vector<Variable> matrices, others;
  if (config.decay_matrices_only) {
    for (const Variable& p : params) (p.dim() >= 2 ? matrices : others).push_back(p);
  }
  // The groups for the optimizer's options: with decay_matrices_only, group 1 (the vectors) has
  // the same options without weight decay.
  auto make_groups = [&](auto options) {
    std::vector<optim::ParamGroup> groups;
    if (!config.decay_matrices_only) {
      groups.emplace_back(params);
      return groups;
    }
    groups.emplace_back(matrices);
    options.weight_decay = 0;
    if (!others.empty()) groups.emplace_back(others, options);
    return groups;
  };
  std::unique_ptr<optim::Optimizer> opt;
  if (config.name == "adamw" || config.name == "adam") {
    optim::AdamWOptions o;
    o.lr = config.lr;
    o.weight_decay = config.weight_decay;
    o.beta2 = config.beta2;
    if (config.name == "adamw") {
      opt = std::make_unique<optim::AdamW>(make_groups(o), o);
    } else {
      const optim::AdamOptions& adam = o;
      opt = std::make_unique<optim::Adam>(make_groups(adam), adam);
    }
  } else if (config.name == "sgd") {
    optim::SGDOptions o;
    o.lr = config.lr;
    o.momentum = config.momentum;
    o.weight_decay = config.weight_decay;
    opt = std::make_unique<optim::SGD>(make_groups(o), o);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", config.name, "' (expected adamw, adam or sgd)"));
  }
  return opt;
}

absl::StatusOr<amp::MixedPrecisionOptions> MakeMixedPrecisionOptions(
    const PrecisionConfig& precision) {
  amp::MixedPrecisionOptions mp;
  mp.reduce_found_inf = precision.reduce_found_inf;
  // Every precision checks for non-finite gradients, not only f16: an f32 or bf16 step on NaN
  // gradients would write NaN into every master weight before the loss showed it. A skipped step
  // of a constant scale stops the run (DivergenceCheck). The cost is the found_inf read of each
  // step (nothing on the CPU; on a GPU one read next to the gradient norm's).
  mp.check_non_finite = true;
  const std::string& s = precision.loss_scaler;
  if (s == "pytorch") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch());
  } else if (s == "megatron") {
    // Megatron-LM's defaults for --fp16 with dynamic scaling.
    mp.scaler = std::make_shared<amp::LossScaler>(
        amp::LossScaler::MegatronDynamic(4294967296.0, 1.0, 2.0, 0.5, 1000, 2));
  } else if (s == "deepspeed") {
    // What a DeepSpeed user's fp16 run gets from the engine's config defaults (2^16, hysteresis
    // 2); the class defaults are deepspeed_class.
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedEngine());
  } else if (s == "deepspeed_class") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedDynamic());
  } else if (s == "deepspeed_legacy") {
    // DeepSpeed's defaults with its growth timing before v0.17.1.
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedDynamic(
        4294967296.0, 2.0, 1000, 1.0, 1, false, true, amp::DeepSpeedGrowth::kBeforeV0_17_1));
  } else if (s == "apex") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::Apex());
  } else if (s == "none") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::Constant(1.0));
  } else if (s != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown loss scaler '", s,
        "' (expected auto, pytorch, megatron, deepspeed, deepspeed_class, deepspeed_legacy, apex "
        "or none)"));
  }
  return mp;
}

absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Variable>& params, const OptimizerConfig& config,
    const PrecisionConfig& precision) {
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> opt = MakeOptimizer(params, config);
  if (!opt.ok()) return opt.status();
  absl::StatusOr<amp::MixedPrecisionOptions> mp = MakeMixedPrecisionOptions(precision);
  if (!mp.ok()) return mp.status();
  return std::make_unique<amp::MixedPrecisionOptimizer>(std::move(*opt), std::move(*mp));
}

StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable()>& loss_fn) {
  return TrainStep(
      opt, schedule, dtype, max_grad_norm, [&](int64_t) { return loss_fn(); }, Accumulation{});
}

StepStats TrainStep(amp::TrainingOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable(int64_t micro)>& loss_fn,
                    const Accumulation& accumulation) {
  const int64_t n = accumulation.micro_batches;
  TG_CHECK(n >= 1, "TrainStep: micro_batches must be >= 1, got ", n);
  TG_CHECK(accumulation.summed_ranks >= 1, "TrainStep: summed_ranks must be >= 1, got ",
           accumulation.summed_ranks);
  const int64_t divisor = n * accumulation.summed_ranks;
  StepStats stats;
  stats.lr = opt.optimizer().param_groups()[0].lr();
  opt.zero_grad();
  const bool defer = n > 1 && opt.can_defer_master_grads();
  double loss_sum = 0;
  for (int64_t k = 0; k < n; ++k) {
    const bool last = k == n - 1;
    auto body = [&] {
      Variable loss;
      {
        PrecisionScope precision(dtype);
        loss = loss_fn(k);
      }
      // One micro-batch: the loss as it is (bit for bit the unaccumulated step).
      amp::MasterBackwardOptions options;
      options.update_master_grads = last || !defer;
      opt.backward(divisor == 1 ? loss : MulScalar(loss, 1.0 / static_cast<double>(divisor)),
                   options);
      loss_sum += loss.item();
    };
    if (accumulation.sync_scope && defer) {
      accumulation.sync_scope(last, body);
    } else {
      body();
    }
  }
  stats.loss = n == 1 ? loss_sum : loss_sum / static_cast<double>(n);
  stats.grad_norm = opt.clip_master_grads(max_grad_norm > 0 ? max_grad_norm : INFINITY);
  stats.result = opt.step();
  stats.loss_scale_next = opt.scaler().scale();
  schedule.step(stats.result.skipped);
  return stats;
}

namespace {
std::atomic<int> g_stop_signal{0};

void OnStopSignal(int sig) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  // Restore the default action: a second Ctrl-C ends the process at once.
  signal(sig, SIG_DFL);
}
}  // namespace

void StopSignal::Install() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopSignal::requested() { return g_stop_signal.load() != 0; }
int StopSignal::signal_number() { return g_stop_signal.load(); }

std::string GeneratorStateToString(const Generator::State& state) {
  return absl::StrCat(state.seed, ":", state.offset);
}

absl::StatusOr<Generator::State> GeneratorStateFromString(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  Generator::State state;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &state.seed) ||
      !absl::SimpleAtoi(parts[1], &state.offset)) {
    return absl::InvalidArgumentError(
        absl::StrCat("generator state '", text, "' is not <seed>:<offset>"));
  }
  return state;
}

std::string CheckpointPath(const std::string& dir) {
  return absl::StrCat(dir, "/checkpoint.safetensors");
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const StateDict& state,
                                           const std::map<std::string, std::string>& metadata) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InternalError(
        absl::StrCat("cannot create checkpoint directory ", dir, ": ", std::strerror(errno)));
  }
  std::string path = CheckpointPath(dir);
  absl::Status status = io::SaveStateDict(path, state, metadata);
  if (!status.ok()) return status;
  return path;
}

absl::StatusOr<StateDict> LoadCheckpoint(const std::string& dir,
                                         std::map<std::string, std::string>* metadata) {
  return io::LoadStateDict(CheckpointPath(dir), metadata);
}

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

std::string StopRequest::Describe() const {
  std::string text = absl::StrCat("signal ", signal, " (", strsignal(signal), ")");
  if (received_by >= 0) absl::StrAppend(&text, " received by rank ", received_by);
  return text;
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

int Fail(const char* name, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", name, std::string(status.message()).c_str());
  return 1;
}

int RunMain(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    return Fail(name, absl::InternalError(e.what()));
  } catch (const std::bad_alloc& e) {
    // A host allocation outside the tensor allocator (a std::vector of a reader or a kernel; a
    // kernel's parallel regions hand their exceptions to the calling thread) ends the run as the
    // allocator's own "out of memory" error does, not in std::terminate.
    return Fail(name, absl::ResourceExhaustedError(absl::StrCat(
                          "out of memory: a host allocation failed (", e.what(), ")")));
  }
}

}  // namespace tg::train
