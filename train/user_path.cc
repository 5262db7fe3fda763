#include "train/user_path.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace tg::train {

std::string ResolveUserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* base = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`
  if (base != nullptr && base[0] != '\0') return absl::StrCat(base, "/", path);
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) != nullptr) return absl::StrCat(cwd, "/", path);
  return path;
}

}  // namespace tg::train
