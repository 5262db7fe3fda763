// Activation checkpointing (autograd/checkpoint.h), both modes: gradients equal those without
// checkpointing bit for bit, randomness is replayed, the graph-task phases of hooks and
// callbacks (docs/architecture.md, autograd; amp's callback from the first hook of the outermost
// backward), Grad()/inputs= behaviour, retain_graph, and the recomputation checks.
#include "autograd/checkpoint.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;
using testing::ThrowsErrorExactly;

std::vector<double> Values(const Tensor& v) { return v.data().to_vector<double>(); }

Tensor Param(Generator& gen, Shape shape, const std::string& name) {
  Tensor p(RandNormal(shape, gen, 0, 0.5, kF64), /*requires_grad=*/true);
  p.set_name(name);
  return p;
}

// linear1 (Matmul + b1, GeluTanh, optional dropout-like mask) -> linear2 (Matmul + b2).
struct TwoLayer {
  Generator init{7};
  Tensor w1 = Param(init, {4, 5}, "W1");
  Tensor b1 = Param(init, {5}, "b1");
  Tensor w2 = Param(init, {5, 3}, "W2");
  Tensor b2 = Param(init, {3}, "b2");
  Generator dropout{123};
  bool use_dropout = false;
  // Told "forward" or "recompute" each time linear1 runs.
  std::function<void(const std::string&)> trace;

  Tensor Linear1(const Tensor& x) {
    if (trace) trace(current_graph_task_id() == -1 ? "forward" : "recompute");
    Tensor h = GeluTanh(Add(Matmul(x, w1), b1));
    if (use_dropout) {
      // Keep with probability 0.7, scaled: the mask comes from `dropout`.
      RawTensor keep =
          tg::Gt(RandUniform(h.shape(), dropout, 0, 1, kF64), RawTensor::Scalar(0.3, kF64));
      h = Mul(h, Tensor(tg::MulScalar(keep.to(kF64), 1 / 0.7)));
    }
    return h;
  }

  // mode: 0 = no checkpoint, 1 = reentrant, 2 = non-reentrant.
  Tensor Loss(const Tensor& x, int mode, bool pass_generator = true) {
    Tensor h;
    if (mode == 0) {
      h = Linear1(x);
    } else {
      CheckpointOptions options;
      options.reentrant = mode == 1;
      if (pass_generator) options.generators = {&dropout};
      h = Checkpoint([this](const VariableList& in) { return Linear1(in[0]); }, {x}, options);
    }
    Tensor out = Add(Matmul(h, w2), b2);
    return Sum(Mul(out, out));
  }

  VariableList Params() const { return {w1, b1, w2, b2}; }
  void ZeroGrad() {
    for (const Tensor& p : Params()) p.set_grad(Tensor());
  }
};

Tensor Input(bool requires_grad = true) {
  Generator gen(99);
  return Tensor(RandNormal({2, 4}, gen, 0, 1, kF64), requires_grad);
}

// Gradients of the four parameters and the input after one backward in `mode`.
std::vector<std::vector<double>> Grads(int mode, bool dropout, bool pass_generator = true) {
  TwoLayer m;
  m.use_dropout = dropout;
  Tensor x = Input();
  m.Loss(x, mode, pass_generator).backward();
  std::vector<std::vector<double>> grads;
  for (const Tensor& v : {m.w1, m.b1, m.w2, m.b2, x}) grads.push_back(Values(v.grad()));
  return grads;
}

TEST(CheckpointTest, GradientsEqualThoseWithoutCheckpointingBitForBit) {
  const auto reference = Grads(0, false);
  EXPECT_EQ(Grads(1, false), reference);
  EXPECT_EQ(Grads(2, false), reference);
}

TEST(CheckpointTest, RandomnessIsReplayedFromTheGivenGenerators) {
  const auto reference = Grads(0, true);
  EXPECT_EQ(Grads(1, true), reference);
  EXPECT_EQ(Grads(2, true), reference);
  // Without restoring the generator the recomputation draws a different mask.
  EXPECT_NE(Grads(1, true, /*pass_generator=*/false)[0], reference[0]);
  EXPECT_NE(Grads(2, true, /*pass_generator=*/false)[0], reference[0]);
}

TEST(CheckpointTest, TheCallersRandomStreamIsUnaffectedByTheRecomputation) {
  for (int mode : {1, 2}) {
    TwoLayer m;
    m.use_dropout = true;
    Tensor loss = m.Loss(Input(), mode);
    const Generator::State after_forward = m.dropout.state();
    loss.backward();
    EXPECT_EQ(m.dropout.state(), after_forward) << "mode " << mode;
  }
}

TEST(CheckpointTest, ForwardValueEqualsTheUncheckpointedOne) {
  TwoLayer m;
  const double reference = m.Loss(Input(), 0).item();
  EXPECT_EQ(m.Loss(Input(), 1).item(), reference);
  EXPECT_EQ(m.Loss(Input(), 2).item(), reference);
}

TEST(CheckpointTest, ReentrantForwardRecordsOneNodeAndNothingInside) {
  TwoLayer m;
  Tensor x = Input();
  Tensor h = Checkpoint([&](const VariableList& in) { return m.Linear1(in[0]); }, {x});
  ASSERT_NE(h.grad_fn(), nullptr);
  EXPECT_EQ(h.grad_fn()->name(), "CheckpointBackward");
  ASSERT_EQ(h.grad_fn()->next_edges().size(), 1u);
  EXPECT_EQ(h.grad_fn()->next_edges()[0].fn, x.gradient_edge_node());
  // fn ran under no-grad: no node of linear1 refers to W1 (its accumulator was never made).
  EXPECT_TRUE(m.w1.impl()->grad_accumulator.expired());
}

TEST(CheckpointTest, TheSegmentsSavedTensorsAreNotKept) {
  // exp(x) is saved by ExpBackward (its output) and twice by MulBackward; with checkpointing
  // none of those references survive the forward, and the recomputed copy dies in backward.
  std::vector<double> reference;
  for (int mode : {0, 1, 2}) {
    std::weak_ptr<Storage> intermediate;
    auto fn = [&](const VariableList& in) {
      Tensor a = Exp(in[0]);
      intermediate = a.data().storage();
      return Mul(a, a);
    };
    Tensor x(RawTensor::FromVector<double>({0.5, 1}, {2}, kF64), /*requires_grad=*/true);
    Tensor loss;
    if (mode == 0) {
      loss = Sum(fn({x}));
    } else {
      CheckpointOptions options;
      options.reentrant = mode == 1;
      loss = Sum(Checkpoint(fn, {x}, options));
    }
    EXPECT_EQ(intermediate.expired(), mode != 0) << "mode " << mode;
    loss.backward();
    EXPECT_TRUE(intermediate.expired()) << "mode " << mode;
    if (mode == 0) reference = Values(x.grad());
    EXPECT_EQ(Values(x.grad()), reference) << "mode " << mode;
  }
  EXPECT_NEAR(reference[1], 2 * std::exp(2.0), 1e-12);  // d/dx exp(x)^2
}

// ---- Graph-task phases ---------------------------------------------------------------------

struct Event {
  std::string what;
  int64_t task;
  int depth;
};

// Runs two training steps of TwoLayer with linear1 checkpointed in `mode` and returns the
// events of each: linear1's forward/recompute, each parameter's post-accumulate-grad hook, and
// a callback queued from the first hook that fires in the outermost task (depth 0), the way
// the amp facade queues its epilogue; each with the task id and depth it ran in.
std::vector<std::vector<Event>> PhaseEvents(int mode) {
  TwoLayer m;
  std::vector<Event> events;
  auto record = [&events](const std::string& what) {
    events.push_back({what, current_graph_task_id(), current_reentrant_depth()});
  };
  m.trace = record;
  int64_t queued_for = -1;
  std::vector<HookHandle> handles;
  for (const Tensor& p : m.Params()) {
    handles.push_back(p.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
      record(leaf.name());
      if (current_reentrant_depth() == 0 && queued_for != current_graph_task_id()) {
        queued_for = current_graph_task_id();
        queue_callback([&] { record("callback"); });
      }
    }));
  }
  std::vector<std::vector<Event>> steps;
  for (int step = 0; step < 2; ++step) {
    events.clear();
    m.ZeroGrad();
    m.Loss(Input(), mode).backward();
    steps.push_back(events);
  }
  for (HookHandle& h : handles) h.remove();
  return steps;
}

std::vector<std::string> Names(const std::vector<Event>& events) {
  std::vector<std::string> names;
  for (const Event& e : events) names.push_back(e.what);
  return names;
}

TEST(CheckpointPhasesTest, ReentrantLinear1AccumulatesInANestedTaskAndTheCallbackRunsOnceLast) {
  const auto steps = PhaseEvents(/*mode=*/1);
  int64_t previous_outer = -1;
  for (const std::vector<Event>& ev : steps) {
    // linear2's parameters accumulate in the outer task; then the checkpoint node recomputes
    // linear1 and its nested backward accumulates W1/b1; the callback runs after all four.
    ASSERT_EQ(Names(ev), (std::vector<std::string>{"forward", "b2", "W2", "recompute", "b1", "W1",
                                                   "callback"}));
    EXPECT_EQ(ev[0].task, -1);  // the forward ran outside backward
    const int64_t outer = ev[1].task;
    EXPECT_GT(outer, previous_outer);
    previous_outer = outer;
    for (int i : {1, 2, 3, 6}) {
      EXPECT_EQ(ev[i].task, outer) << ev[i].what;
      EXPECT_EQ(ev[i].depth, 0) << ev[i].what;
    }
    const int64_t nested = ev[4].task;
    EXPECT_NE(nested, outer);
    EXPECT_GT(nested, outer);
    for (int i : {4, 5}) {
      EXPECT_EQ(ev[i].task, nested) << ev[i].what;
      EXPECT_EQ(ev[i].depth, 1) << ev[i].what;
    }
  }
}

TEST(CheckpointPhasesTest, NonReentrantEverythingRunsInTheOneTask) {
  const auto steps = PhaseEvents(/*mode=*/2);
  for (const std::vector<Event>& ev : steps) {
    // The first unpack of a linear1 tensor (GeluTanh's input) recomputes linear1 once.
    ASSERT_EQ(Names(ev), (std::vector<std::string>{"forward", "b2", "W2", "recompute", "b1", "W1",
                                                   "callback"}));
    EXPECT_EQ(ev[0].task, -1);
    for (size_t i = 1; i < ev.size(); ++i) {
      EXPECT_EQ(ev[i].task, ev[1].task) << ev[i].what;
      EXPECT_EQ(ev[i].depth, 0) << ev[i].what;
    }
  }
}

// ---- Grad(), inputs=, retain_graph -----------------------------------------------------------

constexpr char kReentrantPartialError[] =
    "checkpoint: reentrant checkpointing does not work with Engine::Grad() or with Backward() "
    "given inputs; use CheckpointOptions::reentrant = false [in CheckpointBackward]";

TEST(CheckpointTest, ReentrantRefusesUnderGradAndBackwardWithInputs) {
  TwoLayer m;
  Tensor x = Input();
  Tensor loss = m.Loss(x, 1);
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { Engine::Grad({loss}, {x}, {}, GradOptions{/*retain_graph=*/true}); },
                         kReentrantPartialError));
  VariableList inputs = {x};  // reaches the checkpoint node (W1 is only inside fn)
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Engine::Backward({loss}, {}, BackwardOptions{true, false, &inputs});
      },
      kReentrantPartialError));
  EXPECT_FALSE(m.w1.grad().defined());
}

TEST(CheckpointTest, NonReentrantWorksUnderGrad) {
  TwoLayer reference_model, m;
  Tensor x0 = Input(), x = Input();
  const VariableList want =
      Engine::Grad({reference_model.Loss(x0, 0)}, {reference_model.w1, reference_model.b2, x0});
  const VariableList got = Engine::Grad({m.Loss(x, 2)}, {m.w1, m.b2, x});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(Values(got[i]), Values(want[i])) << i;
  EXPECT_FALSE(m.w1.grad().defined());  // Grad() accumulates nothing
}

TEST(CheckpointTest, NonReentrantWorksWithBackwardInputs) {
  TwoLayer reference_model, m;
  Tensor x0 = Input(), x = Input();
  VariableList want_inputs = {reference_model.w1}, inputs = {m.w1};
  Engine::Backward({reference_model.Loss(x0, 0)}, {}, BackwardOptions{false, false, &want_inputs});
  Engine::Backward({m.Loss(x, 2)}, {}, BackwardOptions{false, false, &inputs});
  EXPECT_EQ(Values(m.w1.grad()), Values(reference_model.w1.grad()));
  EXPECT_FALSE(m.w2.grad().defined());
}

TEST(CheckpointTest, NonReentrantRecomputesOncePerBackwardWithRetainGraph) {
  TwoLayer reference_model, m;
  int recomputes = 0;
  m.trace = [&](const std::string& what) { recomputes += what == "recompute"; };
  Tensor x0 = Input(), x = Input();
  Tensor want = reference_model.Loss(x0, 0), loss = m.Loss(x, 2);
  for (int i = 0; i < 2; ++i) {
    want.backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
    loss.backward(Tensor(), BackwardOptions{/*retain_graph=*/true});
    EXPECT_EQ(recomputes, i + 1);
  }
  EXPECT_EQ(Values(m.w1.grad()), Values(reference_model.w1.grad()));
  EXPECT_EQ(Values(x.grad()), Values(x0.grad()));
}

TEST(CheckpointTest, NonReentrantPassesGradcheck) {
  TwoLayer m;
  Tensor x = Input();
  GradcheckResult r = Gradcheck(
      [&](const VariableList& in) {
        CheckpointOptions options;
        options.reentrant = false;
        return Checkpoint([&](const VariableList& a) { return m.Linear1(a[0]); }, {in[0]}, options);
      },
      {x});
  EXPECT_TRUE(r.ok) << r.message;
}

// ---- Recomputation checks ----------------------------------------------------------------------

CheckpointOptions NonReentrant() {
  CheckpointOptions options;
  options.reentrant = false;
  return options;
}

// Recomputations that save more (early stop) or fewer tensors, and different metadata:
// checkpoint_semantics_test.cc pins them against PyTorch; here the texts on a two-layer segment.
TEST(CheckpointTest, RecomputationThatSavesFewerTensorsThrows) {
  bool extra_op = true;
  Tensor x(RawTensor::FromVector<double>({1, 2, 3}, {3}, kF64), /*requires_grad=*/true);
  auto fn = [&](const VariableList& in) {
    Tensor y = Mul(in[0], in[0]);     // saves 2
    if (extra_op) y = Mul(y, in[0]);  // saves 2 more
    return Tanh(y);                   // saves its output
  };
  Tensor loss = Sum(Checkpoint(fn, {x}, NonReentrant()));
  extra_op = false;  // the recomputation no longer matches the forward
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { loss.backward(); },
      "checkpoint: a different number of tensors was saved during the original forward and the "
      "recomputation: 5 in the forward, 3 in the recomputation (none at position 3); the "
      "checkpointed function must run the same ops on the same shapes both times (pass the "
      "generators it draws from in CheckpointOptions::generators) [in TanhBackward]"));
}

// A function whose forward runs a backward of its own (a tiled loss accumulating w's gradient
// while it computes x * w), inside a checkpointed function: the recomputation would accumulate
// w's gradient a second time (PyTorch does), so the backward it starts there throws, in both
// modes, and w keeps the one gradient of the original forward.
struct BackwardInForward : Function<BackwardInForward> {
  static constexpr const char* kName = "BackwardInForward";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    EnableGradGuard grad;
    Sum(Mul(in[1], in[1])).backward();  // w.grad += 2w
    return {Tensor(tg::Mul(in[0].data(), in[1].data()))};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) {
    return {grads[0], Tensor()};  // w's gradient was accumulated in Forward
  }
};

TEST(CheckpointTest, ABackwardStartedDuringTheRecomputationThrowsInsteadOfCountingTwice) {
  for (const bool reentrant : {true, false}) {
    SCOPED_TRACE(reentrant ? "reentrant" : "non-reentrant");
    Tensor x(RawTensor::FromVector<double>({1, 2}, {2}, kF64), /*requires_grad=*/true);
    Tensor w(RawTensor::FromVector<double>({3, -1}, {2}, kF64), /*requires_grad=*/true);
    CheckpointOptions options;
    options.reentrant = reentrant;
    auto fn = [&](const VariableList& in) {
      const Tensor y = BackwardInForward::Apply({in[0], w})[0];
      return Mul(y, in[0]);  // saves tensors: the non-reentrant recomputation runs
    };
    Tensor loss = Sum(Checkpoint(fn, {x}, options));
    EXPECT_EQ(Values(w.grad()), (std::vector<double>{6, -2}));  // once, in the forward
    EXPECT_TRUE(ThrowsError(
        [&] { loss.backward(); },
        "backward: called while a checkpoint recomputes its function (from the function's "
        "forward or a hook inside it); its gradients were accumulated when the forward first "
        "ran and would be accumulated a second time."));
    EXPECT_EQ(Values(w.grad()), (std::vector<double>{6, -2}));
  }
}

TEST(CheckpointTest, RecomputationThatSavesDifferentShapesThrows) {
  bool transposed = false;
  Tensor x(RawTensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {6}, kF64), /*requires_grad=*/true);
  auto fn = [&](const VariableList& in) {
    Tensor r = Reshape(in[0], transposed ? Shape{3, 2} : Shape{2, 3});
    return Mul(r, r);
  };
  Tensor loss = Sum(Checkpoint(fn, {x}, NonReentrant()));
  transposed = true;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { loss.backward(); },
      "checkpoint: recomputed values for the following tensors have different metadata than "
      "during the forward: tensor at position 0: saved f64 [2, 3] on cpu, recomputed f64 [3, 2] "
      "on cpu; tensor at position 1: saved f64 [2, 3] on cpu, recomputed f64 [3, 2] on cpu "
      "[in MulBackward]"));
}

TEST(CheckpointTest, InputsModifiedInPlaceAfterTheForwardAreDetected) {
  Tensor x(RawTensor::FromVector<double>({1, 2}, {2}, kF64), /*requires_grad=*/true);
  Tensor loss = Sum(
      Checkpoint([](const VariableList& in) { return Mul(in[0], in[0]); }, {x}, NonReentrant()));
  x.bump_version();
  EXPECT_TRUE(ThrowsError([&] { loss.backward(); },
                          "checkpoint: input 0 was modified in place after the checkpointed "
                          "forward (version 0, now 1)"));

  Tensor y(RawTensor::FromVector<double>({1, 2}, {2}, kF64), /*requires_grad=*/true);
  Tensor loss2 = Sum(Checkpoint([](const VariableList& in) { return Mul(in[0], in[0]); }, {y}));
  y.bump_version();
  EXPECT_TRUE(ThrowsError([&] { loss2.backward(); }, "was modified in place after it was saved"));
}

TEST(CheckpointTest, ReentrantWithoutAnInputRequiringGradDoesNotRecord) {
  // As in PyTorch (use_reentrant=True): the output does not require grad, so parameters used
  // only inside fn get no gradient.
  TwoLayer m;
  Tensor h = Checkpoint([&](const VariableList& in) { return m.Linear1(in[0]); },
                        {Input(/*requires_grad=*/false)});
  EXPECT_FALSE(h.requires_grad());
  CheckpointOptions options = NonReentrant();
  Tensor h2 = Checkpoint([&](const VariableList& in) { return m.Linear1(in[0]); },
                         {Input(/*requires_grad=*/false)}, options);
  EXPECT_TRUE(h2.requires_grad());  // non-reentrant records normally
}

}  // namespace
}  // namespace tg
