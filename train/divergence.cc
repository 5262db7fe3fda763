#include "train/divergence.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "train/format_number.h"

namespace tg::train {

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

}  // namespace tg::train
