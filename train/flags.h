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
//     tg::train::ParseCommandLine(argc, argv, "Trains ... Flags:", __FILE__);
//     ...
//   }
#ifndef TAPEGRAD_TRAIN_FLAGS_H_
#define TAPEGRAD_TRAIN_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "train/flag_values.h"
#include "train/optimizer_setup.h"
#include "train/resume_flag.h"

ABSL_DECLARE_FLAG(std::string, optimizer);
ABSL_DECLARE_FLAG(double, muon_lr);
ABSL_DECLARE_FLAG(double, muon_momentum);
ABSL_DECLARE_FLAG(bool, muon_nesterov);
ABSL_DECLARE_FLAG(int64_t, muon_ns_steps);
ABSL_DECLARE_FLAG(std::string, muon_adjust_lr);
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

// The command line of a training binary, parsed: `usage` as absl's program usage message;
// --help and --helpshort list the flags of `main_file` (__FILE__ of the file with main()) and
// of every train/ file linked in (absl shows only the main file's unless told); a bare --resume
// (a ResumeFlag, not a bool) normalised; the flags given on the command line recorded
// (FlagGiven).
void ParseCommandLine(int argc, char** argv, const char* usage, const char* main_file);

// Whether --`name` was given on the command line, not just left at its default (--n_head with
// --init_from is the head count of a file without config.json only when the user gave it). Read
// from argv before absl parses it (this abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine
// private); a value from --flagfile counts as not given.
bool FlagGiven(absl::string_view name);

// The binary's own numeric flags (`own`, checked first) and the shared ones of this file against
// their documented ranges (CheckFlagRanges: the first one outside its range).
absl::Status CheckFlagsAndShared(std::vector<FlagRange> own);

// The --muon_* flags (Run::Prepare puts them into the OptimizerConfig of every run).
MuonConfig MuonFlags();

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_FLAGS_H_
