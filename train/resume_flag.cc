#include "train/resume_flag.h"

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "train/checkpoint.h"

namespace tg::train {

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

}  // namespace tg::train
