// Fuzz target of the checkpoint loader (train/checkpoint.h, train/run_state.h): train::LoadCheckpoint and
// train::RunState::Resume of <dir>/checkpoint.safetensors into the runs of checkpoint_setup.h
// (an f16 AdamW run with masters and a dynamic scaler, and an f32 SGD run).
//
// The input is the whole checkpoint file. Checked on every input, for both runs:
// - Resume (allowing an override of the lr setting) never crashes or throws: every problem is a
//   Status. It succeeds only where LoadCheckpoint does; on error the step counters are untouched;
//   on success they lie in [0, total steps] with skipped <= step.
// - After a successful Resume the parameters keep their dtypes and shapes, the run saves again
//   (RunState::Save), a fresh run resumes from that save to the same model and optimizer state,
//   and a training step runs without throwing (so Resume let through only state that fits).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tools/fuzz/checkpoint_setup.h"
#include "tools/fuzz/fuzz_util.h"
#include "train/checkpoint.h"
#include "train/run_state.h"

namespace tg::fuzz {
namespace {

void CheckSameState(const StateDict& a, const StateDict& b, const char* what) {
  FUZZ_CHECK(a.tensors.size() == b.tensors.size() && a.scalars.size() == b.scalars.size(), what,
             ": different keys");
  for (const auto& [key, t] : a.tensors) {
    auto it = b.tensors.find(key);
    FUZZ_CHECK(it != b.tensors.end() && SameTensor(t, it->second), what, ": tensor '", key, "'");
  }
  for (const auto& [key, v] : a.scalars) {
    auto it = b.scalars.find(key);
    // Equal, or both NaN (a NaN hyper-parameter survives the round trip as NaN).
    FUZZ_CHECK(it != b.scalars.end() && (it->second == v || (it->second != it->second && v != v)),
               what, ": scalar '", key, "'");
  }
}

void ResumeInto(RunKind kind, const std::string& dir, bool loadable) {
  FuzzRun run = MakeFuzzRun(kind);
  std::vector<std::pair<DType, Shape>> before;
  for (const Tensor& p : run.model->parameters()) before.emplace_back(p.dtype(), p.shape());

  std::map<std::string, std::string> metadata;
  std::vector<std::string> changes;
  absl::StatusOr<StateDict> resumed = NoThrow(
      "RunState::Resume", [&] { return run.state->Resume(dir, {"lr"}, &metadata, &changes); });
  if (!resumed.ok()) {
    FUZZ_CHECK(run.state->step() == 0 && run.state->skipped() == 0,
               "a failed Resume changed the step counters: ", resumed.status().ToString());
    return;
  }
  FUZZ_CHECK(loadable, "Resume succeeded where LoadCheckpoint fails");
  FUZZ_CHECK(run.state->step() >= 0 && run.state->step() <= kFuzzRunSteps &&
                 run.state->skipped() >= 0 && run.state->skipped() <= run.state->step(),
             "resumed counters: step ", run.state->step(), ", skipped ", run.state->skipped());
  const std::vector<Tensor> params = run.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    FUZZ_CHECK(params[i].dtype() == before[i].first && params[i].shape() == before[i].second,
               "Resume changed parameter ", i, " to ", Describe(params[i].data()));
  }

  const std::string again = ScratchPath("resaved");
  absl::Status saved = NoThrow("RunState::Save", [&] { return run.state->Save(again, {}, {}); });
  FUZZ_CHECK(saved.ok(), "a resumed run does not save: ", saved.ToString());
  FuzzRun fresh = MakeFuzzRun(kind);
  std::map<std::string, std::string> metadata2;
  std::vector<std::string> changes2;
  absl::StatusOr<StateDict> resumed2 = NoThrow(
      "RunState::Resume", [&] { return fresh.state->Resume(again, {}, &metadata2, &changes2); });
  FUZZ_CHECK(resumed2.ok(),
             "a resumed and saved run does not resume: ", resumed2.status().ToString());
  FUZZ_CHECK(
      fresh.state->step() == run.state->step() && fresh.state->skipped() == run.state->skipped(),
      "step counters differ after save + resume");
  CheckSameState(run.model->state_dict(), fresh.model->state_dict(), "model after save + resume");
  CheckSameState(run.optimizer->state_dict(), fresh.optimizer->state_dict(),
                 "optimizer after save + resume");
  CheckSameState(run.schedule->state_dict(), fresh.schedule->state_dict(),
                 "schedule after save + resume");

  NoThrow("TrainStep after Resume", [&] { return TrainFuzzRun(run); });
}

}  // namespace
}  // namespace tg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tg::fuzz;  // NOLINT: a C entry point
  const std::string& dir = ScratchDir();
  WriteScratchFile("checkpoint.safetensors", data, size);
  std::map<std::string, std::string> metadata;
  const bool loadable =
      NoThrow("LoadCheckpoint", [&] { return tg::train::LoadCheckpoint(dir, &metadata); }).ok();
  for (RunKind kind : kRunKinds) ResumeInto(kind, dir, loadable);
  return 0;
}
