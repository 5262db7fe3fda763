// Non-reentrant checkpointing with PyTorch's semantics (issue 19 rule 5): the recomputation
// stops early once every saved tensor is back (one that would save more is fine), fewer saved
// tensors or other shapes/dtypes are errors naming the counts and positions, a saved tensor
// unpacked twice in one backward is an error (not a silent second recomputation), and saved
// inputs keep their place in the graph (tapegrad: they unpack as the inputs themselves).
//
// The events, values and the counts/positions in the errors are PyTorch's:
// tests/autograd/checkpoint_reference.py builds the same graphs and prints them (tapegrad
// words its errors in its own style).
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/ops.h"
#include "tests/autograd/reference_values.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsErrorExactly;
using testing::Events;
using testing::Fmt;
using testing::Leaf;

CheckpointOptions NonReentrant() {
  CheckpointOptions options;
  options.reentrant = false;
  return options;
}

Events* events = nullptr;  // where Tag and Inspect log (set by each test)

// 2 * x, logging its forward and backward; saves x unless named "tail".
struct Tag : Function<Tag> {
  static constexpr const char* kName = "Tag";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in, std::string name) {
    events->push_back("fwd " + name);
    if (name != "tail") ctx.save_for_backward({in[0]});
    ctx.saved_data["name"] = name;
    return {MulScalar(in[0], 2)};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    const auto& name = std::any_cast<const std::string&>(ctx.saved_data.at("name"));
    if (name != "tail") ctx.saved_variables();
    events->push_back("bwd " + name);
    return {MulScalar(grads[0], 2)};
  }
};

TEST(CheckpointSemanticsTest, EarlyStop) {
  Events ev;
  events = &ev;
  Tensor x = Leaf({1});
  Tensor out = Checkpoint(
      [](const VariableList& in) {
        Tensor a = Tag::Apply({in[0]}, std::string("a"))[0];
        Tensor b = Tag::Apply({a}, std::string("b"))[0];
        return Tag::Apply({b}, std::string("tail"))[0];
      },
      {x}, NonReentrant());
  Sum(out).backward();
  // The recomputation stops at b's save: "tail" does not run again.
  EXPECT_EQ(ev,
            (Events{"fwd a", "fwd b", "fwd tail", "bwd tail", "fwd a", "fwd b", "bwd b", "bwd a"}));
  EXPECT_EQ(Fmt(x.grad()), "[8]");
}

TEST(CheckpointSemanticsTest, RecomputationThatSavesMore) {
  int calls = 0;
  Tensor x = Leaf({1.5});
  Tensor out = Checkpoint(
      [&](const VariableList& in) {
        Tensor y = Mul(in[0], in[0]);        // saves 2
        if (++calls > 1) y = Mul(y, in[0]);  // the recomputation would save 2 more
        return y;
      },
      {x}, NonReentrant());
  Sum(out).backward();
  EXPECT_EQ(Fmt(x.grad()), "[3]");
}

TEST(CheckpointSemanticsTest, RecomputationThatSavesFewer) {
  int calls = 0;
  Tensor x = Leaf({1.5});
  Tensor out = Checkpoint(
      [&](const VariableList& in) {
        Tensor y = Mul(in[0], in[0]);
        if (++calls == 1) y = Mul(y, in[0]);
        return y;
      },
      {x}, NonReentrant());
  // PyTorch: "Number of tensors saved during forward: 4 / during recomputation: 2".
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { Sum(out).backward(); },
      "checkpoint: a different number of tensors was saved during the original forward and the "
      "recomputation: 4 in the forward, 2 in the recomputation (none at position 2); the "
      "checkpointed function must run the same ops on the same shapes both times (pass the "
      "generators it draws from in CheckpointOptions::generators) [in MulBackward]"));
}

TEST(CheckpointSemanticsTest, RecomputationWithOtherMetadata) {
  int calls = 0;
  Tensor x = Leaf({1, 2, 3, 4, 5, 6});
  Tensor out = Checkpoint(
      [&](const VariableList& in) {
        Tensor r = Reshape(in[0], ++calls == 1 ? Shape{2, 3} : Shape{3, 2});
        return Mul(r, r);
      },
      {x}, NonReentrant());
  // PyTorch lists positions 0 and 1: saved [2, 3] float64 cpu, recomputed [3, 2].
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { Sum(out).backward(); },
      "checkpoint: recomputed values for the following tensors have different metadata than "
      "during the forward: tensor at position 0: saved f64 [2, 3] on cpu, recomputed f64 [3, 2] "
      "on cpu; tensor at position 1: saved f64 [2, 3] on cpu, recomputed f64 [3, 2] on cpu "
      "[in MulBackward]"));
}

struct UnpackTwice : Function<UnpackTwice> {
  static constexpr const char* kName = "UnpackTwice";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    ctx.save_for_backward({in[0]});
    return {MulScalar(in[0], 2)};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    ctx.saved_variables();
    ctx.saved_variables();
    return {MulScalar(grads[0], 2)};
  }
};

TEST(CheckpointSemanticsTest, UnpackTwice) {
  Tensor x = Leaf({1});
  Tensor out = Checkpoint(
      [](const VariableList& in) { return UnpackTwice::Apply({MulScalar(in[0], 3)})[0]; }, {x},
      NonReentrant());
  // PyTorch: "Unpack is being triggered for a tensor that was already unpacked once. ...".
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { Sum(out).backward(); },
      "checkpoint: unpack is being triggered for saved tensor 0, which was already unpacked "
      "once in this backward; if you call FunctionCtx::saved_variables() in backward, call it "
      "only once [in UnpackTwiceBackward]"));
}

// x * h; its backward logs what the unpacked saved inputs are.
struct Inspect : Function<Inspect> {
  static constexpr const char* kName = "Inspect";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in) {
    ctx.save_for_backward({in[0], in[1]});
    return {Mul(in[0], in[1])};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    const VariableList saved = ctx.saved_variables();
    const char* names[] = {"x", "h"};
    for (size_t i = 0; i < 2; ++i) {
      const Tensor& t = saved[i];
      events->push_back(std::string(names[i]) + " leaf=" + std::to_string(t.is_leaf()) +
                        " requires_grad=" + std::to_string(t.requires_grad()) +
                        " grad_fn=" + (t.grad_fn() ? t.grad_fn()->name() : "-") + " " + Fmt(t));
    }
    return {Mul(grads[0], saved[1]), Mul(grads[0], saved[0])};
  }
};

TEST(CheckpointSemanticsTest, SavedInputsKeepTheirPlace) {
  Events ev;
  events = &ev;
  Tensor x = Leaf({2});
  Tensor h = Mul(x, Tensor(RawTensor::FromVector<double>({3}, {1}, kF64)));
  Tensor out = Checkpoint(
      [](const VariableList& in) {
        return Inspect::Apply({in[0], in[1]})[0];
      },
      {x, h}, NonReentrant());
  Sum(out).backward();
  EXPECT_EQ(ev, (Events{"x leaf=1 requires_grad=1 grad_fn=- [2]",
                        "h leaf=0 requires_grad=1 grad_fn=MulBackward [6]"}));
  EXPECT_EQ(Fmt(x.grad()), "[12]");
}

// 2 * x; its backward hands out the unpacked saved input.
struct Keep : Function<Keep> {
  static constexpr const char* kName = "Keep";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in, Tensor* seen) {
    ctx.save_for_backward({in[0]});
    ctx.saved_data["seen"] = seen;
    return {MulScalar(in[0], 2)};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    *std::any_cast<Tensor*>(ctx.saved_data.at("seen")) = ctx.saved_variables()[0];
    return {MulScalar(grads[0], 2)};
  }
};

// Deliberately unlike PyTorch (whose unpacked tensors are new objects on the same graph
// places): a saved input unpacks as the input variable itself, as it does without checkpointing.
TEST(CheckpointSemanticsTest, SavedInputUnpacksAsTheSameVariable) {
  Tensor x = Leaf({2});
  Tensor seen;
  Tensor out = Checkpoint([&](const VariableList& in) { return Keep::Apply({in[0]}, &seen)[0]; },
                          {x}, NonReentrant());
  Sum(out).backward();
  EXPECT_TRUE(seen.is_same(x));
}

TEST(CheckpointSemanticsTest, DoubleBackwardThroughCheckpoint) {
  Events ev;
  Tensor x = Leaf({3});
  x.register_hook([&](const Tensor& g) {
    ev.push_back("x hook " + Fmt(g));
    return Tensor();
  });
  Tensor y = Checkpoint([](const VariableList& in) { return Mul(Mul(in[0], in[0]), in[0]); }, {x},
                        NonReentrant());
  GradOptions options;
  options.create_graph = true;
  Tensor g = Engine::Grad({y}, {x}, {}, options)[0];
  ev.push_back("g " + Fmt(g) + " requires_grad=" + std::to_string(g.requires_grad()));
  g.backward();
  EXPECT_EQ(ev, (Events{"x hook [27]", "g [27] requires_grad=1", "x hook [18]"}));
  EXPECT_EQ(Fmt(x.grad()), "[18]");
}

TEST(CheckpointSemanticsTest, SavedTensorHooksCopyKeepsThePlace) {
  Events ev;
  Tensor x = Leaf({3});
  x.register_hook([&](const Tensor& g) {
    ev.push_back("x hook " + Fmt(g));
    return Tensor();
  });
  Tensor y;
  {
    SavedTensorHooks copies(
        [](const Tensor& v) -> std::any { return v.data().clone(); },
        [](const std::any& packed) -> Tensor { return Tensor(std::any_cast<RawTensor>(packed)); });
    y = Mul(Mul(x, x), x);
  }
  GradOptions options;
  options.create_graph = true;
  Tensor g = Engine::Grad({y}, {x}, {}, options)[0];
  ev.push_back("g " + Fmt(g) + " requires_grad=" + std::to_string(g.requires_grad()));
  g.backward();
  EXPECT_EQ(ev, (Events{"x hook [27]", "g [27] requires_grad=1", "x hook [18]"}));
  EXPECT_EQ(Fmt(x.grad()), "[18]");
}

}  // namespace
}  // namespace tg
