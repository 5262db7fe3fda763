// PyTorch-exact hook semantics (issue 19): which hooks a graph task runs (only those of the
// nodes it needs), Grad() and Backward(inputs=) with non-leaf inputs, multi-grad hooks in both
// modes, undefined gradients reaching tensor hooks, root gradients of another dtype, and hooks
// added or removed while hooks run.
//
// The event lists and values are PyTorch's: tests/autograd/hook_semantics_reference.py builds
// the same graphs (same op order, so the same node order) and prints them.
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/ops.h"
#include "tests/autograd/reference_values.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::Events;
using testing::Fmt;
using testing::Leaf;
using testing::ThrowsError;
using testing::ThrowsErrorExactly;

std::string FmtList(const VariableList& grads) {
  std::string s = "[";
  for (size_t i = 0; i < grads.size(); ++i) s += (i ? ", " : "") + Fmt(grads[i]);
  return s + "]";
}

// sum(a * 2 + b * 5), recording a's node first as Python does (C++ leaves the order in which
// function arguments are evaluated open, and node order decides which ready node runs first).
Tensor TwoAFiveB(const Tensor& a, const Tensor& b) {
  Tensor two_a = MulScalar(a, 2);
  Tensor five_b = MulScalar(b, 5);
  return Sum(Add(two_a, five_b));
}

// The hooks of the reference script's Recorder, appending to one list of events.
struct Recorder {
  Events events;
  std::vector<std::shared_ptr<tg::Node>> nodes;  // a leaf's AccumulateGrad lives only while held

  void RawTensor(const Tensor& v, const std::string& name, double scale = 0) {
    v.register_hook([this, name, scale](const Tensor& g) {
      events.push_back(name + " hook " + Fmt(g));
      return scale == 0 ? Tensor() : MulScalar(g, scale);
    });
  }
  void Node(const std::shared_ptr<tg::Node>& node, const std::string& name) {
    nodes.push_back(node);
    node->RegisterPreHook([this, name](const VariableList& g) -> VariableList {
      events.push_back(name + " pre " + Fmt(g[0]));
      return {};
    });
    node->RegisterPostHook([this, name](const VariableList&, const VariableList&) {
      events.push_back(name + " post");
    });
  }
  void PostAcc(const Tensor& v, const std::string& name) {
    v.register_post_accumulate_grad_hook([this, name](const Tensor& leaf) {
      events.push_back(name + " postacc " + Fmt(leaf.grad()));
    });
  }
  std::function<void(const VariableList&)> Multi() {
    return [this](const VariableList& grads) { events.push_back("multi " + FmtList(grads)); };
  }
};

// ---- Rule 1: a task with inputs runs no hook of a node it does not need ----------------------

// loss = sum(a * b + c * 2), c = b * 3.
struct UnneededLeafGraph {
  Tensor a = Leaf({1}), b = Leaf({2}), loss;
  explicit UnneededLeafGraph(Recorder& r) {
    r.RawTensor(a, "a");
    r.RawTensor(b, "b");
    r.PostAcc(a, "a");
    r.PostAcc(b, "b");
    r.Node(b.gradient_edge_node(), "b.acc");
    Tensor prod = Mul(a, b);
    Tensor c = MulScalar(b, 3);
    r.RawTensor(c, "c");
    r.Node(c.grad_fn(), "c");
    loss = Sum(Add(prod, MulScalar(c, 2)));
    r.Node(prod.grad_fn(), "prod");
  }
};

TEST(HookSemanticsTest, BackwardInputsSkipsUnneededLeaf) {
  Recorder r;
  UnneededLeafGraph g(r);
  VariableList inputs = {g.a};
  g.loss.backward(Tensor(), BackwardOptions{false, false, &inputs});
  EXPECT_EQ(r.events, (Events{"prod pre [1]", "prod post", "a hook [2]", "a postacc [2]"}));
  EXPECT_EQ(Fmt(g.a.grad()), "[2]");
  EXPECT_EQ(Fmt(g.b.grad()), "undef");
}

TEST(HookSemanticsTest, GradSkipsUnneededLeaf) {
  Recorder r;
  UnneededLeafGraph g(r);
  VariableList ga = Engine::Grad({g.loss}, {g.a});
  EXPECT_EQ(r.events, (Events{"prod pre [1]", "prod post", "a hook [2]"}));
  EXPECT_EQ(Fmt(ga[0]), "[2]");
  EXPECT_EQ(Fmt(g.a.grad()), "undef");
  EXPECT_EQ(Fmt(g.b.grad()), "undef");
}

// ---- Order: a leaf's AccumulateGrad runs as soon as it is ready ------------------------------

TEST(HookSemanticsTest, AccumulateGradRunsFirst) {
  // x's AccumulateGrad exists (hooked) before z's graph is recorded; once ready it still runs
  // before z's MulBackward, which was created later than it (PyTorch gives AccumulateGrad the
  // highest sequence number).
  Recorder r;
  Tensor x = Leaf({1}), z = Leaf({2});
  r.RawTensor(x, "x");
  r.RawTensor(z, "z");
  r.Node(x.gradient_edge_node(), "x.acc");
  Tensor c = MulScalar(z, 3);
  r.Node(c.grad_fn(), "c");
  Tensor y = MulScalar(x, 2);
  r.Node(y.grad_fn(), "y");
  Sum(Mul(y, c)).backward();
  EXPECT_EQ(r.events, (Events{"y pre [6]", "y post", "x hook [12]", "x.acc pre [12]", "x.acc post",
                              "c pre [2]", "c post", "z hook [6]"}));
  EXPECT_EQ(Fmt(x.grad()), "[12]");
  EXPECT_EQ(Fmt(z.grad()), "[6]");
}

// ---- Rule 2: a non-leaf input is where the task stops ----------------------------------------

// loss = sum(h * h), h = x * 3; h's hook multiplies its gradient by 10.
struct NonLeafGraph {
  Tensor x = Leaf({1, 2}), h, loss;
  explicit NonLeafGraph(Recorder& r) {
    r.RawTensor(x, "x");
    r.PostAcc(x, "x");
    r.Node(x.gradient_edge_node(), "x.acc");
    h = MulScalar(x, 3);
    h.retain_grad();
    r.RawTensor(h, "h", 10);
    r.Node(h.grad_fn(), "h");
    loss = Sum(Mul(h, h));
    r.Node(loss.grad_fn(), "loss");
  }
};

TEST(HookSemanticsTest, GradStopsAtNonLeafInput) {
  Recorder r;
  NonLeafGraph g(r);
  VariableList gh = Engine::Grad({g.loss}, {g.h});
  // The captured gradient is the one h's tensor hooks returned; h's node and x never run.
  EXPECT_EQ(r.events, (Events{"loss pre [1]", "loss post", "h hook [6, 12]"}));
  EXPECT_EQ(Fmt(gh[0]), "[60, 120]");
  EXPECT_EQ(Fmt(g.h.grad()), "[60, 120]");  // retain_grad runs with the tensor hooks
  EXPECT_EQ(Fmt(g.x.grad()), "undef");
}

TEST(HookSemanticsTest, GradNonLeafAndLeafBelow) {
  Recorder r;
  NonLeafGraph g(r);
  VariableList grads = Engine::Grad({g.loss}, {g.h, g.x});
  EXPECT_EQ(r.events, (Events{"loss pre [1]", "loss post", "h hook [6, 12]", "h pre [60, 120]",
                              "h post", "x hook [180, 360]"}));
  // h's node also runs (x lies below it), so h's gradient is captured before its hooks.
  EXPECT_EQ(Fmt(grads[0]), "[6, 12]");
  EXPECT_EQ(Fmt(grads[1]), "[180, 360]");
  EXPECT_EQ(Fmt(g.h.grad()), "[60, 120]");
  EXPECT_EQ(Fmt(g.x.grad()), "undef");
}

TEST(HookSemanticsTest, BackwardInputsNonLeaf) {
  Recorder r;
  Tensor x = Leaf({1, 2});
  r.RawTensor(x, "x");
  r.PostAcc(x, "x");
  Tensor h = MulScalar(x, 3);
  r.RawTensor(h, "h", 10);
  r.Node(h.grad_fn(), "h");
  Tensor loss = Sum(Mul(h, h));
  VariableList inputs = {h};
  loss.backward(Tensor(), BackwardOptions{/*retain_graph=*/true, false, &inputs});
  EXPECT_EQ(Fmt(h.grad()), "[60, 120]");
  EXPECT_EQ(Fmt(x.grad()), "undef");
  EXPECT_TRUE(h.retains_grad());  // PyTorch leaves retain_grad on
  r.events.push_back("-- full backward");
  loss.backward();
  EXPECT_EQ(r.events, (Events{"h hook [6, 12]", "h pre [60, 120]", "h post", "-- full backward",
                              "h hook [6, 12]", "h pre [60, 120]", "h post", "x hook [180, 360]",
                              "x postacc [180, 360]"}));
  EXPECT_EQ(Fmt(h.grad()), "[120, 240]");
  EXPECT_EQ(Fmt(x.grad()), "[180, 360]");
}

TEST(HookSemanticsTest, RootIsTheInput) {
  Recorder r;
  Tensor x = Leaf({1, 2});
  r.RawTensor(x, "x");
  Tensor y = MulScalar(x, 3);
  r.RawTensor(y, "y", 2);
  r.Node(y.grad_fn(), "y");
  const Tensor grad_output(RawTensor::FromVector<double>({1, 5}, {2}));
  VariableList gy = Engine::Grad({y}, {y}, {grad_output});
  r.events.push_back("-- backward inputs=[y]");
  VariableList inputs = {y};
  y.backward(grad_output, BackwardOptions{false, false, &inputs});
  EXPECT_EQ(r.events, (Events{"y hook [1, 5]", "-- backward inputs=[y]", "y hook [1, 5]",
                              "y pre [2, 10]", "y post"}));
  EXPECT_EQ(Fmt(gy[0]), "[2, 10]");
  EXPECT_EQ(Fmt(y.grad()), "[2, 10]");
  EXPECT_EQ(Fmt(x.grad()), "undef");
}

TEST(HookSemanticsTest, WillExecuteCountsCapturedNonLeafInputs) {
  Tensor x = Leaf({1, 2});
  Tensor h = MulScalar(x, 3);
  Tensor loss = Sum(Mul(h, h));
  std::vector<bool> seen;
  bool ask_leaf = true;
  loss.grad_fn()->RegisterPreHook([&](const VariableList&) -> VariableList {
    seen = {will_execute(h.grad_fn()), ask_leaf && will_execute(x.gradient_edge_node())};
    return {};
  });
  Engine::Grad({loss}, {h}, {}, GradOptions{/*retain_graph=*/true});
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));  // PyTorch: captured counts as executing
  // A leaf input of Grad(): refused (engine_test's WillExecuteRefusesALeafInputOfGrad).
  EXPECT_TRUE(ThrowsError([&] { Engine::Grad({loss}, {x}, {}, GradOptions{true}); },
                          "will_execute: the node is the AccumulateGrad of a leaf"));
  ask_leaf = false;
  Engine::Grad({loss}, {x}, {}, GradOptions{true});
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));
  ask_leaf = true;
  VariableList inputs = {h};
  loss.backward(Tensor(), BackwardOptions{true, false, &inputs});
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));
  loss.backward();
  EXPECT_EQ(seen, (std::vector<bool>{true, true}));
}

// ---- Rule 3: multi-grad hooks -----------------------------------------------------------------

TEST(HookSemanticsTest, MultiGradAll) {
  Recorder r;
  Tensor a = Leaf({1}), b = Leaf({2}), u = Leaf({3});
  r.RawTensor(a, "a");
  HookHandle handle = register_multi_grad_hook({a, b, u}, r.Multi());
  r.RawTensor(b, "b");
  r.events.push_back("-- both");
  TwoAFiveB(a, b).backward();
  r.events.push_back("-- a only");
  Sum(a).backward();
  Tensor loss = TwoAFiveB(a, b);
  r.events.push_back("-- backward inputs=[a]");
  VariableList only_a = {a}, only_b = {b};
  loss.backward(Tensor(), BackwardOptions{true, false, &only_a});
  r.events.push_back("-- backward inputs=[b]");
  loss.backward(Tensor(), BackwardOptions{false, false, &only_b});
  handle.remove();
  r.events.push_back("-- removed");
  TwoAFiveB(a, b).backward();
  EXPECT_EQ(r.events, (Events{"-- both", "b hook [5]", "a hook [2]", "multi [[2], [5], undef]",
                              "-- a only", "a hook [1]", "multi [[1], undef, undef]",
                              "-- backward inputs=[a]", "a hook [2]", "multi [[2], undef, undef]",
                              "-- backward inputs=[b]", "multi [undef, [5], undef]", "b hook [5]",
                              "-- removed", "b hook [5]", "a hook [2]"}));
}

TEST(HookSemanticsTest, MultiGradAny) {
  Recorder r;
  Tensor a = Leaf({1}), b = Leaf({2});
  r.RawTensor(a, "a");
  r.RawTensor(b, "b");
  HookHandle handle = register_multi_grad_hook(
      {a, b}, [&](const Tensor& g) { r.events.push_back("any " + Fmt(g)); }, MultiGradMode::kAny);
  r.events.push_back("-- first");
  TwoAFiveB(a, b).backward();
  r.events.push_back("-- second");
  TwoAFiveB(a, b).backward();
  r.events.push_back("-- a only");
  Sum(MulScalar(a, 7)).backward();
  handle.remove();
  r.events.push_back("-- removed");
  TwoAFiveB(a, b).backward();
  EXPECT_EQ(r.events, (Events{"-- first", "b hook [5]", "any [5]", "a hook [2]", "-- second",
                              "b hook [5]", "any [5]", "a hook [2]", "-- a only", "a hook [7]",
                              "any [7]", "-- removed", "b hook [5]", "a hook [2]"}));
}

TEST(HookSemanticsTest, MultiGradAnyWithTheListSignature) {
  Tensor a = Leaf({1}), b = Leaf({2});
  Events events;
  register_multi_grad_hook(
      {a, b}, [&](const VariableList& grads) { events.push_back("any " + FmtList(grads)); },
      MultiGradMode::kAny);
  TwoAFiveB(a, b).backward();
  EXPECT_EQ(events, (Events{"any [undef, [5]]"}));
  EXPECT_TRUE(ThrowsError(
      [&] {
        register_multi_grad_hook(
            {a}, [](const Tensor&) {}, MultiGradMode::kAll);
      },
      "register_multi_grad_hook: a hook taking one gradient needs MultiGradMode::kAny"));
}

TEST(HookSemanticsTest, MultiGradNonLeaf) {
  Recorder r;
  Tensor x = Leaf({1, 2});
  Tensor p = MulScalar(x, 2), q = MulScalar(x, 3);
  register_multi_grad_hook({p, q}, r.Multi());
  Tensor loss = Sum(Mul(p, q));
  r.events.push_back("-- grad p");
  Engine::Grad({loss}, {p}, {}, GradOptions{true});
  r.events.push_back("-- grad x");
  Engine::Grad({loss}, {x}, {}, GradOptions{true});
  r.events.push_back("-- backward inputs=[x]");
  VariableList inputs = {x};
  loss.backward(Tensor(), BackwardOptions{true, false, &inputs});
  r.events.push_back("-- full");
  loss.backward();
  EXPECT_EQ(r.events, (Events{"-- grad p", "multi [[3, 6], undef]", "-- grad x",
                              "multi [[3, 6], [2, 4]]", "-- backward inputs=[x]",
                              "multi [[3, 6], [2, 4]]", "-- full", "multi [[3, 6], [2, 4]]"}));
}

TEST(HookSemanticsTest, MultiGradReentrant) {
  Recorder r;
  Tensor a = Leaf({1}), b = Leaf({2}), c = Leaf({7});
  register_multi_grad_hook({a, b}, r.Multi());
  register_multi_grad_hook(
      {a, b}, [&](const Tensor& g) { r.events.push_back("any " + Fmt(g)); }, MultiGradMode::kAny);
  c.register_hook([&](const Tensor&) {
    r.events.push_back("c hook: nested backward");
    {
      EnableGradGuard grad;
      Sum(MulScalar(a, 3)).backward();
    }
    r.events.push_back("c hook: nested backward returned");
    return Tensor();
  });
  Tensor two_a = MulScalar(a, 2);
  Tensor five_b = MulScalar(b, 5);
  Tensor sum_ab = Add(two_a, five_b);
  Sum(Add(sum_ab, c)).backward();
  EXPECT_EQ(r.events, (Events{"c hook: nested backward", "multi [[3], undef]", "any [3]",
                              "c hook: nested backward returned", "any [5]", "multi [[2], [5]]"}));
  EXPECT_EQ(Fmt(a.grad()), "[5]");
  EXPECT_EQ(Fmt(b.grad()), "[5]");
}

// y = a * b; the backward gives a its gradient and b none.
struct DropSecond : Function<DropSecond> {
  static constexpr const char* kName = "DropSecond";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {Tensor(tg::Mul(in[0].data(), in[1].data()))};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {grads[0], Tensor()};
  }
};

TEST(HookSemanticsTest, UndefinedGradientReachesHooks) {
  Recorder r;
  Tensor a = Leaf({1}), b = Leaf({2});
  r.RawTensor(a, "a");
  r.RawTensor(b, "b");
  register_multi_grad_hook({a, b}, r.Multi());
  Sum(DropSecond::Apply({a, b})[0]).backward();
  EXPECT_EQ(r.events, (Events{"a hook [1]", "b hook undef", "multi [[1], undef]"}));
  EXPECT_EQ(Fmt(a.grad()), "[1]");
  EXPECT_EQ(Fmt(b.grad()), "undef");
}

TEST(HookSemanticsTest, AHookMayNotInventAGradient) {
  Tensor a = Leaf({1}), b = Leaf({2});
  b.set_name("b");
  b.register_hook([](const Tensor&) { return Tensor(RawTensor::Ones({1}, kF64)); });
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Sum(DropSecond::Apply({a, b})[0]).backward();
      },
      "hook on b returned a gradient where it received none (an undefined gradient)"));
}

// ---- Rule 6: root gradients of another dtype --------------------------------------------------

TEST(HookSemanticsTest, RootGradientDtypeCast) {
  Events events;
  for (DType dtype : {kF64, kF16, kI64}) {
    Tensor x = Leaf({1, 2}, kF32);
    Tensor y = MulScalar(x, 2);
    y.register_hook([&](const Tensor& g) {
      events.push_back(std::string("y hook ") + DTypeName(g.dtype()) + " " + Fmt(g));
      return Tensor();
    });
    y.backward(Tensor(RawTensor::FromVector<double>({1, 3}, {2}, dtype)));
    EXPECT_EQ(x.grad().dtype(), kF32) << DTypeName(dtype);
    EXPECT_EQ(Fmt(x.grad()), "[2, 6]") << DTypeName(dtype);
  }
  EXPECT_EQ(events, (Events{"y hook f32 [1, 3]", "y hook f32 [1, 3]", "y hook f32 [1, 3]"}));
  Tensor x = Leaf({1, 2}, kF32);
  VariableList gx = Engine::Grad({MulScalar(x, 2)}, {x},
                                 {Tensor(RawTensor::FromVector<double>({0.5, 1}, {2}, kF64))});
  EXPECT_EQ(gx[0].dtype(), kF32);
  EXPECT_EQ(Fmt(gx[0]), "[1, 2]");
  // The shape must still match exactly (PyTorch: "Mismatch in shape: grad_output[0] has a
  // shape of torch.Size([3]) and output[0] has a shape of torch.Size([2]).").
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { MulScalar(x, 2).backward(Tensor(RawTensor::Ones({3}, kF64))); },
                         "backward: grad_output 0 has shape [3] but root 0 has shape [2]"));
}

TEST(HookSemanticsTest, RootGradientCastIsDifferentiableUnderCreateGraph) {
  Tensor x = Leaf({1, 2}, kF32);
  Tensor v = Leaf({3, 4}, kF64);  // the grad_output itself requires grad
  VariableList gx = Engine::Grad({Mul(x, x)}, {x}, {v}, GradOptions{false, /*create_graph=*/true});
  EXPECT_EQ(Fmt(gx[0]), "[6, 16]");  // 2 x v
  VariableList gv = Engine::Grad({Sum(gx[0])}, {v});
  EXPECT_EQ(gv[0].dtype(), kF64);
  EXPECT_EQ(Fmt(gv[0]), "[2, 4]");  // d(sum 2 x v)/dv = 2 x
}

// ---- Rule 4: hooks added or removed while hooks run ------------------------------------------
// Each hook list runs from a copy taken when its turn comes (PyTorch iterates over a copy of the
// hook dict's values): a hook added meanwhile runs from the next backward on, a hook removed
// meanwhile still runs this time.

TEST(HookSemanticsTest, HooksChangedWhileTensorHooksRun) {
  Events events;
  HookHandle h2;
  Tensor a = Leaf({1});
  Tensor y = MulScalar(a, 2);
  y.register_hook([&](const Tensor& g) {
    events.push_back("h1 " + Fmt(g));
    h2.remove();
    y.register_hook([&](const Tensor& g) {
      events.push_back("h4 " + Fmt(g));
      return Tensor();
    });
    return Tensor();
  });
  h2 = y.register_hook([&](const Tensor& g) {
    events.push_back("h2 " + Fmt(g));
    return Tensor();
  });
  y.register_hook([&](const Tensor& g) {
    events.push_back("h3 " + Fmt(g));
    return Tensor();
  });
  Sum(y).backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
  events.push_back("--");
  Sum(y).backward();
  EXPECT_EQ(events, (Events{"h1 [1]", "h2 [1]", "h3 [1]", "--", "h1 [1]", "h3 [1]", "h4 [1]"}));
}

TEST(HookSemanticsTest, HooksChangedWhileLeafHooksRun) {
  Events events;
  HookHandle t2, p2;
  Tensor a = Leaf({1});
  a.register_hook([&](const Tensor& g) {
    events.push_back("t1 " + Fmt(g));
    t2.remove();
    a.register_hook([&](const Tensor& g) {
      events.push_back("t3 " + Fmt(g));
      return Tensor();
    });
    return Tensor();
  });
  t2 = a.register_hook([&](const Tensor& g) {
    events.push_back("t2 " + Fmt(g));
    return Tensor();
  });
  a.register_post_accumulate_grad_hook([&](const Tensor& p) {
    events.push_back("p1 " + Fmt(p.grad()));
    p2.remove();
    a.register_post_accumulate_grad_hook(
        [&](const Tensor& p) { events.push_back("p3 " + Fmt(p.grad())); });
  });
  p2 = a.register_post_accumulate_grad_hook(
      [&](const Tensor& p) { events.push_back("p2 " + Fmt(p.grad())); });
  Sum(MulScalar(a, 2)).backward();
  events.push_back("--");
  Sum(MulScalar(a, 2)).backward();
  EXPECT_EQ(events, (Events{"t1 [2]", "t2 [2]", "p1 [2]", "p2 [2]", "--", "t1 [2]", "t3 [2]",
                            "p1 [4]", "p3 [4]"}));
}

TEST(HookSemanticsTest, HooksChangedWhileNodeHooksRun) {
  Events events;
  HookHandle pre2, post2;
  Tensor a = Leaf({1});
  Tensor y = MulScalar(a, 2);
  std::shared_ptr<Node> n = y.grad_fn();
  n->RegisterPreHook([&](const VariableList& go) -> VariableList {
    events.push_back("pre1 " + Fmt(go[0]));
    pre2.remove();
    n->RegisterPreHook([&](const VariableList& go) -> VariableList {
      events.push_back("pre3 " + Fmt(go[0]));
      return {};
    });
    return {};
  });
  pre2 = n->RegisterPreHook([&](const VariableList& go) -> VariableList {
    events.push_back("pre2 " + Fmt(go[0]));
    return {};
  });
  n->RegisterPostHook([&](const VariableList&, const VariableList&) {
    events.push_back("post1");
    post2.remove();
    n->RegisterPostHook(
        [&](const VariableList&, const VariableList&) { events.push_back("post3"); });
  });
  post2 = n->RegisterPostHook(
      [&](const VariableList&, const VariableList&) { events.push_back("post2"); });
  Sum(y).backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
  events.push_back("--");
  Sum(y).backward();
  EXPECT_EQ(events, (Events{"pre1 [1]", "pre2 [1]", "post1", "post2", "--", "pre1 [1]", "pre3 [1]",
                            "post1", "post3"}));
}

// The tensor hooks of a multi-output node run output by output (in the order of each output's
// first hook), and those of an output that received no gradient see an undefined one.
TEST(HookSemanticsTest, MultiOutputHookOrder) {
  Events events;
  Tensor a = Leaf({1, 2});
  VariableList uv = Split(MulScalar(a, 1), 1, 0);
  auto hook = [&](const std::string& name) {
    return [&events, name](const Tensor& g) {
      events.push_back(name + " " + Fmt(g));
      return Tensor();
    };
  };
  uv[0].register_hook(hook("u1"));
  uv[1].register_hook(hook("v1"));
  uv[0].register_hook(hook("u2"));
  Sum(MulScalar(uv[0], 3)).backward();
  EXPECT_EQ(events, (Events{"u1 [3]", "u2 [3]", "v1 undef"}));
  EXPECT_EQ(Fmt(a.grad()), "[3, 0]");
}

TEST(HookSemanticsTest, MultiOutputHooksChangedByAnotherOutput) {
  Events events;
  HookHandle v1;
  Tensor a = Leaf({1, 2, 3});
  VariableList uvw = Split(MulScalar(a, 1), 1, 0);
  const Tensor u = uvw[0], v = uvw[1], w = uvw[2];
  bool w_hooked = false;
  u.register_hook([&](const Tensor& g) {
    events.push_back("u1 " + Fmt(g));
    v1.remove();
    v.register_hook([&](const Tensor& g) {
      events.push_back("v2 " + Fmt(g));
      return Tensor();
    });
    // Not in the reference script (undefined in PyTorch, see there): w's first hook, added
    // while the node's tensor hooks run, runs from the next backward on.
    if (!w_hooked) {
      w_hooked = true;
      w.register_hook([&](const Tensor& g) {
        events.push_back("w1 " + Fmt(g));
        return Tensor();
      });
    }
    return Tensor();
  });
  v1 = v.register_hook([&](const Tensor& g) {
    events.push_back("v1 " + Fmt(g));
    return Tensor();
  });
  Tensor loss = Sum(Add(MulScalar(u, 3), MulScalar(v, 5)));
  loss.backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
  events.push_back("--");
  loss.backward();
  EXPECT_EQ(events, (Events{"u1 [3]", "v2 [5]", "--", "u1 [3]", "v2 [5]", "v2 [5]", "w1 undef"}));
  EXPECT_EQ(Fmt(a.grad()), "[6, 10, 0]");
}

}  // namespace
}  // namespace tg
