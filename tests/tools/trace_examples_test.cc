// The examples of //tools:trace_backward: their exact event sequences (what the engine, amp and
// DDP did), and a DOT graph for each.
#include <algorithm>
#include <string>
#include <vector>

#include "autograd/trace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/trace/examples.h"

namespace tg::tools {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// "kind name", "hook kind @ node", "user category: message"; only the events of `thread`
// (-1: all).
std::vector<std::string> Sequence(const std::vector<TraceRecord>& events, int thread = -1) {
  std::vector<std::string> out;
  for (const TraceRecord& e : events) {
    if (thread >= 0 && e.thread != thread) continue;
    std::string s = std::string(TraceKindName(e.kind)) + " " + e.name;
    if (e.kind == TraceKind::kHook) s += " @ " + e.node;
    if (e.kind == TraceKind::kUser) s += ": " + e.detail;
    out.push_back(s);
  }
  return out;
}

std::vector<TraceRecord> RunTraced(const std::string& name, std::string* dot = nullptr) {
  TraceScope trace;
  absl::StatusOr<std::string> result = RunTraceExample(name);
  EXPECT_TRUE(result.ok()) << result.status();
  if (dot != nullptr && result.ok()) *dot = *result;
  // Every export parses.
  EXPECT_NO_THROW(nlohmann::json::parse(trace.ToChromeJson()));
  return trace.events();
}

TEST(TraceExamples, ReentrantCheckpoint) {
  std::string dot;
  const auto events = RunTraced("reentrant_checkpoint", &dot);
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                  "node_begin MulBackward", "node_end MulBackward", "node_begin CheckpointBackward",
                  "hook tensor_pre_hook @ CheckpointBackward",
                  "hook retain_grad @ CheckpointBackward", "recompute_begin reentrant",
                  "recompute_end reentrant", "task_begin backward", "node_begin TanhBackward",
                  "node_end TanhBackward", "node_begin MulBackward", "node_end MulBackward",
                  "node_begin AccumulateGrad", "node_end AccumulateGrad",
                  "node_begin AccumulateGrad(w)", "hook post_accumulate_grad @ AccumulateGrad(w)",
                  "callback_queued callback", "node_end AccumulateGrad(w)", "task_end backward",
                  "node_end CheckpointBackward", "node_begin AccumulateGrad(x)",
                  "node_end AccumulateGrad(x)", "callback_run callback", "task_end backward"));
  // The callback queued in the nested task belongs to the outer (user's) task.
  EXPECT_EQ(events[19].task, events[0].task);
  EXPECT_EQ(events[18].depth, 1);
  EXPECT_THAT(dot, HasSubstr("CheckpointBackward  #"));
  EXPECT_THAT(dot, HasSubstr("retains grad"));
}

TEST(TraceExamples, NonReentrantCheckpoint) {
  std::string dot;
  const auto events = RunTraced("non_reentrant_checkpoint", &dot);
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                  "node_begin MulBackward", "node_end MulBackward", "node_begin TanhBackward",
                  "hook tensor_pre_hook @ TanhBackward", "hook retain_grad @ TanhBackward",
                  "recompute_begin non_reentrant", "recompute_end non_reentrant",
                  "node_end TanhBackward", "node_begin MulBackward", "node_end MulBackward",
                  "node_begin AccumulateGrad(x)", "node_end AccumulateGrad(x)",
                  "node_begin AccumulateGrad(w)", "hook post_accumulate_grad @ AccumulateGrad(w)",
                  "callback_queued callback", "node_end AccumulateGrad(w)", "callback_run callback",
                  "task_end backward"));
  for (const TraceRecord& e : events) EXPECT_EQ(e.depth, 0);  // one task: no nesting
  EXPECT_THAT(dot, HasSubstr("TanhBackward  #"));
}

TEST(TraceExamples, AmpSkippedStep) {
  const auto events = RunTraced("amp_skipped_step");
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin MulScalarBackward",
                  "node_end MulScalarBackward", "node_begin CastBackward", "node_end CastBackward",
                  "node_begin SumBackward", "node_end SumBackward", "node_begin MulBackward",
                  "node_end MulBackward", "node_begin AccumulateGrad(w)",
                  "hook post_accumulate_grad @ AccumulateGrad(w)", "callback_queued callback",
                  "node_end AccumulateGrad(w)", "callback_run callback",
                  "user amp: master-gradient update (1 parameters)", "task_end backward",
                  "user amp: scaler update: found_inf=1 scale 65536 -> 32768 (step "
                  "skipped)"));
}

TEST(TraceExamples, Ddp2Ranks) {
  const auto events = RunTraced("ddp_2_ranks");
  std::vector<int> threads;
  for (const TraceRecord& e : events) {
    if (std::find(threads.begin(), threads.end(), e.thread) == threads.end())
      threads.push_back(e.thread);
  }
  ASSERT_EQ(threads.size(), 2u);  // one per rank
  for (int t : threads) {
    EXPECT_THAT(Sequence(events, t),
                ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                            "node_begin LinearBackward", "node_end LinearBackward",
                            "node_begin AccumulateGrad(bias)",
                            "hook post_accumulate_grad @ AccumulateGrad(bias)",
                            "callback_queued callback", "user ddp: bucket 0 launched",
                            "node_end AccumulateGrad(bias)", "node_begin AccumulateGrad(weight)",
                            "hook post_accumulate_grad @ AccumulateGrad(weight)",
                            "user ddp: bucket 1 launched", "node_end AccumulateGrad(weight)",
                            "callback_run callback", "user ddp: bucket 0 finished",
                            "user ddp: bucket 1 finished", "task_end backward"))
        << "thread " << t;
  }
}

TEST(TraceExamples, UnknownName) {
  EXPECT_EQ(RunTraceExample("nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tg::tools
