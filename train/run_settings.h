// The settings that decide a run's trajectory, recorded in its checkpoint and compared on resume
// (--override), and the fingerprint data-parallel ranks compare at start.
#ifndef TAPEGRAD_TRAIN_RUN_SETTINGS_H_
#define TAPEGRAD_TRAIN_RUN_SETTINGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nn/module.h"
#include "train/format_number.h"

namespace tg::train {

// The settings that decide a run's trajectory (model shape, data, optimizer and its options,
// schedule, precision and scaler, seed, ...), by flag name, in the order the binary adds them. A
// checkpoint records them as "setting.<name>" metadata; resuming compares them one by one, so a
// checkpoint never continues under settings other than its own without the user saying so:
// - a changed `fixed` setting (one the checkpoint's state depends on: the model's shapes, the
//   optimizer, the scaler preset, the batch size, the seed) is refused;
// - a changed overridable setting (lr, weight decay, dropout, step count, ...) is refused unless
//   --override names it; then the run continues with the new value and the binary prints the
//   changes first.
// Data-parallel ranks compare the same settings at start (DataParallel::CheckSameRun).
class RunSettings {
 public:
  struct Setting {
    std::string name;
    std::string value;
    bool fixed;
  };
  void Add(const std::string& name, const std::string& value, bool fixed);
  void Add(const std::string& name, const char* value, bool fixed) {
    Add(name, std::string(value), fixed);
  }
  void Add(const std::string& name, double value, bool fixed) {
    Add(name, FormatNumber(value), fixed);
  }
  const std::vector<Setting>& items() const { return items_; }
  // "setting.<name>" -> value.
  std::map<std::string, std::string> ToMetadata() const;
  // "name=value ...", for the first output line.
  std::string ToString() const;

  // Parses --override ("lr,weight_decay"; empty: none). InvalidArgument for an unknown name, a
  // fixed setting, or any name when the run does not `resume`.
  absl::StatusOr<std::vector<std::string>> ParseOverrides(const std::string& flag,
                                                          bool resume) const;
  // Compares with a checkpoint's metadata; returns the allowed changes as "lr 0.003 -> 0.001".
  // FailedPrecondition naming the first refused difference (or a setting the checkpoint lacks).
  absl::StatusOr<std::vector<std::string>> CheckResume(
      const std::string& dir, const std::map<std::string, std::string>& metadata,
      const std::vector<std::string>& overrides) const;

 private:
  std::vector<Setting> items_;
};

// What data-parallel ranks compare at start (DataParallel::CheckSameRun): the settings
// ("name=value"), every parameter ("param <name> <dtype> [shape]") and the caller's `extra`
// lines (the data size, ...).
std::vector<std::string> RunFingerprint(const RunSettings& settings, const nn::Module& model,
                                        const std::vector<std::string>& extra);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RUN_SETTINGS_H_
