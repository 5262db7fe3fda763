// Writes the valid seed checkpoints of the checkpoint fuzz target: each run of
// checkpoint_setup.h saved by RunState::Save before training and after 2 steps, as
// <out_dir>/valid_<run>_step<N>.safetensors. tools/fuzz/make_corpus.py runs it and derives the
// invalid seeds from these files.
//
//   bazel run //tools/fuzz:checkpoint_seed -- /abs/path/to/tools/fuzz/corpus/checkpoint
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "tools/fuzz/checkpoint_setup.h"
#include "train/checkpoint.h"

namespace tg::fuzz {
namespace {

int Main(const std::string& out_dir) {
  for (RunKind kind : kRunKinds) {
    const char* name = kind == RunKind::kF16AdamW ? "f16_adamw" : "f32_sgd";
    FuzzRun run = MakeFuzzRun(kind);
    for (int step = 0; step <= 2; ++step) {
      if (step > 0) TrainFuzzRun(run);
      if (step == 1) continue;
      const std::string dir = absl::StrCat(out_dir, "/tmp_", name);
      absl::Status s = run.state->Save(dir, {}, {});
      const std::string to = absl::StrCat(out_dir, "/valid_", name, "_step", step, ".safetensors");
      if (!s.ok() || std::rename(train::CheckpointPath(dir).c_str(), to.c_str()) != 0 ||
          std::remove(dir.c_str()) != 0) {
        std::fprintf(stderr, "checkpoint_seed: cannot write %s: %s\n", to.c_str(),
                     s.ToString().c_str());
        return 1;
      }
      std::printf("%s\n", to.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace tg::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint_seed <out_dir>\n");
    return 2;
  }
  return tg::fuzz::Main(argv[1]);
}
