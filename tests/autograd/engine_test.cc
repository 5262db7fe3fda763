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

Tensor Leaf(std::vector<double> values, Shape shape, DType dtype = kF64) {
  return Tensor(RawTensor::FromVector<double>(values, shape, dtype), /*requires_grad=*/true);
}

std::vector<double> Values(const Tensor& v) { return v.data().to_vector<double>(); }

// A node whose backward throws, for failure tests.
class FailingNode : public Node {
 public:
  explicit FailingNode(const Tensor& input) {
    mutable_next_edges().push_back(Edge{input.gradient_edge_node(), 0});
    AddInputMetadata(input.data());
  }
  VariableList Apply(VariableList) override { throw Error("boom"); }
  std::string name() const override { return "FailingBackward"; }
};

Tensor Failing(const Tensor& x) {
  return MakeNonLeaf(x.data().clone(), std::make_shared<FailingNode>(x), 0);
}

TEST(EngineTest, SimpleChainRule) {
  Tensor x = Leaf({1, 2, 3}, {3});
  Sum(Mul(x, x)).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 4, 6}));
}

TEST(EngineTest, GradcheckSmoke) {
  Tensor a = Leaf({0.5, -1.0, 2.0, 0.3}, {2, 2});
  Tensor b = Leaf({1.5, 0.25}, {2});
  GradcheckResult r = Gradcheck(
      [](const VariableList& in) { return Tanh(Add(Matmul(in[0], in[0]), in[1])); }, {a, b});
  EXPECT_TRUE(r.ok) << r.message;
}

// ---- Graph-task ids --------------------------------------------------------------------------

TEST(GraphTaskIdTest, IncreasesAcrossCallsAndIsMinusOneOutside) {
  EXPECT_EQ(current_graph_task_id(), -1);
  EXPECT_EQ(current_reentrant_depth(), -1);
  Tensor x = Leaf({1, 2}, {2});
  std::vector<int64_t> ids;
  x.register_hook([&](const Tensor&) {
    ids.push_back(current_graph_task_id());
    return Tensor();
  });
  for (int i = 0; i < 3; ++i) Sum(x).backward();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_LT(ids[0], ids[1]);
  EXPECT_LT(ids[1], ids[2]);
  EXPECT_GE(ids[0], 0);
  EXPECT_EQ(current_graph_task_id(), -1);
}

TEST(GraphTaskIdTest, CallbackSeesTheIdOfItsTasksHooks) {
  Tensor x = Leaf({1, 2}, {2});
  int64_t hook_id = -2, callback_id = -3;
  x.register_hook([&](const Tensor&) {
    hook_id = current_graph_task_id();
    queue_callback([&] { callback_id = current_graph_task_id(); });
    return Tensor();
  });
  Sum(x).backward();
  EXPECT_GE(hook_id, 0);
  EXPECT_EQ(callback_id, hook_id);
}

TEST(GraphTaskIdTest, NestedTaskHasItsOwnIdAndTheParentsComesBack) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor inner = Leaf({3}, {1});
  int64_t outer_before = -1, nested = -1, outer_after = -1, inner_depth = -1;
  inner.register_hook([&](const Tensor&) {
    nested = current_graph_task_id();
    inner_depth = current_reentrant_depth();
    return Tensor();
  });
  x.register_hook([&](const Tensor&) {
    outer_before = current_graph_task_id();
    EXPECT_EQ(current_reentrant_depth(), 0);
    EnableGradGuard grad;  // hooks run without grad, as in PyTorch
    Sum(Mul(inner, inner)).backward();
    outer_after = current_graph_task_id();
    return Tensor();
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
  Tensor x = Leaf({1, 2}, {2});
  int count = 0;
  std::vector<double> grad_seen_by_callback;
  x.register_hook([&](const Tensor&) {
    queue_callback([&] {
      ++count;
      queue_callback([&] {
        ++count;
        grad_seen_by_callback = Values(x.grad());  // .grad is final when callbacks run
      });
    });
    return Tensor();
  });
  Sum(MulScalar(x, 3)).backward();
  EXPECT_EQ(count, 2);
  EXPECT_EQ(grad_seen_by_callback, (std::vector<double>{3, 3}));
}

TEST(CallbackTest, CallbacksRunFifoOnce) {
  Tensor x = Leaf({1}, {1});
  std::vector<int> order;
  x.register_hook([&](const Tensor&) {
    for (int i = 0; i < 4; ++i) queue_callback([&order, i] { order.push_back(i); });
    return Tensor();
  });
  Sum(x).backward();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  Sum(x).backward();  // a new task: the old callbacks do not run again
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(CallbackTest, InnerOuterAndBothDepthCallbacksFireOnceInTheirOwnTask) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = Leaf({5}, {1});
  std::vector<std::string> events;
  int64_t outer_id = -1, inner_id = -1;
  y.register_hook([&](const Tensor&) {
    inner_id = current_graph_task_id();
    queue_callback([&] {
      events.push_back("inner-callback task " +
                       std::to_string(current_graph_task_id() == inner_id));
    });
    return Tensor();
  });
  x.register_hook([&](const Tensor&) {
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
    return Tensor();
  });
  Sum(x).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"inner-callback task 1", "nested backward returned",
                                              "outer-callback task 1", "outer-callback-2"}));
}

TEST(CallbackTest, OutermostTaskCallbackQueuedInANestedTaskRunsAfterTheWholeBackward) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = Leaf({5}, {1});
  std::vector<std::string> events;
  int64_t outer_id = -1;
  y.register_hook([&](const Tensor&) {
    EXPECT_EQ(current_reentrant_depth(), 1);
    EXPECT_EQ(outermost_graph_task_id(), outer_id);
    queue_callback_on_outermost_task([&] {
      events.push_back("outermost callback in task " +
                       std::to_string(current_graph_task_id() == outer_id));
    });
    return Tensor();
  });
  x.register_hook([&](const Tensor&) {
    outer_id = current_graph_task_id();
    EXPECT_EQ(outermost_graph_task_id(), outer_id);
    {
      EnableGradGuard grad;
      Sum(y).backward();
    }
    events.push_back("nested backward returned");
    return Tensor();
  });
  Sum(x).backward();
  EXPECT_EQ(events,
            (std::vector<std::string>{"nested backward returned", "outermost callback in task 1"}));
  EXPECT_EQ(outermost_graph_task_id(), -1);
  EXPECT_TRUE(ThrowsErrorExactly([] { queue_callback_on_outermost_task([] {}); },
                                 "callbacks can only be queued during backward"));
}

TEST(CallbackTest, BackwardStartedInsideAForwardScopeIsFlaggedWithItsNestedTasks) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = Leaf({5}, {1});
  std::vector<int> flags;  // x's hook (outer), then y's (nested)
  y.register_hook([&](const Tensor&) {
    flags.push_back(backward_issued_in_forward());
    return Tensor();
  });
  x.register_hook([&](const Tensor&) {
    flags.push_back(backward_issued_in_forward());
    EnableGradGuard grad;
    Sum(y).backward();
    return Tensor();
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
  Tensor x = Leaf({1, 2}, {2});
  bool ran = false;
  Tensor z = Leaf({1}, {1});
  z.register_hook([&](const Tensor&) {
    queue_callback([&] { ran = true; });
    return Tensor();
  });
  // z's hook runs first (its node is created later), then the failing node throws.
  Tensor loss = Add(Sum(Failing(x)), z);
  EXPECT_TRUE(ThrowsErrorExactly([&] { loss.backward(); }, "boom [in FailingBackward]"));
  EXPECT_FALSE(ran);
  EXPECT_EQ(current_graph_task_id(), -1);  // the task state was unwound
}

// ---- Hook order
// ----------------------------------------------------------------------------------

TEST(HookOrderTest, LeafHooksRunInTheDocumentedOrder) {
  Tensor x = Leaf({1, 2, 3, 4}, {4});
  Tensor loss = Sum(x);
  std::shared_ptr<Node> acc = x.gradient_edge_node();
  x.register_hook([](const Tensor& g) { return AddScalar(g, -2); });    // 1 -> -1
  acc->RegisterPreHook([](const VariableList& g) -> VariableList {      // -> -0.2
    return {MulScalar(g[0], 1.0 / 5)};
  });
  x.register_post_accumulate_grad_hook([](const Tensor& leaf) {  // -> 0.3
    leaf.grad().data().copy_(tg::AddScalar(leaf.grad().data(), 0.5));
  });
  acc->RegisterPostHook([&x](const VariableList&, const VariableList&) {  // -> 3
    x.grad().data().copy_(tg::MulScalar(x.grad().data(), 10));
  });
  loss.backward();
  for (double v : Values(x.grad())) EXPECT_NEAR(v, 3.0, 1e-12);
}

TEST(HookOrderTest, TensorHooksChainRetainGradSeesTheResultAndNodeHooksFollow) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = MulScalar(x, 2);
  y.retain_grad();
  std::vector<std::string> events;
  y.register_hook([&](const Tensor& g) {
    events.push_back("tensor hook 1");
    return MulScalar(g, 3);
  });
  y.register_hook([&](const Tensor& g) {
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
  Tensor x = Leaf({1}, {1});
  int calls = 0;
  HookHandle h = x.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  HookHandle p = x.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
  Sum(x).backward();
  EXPECT_EQ(calls, 2);
  h.remove();
  p.remove();
  h.remove();  // idempotent
  Sum(x).backward();
  EXPECT_EQ(calls, 2);
}

TEST(HookOrderTest, PostAccumulateGradHookOnANonLeafThrows) {
  Tensor x = Leaf({1}, {1});
  Tensor y = MulScalar(x, 2);
  EXPECT_TRUE(ThrowsError([&] { y.register_post_accumulate_grad_hook([](const Tensor&) {}); },
                          "post-accumulate-grad hooks can only be registered on leaf variables"));
}

TEST(HookOrderTest, MultiGradHookFiresOncePerBackwardAfterTheLastGradient) {
  Tensor a = Leaf({1}, {1});
  Tensor b = Leaf({2}, {1});
  Tensor unused = Leaf({3}, {1});
  std::vector<std::string> events;
  a.register_hook([&](const Tensor&) {
    events.push_back("a");
    return Tensor();
  });
  b.register_hook([&](const Tensor&) {
    events.push_back("b");
    return Tensor();
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
  Tensor x = Leaf({1, 2}, {2});
  Tensor loss = Sum(Mul(x, x));
  loss.backward();
  EXPECT_TRUE(ThrowsError([&] { loss.backward(); }, "pass retain_graph=true"));
  EXPECT_TRUE(ThrowsError([&] { loss.backward(); }, "MulBackward"));
}

TEST(RetainGraphTest, RetainedGraphRunsAgainAndGradAccumulatesInPlace) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor loss = Sum(Mul(x, x));
  loss.backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
  const void* storage = x.grad().data().raw_data();
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{4, 8}));
  EXPECT_EQ(x.grad().data().raw_data(), storage);  // accumulated in place
}

TEST(RetainGraphTest, NodesThatSaveNothingCanRunTwice) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor loss = Sum(AddScalar(MulScalar(x, 3), 1));
  loss.backward();
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{6, 6}));
}

// ---- Roots and grad_outputs
// -----------------------------------------------------------------------

// (A grad_output of another dtype is cast: hook_semantics_test.cc.)
TEST(RootsTest, NonScalarRootNeedsMatchingGradOutputs) {
  Tensor x = Leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = MulScalar(x, 2);
  EXPECT_TRUE(ThrowsError([&] { y.backward(); }, "root 0 has shape [2, 3]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        y.backward(Tensor(RawTensor::Ones({3, 2}, kF64)));
      },
      "backward: grad_output 0 has shape [3, 2] but root 0 has shape [2, 3]"));
  y.backward(Tensor(RawTensor::FromVector<double>({1, 0, 2, 0, 3, 0}, {2, 3})));
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 0, 4, 0, 6, 0}));
}

TEST(RootsTest, SeveralAndRepeatedRootsSum) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor a = Sum(MulScalar(x, 2));
  Tensor b = Sum(Mul(x, x));
  Engine::Backward({a, b, a});
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2 + 2 + 2, 4 + 2 + 2}));
}

TEST(RootsTest, RootThatDoesNotRequireGradThrows) {
  Tensor c(RawTensor::Ones({1}, kF64));
  EXPECT_TRUE(ThrowsErrorExactly([&] { c.backward(); },
                                 "backward: root 0 does not require grad and has no grad_fn"));
}

TEST(RootsTest, ARootThatIsAlsoInsideTheGraphWaitsForItsDependencies) {
  Tensor x = Leaf({3}, {1});
  Tensor y = MulScalar(x, 2);  // root 1
  Tensor z = Mul(y, y);        // root 0 depends on y
  Engine::Backward({z, y});
  // dz/dx = 2y * 2 = 24, dy/dx = 2
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{26}));
}

// ---- grad() and backward(inputs=)
// -----------------------------------------------------------------

TEST(GradTest, NeverTouchesGradAndRunsInputTensorHooksButNotAccumulation) {
  Tensor x = Leaf({1, 2}, {2});
  int tensor_hooks = 0, post_acc = 0;
  x.register_hook([&](const Tensor& g) {
    ++tensor_hooks;
    return MulScalar(g, 10);
  });
  x.register_post_accumulate_grad_hook([&](const Tensor&) { ++post_acc; });
  VariableList g = Engine::Grad({Sum(Mul(x, x))}, {x});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{20, 40}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(tensor_hooks, 1);
  EXPECT_EQ(post_acc, 0);
}

TEST(GradTest, NonLeafInputsAndUnusedInputs) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor unused = Leaf({5}, {1});
  Tensor h = MulScalar(x, 3);
  Tensor loss = Sum(Mul(h, h));
  VariableList g = Engine::Grad({loss}, {h, x}, {}, GradOptions{true, false, false});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{6, 12}));
  EXPECT_EQ(Values(g[1]), (std::vector<double>{18, 36}));
  EXPECT_TRUE(ThrowsError([&] { Engine::Grad({loss}, {unused}, {}, GradOptions{true}); },
                          "grad: input 0 is not used by the outputs; pass allow_unused=true"));
  VariableList u = Engine::Grad({loss}, {unused}, {}, GradOptions{true, false, true});
  EXPECT_FALSE(u[0].defined());
}

TEST(GradTest, BackwardWithInputsAccumulatesOnlyThere) {
  Tensor a = Leaf({1}, {1});
  Tensor b = Leaf({2}, {1});
  Tensor loss = Sum(Mul(a, b));
  VariableList inputs = {a};
  loss.backward(Tensor(), BackwardOptions{false, false, &inputs});
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{2}));
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradTest, WillExecuteTellsWhichNodesRun) {
  Tensor a = Leaf({1}, {1});
  Tensor b = Leaf({2}, {1});
  Tensor other = Leaf({3}, {1});
  Tensor loss = Sum(Mul(a, b));
  std::shared_ptr<Node> acc_a = a.gradient_edge_node(), acc_b = b.gradient_edge_node();
  std::shared_ptr<Node> acc_other = other.gradient_edge_node();
  std::vector<bool> seen;
  loss.grad_fn()->RegisterPreHook([&](const VariableList&) -> VariableList {
    seen = {will_execute(acc_a), will_execute(acc_b), will_execute(acc_other)};
    return {};
  });
  loss.backward(Tensor(), BackwardOptions{true});
  EXPECT_EQ(seen, (std::vector<bool>{true, true, false}));
  VariableList only_a = {a};
  loss.backward(Tensor(), BackwardOptions{true, false, &only_a});
  EXPECT_EQ(seen, (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(ThrowsError([&] { will_execute(acc_a); }, "only be called during backward"));
}

// Under Grad() no AccumulateGrad runs: a leaf that is not an input gives false, and one that is
// (its hooks run, its AccumulateGrad does not) is refused, as PyTorch's
// _will_engine_execute_node raises "A leaf node was passed to _will_engine_execute_node but we
// are currently running autograd.grad()".
TEST(GradTest, WillExecuteRefusesALeafInputOfGrad) {
  Tensor a = Leaf({1}, {1});
  Tensor b = Leaf({2}, {1});
  a.set_name("a");
  Tensor loss = Sum(Mul(a, b));
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
  loss.backward(Tensor(), BackwardOptions{true, false, &only_a});
  EXPECT_EQ(refused, "(answered)");
}

// ---- Grad mode
// -----------------------------------------------------------------------------------

TEST(GradModeTest, NoGradRecordsNothingAndBackwardBodiesRunWithoutGrad) {
  Tensor x = Leaf({1, 2}, {2});
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(Mul(x, x).requires_grad());
    EnableGradGuard enable;
    EXPECT_TRUE(Mul(x, x).requires_grad());
  }
  std::vector<bool> modes;
  x.register_hook([&](const Tensor&) {
    modes.push_back(GradMode::is_enabled());
    return Tensor();
  });
  Sum(Mul(x, x)).backward();
  Engine::Grad({Sum(Mul(x, x))}, {x}, {}, GradOptions{false, /*create_graph=*/true});
  EXPECT_EQ(modes, (std::vector<bool>{false, true}));
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(GradModeTest, CreateGraphGivesSecondDerivatives) {
  Tensor x = Leaf({1, 2, 3}, {3});
  VariableList g = Engine::Grad({Sum(Mul(Mul(x, x), x))}, {x}, {}, GradOptions{false, true});
  EXPECT_EQ(Values(g[0]), (std::vector<double>{3, 12, 27}));
  VariableList gg = Engine::Grad({Sum(g[0])}, {x});
  EXPECT_EQ(Values(gg[0]), (std::vector<double>{6, 12, 18}));
}

// ---- Reentrant depth and graph size ------------------------------------------------------------

void RecurseBackward(int remaining, int* deepest) {
  EnableGradGuard grad;
  Tensor x = Leaf({1}, {1});
  x.register_hook([remaining, deepest](const Tensor&) {
    *deepest = std::max(*deepest, current_reentrant_depth());
    if (remaining > 0) RecurseBackward(remaining - 1, deepest);
    return Tensor();
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
  Tensor x = Leaf({1, 2}, {2});
  Tensor s = Mul(x, x);
  Tensor a = MulScalar(s, 3);
  a.register_hook([&](const Tensor&) {
    EnableGradGuard grad;
    Sum(s).backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
    return Tensor();
  });
  Sum(a).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2 + 6, 4 + 12}));
}

TEST(ReentrantTest, ErrorsPropagateThroughHandOffThreads) {
  int deepest = -1;
  Tensor x = Leaf({1}, {1});
  std::function<void(int)> recurse = [&](int remaining) {
    EnableGradGuard grad;
    Tensor y = Leaf({1}, {1});
    y.register_hook([&, remaining](const Tensor&) {
      deepest = std::max(deepest, current_reentrant_depth());
      if (remaining == 0) throw Error("deep failure");
      recurse(remaining - 1);
      return Tensor();
    });
    Sum(y).backward();
  };
  EXPECT_TRUE(ThrowsError([&] { recurse(150); }, "deep failure"));
  EXPECT_EQ(deepest, 150);
  EXPECT_EQ(current_graph_task_id(), -1);
}

TEST(GraphSizeTest, ChainOfOneHundredThousandNodes) {
  Tensor x = Leaf({1}, {1});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = AddScalar(y, 1);
  Sum(y).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{1}));
  y = Tensor();  // destroying a long graph must not recurse either
}

TEST(GraphSizeTest, FanInOfTenThousandLeaves) {
  VariableList leaves;
  Tensor total = Tensor(RawTensor::Zeros({1}, kF64));
  for (int i = 0; i < 10000; ++i) {
    leaves.push_back(Leaf({static_cast<double>(i)}, {1}));
    total = Add(total, MulScalar(leaves.back(), i % 7));
  }
  Sum(total).backward();
  for (int i = 0; i < 10000; i += 997) EXPECT_EQ(Values(leaves[i].grad())[0], i % 7);
}

}  // namespace
}  // namespace tg
