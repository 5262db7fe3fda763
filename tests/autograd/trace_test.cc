// The engine event trace (autograd/trace.h): exact event sequences, nothing recorded when off,
// nested scopes, threads, hand-off, and the JSON / text exports.
#include "autograd/trace.h"

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/graph_dot.h"
#include "autograd/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tg {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// "kind name", "hook kind @ node", "user category: message".
std::vector<std::string> Sequence(const std::vector<TraceRecord>& events) {
  std::vector<std::string> out;
  for (const TraceRecord& e : events) {
    std::string s = std::string(TraceKindName(e.kind)) + " " + e.name;
    if (e.kind == TraceKind::kHook) s += " @ " + e.node;
    if (e.kind == TraceKind::kUser) s += ": " + e.detail;
    out.push_back(s);
  }
  return out;
}

Tensor Leaf(std::vector<float> values, const char* name) {
  Tensor v(RawTensor::FromVector<float>(values, {static_cast<int64_t>(values.size())}), true);
  v.set_name(name);
  return v;
}

TEST(Trace, OffRecordsNothingAndIsOffByDefault) {
  EXPECT_FALSE(TracingEnabled());
  Tensor x = Leaf({1, 2}, "x");
  Sum(Mul(x, x)).backward();
  TraceEvent("test", "not recorded");
  TraceScope trace;
  EXPECT_TRUE(TracingEnabled());
  EXPECT_TRUE(trace.events().empty());  // nothing from before the scope
}

TEST(Trace, HooksNodesAndCallbacksInEngineOrder) {
  Tensor x = Leaf({1, 2}, "x");
  Tensor y = Mul(x, x);
  y.retain_grad();
  y.register_hook([](const Tensor&) { return Tensor(); });
  y.grad_fn()->RegisterPreHook([](const VariableList&) { return VariableList(); });
  y.grad_fn()->RegisterPostHook([](const VariableList&, const VariableList&) {});
  x.register_hook([](const Tensor&) { return Tensor(); });
  x.register_post_accumulate_grad_hook([](const Tensor&) { queue_callback([] {}); });
  Tensor loss = Sum(y);
  std::vector<TraceRecord> events;
  {
    TraceScope trace;
    loss.backward();
    TraceEvent("user", "after ", 1, " backward");
    events = trace.events();
  }
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                  "node_begin MulBackward", "hook tensor_pre_hook @ MulBackward",
                  "hook retain_grad @ MulBackward", "hook node_pre_hook @ MulBackward",
                  "hook node_post_hook @ MulBackward", "node_end MulBackward",
                  "node_begin AccumulateGrad(x)", "hook tensor_pre_hook @ AccumulateGrad(x)",
                  "hook post_accumulate_grad @ AccumulateGrad(x)", "callback_queued callback",
                  "node_end AccumulateGrad(x)", "callback_run callback", "callback_end callback",
                  "task_end backward", "user user: after 1 backward"));
  EXPECT_EQ(events[0].parent_task, -1);
  EXPECT_EQ(events[0].depth, 0);
  EXPECT_EQ(events.back().task, -1);  // after the backward
  for (size_t i = 1; i + 1 < events.size(); ++i) EXPECT_EQ(events[i].task, events[0].task);
  EXPECT_GT(events[4].handle, 0u);  // the tensor hook's handle id
}

TEST(Trace, GradTaskAndMultiGradHook) {
  Tensor a = Leaf({1}, "a");
  Tensor b = Leaf({2}, "b");
  auto handle = register_multi_grad_hook({a, b}, [](const VariableList&) {});
  Tensor loss = Sum(Mul(a, b));
  TraceScope trace;
  Engine::Grad({loss}, {a, b});
  const std::vector<std::string> seq = Sequence(trace.events());
  EXPECT_EQ(seq.front(), "task_begin grad");
  EXPECT_EQ(seq.back(), "task_end grad");
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "hook multi_grad @ vars[1]") +
                std::count(seq.begin(), seq.end(), "hook multi_grad @ vars[0]"),
            1);
  // The hook's per-task bookkeeping is the engine's, not a callback the user queued.
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "callback_queued multi_grad cleanup (internal)"), 1);
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "callback_run multi_grad cleanup (internal)"), 1);
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "callback_end multi_grad cleanup (internal)"), 1);
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "callback_queued callback"), 0);
}

TEST(Trace, ReentrantCheckpointNestsATask) {
  Tensor x = Leaf({1, 2}, "x");
  Tensor w = Leaf({3, 4}, "w");
  CheckpointOptions options;
  options.reentrant = true;
  Tensor h = Checkpoint([&w](const VariableList& in) { return Mul(in[0], w); }, {x}, options);
  Tensor loss = Sum(h);
  TraceScope trace;
  loss.backward();
  const auto events = trace.events();
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                  "node_begin CheckpointBackward", "recompute_begin reentrant",
                  "recompute_end reentrant", "task_begin backward", "node_begin MulBackward",
                  "node_end MulBackward", "node_begin AccumulateGrad", "node_end AccumulateGrad",
                  "node_begin AccumulateGrad(w)", "node_end AccumulateGrad(w)", "task_end backward",
                  "node_end CheckpointBackward", "node_begin AccumulateGrad(x)",
                  "node_end AccumulateGrad(x)", "task_end backward"));
  EXPECT_EQ(events[6].parent_task, events[0].task);
  EXPECT_EQ(events[6].depth, 1);
  EXPECT_EQ(events[7].task, events[6].task);
}

TEST(Trace, NonReentrantCheckpointRecomputesInsideTheNode) {
  Tensor x = Leaf({1, 2}, "x");
  CheckpointOptions options;
  options.reentrant = false;
  Tensor h = Checkpoint([](const VariableList& in) { return Tanh(in[0]); }, {x}, options);
  Tensor loss = Sum(h);
  TraceScope trace;
  loss.backward();
  EXPECT_THAT(Sequence(trace.events()),
              ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                          "node_begin TanhBackward", "recompute_begin non_reentrant",
                          "recompute_end non_reentrant", "node_end TanhBackward",
                          "node_begin AccumulateGrad(x)", "node_end AccumulateGrad(x)",
                          "task_end backward"));
}

TEST(Trace, AFailedTaskEndsWithItsError) {
  Tensor x = Leaf({1}, "x");
  x.register_hook([](const Tensor&) -> Tensor { throw Error("boom"); });
  Tensor loss = Sum(x);
  TraceScope trace;
  EXPECT_THROW(loss.backward(), Error);
  const auto events = trace.events();
  // The failing node's span ends (with the error) before the task's.
  EXPECT_THAT(Sequence(events), ElementsAre("task_begin backward", "node_begin SumBackward",
                                            "node_end SumBackward", "node_begin AccumulateGrad(x)",
                                            "hook tensor_pre_hook @ AccumulateGrad(x)",
                                            "node_end AccumulateGrad(x)", "task_end backward"));
  EXPECT_EQ(events[5].error, "boom");
  EXPECT_EQ(events[6].error, "boom");
  EXPECT_EQ(events[2].error, "");
}

// Pairs every end with the innermost open begin of its thread; returns what is left open.
std::vector<std::string> UnclosedSpans(const nlohmann::json& doc) {
  std::map<int, std::vector<std::string>> open;
  for (const auto& e : doc.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "B") open[e.at("tid").get<int>()].push_back(e.at("name"));
    if (ph == "E") {
      auto& stack = open[e.at("tid").get<int>()];
      EXPECT_FALSE(stack.empty()) << "an end without a begin: " << e.dump();
      if (stack.empty()) continue;
      EXPECT_EQ(stack.back(), e.at("name").get<std::string>()) << "closes the wrong span";
      stack.pop_back();
    }
  }
  std::vector<std::string> left;
  for (const auto& [tid, stack] : open) left.insert(left.end(), stack.begin(), stack.end());
  return left;
}

TEST(Trace, ANodeThatThrowsEndsEverySpanInOrder) {
  Tensor x = Leaf({1, 2}, "x");
  Tensor y = Mul(x, x);
  y.grad_fn()->RegisterPreHook([](const VariableList&) -> VariableList { throw Error("boom"); });
  Tensor loss = Sum(y);
  TraceScope trace;
  EXPECT_THROW(loss.backward(), Error);
  const auto events = trace.events();
  EXPECT_THAT(Sequence(events),
              ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                          "node_begin MulBackward", "hook node_pre_hook @ MulBackward",
                          "node_end MulBackward", "task_end backward"));
  EXPECT_EQ(events[5].error, "boom");
  EXPECT_EQ(events[6].error, "boom");
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  EXPECT_TRUE(UnclosedSpans(doc).empty());
  const auto& json_events = doc.at("traceEvents");
  // json_events[0] names the thread; then the records in order.
  EXPECT_EQ(json_events[6].at("ph"), "E");
  EXPECT_EQ(json_events[6].at("name"), "MulBackward");
  EXPECT_EQ(json_events[6].at("args").at("error"), "boom");
  EXPECT_EQ(json_events[7].at("ph"), "E");
  EXPECT_EQ(json_events[7].at("args").at("error"), "boom");
  EXPECT_FALSE(json_events[3].at("args").contains("error"));  // SumBackward ended normally
  EXPECT_THAT(trace.ToText(),
              HasSubstr("node_end MulBackward seq=" + std::to_string(events[5].sequence_nr) +
                        " task=" + std::to_string(events[5].task) + " error=\"boom\"\n"));
}

TEST(Trace, AFailedRecomputeInANestedTaskEndsEverySpan) {
  // A reentrant checkpoint whose recomputation throws: recompute, node and task all end.
  Tensor x = Leaf({1, 2}, "x");
  int calls = 0;
  CheckpointOptions options;
  options.reentrant = true;
  Tensor h = Checkpoint(
      [&calls](const VariableList& in) {
        if (++calls == 2) throw Error("recompute failed");
        return Tanh(in[0]);
      },
      {x}, options);
  Tensor loss = Sum(h);
  TraceScope trace;
  EXPECT_THROW(loss.backward(), Error);
  const auto events = trace.events();
  EXPECT_THAT(Sequence(events), ElementsAre("task_begin backward", "node_begin SumBackward",
                                            "node_end SumBackward", "node_begin CheckpointBackward",
                                            "recompute_begin reentrant", "recompute_end reentrant",
                                            "node_end CheckpointBackward", "task_end backward"));
  EXPECT_EQ(events[5].error, "recompute failed");
  EXPECT_EQ(events[6].error, "recompute failed [in CheckpointBackward]");
  EXPECT_EQ(events[7].error, "recompute failed [in CheckpointBackward]");
  EXPECT_TRUE(UnclosedSpans(nlohmann::json::parse(trace.ToChromeJson())).empty());
}

TEST(Trace, ACallbackIsASpanThatEndsWhenItThrows) {
  Tensor x = Leaf({1}, "x");
  x.register_post_accumulate_grad_hook([](const Tensor&) {
    queue_callback([] {}, "first");
    queue_callback([] { throw Error("callback failed"); }, "second");
  });
  Tensor loss = Sum(x);
  TraceScope trace;
  EXPECT_THROW(loss.backward(), Error);
  const auto events = trace.events();
  EXPECT_THAT(
      Sequence(events),
      ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                  "node_begin AccumulateGrad(x)", "hook post_accumulate_grad @ AccumulateGrad(x)",
                  "callback_queued first", "callback_queued second", "node_end AccumulateGrad(x)",
                  "callback_run first", "callback_end first", "callback_run second",
                  "callback_end second", "task_end backward"));
  EXPECT_EQ(events[9].error, "");
  EXPECT_EQ(events[11].error, "callback failed");
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  EXPECT_TRUE(UnclosedSpans(doc).empty());
  EXPECT_EQ(doc.at("traceEvents")[9].at("ph"), "B");
  EXPECT_EQ(doc.at("traceEvents")[9].at("name"), "first");
  EXPECT_EQ(doc.at("traceEvents")[10].at("ph"), "E");
}

TEST(Trace, ThreadsAreNamedByRankAndRole) {
  Tensor x = Leaf({1}, "x");
  TraceScope trace;
  Sum(x).backward();
  std::thread other([&] {
    TraceScope::ThreadGuard guard(&trace);
    TraceEvent("t", "no role");
  });
  other.join();
  std::thread worker([&] {
    TraceScope::ThreadGuard guard(&trace);
    TraceThreadRole role("data loader");
    SetTraceRank(3);
    TraceEvent("t", "with role");
  });
  worker.join();
  const auto events = trace.events();
  const int main_t = events.front().thread, other_t = events[events.size() - 2].thread,
            worker_t = events.back().thread;
  EXPECT_THAT(trace.thread_names(),
              ElementsAre(std::pair<int, std::string>(main_t, "backward"),
                          std::pair<int, std::string>(other_t, "thread " + std::to_string(other_t)),
                          std::pair<int, std::string>(worker_t, "rank 3 / data loader")));
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  EXPECT_EQ(doc.at("traceEvents")[0],
            nlohmann::json::parse(R"({"name":"thread_name","ph":"M","pid":1,"tid":)" +
                                  std::to_string(main_t) + R"(,"args":{"name":"backward"}})"));
  EXPECT_EQ(doc.at("traceEvents")[2].at("args").at("name"), "rank 3 / data loader");
  EXPECT_THAT(trace.ToText(),
              HasSubstr("# [t" + std::to_string(worker_t) + "] rank 3 / data loader\n"));
}

TEST(Trace, TextIndentationIsCappedAtReentrantDepth47) {
  // 48 nested backward calls on one thread (depths 0..47, Engine::kMaxDepthPerThread = 48):
  // each nests two levels (its task, the leaf's AccumulateGrad whose hook starts the next).
  std::function<void(int)> nest = [&](int level) {
    EnableGradGuard grad;
    Tensor x = Leaf({1}, "x");
    Tensor y = MulScalar(x, 2);
    if (level > 0) {
      x.register_hook([&, level](const Tensor&) {
        nest(level - 1);
        return Tensor();
      });
    }
    Sum(y).backward();
  };
  TraceScope trace;
  nest(47);
  const auto events = trace.events();
  const TraceRecord* deepest = nullptr;
  for (const TraceRecord& e : events) {
    if (e.kind == TraceKind::kTaskBegin && e.depth == 47) deepest = &e;
  }
  ASSERT_NE(deepest, nullptr);
  const std::string text = trace.ToText();
  const std::string line = absl::StrCat("[level 94] task_begin backward task=", deepest->task,
                                        " parent=", deepest->parent_task, " depth=47\n");
  const size_t at = text.find(line);
  ASSERT_NE(at, std::string::npos) << text;
  // Its indent: the cap (12 levels of two spaces) after the timestamp's "us  ".
  EXPECT_EQ(text.substr(at - 28, 28), "us  " + std::string(2 * TraceScope::kMaxTextIndent, ' '));
  size_t longest = 0;
  for (size_t p = 0, q; p < text.size(); p = q + 1) {
    q = text.find('\n', p);
    longest = std::max(longest, q - p);
  }
  EXPECT_LE(longest, 120u);
  EXPECT_THAT(text, HasSubstr("us  " + std::string(22, ' ') + "node_begin SumBackward"));
}

TEST(Trace, NestedScopesSeeTheirOwnStretch) {
  Tensor x = Leaf({1}, "x");
  TraceScope outer;
  TraceEvent("t", "outer only");
  std::vector<std::string> inner_seq;
  {
    TraceScope inner;
    TraceEvent("t", "both");
    inner_seq = Sequence(inner.events());
  }
  EXPECT_TRUE(TracingEnabled());  // the outer scope is active again
  TraceEvent("t", "outer again");
  EXPECT_THAT(inner_seq, ElementsAre("user t: both"));
  EXPECT_THAT(Sequence(outer.events()),
              ElementsAre("user t: outer only", "user t: both", "user t: outer again"));
}

TEST(Trace, ThreadsRecordIntoTheirOwnScopesUnlessTheyJoin) {
  TraceScope main_trace;
  std::vector<std::string> other_seq;
  std::thread other([&] {
    EXPECT_FALSE(TracingEnabled());  // scopes are per thread
    TraceEvent("t", "dropped");
    TraceScope own;
    Tensor x = Leaf({1}, "x");
    Sum(x).backward();
    other_seq = Sequence(own.events());
  });
  other.join();
  EXPECT_TRUE(main_trace.events().empty());
  EXPECT_EQ(other_seq.size(), 6u);

  std::thread joined([&] {
    TraceScope::ThreadGuard guard(&main_trace);
    TraceEvent("t", "from the other thread");
  });
  joined.join();
  TraceEvent("t", "from main");
  const auto events = main_trace.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_NE(events[0].thread, events[1].thread);
}

TEST(Trace, DeepReentrantBackwardHandsOffAndKeepsTracing) {
  // A chain of nested backward calls deeper than one thread runs: the engine hands off.
  const int depth = Engine::kMaxDepthPerThread + 2;
  std::function<void(int)> nest = [&](int level) {
    EnableGradGuard grad;         // hooks run under no-grad
    Tensor x = Leaf({1}, "x");    // a leaf: hooks run under no-grad, where ops record nothing
    Tensor y = MulScalar(x, 2);
    if (level > 0) {
      x.register_hook([&, level](const Tensor&) {
        nest(level - 1);
        return Tensor();
      });
    }
    Sum(y).backward();
  };
  TraceScope trace;
  nest(depth);
  const auto events = trace.events();
  int handoffs = 0, begins = 0;
  bool other_thread = false;
  for (const TraceRecord& e : events) {
    handoffs += e.kind == TraceKind::kHandOff;
    begins += e.kind == TraceKind::kTaskBegin;
    other_thread |= e.thread != events[0].thread;
  }
  EXPECT_EQ(handoffs, 1);
  EXPECT_EQ(begins, depth + 1);
  EXPECT_TRUE(other_thread);
  // The hand-off thread is named after the task it continues.
  int64_t handed_off = -1;
  for (const TraceRecord& e : events) {
    if (e.kind == TraceKind::kHandOff) handed_off = e.task;
  }
  EXPECT_THAT(
      trace.thread_names(),
      ElementsAre(std::pair<int, std::string>(events[0].thread, "backward"),
                  ::testing::Pair(::testing::Ne(events[0].thread),
                                  absl::StrCat("backward hand-off (task ", handed_off, ")"))));
}

TEST(Trace, ChromeJsonAndTextExports) {
  Tensor x = Leaf({1, 2}, "x");
  x.register_post_accumulate_grad_hook([](const Tensor&) {});
  Tensor loss = Sum(Mul(x, x));
  TraceScope trace;
  loss.backward();
  TraceEvent("ddp", "bucket 0 launched");
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  const auto& events = doc.at("traceEvents");
  ASSERT_EQ(events.size(), trace.events().size() + 1);  // + the thread's name
  EXPECT_EQ(events[0].at("ph"), "M");
  int begins = 0, ends = 0;
  for (const auto& e : events) {
    if (e.at("ph") == "M") continue;
    for (const char* field : {"name", "cat", "ph", "pid", "tid", "ts", "args"}) {
      EXPECT_TRUE(e.contains(field)) << field << " in " << e.dump();
    }
    const std::string ph = e.at("ph");
    begins += ph == "B";
    ends += ph == "E";
    if (ph == "i") {
      EXPECT_EQ(e.at("s"), "t");
    }
    EXPECT_GE(e.at("ts").get<double>(), 0.0);
  }
  EXPECT_EQ(begins, ends);
  EXPECT_EQ(events[1].at("name"), "backward");
  EXPECT_EQ(events[1].at("ph"), "B");
  EXPECT_EQ(events[1].at("args").at("parent_task"), -1);
  EXPECT_EQ(events.back().at("name"), "ddp: bucket 0 launched");

  const std::string text = trace.ToText();
  // A header line naming the thread, then one line per record.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(events.size()));
  EXPECT_EQ(text.substr(0, text.find('\n') + 1),
            "# [t" + std::to_string(trace.events()[0].thread) + "] backward\n");
  EXPECT_THAT(text, HasSubstr("us  task_begin backward"));
  EXPECT_THAT(text, HasSubstr("us    node_begin SumBackward"));
  EXPECT_THAT(text, HasSubstr("us      hook post_accumulate_grad node=AccumulateGrad(x)"));
}

TEST(GraphDot, NamesEdgesHooksAndRetainedGrads) {
  Tensor x = Leaf({1, 2}, "x");
  Tensor w = Leaf({3, 4}, "w");
  Tensor y = Mul(x, w);
  y.retain_grad();
  w.register_post_accumulate_grad_hook([](const Tensor&) {});
  Tensor loss = Sum(y);
  loss.set_name("loss");
  const std::string dot = BackwardGraphToDot(loss);
  EXPECT_THAT(dot, HasSubstr("digraph backward {"));
  EXPECT_THAT(dot, HasSubstr("root [shape=plaintext, label=\"loss []\"]"));
  EXPECT_THAT(dot, HasSubstr("SumBackward  #"));
  EXPECT_THAT(dot, HasSubstr("MulBackward  #"));
  EXPECT_THAT(dot, HasSubstr("retains grad\", shape=box, style=filled"));
  EXPECT_THAT(dot, HasSubstr("AccumulateGrad(w)\\nleaf [2] f32\\n1 post-accumulate-grad hook(s)"));
  EXPECT_THAT(dot, HasSubstr("AccumulateGrad(x)\\nleaf [2] f32\", shape=ellipse"));
  // root -> Sum -> Mul -> two leaves: four edges.
  size_t arrows = 0;
  for (size_t p = dot.find("->"); p != std::string::npos; p = dot.find("->", p + 1)) ++arrows;
  EXPECT_EQ(arrows, 4u);
  EXPECT_EQ(BackwardGraphToDot(Tensor(RawTensor::Ones({1}))),
            "digraph backward {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n}\n");
}

TEST(GraphDot, MarksTheNodesANonReentrantCheckpointRecomputes) {
  Tensor x = Leaf({1, 2}, "x");
  Tensor w = Leaf({3, 4}, "w");
  Tensor x2 = MulScalar(x, 2);  // before the checkpoint: kept, not recomputed
  CheckpointOptions options;
  options.reentrant = false;
  Tensor h =
      Checkpoint([&w](const VariableList& in) { return Tanh(Mul(in[0], w)); }, {x2}, options);
  h.retain_grad();
  Tensor loss = Sum(h);
  loss.set_name("loss");
  const Node* sum = loss.grad_fn().get();
  const Node* tanh = h.grad_fn().get();
  const Node* mul = tanh->next_edges()[0].fn.get();
  const Node* scale = x2.grad_fn().get();
  auto seq = [](const Node* n) { return std::to_string(n->sequence_nr()); };
  EXPECT_EQ(BackwardGraphToDot(loss),
            "digraph backward {\n"
            "  rankdir=TB;\n"
            "  node [fontname=\"monospace\"];\n"
            "  root [shape=plaintext, label=\"loss []\"];\n"
            "  root -> n0;\n"
            "  n0 [label=\"SumBackward  #" +
                seq(sum) +
                "\", shape=box];\n"
                "  n0 -> n1;\n"
                "  n1 [label=\"TanhBackward  #" +
                seq(tanh) +
                "\\nretains grad\\nrecomputed by checkpoint\", shape=box, "
                "style=\"filled,dashed\", fillcolor=lightblue];\n"
                "  n1 -> n2;\n"
                "  n2 [label=\"MulBackward  #" +
                seq(mul) +
                "\\nrecomputed by checkpoint\", shape=box, style=dashed];\n"
                "  n2 -> n3;\n"
                "  n2 -> n4;\n"
                "  n4 [label=\"AccumulateGrad(w)\\nleaf [2] f32\", shape=ellipse];\n"
                "  n3 [label=\"MulScalarBackward  #" +
                seq(scale) +
                "\", shape=box];\n"
                "  n3 -> n5;\n"
                "  n5 [label=\"AccumulateGrad(x)\\nleaf [2] f32\", shape=ellipse];\n"
                "}\n");
}

TEST(GraphDot, NestedCheckpointsMarkTheOuterSegmentBelowTheInnerOne) {
  Tensor x = Leaf({1, 2}, "x");
  CheckpointOptions options;
  options.reentrant = false;
  Tensor h = Checkpoint(
      [&options](const VariableList& in) {
        Tensor a = Exp(in[0]);  // outer segment, below the inner checkpoint
        Tensor b = Checkpoint([](const VariableList& v) { return Tanh(v[0]); }, {a}, options);
        return Sum(b);
      },
      {x}, options);
  const Node* sum = h.grad_fn().get();
  const Node* tanh = sum->next_edges()[0].fn.get();
  const Node* exp = tanh->next_edges()[0].fn.get();
  EXPECT_EQ(exp->name(), "ExpBackward");
  EXPECT_TRUE(sum->recomputed_by_checkpoint());
  EXPECT_TRUE(tanh->recomputed_by_checkpoint());
  EXPECT_TRUE(exp->recomputed_by_checkpoint());
  EXPECT_FALSE(exp->next_edges()[0].fn->recomputed_by_checkpoint());  // x's AccumulateGrad
}

}  // namespace
}  // namespace tg
