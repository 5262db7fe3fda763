// When a run stops because it diverged: a non-finite loss or skipped steps that no dynamic loss
// scaler absorbs, too many skipped steps in a row, or too many skipped steps in all.
#ifndef TAPEGRAD_TRAIN_DIVERGENCE_H_
#define TAPEGRAD_TRAIN_DIVERGENCE_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace tg::train {

// Divergence: a run stops with an error when its loss becomes NaN/inf, or a step is skipped for
// non-finite gradients, and no dynamic loss scaler can absorb it (f32, bf16, or any constant
// scale: MakeMixedPrecisionOptions turns the overflow check on for them, so such a step changes
// no weight), or when a dynamic scaler has skipped `max_skipped_in_a_row` consecutive steps (0:
// never). The binaries check after every step and before any save, so the last checkpoint is
// never overwritten by the diverged state. Megatron-LM and DeepSpeed stop too; training on NaN
// weights to a successful exit helps nobody.
class DivergenceCheck {
 public:
  DivergenceCheck(bool dynamic_scaler, int64_t max_skipped_in_a_row)
      : dynamic_(dynamic_scaler), max_skipped_(max_skipped_in_a_row) {}
  // The weights were loaded from `file` (--resume, --init_from) after step `step`: a divergence
  // that starts with the next step names the file instead of advising a lower --lr.
  void set_loaded_from(std::string file, int64_t step) {
    loaded_from_ = std::move(file);
    loaded_step_ = step;
  }
  // After each step (the loss agreed across ranks). FailedPrecondition says why the run stopped.
  absl::Status Check(int64_t step, double loss, bool skipped);

 private:
  // What to do about it: lower the lr, or (when the trouble starts at the first step after
  // loading a file) look at that file.
  std::string Advice(int64_t first_bad_step) const;

  bool dynamic_;
  int64_t max_skipped_;
  int64_t skipped_in_a_row_ = 0;
  std::string loaded_from_;
  int64_t loaded_step_ = -1;
};

// The end of a run: FailedPrecondition when more than `max_fraction` (in [0, 1]) of its `steps`
// were skipped for non-finite gradients (`flag` names the flag in the message). A run that
// skipped 31 of 32 steps did not train, whatever its loss says; a healthy f16 run skips a few
// steps while its loss scale settles (tests/tools:reliability_test measures them).
absl::Status CheckSkippedFraction(int64_t steps, int64_t skipped, double max_fraction,
                                  const char* flag = "--max_skipped_fraction");

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_DIVERGENCE_H_
