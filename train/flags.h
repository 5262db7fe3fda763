// The flags that tools:train_mnist and tools:train_gpt share: the same name, default and help text
// in both, so they are defined once here (flags.cc) and each binary reads them with
// absl::GetFlag(FLAGS_<name>) after including this header.
//
// Not here: the flags whose default or help text differs between the two binaries (batch_size
// and micro_batch_size say "images" or "sequences" and differ in their default batch; lr,
// weight_decay, seed, checkpoint_every and override have other defaults or texts). absl gives a
// flag one default and one help text, so each binary keeps its own definition of those seven;
// a definition here would have changed one binary's default or --help.
//
//   int main(int argc, char** argv) {
//     tg::train::ShowSharedFlagsInHelp(__FILE__);  // before absl::ParseCommandLine
//     ...
//   }
#ifndef TAPEGRAD_TRAIN_FLAGS_H_
#define TAPEGRAD_TRAIN_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "train/resume_flag.h"

ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, fp8_recipe);
ABSL_DECLARE_FLAG(int64_t, fp8_amax_history_len);
ABSL_DECLARE_FLAG(int64_t, fp8_margin);
ABSL_DECLARE_FLAG(std::string, loss_scaler);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(tg::train::ResumeFlag, resume);
ABSL_DECLARE_FLAG(int64_t, max_skipped_in_a_row);
ABSL_DECLARE_FLAG(double, max_skipped_fraction);
ABSL_DECLARE_FLAG(std::string, metrics);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, tf32);
ABSL_DECLARE_FLAG(int64_t, world_size);
ABSL_DECLARE_FLAG(int64_t, rank);
ABSL_DECLARE_FLAG(std::string, rdzv);
ABSL_DECLARE_FLAG(int64_t, zero_stage);
ABSL_DECLARE_FLAG(int64_t, grad_accum_steps);
ABSL_DECLARE_FLAG(int64_t, print_every);
ABSL_DECLARE_FLAG(int64_t, stop_at_step);

namespace tg::train {

// absl's --help and --helpshort list only the flags of the binary's main file (`main_file`,
// __FILE__ of the file with main()); this makes them list the shared flags of flags.cc too, so
// --help shows every flag of the binary as it did when each binary defined them. Call before
// absl::ParseCommandLine.
void ShowSharedFlagsInHelp(const char* main_file);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_FLAGS_H_
