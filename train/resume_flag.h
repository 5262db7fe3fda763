// --resume (no, yes, auto) and whether a run resumes, also on an elastic launcher's restart.
#ifndef TAPEGRAD_TRAIN_RESUME_FLAG_H_
#define TAPEGRAD_TRAIN_RESUME_FLAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tg::train {

// --resume: no (the default: a fresh run), yes (--resume, --resume=true: the checkpoint must
// exist), or auto (resume when <checkpoint_dir>/checkpoint.safetensors exists, else start fresh:
// what an elastic launcher's restarts need, torchrun --max-restarts or tools:launch
// --max_restarts, whose first attempt has no checkpoint yet). Parsed from true/false/1/0/yes/no/
// auto; a bare --resume (and --noresume) keep working through NormalizeResumeArgs.
struct ResumeFlag {
  enum class Mode { kNo, kYes, kAuto };
  Mode mode = Mode::kNo;
};
bool AbslParseFlag(absl::string_view text, ResumeFlag* flag, std::string* error);
std::string AbslUnparseFlag(ResumeFlag flag);
// Before absl::ParseCommandLine: absl takes a flag without a value for bools only, so argv's
// "--resume" / "-resume" become "--resume=true" and "--noresume" / "-noresume" "--resume=false"
// (up to a "--" that ends the flags).
void NormalizeResumeArgs(int argc, char** argv);

// Whether this run resumes. `restart_count` is the elastic launcher's restart of the workers
// (TORCHELASTIC_RESTART_COUNT, set by torchrun and tools:launch; 0 on the first attempt).
// auto needs a checkpoint directory (InvalidArgument). A fresh run (no) on a restart when the
// checkpoint exists is refused (FailedPrecondition naming the file and --resume=auto): it would
// begin at step 0 and overwrite the checkpoint of the attempt that failed. `line` gets what
// --resume=auto decided, for the first output line ("" otherwise).
// The binaries' `restart_count`: TORCHELASTIC_RESTART_COUNT, 0 when unset (InvalidArgument
// naming it when it is not an integer >= 0).
absl::StatusOr<int> ElasticRestartCount();
absl::StatusOr<bool> DecideResume(ResumeFlag flag, const std::string& checkpoint_dir,
                                  int restart_count, std::string* line);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RESUME_FLAG_H_
