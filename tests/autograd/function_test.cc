// Custom autograd functions (autograd/function.h): gradients, saved variables, error text,
// needs_input_grad, non-differentiable outputs, higher order and reentrant backward.
#include "autograd/function.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;
using testing::ThrowsErrorExactly;

Tensor Leaf(std::vector<double> values, Shape shape, bool requires_grad = true) {
  return Tensor(RawTensor::FromVector<double>(values, shape, kF64), requires_grad);
}

std::vector<double> Values(const Tensor& v) { return v.data().to_vector<double>(); }

// x^3 with the hand-written backward 3x^2 * g, made of differentiable ops (so create_graph
// gives the second derivative).
struct Cube : Function<Cube> {
  static constexpr const char* kName = "Cube";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    EXPECT_FALSE(GradMode::is_enabled());  // Forward computes on data
    ctx.save_for_backward({in[0]});
    return {Tensor(tg::Pow(in[0].data(), 3.0))};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    const Tensor x = ctx.saved_variables()[0];
    return {Mul(grads[0], MulScalar(Mul(x, x), 3))};
  }
};

TEST(FunctionTest, CubeRecordsOneNodeAndPassesGradcheck) {
  Tensor x = Leaf({0.5, -1.25, 2.0, 0.75}, {2, 2});
  Tensor y = Cube::Apply({x})[0];
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "CubeBackward");
  ASSERT_EQ(y.grad_fn()->next_edges().size(), 1u);
  EXPECT_EQ(y.grad_fn()->next_edges()[0].fn, x.gradient_edge_node());
  EXPECT_EQ(Values(y), (std::vector<double>{0.125, -1.953125, 8.0, 0.421875}));

  GradcheckResult r =
      Gradcheck([](const VariableList& in) { return Cube::Apply({in[0]})[0]; }, {x});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(FunctionTest, BackwardRunsUnderCreateGraphForSecondDerivatives) {
  Tensor x = Leaf({1.5, -2.0}, {2});
  Tensor y = Sum(Cube::Apply({x})[0]);
  Tensor gx = Engine::Grad({y}, {x}, {}, GradOptions{false, /*create_graph=*/true})[0];
  EXPECT_EQ(Values(gx), (std::vector<double>{3 * 1.5 * 1.5, 12.0}));
  ASSERT_TRUE(gx.requires_grad());
  Tensor ggx = Engine::Grad({Sum(gx)}, {x})[0];
  EXPECT_EQ(Values(ggx), (std::vector<double>{9.0, -12.0}));  // 6x
}

TEST(FunctionTest, NotRecordedWithoutGradOrUnderNoGrad) {
  Tensor plain = Leaf({2}, {1}, /*requires_grad=*/false);
  Tensor y = Cube::Apply({plain})[0];
  EXPECT_FALSE(y.requires_grad());
  Tensor x = Leaf({2}, {1});
  NoGradGuard no_grad;
  Tensor z = Cube::Apply({x})[0];
  EXPECT_FALSE(z.requires_grad());
  EXPECT_EQ(Values(z), (std::vector<double>{8}));
}

// Returns as many gradients as it is told to; for the count error.
struct BadCount : Function<BadCount> {
  static constexpr const char* kName = "BadCount";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {Tensor(in[0].data().clone())};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {grads[0], grads[0]};
  }
};

TEST(FunctionTest, WrongGradientCountNamesTheFunctionAndBothCounts) {
  Tensor x = Leaf({1, 2, 3}, {3});
  Tensor y = Sum(BadCount::Apply({x})[0]);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { y.backward(); },
      "function BadCountBackward returned an incorrect number of gradients (expected 1, got 2) "
      "[in BadCountBackward]"));
}

// Returns a [2, 3] gradient for a [3] input.
struct BadShape : Function<BadShape> {
  static constexpr const char* kName = "BadShape";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {Tensor(in[0].data().clone())};
  }
  static VariableList Backward(FunctionCtx&, const VariableList&) {
    return {Tensor(RawTensor::Ones({2, 3}, kF64))};
  }
};

TEST(FunctionTest, WrongGradientShapeNamesBothShapes) {
  Tensor x = Leaf({1, 2, 3}, {3});
  Tensor y = Sum(BadShape::Apply({x})[0]);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { y.backward(); },
      "function BadShapeBackward returned a gradient of shape [2, 3] for input 0, which has "
      "shape [3] [in BadShapeBackward]"));
}

// a * b + c, recording needs_input_grad in Forward and Backward.
struct MulAdd : Function<MulAdd> {
  static constexpr const char* kName = "MulAdd";
  static std::vector<bool> forward_needs, backward_needs;
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    forward_needs = {ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2)};
    ctx.save_for_backward({in[0], in[1]});
    return {Tensor(tg::Add(tg::Mul(in[0].data(), in[1].data()), in[2].data()))};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    backward_needs = {ctx.needs_input_grad(0), ctx.needs_input_grad(1), ctx.needs_input_grad(2)};
    const VariableList saved = ctx.saved_variables();
    // Gradients for every input: those not needed are dropped by the node.
    return {Mul(grads[0], saved[1]), Mul(grads[0], saved[0]), grads[0]};
  }
};
std::vector<bool> MulAdd::forward_needs;
std::vector<bool> MulAdd::backward_needs;

TEST(FunctionTest, NeedsInputGradReflectsRequiresGrad) {
  Tensor a = Leaf({1, 2}, {2});
  Tensor b = Leaf({3, 4}, {2}, /*requires_grad=*/false);
  Tensor c = Leaf({5, 6}, {2}, /*requires_grad=*/false);
  Tensor y = MulAdd::Apply({a, b, c})[0];
  EXPECT_EQ(MulAdd::forward_needs, (std::vector<bool>{true, false, false}));
  Sum(y).backward();
  EXPECT_EQ(MulAdd::backward_needs, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{3, 4}));
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(c.grad().defined());

  // Under no-grad nothing is recorded, so no input needs a gradient.
  {
    NoGradGuard no_grad;
    MulAdd::Apply({a, b, c});
  }
  EXPECT_EQ(MulAdd::forward_needs, (std::vector<bool>{false, false, false}));
}

// Returns 2x and a "sign" output marked non-differentiable; records the gradients it got.
struct TwiceAndSign : Function<TwiceAndSign> {
  static constexpr const char* kName = "TwiceAndSign";
  static VariableList seen_grads;
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    Tensor twice(tg::MulScalar(in[0].data(), 2));
    Tensor sign(tg::Gt(in[0].data(), RawTensor::Scalar(0, kF64)).to(kF64));
    ctx.mark_non_differentiable({sign});
    return {twice, sign};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    seen_grads = grads;
    return {MulScalar(grads[0], 2)};
  }
};
VariableList TwiceAndSign::seen_grads;

TEST(FunctionTest, NonDifferentiableOutputsDoNotRequireGradAndGetZeroGradients) {
  Tensor x = Leaf({-1, 2, 3}, {3});
  VariableList out = TwiceAndSign::Apply({x});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].requires_grad());
  EXPECT_FALSE(out[1].requires_grad());
  EXPECT_TRUE(out[1].is_leaf());
  EXPECT_EQ(Values(out[1]), (std::vector<double>{0, 1, 1}));
  Add(Sum(out[0]), Sum(out[1])).backward();
  ASSERT_EQ(TwiceAndSign::seen_grads.size(), 2u);
  EXPECT_EQ(Values(TwiceAndSign::seen_grads[0]), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(Values(TwiceAndSign::seen_grads[1]), (std::vector<double>{0, 0, 0}));  // materialized
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 2, 2}));
  TwiceAndSign::seen_grads.clear();
}

// exp(x), saving its own output (held without a node -> itself reference cycle).
struct ExpFn : Function<ExpFn> {
  static constexpr const char* kName = "ExpFn";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    Tensor y(tg::Exp(in[0].data()));
    ctx.save_for_backward({y});
    return {y};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    return {Mul(grads[0], ctx.saved_variables()[0])};
  }
};

TEST(FunctionTest, SavedOutputAndNonTensorData) {
  Tensor x = Leaf({0, 1}, {2});
  Tensor y = ExpFn::Apply({x})[0];
  Sum(y).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{1, std::exp(1.0)}));
}

struct ScaleBy : Function<ScaleBy> {
  static constexpr const char* kName = "ScaleBy";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in, double factor) {
    ctx.saved_data["factor"] = factor;
    return {Tensor(tg::MulScalar(in[0].data(), factor))};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    return {MulScalar(grads[0], std::any_cast<double>(ctx.saved_data.at("factor")))};
  }
};

TEST(FunctionTest, ExtraArgumentsReachForwardAndSavedDataReachesBackward) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = ScaleBy::Apply({x}, 2.5)[0];
  EXPECT_EQ(Values(y), (std::vector<double>{2.5, 5}));
  Sum(y).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2.5, 2.5}));
}

TEST(FunctionTest, SavedVariablesAreVersionCheckedAndReleased) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor y = Sum(Cube::Apply({x})[0]);
  x.bump_version();  // what an in-place op on x would do
  EXPECT_TRUE(ThrowsError([&] { y.backward(); }, "was modified in place after it was saved"));

  Tensor x2 = Leaf({1, 2}, {2});
  Tensor y2 = Sum(Cube::Apply({x2})[0]);
  y2.backward();
  EXPECT_TRUE(ThrowsError([&] { y2.backward(); }, "pass retain_graph=true"));
}

struct Throwing : Function<Throwing> {
  static constexpr const char* kName = "Throwing";
  static VariableList Forward(FunctionCtx&, const VariableList& in) { return {in[0].detach()}; }
  static VariableList Backward(FunctionCtx&, const VariableList&) { throw Error("nope"); }
};

TEST(FunctionTest, ErrorsFromBackwardPropagate) {
  Tensor x = Leaf({1}, {1});
  Tensor y = Throwing::Apply({x})[0];
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.backward(); }, "nope [in ThrowingBackward]"));
}

// x^2 whose backward recomputes x*x on a detached leaf and runs a nested Engine::Backward
// (the pattern of reentrant checkpointing).
struct ReentrantSquare : Function<ReentrantSquare> {
  static constexpr const char* kName = "ReentrantSquare";
  static int nested_depth;
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    ctx.save_for_backward({in[0]});
    return {Tensor(tg::Mul(in[0].data(), in[0].data()))};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    Tensor x = ctx.saved_variables()[0].detach().set_requires_grad(true);
    x.register_hook([](const Tensor&) {
      nested_depth = current_reentrant_depth();
      return Tensor();
    });
    EnableGradGuard grad;
    Engine::Backward({Mul(x, x)}, {grads[0]});
    return {x.grad()};
  }
};
int ReentrantSquare::nested_depth = -1;

TEST(FunctionTest, BackwardMayRunANestedBackward) {
  Tensor x = Leaf({1, -3}, {2});
  Tensor y = Sum(MulScalar(ReentrantSquare::Apply({x})[0], 2));
  y.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{4, -12}));
  EXPECT_EQ(ReentrantSquare::nested_depth, 1);
}

// Forward runs a backward of its own (a tiled loss accumulating a weight's gradient) inside a
// ForwardScope: that backward is flagged as issued in forward; the user's backward is not.
struct BackwardInForward : Function<BackwardInForward> {
  static constexpr const char* kName = "BackwardInForward";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    EXPECT_TRUE(ForwardScope::active());
    EnableGradGuard grad;
    Sum(Mul(in[1], in[1])).backward();  // w.grad += 2w, flagged
    return {Tensor(tg::Mul(in[0].data(), in[1].data()))};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {grads[0], Tensor()};  // no gradient for w: accumulated in Forward
  }
};

TEST(FunctionTest, ForwardRunsInsideAForwardScope) {
  Tensor x = Leaf({1, 2}, {2});
  Tensor w = Leaf({3, -1}, {2});
  std::vector<bool> flags;
  HookHandle h = w.register_post_accumulate_grad_hook(
      [&](const Tensor&) { flags.push_back(backward_issued_in_forward()); });
  HookHandle hx = x.register_post_accumulate_grad_hook(
      [&](const Tensor&) { flags.push_back(backward_issued_in_forward()); });
  EXPECT_FALSE(ForwardScope::active());
  Sum(BackwardInForward::Apply({x, w})[0]).backward();
  EXPECT_FALSE(ForwardScope::active());
  EXPECT_EQ(flags, (std::vector<bool>{true, false}));  // w in Forward, x in the user's backward
  EXPECT_EQ(Values(w.grad()), (std::vector<double>{6, -2}));
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{1, 1}));
}

// 2x whose backward gives no gradient (PyTorch's test_function_returns_undefined_tensor).
struct ReturnsNone : Function<ReturnsNone> {
  static constexpr const char* kName = "ReturnsNone";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {Tensor(tg::MulScalar(in[0].data(), 2))};
  }
  static VariableList Backward(FunctionCtx&, const VariableList&) { return {Tensor()}; }
};

// An undefined gradient is "no gradient", not zeros: built-in nodes that receive nothing else
// (x^2's PowBackward, exp's, mul's) pass none on, so x.grad stays undefined, and Grad() gives
// an undefined result under allow_unused and an error without it, as PyTorch.
TEST(FunctionTest, UndefinedGradientFlowsAsNoGradient) {
  Tensor x = Leaf({1}, {1});
  x.set_name("x");
  std::vector<std::string> hook_saw;
  x.register_hook([&](const Tensor& g) {
    hook_saw.push_back(g.defined() ? absl::StrCat(Values(g)[0]) : "undef");
    return Tensor();
  });
  int accumulated = 0;
  x.register_post_accumulate_grad_hook([&](const Tensor&) { ++accumulated; });

  ReturnsNone::Apply({x})[0].backward();
  EXPECT_FALSE(x.grad().defined());
  ReturnsNone::Apply({Pow(x, 2.0)})[0].backward();
  EXPECT_FALSE(x.grad().defined());
  ReturnsNone::Apply({Mul(Exp(x), MulScalar(x, 3))})[0].backward();
  EXPECT_FALSE(x.grad().defined());
  Sum(ReturnsNone::Apply({x})[0]).backward();
  EXPECT_FALSE(x.grad().defined());
  // The leaf's tensor hooks see the undefined gradient (PyTorch calls them with None); nothing
  // is accumulated, so no post-accumulate-grad hook runs.
  EXPECT_EQ(hook_saw, (std::vector<std::string>{"undef", "undef", "undef", "undef"}));
  EXPECT_EQ(accumulated, 0);

  VariableList g = Engine::Grad({ReturnsNone::Apply({Pow(x, 2.0)})[0]}, {x}, {},
                                GradOptions{false, false, /*allow_unused=*/true});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(g[0].defined());
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { Engine::Grad({ReturnsNone::Apply({Pow(x, 2.0)})[0]}, {x}); },
      "grad: input 0 (x) received no gradient: every path from the outputs to it carries none "
      "(a node on the way, such as a custom function's Backward, returned an undefined "
      "gradient); pass allow_unused=true to get an undefined gradient"));

  // A gradient already in .grad is left as it was; another path's gradient still adds up.
  x.set_grad(Tensor(RawTensor::FromVector<double>({5}, {1}, kF64)));
  ReturnsNone::Apply({Pow(x, 2.0)})[0].backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{5}));
  Add(ReturnsNone::Apply({Pow(x, 2.0)})[0], MulScalar(x, 3)).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{8}));
  EXPECT_EQ(accumulated, 1);
}

}  // namespace
}  // namespace tg
