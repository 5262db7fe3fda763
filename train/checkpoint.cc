#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tensor/io/safetensors.h"
#include "tensor/ops.h"
#include "train/format_number.h"

namespace tg::train {

StateDict ToHost(const StateDict& state) {
  StateDict out;
  out.scalars = state.scalars;
  for (const auto& [key, t] : state.tensors) out.tensors[key] = t.to(Device::Cpu());
  return out;
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

absl::Status RestoreImageBatcher(data::ImageBatcher& batches, const StateDict& checkpoint,
                                 int64_t step, const std::string& dir) {
  try {
    batches.load_state_dict(checkpoint.Sub("data."));
  } catch (const Error& e) {
    return absl::DataLossError(absl::StrCat("cannot resume from ", dir, ": ", e.what()));
  }
  const data::IndexBatcher::State at = batches.state();
  const int64_t data_step =
      at.epoch * batches.batches_per_epoch() + at.position / batches.indices().batch_size();
  if (data_step != step) {
    return absl::DataLossError(absl::StrCat(
        "cannot resume from ", dir, ": the data position (epoch ", at.epoch, ", example ",
        at.position, ") is that of step ", data_step, ", but 'step' is ", step));
  }
  if (!(at.epoch_start == batches.indices().EpochStart(at.epoch))) {
    return absl::DataLossError(absl::StrCat(
        "cannot resume from ", dir, ": the data order's generator state is ",
        GeneratorStateToString(at.epoch_start), ", but epoch ", at.epoch, " starts at ",
        GeneratorStateToString(batches.indices().EpochStart(at.epoch))));
  }
  return absl::OkStatus();
}

}  // namespace tg::train
