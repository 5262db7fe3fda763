// The engine's contracts (docs/architecture.md, autograd): graph-task ids, queued callbacks,
// reentrant backward, hook order, retain_graph, grad() and backward(inputs=), grad mode in
// backward.
#include "autograd/engine.h"

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;
using testing::ThrowsErrorExactly;

Variable Leaf(std::vector<double> values, Shape shape, DType dtype = kF64) {
  return Variable(Tensor::FromVector<double>(values, shape, dtype), /*requires_grad=*/true);
}

std::vector<double> Values(const Variable& v) { return v.data().to_vector<double>(); }

// A node whose backward throws, for failure tests.
class FailingNode : public Node {
 public:
  explicit FailingNode(const Variable& input) {
    mutable_next_edges().push_back(Edge{input.gradient_edge_node(), 0});
    AddInputMetadata(input.data());
  }
  VariableList Apply(VariableList) override { throw Error("boom"); }
  std::string name() const override { return "FailingBackward"; }
};

Variable Failing(const Variable& x) {
  return MakeNonLeaf(x.data().clone(), std::make_shared<FailingNode>(x), 0);
}

TEST(EngineTest, SimpleChainRule) {
  Variable x = Leaf({1, 2, 3}, {3});
  Sum(Mul(x, x)).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 4, 6}));
}

TEST(EngineTest, GradcheckSmoke) {
  Variable a = Leaf({0.5, -1.0, 2.0, 0.3}, {2, 2});
  Variable b = Leaf({1.5, 0.25}, {2});
  GradcheckResult r = Gradcheck(
      [](const VariableList& in) { return Tanh(Add(Matmul(in[0], in[0]), in[1])); }, {a, b});
  EXPECT_TRUE(r.ok) << r.message;
}

// ---- Graph-task ids --------------------------------------------------------------------------

TEST(GraphTaskIdTest, IncreasesAcrossCallsAndIsMinusOneOutside) {
  EXPECT_EQ(current_graph_task_id(), -1);
  EXPECT_EQ(current_reentrant_depth(), -1);
  Variable x = Leaf({1, 2}, {2});
  std::vector<int64_t> ids;
  x.register_hook([&](const Variable&) {
    ids.push_back(current_graph_task_id());
    return Variable();
  });
  for (int i = 0; i < 3; ++i) Sum(x).backward();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_LT(ids[0], ids[1]);
  EXPECT_LT(ids[1], ids[2]);
  EXPECT_GE(ids[0], 0);
  EXPECT_EQ(current_graph_task_id(), -1);
}

TEST(GraphTaskIdTest, CallbackSeesTheIdOfItsTasksHooks) {
  Variable x = Leaf({1, 2}, {2});
  int64_t hook_id = -2, callback_id = -3;
  x.register_hook([&](const Variable&) {
    hook_id = current_graph_task_id();
    queue_callback([&] { callback_id = current_graph_task_id(); });
    return Variable();
  });
  Sum(x).backward();
  EXPECT_GE(hook_id, 0);
  EXPECT_EQ(callback_id, hook_id);
}

TEST(GraphTaskIdTest, NestedTaskHasItsOwnIdAndTheParentsComesBack) {
  Variable x = Leaf({1, 2}, {2});
  Variable inner = Leaf({3}, {1});
  int64_t outer_before = -1, nested = -1, outer_after = -1, inner_depth = -1;
  inner.register_hook([&](const Variable&) {
    nested = current_graph_task_id();
    inner_depth = current_reentrant_depth();
    return Variable();
  });
  x.register_hook([&](const Variable&) {
    outer_before = current_graph_task_id();
    EXPECT_EQ(current_reentrant_depth(), 0);
    EnableGradGuard grad;  // hooks run without grad, as in PyTorch
    Sum(Mul(inner, inner)).backward();
    outer_after = current_graph_task_id();
    return Variable();
  });
  Sum(x).backward();
  EXPECT_GE(outer_before, 0);
  EXPECT_NE(nested, outer_before);
  EXPECT_GT(nested, outer_before);
  EXPECT_EQ(outer_after, outer_before);
  EXPECT_EQ(inner_depth, 1);
  EXPECT_EQ(Values(inner.grad()), (std::vector<double>{6}));
}

// ---- Callbacks ---------------------------------------------------------------------------------

TEST(CallbackTest, ACallbackMayQueueAnotherAndBothRunBeforeBackwardReturns) {
  Variable x = Leaf({1, 2}, {2});
  int count = 0;
  std::vector<double> grad_seen_by_callback;
  x.register_hook([&](const Variable&) {
    queue_callback([&] {
      ++count;
      queue_callback([&] {
        ++count;
        grad_seen_by_callback = Values(x.grad());  // .grad is final when callbacks run
      });
    });
    return Variable();
  });
  Sum(MulScalar(x, 3)).backward();
  EXPECT_EQ(count, 2);
  EXPECT_EQ(grad_seen_by_callback, (std::vector<double>{3, 3}));
}

TEST(CallbackTest, CallbacksRunFifoOnce) {
  Variable x = Leaf({1}, {1});
  std::vector<int> order;
  x.register_hook([&](const Variable&) {
    for (int i = 0; i < 4; ++i) queue_callback([&order, i] { order.push_back(i); });
    return Variable();
  });
  Sum(x).backward();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  Sum(x).backward();  // a new task: the old callbacks do not run again
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(CallbackTest, InnerOuterAndBothDepthCallbacksFireOnceInTheirOwnTask) {
  Variable x = Leaf({1, 2}, {2});
  Variable y = Leaf({5}, {1});
  std::vector<std::string> events;
  int64_t outer_id = -1, inner_id = -1;
  y.register_hook([&](const Variable&) {
    inner_id = current_graph_task_id();
    queue_callback([&] {
      events.push_back("inner-callback task " +
                       std::to_string(current_graph_task_id() == inner_id));
    });
    return Variable();
  });
  x.register_hook([&](const Variable&) {
    outer_id = current_graph_task_id();
    queue_callback([&] {
      events.push_back("outer-callback task " +
                       std::to_string(current_graph_task_id() == outer_id));
    });
    {
      EnableGradGuard grad;
      Sum(y).backward();  // nested task with its own callback
    }
    events.push_back("nested backward returned");
    queue_callback([&] { events.push_back("outer-callback-2"); });
    return Variable();
  });
  Sum(x).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"inner-callback task 1", "nested backward returned",
                                              "outer-callback task 1", "outer-callback-2"}));
}

TEST(CallbackTest, OutermostTaskCallbackQueuedInANestedTaskRunsAfterTheWholeBackward) {
  Variable x = Leaf({1, 2}, {2});
  Variable y = Leaf({5}, {1});
  std::vector<std::string> events;
  int64_t outer_id = -1;
  y.register_hook([&](const Variable&) {
    EXPECT_EQ(current_reentrant_depth(), 1);
    EXPECT_EQ(outermost_graph_task_id(), outer_id);
    queue_callback_on_outermost_task([&] {
      events.push_back("outermost callback in task " +
                       std::to_string(current_graph_task_id() == outer_id));
    });
    return Variable();
  });
  x.register_hook([&](const Variable&) {
    outer_id = current_graph_task_id();
    EXPECT_EQ(outermost_graph_task_id(), outer_id);
    {
      EnableGradGuard grad;
      Sum(y).backward();
    }
    events.push_back("nested backward returned");
    return Variable();
  });
  Sum(x).backward();
  EXPECT_EQ(events,
            (std::vector<std::string>{"nested backward returned", "outermost callback in task 1"}));
  EXPECT_EQ(outermost_graph_task_id(), -1);
  EXPECT_TRUE(ThrowsErrorExactly([] { queue_callback_on_outermost_task([] {}); },
                                 "callbacks can only be queued during backward"));
}

TEST(CallbackTest, BackwardStartedInsideAForwardScopeIsFlaggedWithItsNestedTasks) {
  Variable x = Leaf({1, 2}, {2});
  Variable y = Leaf({5}, {1});
  std::vector<int> flags;  // x's hook (outer), then y's (nested)
  y.register_hook([&](const Variable&) {
    flags.push_back(backward_issued_in_forward());
    return Variable();
  });
  x.register_hook([&](const Variable&) {
    flags.push_back(backward_issued_in_forward());
    EnableGradGuard grad;
    Sum(y).backward();
    return Variable();
  });
  Sum(x).backward();
  {
    ForwardScope forward;
    EXPECT_TRUE(ForwardScope::active());
    Sum(x).backward();
  }
  EXPECT_FALSE(ForwardScope::active());
  EXPECT_EQ(flags, (std::vector<int>{0, 0, 1, 1}));
}

TEST(CallbackTest, QueueingOutsideBackwardThrows) {
  EXPECT_TRUE(ThrowsErrorExactly([] { queue_callback([] {}); },
                                 "callbacks can only be queued during backward"));
}

TEST(CallbackTest, AFailingNodeMeansNoCallbacksRunAndTheErrorNamesIt) {
  Variable x = Leaf({1, 2}, {2});
  bool ran = false;
  Variable z = Leaf({1}, {1});
  z.register_hook([&](const Variable&) {
    queue_callback([&] { ran = true; });
    return Variable();
  });
  // z's hook runs first (its node is created later), then the failing node throws.
  Variable loss = Add(Sum(Failing(x)), z);
  EXPECT_TRUE(ThrowsErrorExactly([&] { loss.backward(); }, "boom [in FailingBackward]"));
  EXPECT_FALSE(ran);
  EXPECT_EQ(current_graph_task_id(), -1);  // the task state was unwound
}

// ---- Hook order
// ----------------------------------------------------------------------------------

TEST(HookOrderTest, LeafHooksRunInTheDocumentedOrder) {
  Variable x = Leaf({1, 2, 3, 4}, {4});
  Variable loss = Sum(x);
  std::shared_ptr<Node> acc = x.gradient_edge_node();
  x.register_hook([](const Variable& g) { return AddScalar(g, -2); });  // 1 -> -1
  acc->RegisterPreHook([](const VariableList& g) -> VariableList {      // -> -0.2
    return {MulScalar(g[0], 1.0 / 5)};
  });
  x.register_post_accumulate_grad_hook([](const Variable& leaf) {  // -> 0.3
    leaf.grad().data().copy_(tg::AddScalar(leaf.grad().data(), 0.5));
  });
  acc->RegisterPostHook([&x](const VariableList&, const VariableList&) {  // -> 3
    x.grad().data().copy_(tg::MulScalar(x.grad().data(), 10));
  });
  loss.backward();
  for (double v : Values(x.grad())) EXPECT_NEAR(v, 3.0, 1e-12);
}

TEST(HookOrderTest, TensorHooksChainRetainGradSeesTheResultAndNodeHooksFollow) {
  Variable x = Leaf({1, 2}, {2});
  Variable y = MulScalar(x, 2);
  y.retain_grad();
  std::vector<std::string> events;
  y.register_hook([&](const Variable& g) {
    events.push_back("tensor hook 1");
    return MulScalar(g, 3);
  });
  y.register_hook([&](const Variable& g) {
    events.push_back("tensor hook 2 sees " + std::to_string(static_cast<int>(Values(g)[0])));
    return AddScalar(g, 1);
  });
  y.grad_fn()->RegisterPreHook([&](const VariableList& g) -> VariableList {
    events.push_back("node pre-hook sees " + std::to_string(static_cast<int>(Values(g[0])[0])));
    return {};
  });
  y.grad_fn()->RegisterPostHook([&](const VariableList& in, const VariableList&) {
    events.push_back("node post-hook sees " + std::to_string(static_cast<int>(Values(in[0])[0])));
  });
  Sum(y).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"tensor hook 1", "tensor hook 2 sees 3",
                                              "node pre-hook sees 4", "node post-hook sees 8"}));
  EXPECT_EQ(Values(y.grad()), (std::vector<double>{4, 4}));  // after all tensor hooks
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{8, 8}));
}

TEST(HookOrderTest, RemovedHooksDoNotRun) {
  Variable x = Leaf({1}, {1});
  int calls = 0;
  HookHandle h = x.register_hook([&](const Variable&) {
    ++calls;
    return Variable();
  });
  HookHandle p = x.register_post_accumulate_grad_hook([&](const Variable&) { ++calls; });
  Sum(x).backward();
  EXPECT_EQ(calls, 2);
  h.remove();
  p.remove();
  h.remove();  // idempotent
  Sum(x).backward();
  EXPECT_EQ(calls, 2);
}

TEST(HookOrderTest, PostAccumulateGradHookOnANonLeafThrows) {
  Variable x = Leaf({1}, {1});
  Variable y = MulScalar(x, 2);
  EXPECT_TRUE(ThrowsError([&] { y.register_post_accumulate_grad_hook([](const Variable&) {}); },
                          "post-accumulate-grad hooks can only be registered on leaf variables"));
}

TEST(HookOrderTest, MultiGradHookFiresOncePerBackwardAfterTheLastGradient) {
  Variable a = Leaf({1}, {1});
  Variable b = Leaf({2}, {1});
  Variable unused = Leaf({3}, {1});
  std::vector<std::string> events;
  a.register_hook([&](const Variable&) {
    events.push_back("a");
    return Variable();
  });
  b.register_hook([&](const Variable&) {
    events.push_back("b");
    return Variable();
  });
  register_multi_grad_hook({a, b, unused}, [&](const VariableList& grads) {
    events.push_back("multi " + std::to_string(grads[0].defined()) +
                     std::to_string(grads[1].defined()) + std::to_string(grads[2].defined()));
  });
  Sum(Add(MulScalar(a, 2), b)).backward();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[2], "multi 110");
  events.clear();
  Sum(a).backward();  // only a participates this time
  EXPECT_EQ(events, (std::vector<std::string>{"a", "multi 100"}));
}

// ---- retain_graph and accumulation -------------------------------------------------------------

TEST(RetainGraphTest, SecondBackwardThroughSavedTensorsSaysToRetain) {
  Variable x = Leaf({1, 2}, {2});
  Variable loss = Sum(Mul(x, x));
  loss.backward();
  EXPECT_TRUE(ThrowsError([&] { loss.backward(); }, "pass retain_graph=true"));
  EXPECT_TRUE(ThrowsError([&] { loss.backward(); }, "MulBackward"));
}

TEST(RetainGraphTest, RetainedGraphRunsAgainAndGradAccumulatesInPlace) {
  Variable x = Leaf({1, 2}, {2});
  Variable loss = Sum(Mul(x, x));
  loss.backward(Variable(), BackwardOptions{/*retain_graph=*/true});
  const void* storage = x.grad().data().raw_data();
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{4, 8}));
  EXPECT_EQ(x.grad().data().raw_data(), storage);  // accumulated in place
}

TEST(RetainGraphTest, NodesThatSaveNothingCanRunTwice) {
  Variable x = Leaf({1, 2}, {2});
  Variable loss = Sum(AddScalar(MulScalar(x, 3), 1));
  loss.backward();
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{6, 6}));
}

// ---- Roots and grad_outputs
// -----------------------------------------------------------------------

// (A grad_output of another dtype is cast: hook_semantics_test.cc.)
TEST(RootsTest, NonScalarRootNeedsMatchingGradOutputs) {
  Variable x = Leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Variable y = MulScalar(x, 2);
  EXPECT_TRUE(ThrowsError([&] { y.backward(); }, "root 0 has shape [2, 3]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        y.backward(Variable(Tensor::Ones({3, 2}, kF64)));
      },
      "backward: grad_output 0 has shape [3, 2] but root 0 has shape [2, 3]"));
  y.backward(Variable(Tensor::FromVector<double>({1, 0, 2, 0, 3, 0}, {2, 3})));
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 0, 4, 0, 6, 0}));
}

TEST(RootsTest, SeveralAndRepeatedRootsSum) {
  Variable x = Leaf({1, 2}, {2});
  Variable a = Sum(MulScalar(x, 2));
  Variable b = Sum(Mul(x, x));
  Engine::Backward({a, b, a});
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2 + 2 + 2, 4 + 2 + 2}));
}

TEST(RootsTest, RootThatDoesNotRequireGradThrows) {
  Variable c(Tensor::Ones({1}, kF64));
  EXPECT_TRUE(ThrowsErrorExactly([&] { c.backward(); },
                                 "backward: root 0 does not require grad and has no grad_fn"));
}

TEST(RootsTest, ARootThatIsAlsoInsideTheGraphWaitsForItsDependencies) {
  Variable x = Leaf({3}, {1});
  Variable y = MulScalar(x, 2);  // root 1
  Variable z = Mul(y, y);        // root 0 depends on y
  Engine::Backward({z, y});
  // dz/dx = 2y * 2 = 24, dy/dx = 2
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{26}));
}

// ---- grad() and backward(inputs=)
// -----------------------------------------------------------------

TEST(GradTest, NeverTouchesGradAndRunsInputTensorHooksButNotAccumulation) {
  Variable x = Leaf({1, 2}, {2});
  int tensor_hooks = 0, post_acc = 0;
  x.register_hook([&](const Variable& g) {
    ++tensor_hooks;
    return MulScalar(g, 10);
  });
  x.register_post_accumulate_grad_hook([&](const Variable&) { ++post_acc; });
  VariableList g = Engine::Grad({Sum(Mul(x, x))}, {x});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{20, 40}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(tensor_hooks, 1);
  EXPECT_EQ(post_acc, 0);
}

TEST(GradTest, NonLeafInputsAndUnusedInputs) {
  Variable x = Leaf({1, 2}, {2});
  Variable unused = Leaf({5}, {1});
  Variable h = MulScalar(x, 3);
  Variable loss = Sum(Mul(h, h));
  VariableList g = Engine::Grad({loss}, {h, x}, {}, GradOptions{true, false, false});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{6, 12}));
  EXPECT_EQ(Values(g[1]), (std::vector<double>{18, 36}));
  EXPECT_TRUE(ThrowsError([&] { Engine::Grad({loss}, {unused}, {}, GradOptions{true}); },
                          "grad: input 0 is not used by the outputs; pass allow_unused=true"));
  VariableList u = Engine::Grad({loss}, {unused}, {}, GradOptions{true, false, true});
  EXPECT_FALSE(u[0].defined());
}

TEST(GradTest, BackwardWithInputsAccumulatesOnlyThere) {
  Variable a = Leaf({1}, {1});
  Variable b = Leaf({2}, {1});
  Variable loss = Sum(Mul(a, b));
  VariableList inputs = {a};
  loss.backward(Variable(), BackwardOptions{false, false, &inputs});
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{2}));
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradTest, WillExecuteTellsWhichNodesRun) {
  Variable a = Leaf({1}, {1});
  Variable b = Leaf({2}, {1});
  Variable other = Leaf({3}, {1});
  Variable loss = Sum(Mul(a, b));
  std::shared_ptr<Node> acc_a = a.gradient_edge_node(), acc_b = b.gradient_edge_node();
  std::shared_ptr<Node> acc_other = other.gradient_edge_node();
  std::vector<bool> seen;
  loss.grad_fn()->RegisterPreHook([&](const VariableList&) -> VariableList {
    seen = {will_execute(acc_a), will_execute(acc_b), will_execute(acc_other)};
    return {};
  });
  loss.backward(Variable(), BackwardOptions{true});
  EXPECT_EQ(seen, (std::vector<bool>{true, true, false}));
  VariableList only_a = {a};
  loss.backward(Variable(), BackwardOptions{true, false, &only_a});
  EXPECT_EQ(seen, (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(ThrowsError([&] { will_execute(acc_a); }, "only be called during backward"));
}

// Under Grad() no AccumulateGrad runs: a leaf that is not an input gives false, and one that is
// (its hooks run, its AccumulateGrad does not) is refused, as PyTorch's
// _will_engine_execute_node raises "A leaf node was passed to _will_engine_execute_node but we
// are currently running autograd.grad()".
TEST(GradTest, WillExecuteRefusesALeafInputOfGrad) {
  Variable a = Leaf({1}, {1});
  Variable b = Leaf({2}, {1});
  a.set_name("a");
  Variable loss = Sum(Mul(a, b));
  std::shared_ptr<Node> acc_a = a.gradient_edge_node(), acc_b = b.gradient_edge_node();
  std::vector<bool> seen;
  std::string refused;
  loss.grad_fn()->RegisterPreHook([&](const VariableList&) -> VariableList {
    seen = {will_execute(acc_b), will_execute(loss.grad_fn())};
    try {
      will_execute(acc_a);
      refused = "(answered)";
    } catch (const Error& e) {
      refused = e.what();
    }
    return {};
  });
  VariableList ga = Engine::Grad({loss}, {a}, {}, GradOptions{true});
  EXPECT_EQ(Values(ga[0]), (std::vector<double>{2}));
  EXPECT_EQ(seen, (std::vector<bool>{false, true}));
  EXPECT_EQ(refused,
            "will_execute: the node is the AccumulateGrad of a leaf (a) that is an input of the "
            "running Engine::Grad(); Grad() computes that leaf's gradient without running its "
            "AccumulateGrad (no .grad is written), so whether the node executes has no answer "
            "there (PyTorch refuses it too)");
  // The same leaf through Backward(inputs=) runs its AccumulateGrad: answered.
  VariableList only_a = {a};
  loss.backward(Variable(), BackwardOptions{true, false, &only_a});
  EXPECT_EQ(refused, "(answered)");
}

// ---- Grad mode
// -----------------------------------------------------------------------------------

TEST(GradModeTest, NoGradRecordsNothingAndBackwardBodiesRunWithoutGrad) {
  Variable x = Leaf({1, 2}, {2});
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(Mul(x, x).requires_grad());
    EnableGradGuard enable;
    EXPECT_TRUE(Mul(x, x).requires_grad());
  }
  std::vector<bool> modes;
  x.register_hook([&](const Variable&) {
    modes.push_back(GradMode::is_enabled());
    return Variable();
  });
  Sum(Mul(x, x)).backward();
  Engine::Grad({Sum(Mul(x, x))}, {x}, {}, GradOptions{false, /*create_graph=*/true});
  EXPECT_EQ(modes, (std::vector<bool>{false, true}));
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(GradModeTest, CreateGraphGivesSecondDerivatives) {
  Variable x = Leaf({1, 2, 3}, {3});
  VariableList g = Engine::Grad({Sum(Mul(Mul(x, x), x))}, {x}, {}, GradOptions{false, true});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{3, 12, 27}));
  VariableList gg = Engine::Grad({Sum(g[0])}, {x});
  EXPECT_EQ(Values(gg[0]), (std::vector<double>{6, 12, 18}));
}

// ---- Reentrant depth and graph size ------------------------------------------------------------

void RecurseBackward(int remaining, int* deepest) {
  EnableGradGuard grad;
  Variable x = Leaf({1}, {1});
  x.register_hook([remaining, deepest](const Variable&) {
    *deepest = std::max(*deepest, current_reentrant_depth());
    if (remaining > 0) RecurseBackward(remaining - 1, deepest);
    return Variable();
  });
  Sum(MulScalar(x, 2)).backward();
}

TEST(ReentrantTest, TwoThousandLevelsCompleteWithoutOverflowingTheStack) {
  int deepest = -1;
  RecurseBackward(2000, &deepest);
  EXPECT_EQ(deepest, 2000);
  EXPECT_EQ(current_reentrant_depth(), -1);
}

TEST(ReentrantTest, NestedTaskThroughNodesOfTheOuterGraphLeavesTheOuterStateIntact) {
  // The nested backward runs MulBackward and x's AccumulateGrad, which the outer task has not
  // reached yet; the outer task must still find its own state for them afterwards.
  Variable x = Leaf({1, 2}, {2});
  Variable s = Mul(x, x);
  Variable a = MulScalar(s, 3);
  a.register_hook([&](const Variable&) {
    EnableGradGuard grad;
    Sum(s).backward(Variable(), BackwardOptions{/*retain_graph=*/true});
    return Variable();
  });
  Sum(a).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2 + 6, 4 + 12}));
}

TEST(ReentrantTest, ErrorsPropagateThroughHandOffThreads) {
  int deepest = -1;
  Variable x = Leaf({1}, {1});
  std::function<void(int)> recurse = [&](int remaining) {
    EnableGradGuard grad;
    Variable y = Leaf({1}, {1});
    y.register_hook([&, remaining](const Variable&) {
      deepest = std::max(deepest, current_reentrant_depth());
      if (remaining == 0) throw Error("deep failure");
      recurse(remaining - 1);
      return Variable();
    });
    Sum(y).backward();
  };
  EXPECT_TRUE(ThrowsError([&] { recurse(150); }, "deep failure"));
  EXPECT_EQ(deepest, 150);
  EXPECT_EQ(current_graph_task_id(), -1);
}

TEST(GraphSizeTest, ChainOfOneHundredThousandNodes) {
  Variable x = Leaf({1}, {1});
  Variable y = x;
  for (int i = 0; i < 100000; ++i) y = AddScalar(y, 1);
  Sum(y).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{1}));
  y = Variable();  // destroying a long graph must not recurse either
}

TEST(GraphSizeTest, FanInOfTenThousandLeaves) {
  VariableList leaves;
  Variable total = Variable(Tensor::Zeros({1}, kF64));
  for (int i = 0; i < 10000; ++i) {
    leaves.push_back(Leaf({static_cast<double>(i)}, {1}));
    total = Add(total, MulScalar(leaves.back(), i % 7));
  }
  Sum(total).backward();
  for (int i = 0; i < 10000; i += 997) EXPECT_EQ(Values(leaves[i].grad())[0], i % 7);
}

}  // namespace
}  // namespace tg
