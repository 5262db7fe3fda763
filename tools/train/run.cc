#include "tools/train/run.h"

#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "amp/loss_scaler.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/io/safetensors.h"

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

absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> MakeMixedPrecisionOptimizer(
    const std::vector<Variable>& params, const OptimizerConfig& config,
    const PrecisionConfig& precision) {
  std::vector<optim::ParamGroup> groups;
  if (config.decay_matrices_only) {
    std::vector<Variable> matrices, others;
    for (const Variable& p : params) (p.dim() >= 2 ? matrices : others).push_back(p);
    groups.emplace_back(std::move(matrices));
    if (!others.empty())
      groups.emplace_back(std::move(others), optim::GroupOptions{{"weight_decay", 0.0}});
  } else {
    groups.emplace_back(params);
  }
  std::unique_ptr<optim::Optimizer> opt;
  if (config.name == "adamw" || config.name == "adam") {
    optim::AdamWOptions o;
    o.lr = config.lr;
    o.weight_decay = config.weight_decay;
    o.beta2 = config.beta2;
    if (config.name == "adamw") {
      opt = std::make_unique<optim::AdamW>(std::move(groups), o);
    } else {
      opt = std::make_unique<optim::Adam>(std::move(groups),
                                          static_cast<const optim::AdamOptions&>(o));
    }
  } else if (config.name == "sgd") {
    optim::SGDOptions o;
    o.lr = config.lr;
    o.momentum = config.momentum;
    o.weight_decay = config.weight_decay;
    opt = std::make_unique<optim::SGD>(std::move(groups), o);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", config.name, "' (expected adamw, adam or sgd)"));
  }
  amp::MixedPrecisionOptions mp;
  mp.reduce_found_inf = precision.reduce_found_inf;
  const std::string& s = precision.loss_scaler;
  if (s == "pytorch") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch());
  } else if (s == "megatron") {
    // Megatron-LM's defaults for --fp16 with dynamic scaling.
    mp.scaler = std::make_shared<amp::LossScaler>(
        amp::LossScaler::MegatronDynamic(4294967296.0, 1.0, 2.0, 0.5, 1000, 2));
  } else if (s == "deepspeed") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::DeepSpeedDynamic());
  } else if (s == "none") {
    mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::Constant(1.0));
  } else if (s != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown loss scaler '", s, "' (expected auto, pytorch, megatron, deepspeed or none)"));
  }
  return std::make_unique<amp::MixedPrecisionOptimizer>(std::move(opt), std::move(mp));
}

StepStats TrainStep(amp::MixedPrecisionOptimizer& opt, optim::LrSchedule& schedule, DType dtype,
                    double max_grad_norm, const std::function<Variable()>& loss_fn) {
  StepStats stats;
  stats.lr = opt.optimizer().param_groups()[0].options.at("lr");
  opt.zero_grad();
  Variable loss;
  {
    PrecisionScope precision(dtype);
    loss = loss_fn();
  }
  opt.backward(loss);
  stats.loss = loss.item();
  stats.grad_norm = opt.clip_master_grads(max_grad_norm > 0 ? max_grad_norm : INFINITY);
  stats.result = opt.step();
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
  record.skipped_steps = skipped_;
  record.elapsed_seconds = elapsed_seconds;
  return record;
}

absl::Status RunState::Save(const std::string& dir, const StateDict& extra,
                            std::map<std::string, std::string> metadata) const {
  if (dir.empty()) return absl::OkStatus();
  StateDict state = extra;
  state.Merge("model.", model_.state_dict());
  state.Merge("optim.", optimizer_.state_dict());
  state.Merge("schedule.", schedule_.state_dict());
  state.scalars["step"] = static_cast<double>(step_);
  state.scalars["skipped_steps"] = static_cast<double>(skipped_);
  metadata["config"] = config_;
  return SaveCheckpoint(dir, ToHost(state), metadata).status();
}

absl::StatusOr<StateDict> RunState::Resume(const std::string& dir,
                                           std::map<std::string, std::string>* metadata) {
  if (dir.empty()) return absl::InvalidArgumentError("--resume needs --checkpoint_dir");
  absl::StatusOr<StateDict> ckpt = LoadCheckpoint(dir, metadata);
  if (!ckpt.ok()) return ckpt.status();
  const std::string& saved = (*metadata)["config"];
  if (saved != config_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint in ", dir, " is of another run (", saved, "; this run: ", config_, ")"));
  }
  try {
    model_.load_state_dict(ckpt->Sub("model."));
    optimizer_.load_state_dict(ckpt->Sub("optim."));
    schedule_.load_state_dict(ckpt->Sub("schedule."));
    step_ = static_cast<int64_t>(ckpt->scalar("step"));
    skipped_ = static_cast<int64_t>(ckpt->scalar("skipped_steps"));
  } catch (const Error& e) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": ", e.what()));
  }
  return ckpt;
}

int RunState::SaveAndStop(const std::string& dir, const StateDict& extra,
                          std::map<std::string, std::string> metadata,
                          ProgressReporter& progress) const {
  absl::Status saved = Save(dir, extra, std::move(metadata));
  const int sig = StopSignal::signal_number();
  if (!saved.ok()) {
    progress.Println(absl::StrCat("stopped by signal ", sig, " after step ", step_,
                                  "; the checkpoint could not be written: ", saved.message()));
    progress.Finish();
    return 1;
  }
  progress.Println(absl::StrCat(
      "stopped by signal ", sig, " after step ", step_,
      dir.empty() ? " (no --checkpoint_dir: nothing saved)"
                  : absl::StrCat("; checkpoint in ", dir, ", continue with --resume")));
  progress.Finish();
  return 128 + sig;
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
  }
}

}  // namespace tg::train
