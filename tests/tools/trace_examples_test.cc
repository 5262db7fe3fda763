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
                  "node_end AccumulateGrad(x)", "callback_run callback", "callback_end callback",
                  "task_end backward"));
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
                  "callback_end callback", "task_end backward"));
  for (const TraceRecord& e : events) EXPECT_EQ(e.depth, 0);  // one task: no nesting
  // The segment's two nodes are marked as recomputed (dashed); the one outside it is not.
  EXPECT_THAT(dot, HasSubstr("TanhBackward  #"));
  EXPECT_THAT(dot, HasSubstr("\\nretains grad\\nrecomputed by checkpoint\", shape=box, "
                             "style=\"filled,dashed\""));
  EXPECT_THAT(dot, HasSubstr("\\nrecomputed by checkpoint\", shape=box, style=dashed];"));
  size_t marked = 0;
  for (size_t p = dot.find("recomputed by"); p != std::string::npos;
       p = dot.find("recomputed by", p + 1)) {
    ++marked;
  }
  EXPECT_EQ(marked, 2u);
}

TEST(TraceExamples, AmpSkippedStep) {
  const auto events = RunTraced("amp_skipped_step");
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin MulScalarBackward",
                  "node_end MulScalarBackward", "node_begin CastBackward", "node_end CastBackward",
                  "node_begin SumBackward", "node_end SumBackward", "node_begin MulBackward",
                  "node_end MulBackward", "node_begin AccumulateGrad(w)",
                  "hook post_accumulate_grad @ AccumulateGrad(w)",
                  "callback_queued amp master-gradient update", "node_end AccumulateGrad(w)",
                  "callback_run amp master-gradient update",
                  "user amp: master-gradient update (1 parameters)",
                  "callback_end amp master-gradient update", "task_end backward",
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
                            "callback_queued ddp finalize", "user ddp: bucket 0 launched",
                            "node_end AccumulateGrad(bias)", "node_begin AccumulateGrad(weight)",
                            "hook post_accumulate_grad @ AccumulateGrad(weight)",
                            "user ddp: bucket 1 launched", "node_end AccumulateGrad(weight)",
                            "callback_run ddp finalize", "user ddp: bucket 0 finished",
                            "user ddp: bucket 1 finished", "callback_end ddp finalize",
                            "task_end backward"))
        << "thread " << t;
  }
}

TEST(TraceExamples, Ddp2RanksNamesItsThreadsAndShowsTheAllReduceWait) {
  TraceScope trace;
  ASSERT_TRUE(RunTraceExample("ddp_2_ranks").ok());
  const std::vector<TraceRecord> events = trace.events();
  const std::vector<std::pair<int, std::string>> names = trace.thread_names();
  ASSERT_EQ(names.size(), 2u);
  // Rank 0 runs on the caller's thread (the first to record), rank 1 on the other one.
  EXPECT_EQ(names[0].second, "rank 0 / backward");
  EXPECT_EQ(names[1].second, "rank 1 / backward");
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  const auto& json_events = doc.at("traceEvents");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(json_events[i], nlohmann::json({{"name", "thread_name"},
                                              {"ph", "M"},
                                              {"pid", 1},
                                              {"tid", names[i].first},
                                              {"args", {{"name", names[i].second}}}}));
  }
  // Per thread: the finaliser is a B/E span and the buckets' waits end inside it.
  for (const auto& [tid, name] : names) {
    std::vector<std::string> seen;
    for (const auto& e : json_events) {
      if (e.at("tid") != tid || e.at("ph") == "M") continue;
      const std::string n = e.at("name");
      if (n == "ddp finalize" || n.rfind("ddp: bucket", 0) == 0)
        seen.push_back(e.at("ph").get<std::string>() + " " + n);
    }
    EXPECT_THAT(
        seen, ElementsAre("i ddp finalize", "i ddp: bucket 0 launched", "i ddp: bucket 1 launched",
                          "B ddp finalize", "i ddp: bucket 0 finished", "i ddp: bucket 1 finished",
                          "E ddp finalize"))
        << name;
  }
}

TEST(TraceExamples, UnknownName) {
  EXPECT_EQ(RunTraceExample("nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tg::tools
