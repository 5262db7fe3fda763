// One checkpoint file of a run (<dir>/checkpoint.safetensors: tensors, scalars and string
// metadata), its directory checked before training, the host copy a checkpoint writes, the
// generator state as metadata text, and the finiteness check that keeps a diverged state out.
#ifndef TAPEGRAD_TRAIN_CHECKPOINT_H_
#define TAPEGRAD_TRAIN_CHECKPOINT_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dataset/loader.h"
#include "tensor/generator.h"
#include "tensor/state_dict.h"

namespace tg::train {

// The same tensors on the CPU (device tensors copied, host ones shared): what checkpoints write.
StateDict ToHost(const StateDict& state);

// The generator state as metadata text ("seed:offset", exact for every 64-bit value).
std::string GeneratorStateToString(const Generator::State& state);
absl::StatusOr<Generator::State> GeneratorStateFromString(const std::string& text);

// An image run's data position from a checkpoint's "data." entries, checked against the step
// count (one batch per step: epoch * batches_per_epoch + position / batch_size must be `step`)
// and against the seed (the order's generator must stand where that epoch starts, a replay from
// the seed). DataLoss naming `dir` and the numbers otherwise; `batches` is then unspecified.
absl::Status RestoreImageBatcher(data::ImageBatcher& batches, const StateDict& checkpoint,
                                 int64_t step, const std::string& dir);

// One checkpoint file: tensors and scalars of `state` (prefixed by the caller: "model.",
// "optim.", "data.", ...) and string metadata (configuration, generator states). Written to a
// temporary file and renamed, creating `dir` if needed. Returns the file's path.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& dir, const StateDict& state,
                                           const std::map<std::string, std::string>& metadata);
// Reads "<dir>/checkpoint.safetensors"; NotFound when there is none.
absl::StatusOr<StateDict> LoadCheckpoint(const std::string& dir,
                                         std::map<std::string, std::string>* metadata);
std::string CheckpointPath(const std::string& dir);

// Before training: creates the checkpoint directory with its parents (as mkdir -p), checks that
// a file can be created in it, and removes the temporaries that interrupted saves of its
// checkpoint left behind. Does nothing for an empty dir.
absl::Status PrepareCheckpointDir(const std::string& dir);

// The first floating tensor of `state` (in key order) that holds NaN or inf, described as
// "tensor 'optim.master.0' holds nan at element 3 of 12 (2 of its elements are not finite)";
// nullopt when every one is finite. One AnyNonFinite pass per tensor; only a bad tensor is read
// element by element.
std::optional<std::string> FindNonFinite(const StateDict& state);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_CHECKPOINT_H_
