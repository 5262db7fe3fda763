// The engine event trace (autograd/trace.h): exact event sequences, nothing recorded when off,
// nested scopes, threads, hand-off, and the JSON / text exports.
#include "autograd/trace.h"

#include <string>
#include <thread>
#include <vector>

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

Variable Leaf(std::vector<float> values, const char* name) {
  Variable v(Tensor::FromVector<float>(values, {static_cast<int64_t>(values.size())}), true);
  v.set_name(name);
  return v;
}

TEST(Trace, OffRecordsNothingAndIsOffByDefault) {
  EXPECT_FALSE(TracingEnabled());
  Variable x = Leaf({1, 2}, "x");
  Sum(Mul(x, x)).backward();
  TraceEvent("test", "not recorded");
  TraceScope trace;
  EXPECT_TRUE(TracingEnabled());
  EXPECT_TRUE(trace.events().empty());  // nothing from before the scope
}

TEST(Trace, HooksNodesAndCallbacksInEngineOrder) {
  Variable x = Leaf({1, 2}, "x");
  Variable y = Mul(x, x);
  y.retain_grad();
  y.register_hook([](const Variable&) { return Variable(); });
  y.grad_fn()->RegisterPreHook([](const VariableList&) { return VariableList(); });
  y.grad_fn()->RegisterPostHook([](const VariableList&, const VariableList&) {});
  x.register_hook([](const Variable&) { return Variable(); });
  x.register_post_accumulate_grad_hook([](const Variable&) { queue_callback([] {}); });
  Variable loss = Sum(y);
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
                  "node_end AccumulateGrad(x)", "callback_run callback", "task_end backward",
                  "user user: after 1 backward"));
  EXPECT_EQ(events[0].parent_task, -1);
  EXPECT_EQ(events[0].depth, 0);
  EXPECT_EQ(events.back().task, -1);  // after the backward
  for (size_t i = 1; i + 1 < events.size(); ++i) EXPECT_EQ(events[i].task, events[0].task);
  EXPECT_GT(events[4].handle, 0u);  // the tensor hook's handle id
}

TEST(Trace, GradTaskAndMultiGradHook) {
  Variable a = Leaf({1}, "a");
  Variable b = Leaf({2}, "b");
  auto handle = register_multi_grad_hook({a, b}, [](const VariableList&) {});
  Variable loss = Sum(Mul(a, b));
  TraceScope trace;
  Engine::Grad({loss}, {a, b});
  const std::vector<std::string> seq = Sequence(trace.events());
  EXPECT_EQ(seq.front(), "task_begin grad");
  EXPECT_EQ(seq.back(), "task_end grad");
  EXPECT_EQ(std::count(seq.begin(), seq.end(), "hook multi_grad @ vars[1]") +
                std::count(seq.begin(), seq.end(), "hook multi_grad @ vars[0]"),
            1);
}

TEST(Trace, ReentrantCheckpointNestsATask) {
  Variable x = Leaf({1, 2}, "x");
  Variable w = Leaf({3, 4}, "w");
  CheckpointOptions options;
  options.reentrant = true;
  Variable h = Checkpoint([&w](const VariableList& in) { return Mul(in[0], w); }, {x}, options);
  Variable loss = Sum(h);
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
  Variable x = Leaf({1, 2}, "x");
  CheckpointOptions options;
  options.reentrant = false;
  Variable h = Checkpoint([](const VariableList& in) { return Tanh(in[0]); }, {x}, options);
  Variable loss = Sum(h);
  TraceScope trace;
  loss.backward();
  EXPECT_THAT(Sequence(trace.events()),
              ElementsAre("task_begin backward", "node_begin SumBackward", "node_end SumBackward",
                          "node_begin TanhBackward", "recompute_begin non_reentrant",
                          "recompute_end non_reentrant", "node_end TanhBackward",
                          "node_begin AccumulateGrad(x)", "node_end AccumulateGrad(x)",
                          "task_end backward"));
}

TEST(Trace, FailedTaskEndsAsFailed) {
  Variable x = Leaf({1}, "x");
  x.register_hook([](const Variable&) -> Variable { throw Error("boom"); });
  Variable loss = Sum(x);
  TraceScope trace;
  EXPECT_THROW(loss.backward(), Error);
  EXPECT_EQ(Sequence(trace.events()).back(), "task_end failed");
}

TEST(Trace, NestedScopesSeeTheirOwnStretch) {
  Variable x = Leaf({1}, "x");
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
    Variable x = Leaf({1}, "x");
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
    Variable x = Leaf({1}, "x");  // a leaf: hooks run under no-grad, where ops record nothing
    Variable y = MulScalar(x, 2);
    if (level > 0) {
      x.register_hook([&, level](const Variable&) {
        nest(level - 1);
        return Variable();
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
}

TEST(Trace, ChromeJsonAndTextExports) {
  Variable x = Leaf({1, 2}, "x");
  x.register_post_accumulate_grad_hook([](const Variable&) {});
  Variable loss = Sum(Mul(x, x));
  TraceScope trace;
  loss.backward();
  TraceEvent("ddp", "bucket 0 launched");
  const nlohmann::json doc = nlohmann::json::parse(trace.ToChromeJson());
  const auto& events = doc.at("traceEvents");
  ASSERT_EQ(events.size(), trace.events().size());
  int begins = 0, ends = 0;
  for (const auto& e : events) {
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
  EXPECT_EQ(events[0].at("name"), "backward");
  EXPECT_EQ(events[0].at("ph"), "B");
  EXPECT_EQ(events[0].at("args").at("parent_task"), -1);
  EXPECT_EQ(events.back().at("name"), "ddp: bucket 0 launched");

  const std::string text = trace.ToText();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), static_cast<long>(events.size()));
  EXPECT_THAT(text, HasSubstr("us  task_begin backward"));
  EXPECT_THAT(text, HasSubstr("us    node_begin SumBackward"));
  EXPECT_THAT(text, HasSubstr("us      hook post_accumulate_grad node=AccumulateGrad(x)"));
}

TEST(GraphDot, NamesEdgesHooksAndRetainedGrads) {
  Variable x = Leaf({1, 2}, "x");
  Variable w = Leaf({3, 4}, "w");
  Variable y = Mul(x, w);
  y.retain_grad();
  w.register_post_accumulate_grad_hook([](const Variable&) {});
  Variable loss = Sum(y);
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
  EXPECT_EQ(BackwardGraphToDot(Variable(Tensor::Ones({1}))),
            "digraph backward {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n}\n");
}

}  // namespace
}  // namespace tg
