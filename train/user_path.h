// Paths typed by the user of a training binary (--data, --checkpoint_dir, --metrics, ...).
#ifndef TAPEGRAD_TRAIN_USER_PATH_H_
#define TAPEGRAD_TRAIN_USER_PATH_H_

#include <string>

namespace tg::train {

// A path given on the command line, made absolute against the directory where `bazel run` was
// typed (BUILD_WORKING_DIRECTORY), or the current directory outside bazel run.
std::string ResolveUserPath(const std::string& path);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_USER_PATH_H_
