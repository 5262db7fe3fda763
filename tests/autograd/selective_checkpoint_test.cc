// Selective activation checkpointing (CheckpointOptions::context_fn with
// CreateSelectiveCheckpointContexts), GraphExecGroup and op dispatch modes. The op lists,
// gradients and errors come from selective_checkpoint_reference.py (PyTorch 2.15); where tapegrad
// differs on purpose (docs/semantics.md) the test says so next to the literal.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/dispatch_mode.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;
using Names = std::vector<std::string>;

// The reference script's inputs: ((i * 7 + s) % 11 - 5) / 4, f64.
RawTensor Values(int64_t n, int s, const Shape& shape) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>((i * 7 + s) % 11 - 5) / 4);
  return RawTensor::FromVector<double>(v, shape, kF64);
}

Tensor LeafOf(int64_t n, int s, const Shape& shape) { return Tensor(Values(n, s, shape), true); }

void ExpectValues(const Tensor& t, const std::vector<double>& expected) {
  ASSERT_TRUE(t.defined());
  const std::vector<double> got = t.data().to_vector<double>();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12) << "at " << i;
}

// Logs the op of every call that reaches it and runs it.
class LogMode : public OpDispatchMode {
 public:
  explicit LogMode(Names* log) : log_(log) {}
  DispatchResult Call(OpId op, const VariableList&,
                      const std::function<DispatchResult()>& run) override {
    log_->push_back(OpTorchName(op));
    return run();
  }

 private:
  Names* log_;
};

// The selective contexts `make` returns, with a LogMode entered below the recompute one: it sees
// the calls each recomputation runs instead of taking a kept output (the reference script's
// "recomputed"); `recomputations` counts the recomputations.
CheckpointContextFn Logged(std::function<CheckpointContexts()> make, Names* recomputed,
                           int* recomputations) {
  return [make, recomputed, recomputations] {
    CheckpointContexts selective = make();
    CheckpointContexts c;
    c.forward = selective.forward;
    c.recompute = [selective, recomputed, recomputations]() -> std::shared_ptr<void> {
      ++*recomputations;
      struct Entered {
        LogMode mode;
        OpDispatchModeGuard log;
        std::shared_ptr<void> inner;
        Entered(Names* names, const CheckpointContext& recompute)
            : mode(names), log(&mode), inner(recompute()) {}
      };
      return std::make_shared<Entered>(recomputed, selective.recompute);
    };
    return c;
  };
}

CheckpointOptions NonReentrant(CheckpointContextFn context_fn) {
  CheckpointOptions o;
  o.reentrant = false;
  o.context_fn = std::move(context_fn);
  return o;
}

// PyTorch's documentation example: sigmoid(mm(mm(x, y), y)) * y.
Tensor DocExample(const VariableList& in) {
  return Mul(Sigmoid(Matmul(Matmul(in[0], in[1]), in[1])), in[1]);
}

const std::vector<double> kDocXGrad = {0.0,
                                       0.13993205642321777,
                                       0.27986411284643553,
                                       -0.019423019309308204,
                                       0.15058047919223874,
                                       0.32058397769378566,
                                       -0.03944801919923316,
                                       -0.04247873457379072,
                                       -0.04550944994834828};
const std::vector<double> kDocYGrad = {
    0.7057686817199276,  -0.3464444410063642,  0.665082627170632,
    -0.4018011181775684, -0.41903939883617425, 0.08593606116411412,
    0.0881365306400145,  1.023129936264116,    0.242842817573084};

struct DocRun {
  Names asked, recomputed;
  int recomputations = 0;
  Tensor x, y;
};

DocRun RunDocExample(const std::vector<OpId>& keep, bool op_list_policy = false) {
  DocRun r;
  r.x = LeafOf(9, 1, {3, 3});
  r.y = LeafOf(9, 2, {3, 3});
  Names* asked = &r.asked;
  const CheckpointPolicyFn policy = [keep, asked, op_list_policy](
                                        const SelectiveCheckpointContext& ctx, OpId op,
                                        const VariableList& inputs) {
    asked->push_back(OpTorchName(op));
    if (op_list_policy) return OpListCheckpointPolicy(ctx, op, inputs);
    return std::find(keep.begin(), keep.end(), op) != keep.end()
               ? CheckpointPolicy::kMustSave
               : CheckpointPolicy::kPreferRecompute;
  };
  const Tensor out =
      Checkpoint(DocExample, {r.x, r.y},
                 NonReentrant(Logged([policy] { return CreateSelectiveCheckpointContexts(policy); },
                                     &r.recomputed, &r.recomputations)));
  Sum(Mul(out, Tensor(Values(9, 5, {3, 3})))).backward();
  return r;
}

TEST(SelectiveCheckpointTest, KeepMatmulTakesBothProductsFromTheForward) {
  const DocRun r = RunDocExample({OpId::kMatmul});
  // PyTorch: policy = ['matmul', 'matmul', 'sigmoid', 'mul'].
  EXPECT_EQ(r.asked, (Names{"matmul", "matmul", "sigmoid", "mul"}));
  // PyTorch: recomputed = ['sigmoid']. tapegrad also runs the mul whose saved operands complete
  // the recomputation: its nodes save after their kernel, PyTorch's before (docs/semantics.md,
  // "early stop").
  EXPECT_EQ(r.recomputed, (Names{"sigmoid", "mul"}));
  EXPECT_EQ(r.recomputations, 1);
  ExpectValues(r.x.grad(), kDocXGrad);
  ExpectValues(r.y.grad(), kDocYGrad);
}

TEST(SelectiveCheckpointTest, RecomputeEverythingIsPlainCheckpointing) {
  const DocRun r = RunDocExample({});
  EXPECT_EQ(r.asked, (Names{"matmul", "matmul", "sigmoid", "mul"}));
  // PyTorch: ['matmul', 'matmul', 'sigmoid'] (the mul: as above).
  EXPECT_EQ(r.recomputed, (Names{"matmul", "matmul", "sigmoid", "mul"}));
  EXPECT_EQ(r.recomputations, 1);
  ExpectValues(r.x.grad(), kDocXGrad);
  ExpectValues(r.y.grad(), kDocYGrad);
}

TEST(SelectiveCheckpointTest, TheOpListKeepsTheGemmsByDefault) {
  const VariableList none;
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kMatmul, none), CheckpointPolicy::kPreferSave);
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kLinear, none), CheckpointPolicy::kPreferSave);
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kConv2d, none), CheckpointPolicy::kPreferSave);
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kScaledDotProductAttention, none),
            CheckpointPolicy::kPreferSave);
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kSigmoid, none), CheckpointPolicy::kPreferRecompute);
  EXPECT_EQ(OpListCheckpointPolicy({}, OpId::kSoftmax, none), CheckpointPolicy::kPreferRecompute);
  const DocRun r = RunDocExample({}, /*op_list_policy=*/true);
  EXPECT_EQ(r.recomputed, (Names{"sigmoid", "mul"}));  // as KeepMatmul
  ExpectValues(r.x.grad(), kDocXGrad);
  ExpectValues(r.y.grad(), kDocYGrad);
}

TEST(SelectiveCheckpointTest, PolicySeesTheInputsAndOutputsOfEachCall) {
  const Tensor x = LeafOf(6, 1, {2, 3}), w = LeafOf(9, 2, {3, 3});
  std::vector<std::string> seen;
  const CheckpointPolicyFn policy = [&seen](const SelectiveCheckpointContext& ctx, OpId op,
                                            const VariableList& inputs) {
    std::string line = OpTorchName(op);
    for (const Tensor& t : inputs) line += " in" + ShapeToString(t.shape());
    for (const Tensor& t : ctx.op_output) line += " out" + ShapeToString(t.shape());
    EXPECT_FALSE(ctx.is_recompute);
    seen.push_back(line);
    return CheckpointPolicy::kPreferRecompute;
  };
  Checkpoint([](const VariableList& in) { return Exp(Matmul(in[0], in[1])); }, {x, w},
             NonReentrant([policy] { return CreateSelectiveCheckpointContexts(policy); }))
      .sum()
      .backward();
  EXPECT_EQ(seen, (Names{"matmul in[2, 3] in[3, 3] out[2, 3]", "exp in[2, 3] out[2, 3]"}));
}

// out = sigmoid(mm(x, w1)) + tanh(mm(y, w2)); the gradient for x, then for y: two backward calls
// through disjoint halves of the segment.
struct BranchRun {
  Names recomputed;
  int recomputations = 0;
  Tensor gx, gy;
};

BranchRun RunTwoBranches(bool group, const std::vector<OpId>& keep) {
  BranchRun r;
  const Tensor x = LeafOf(6, 1, {2, 3}), y = LeafOf(6, 2, {2, 3});
  const Tensor w1 = LeafOf(9, 3, {3, 3}), w2 = LeafOf(9, 4, {3, 3});
  const Tensor out = Checkpoint(
      [](const VariableList& in) {
        const Tensor a = Sigmoid(Matmul(in[0], in[2]));  // in this order (C++ leaves the order
        const Tensor b = Tanh(Matmul(in[1], in[3]));     // of function arguments open)
        return Add(a, b);
      },
      {x, y, w1, w2},
      NonReentrant(Logged([keep] { return CreateSelectiveCheckpointContexts(keep); }, &r.recomputed,
                          &r.recomputations)));
  GradOptions retain;
  retain.retain_graph = true;
  std::optional<GraphExecGroup> exec_group;
  if (group) exec_group.emplace();
  r.gx = Engine::Grad({Sum(out)}, {x}, {}, retain)[0];
  r.gy = Engine::Grad({Sum(out)}, {y}, {}, retain)[0];
  return r;
}

const std::vector<double> kBranchXGrad = {0.21634529753156773,   0.03677768819326943,
                                          -0.14278992114502884,  0.14687462932365403,
                                          -0.008326653387524335, -0.16352793609870267};
const std::vector<double> kBranchYGrad = {0.2037909359820248,  -0.14666380259499096,
                                          -0.63216669518476,   0.1055626911191832,
                                          -0.1713655013342744, -0.6674021300400204};

TEST(SelectiveCheckpointTest, EachBackwardRecomputesWithoutAGroup) {
  const BranchRun r = RunTwoBranches(false, {});
  EXPECT_EQ(r.recomputed,
            (Names{"matmul", "sigmoid", "matmul", "tanh", "matmul", "sigmoid", "matmul", "tanh"}));
  EXPECT_EQ(r.recomputations, 2);
  ExpectValues(r.gx, kBranchXGrad);
  ExpectValues(r.gy, kBranchYGrad);
}

TEST(SelectiveCheckpointTest, ASecondRecomputationOfAKeptOutputIsAnError) {
  // PyTorch: recomputed = ['sigmoid', 'tanh'], 2 recomputations, then "Trying to backward an
  // extra time. You are only allowed to backward once on any region computed under selective
  // activation checkpoint."
  EXPECT_TRUE(ThrowsError([] { RunTwoBranches(false, {OpId::kMatmul}); },
                          "checkpoint: a second recomputation of a selectively checkpointed "
                          "segment reached matmul (call 1), whose kept output the first one "
                          "already took"));
}

TEST(SelectiveCheckpointTest, AGroupRecomputesOnceForBothBackwardCalls) {
  for (const bool keep_mm : {false, true}) {
    SCOPED_TRACE(keep_mm ? "mm kept" : "nothing kept");
    const BranchRun r =
        RunTwoBranches(true, keep_mm ? std::vector<OpId>{OpId::kMatmul} : std::vector<OpId>{});
    EXPECT_EQ(r.recomputed, keep_mm ? (Names{"sigmoid", "tanh"})
                                    : (Names{"matmul", "sigmoid", "matmul", "tanh"}));
    EXPECT_EQ(r.recomputations, 1);
    ExpectValues(r.gx, kBranchXGrad);
    ExpectValues(r.gy, kBranchYGrad);
  }
}

TEST(SelectiveCheckpointTest, BackwardCallsOfOneGroupMustNotShareSavedTensors) {
  const Tensor x = LeafOf(9, 1, {3, 3}), y = LeafOf(9, 2, {3, 3});
  const Tensor out =
      Checkpoint(DocExample, {x, y},
                 NonReentrant([] { return CreateSelectiveCheckpointContexts({OpId::kMatmul}); }));
  GradOptions retain;
  retain.retain_graph = true;
  const GraphExecGroup group;
  Engine::Grad({Sum(out)}, {x}, {}, retain);
  // PyTorch: "... Unpack is being triggered for a tensor that was already unpacked once.
  // Performing two backward calls that overlap ... is not allowed while under the
  // torch.utils.checkpoint.GraphExecGroup context. ..."
  EXPECT_TRUE(ThrowsError([&] { Engine::Grad({Sum(out)}, {y}, {}, retain); },
                          "which was already unpacked once in this backward (under one "
                          "GraphExecGroup, the backward calls must need disjoint saved tensors)"));
}

TEST(SelectiveCheckpointTest, GroupsDoNotNest) {
  EXPECT_EQ(GraphExecGroup::current(), -1);
  {
    const GraphExecGroup group;
    EXPECT_EQ(GraphExecGroup::current(), group.id());
    EXPECT_TRUE(
        ThrowsError([] { GraphExecGroup inner; }, "GraphExecGroup: groups cannot be nested"));
    EXPECT_EQ(GraphExecGroup::current(), group.id());
  }
  EXPECT_EQ(GraphExecGroup::current(), -1);
}

// h = mm(x, y) kept, then h *= 2 inside the segment.
Tensor Mutating(const VariableList& in) {
  Tensor h = Matmul(in[0], in[1]);
  h.mul_(2.0);
  return Mul(Exp(h), in[1]);
}

TEST(SelectiveCheckpointTest, AKeptOutputModifiedInPlaceIsAnError) {
  const Tensor x = LeafOf(9, 1, {3, 3}), y = LeafOf(9, 2, {3, 3});
  const Tensor out =
      Checkpoint(Mutating, {x, y},
                 NonReentrant([] { return CreateSelectiveCheckpointContexts({OpId::kMatmul}); }));
  // PyTorch: "Tensor cached during selective activation checkpoint has been mutated".
  EXPECT_TRUE(ThrowsError([&] { Sum(out).backward(); },
                          "checkpoint: output 0 of matmul (call 1), kept by the selective "
                          "checkpoint policy, was modified in place after the forward (version 0, "
                          "now 1); pass allow_cache_entry_mutation = true"));
}

TEST(SelectiveCheckpointTest, AllowCacheEntryMutationUsesTheModifiedOutputAsPyTorchDoes) {
  const Tensor x = LeafOf(9, 1, {3, 3}), y = LeafOf(9, 2, {3, 3});
  Names recomputed;
  int recomputations = 0;
  const Tensor out = Checkpoint(
      Mutating, {x, y},
      NonReentrant(
          Logged([] { return CreateSelectiveCheckpointContexts({OpId::kMatmul}, /*allow=*/true); },
                 &recomputed, &recomputations)));
  Sum(out).backward();
  // PyTorch: recomputed = ['mul_', 'exp']: tapegrad does not dispatch in-place ops (their output
  // is their input), and runs the last mul (early stop, as above).
  EXPECT_EQ(recomputed, (Names{"exp", "mul"}));
  // The recomputation doubles the kept (already doubled) product again, as PyTorch's does.
  ExpectValues(x.grad(), {4.1374342762683005, 5.393613273035559, 6.649792269802817,
                          105.17478201483915, 140.42941247331876, 175.68404293179833,
                          70.79518629888432, 54.37134360230996, 37.94750090573561});
  ExpectValues(y.grad(), {182.8397650067135, 87.50553684028876, -2.5536771195683166,
                          -4.156560477876724, 17.703892667456685, 0.3639552136596358,
                          72.47194434910395, 17.465321726987348, 6.520280493233255});
}

// The recomputation of tanh(v) * v stops on the mul's saved operands, so, as in PyTorch (which
// packs an op's inputs before running it), the mul is not taken: its kept output may be modified
// after the forward, and the segment backpropagated through twice.
TEST(SelectiveCheckpointTest, TheLastKeptOpIsNeverTaken) {
  const Tensor x = LeafOf(3, 1, {3});
  Tensor out =
      Checkpoint([](const VariableList& in) { return Mul(Tanh(in[0]), in[0]); }, {x},
                 NonReentrant([] { return CreateSelectiveCheckpointContexts({OpId::kMul}); }));
  out.mul_(2.0);
  Sum(out).backward(Tensor(), /*retain_graph=*/true);
  ExpectValues(x.grad(), {-2.363136995139582, 2.165176617196572, -0.9598447492106073});
  Sum(out).backward();
  ExpectValues(x.grad(), {-4.726273990279164, 4.330353234393144, -1.9196894984212145});
}

TEST(SelectiveCheckpointTest, ARecomputationCallingAnotherOpIsAnError) {
  const Tensor x = LeafOf(6, 1, {2, 3});
  int calls = 0;
  const Tensor out = Checkpoint(
      [&calls](const VariableList& in) { return ++calls == 1 ? Exp(in[0]) : Sigmoid(in[0]); }, {x},
      NonReentrant([] { return CreateSelectiveCheckpointContexts({OpId::kExp}); }));
  EXPECT_TRUE(ThrowsError([&] { Sum(out).backward(); },
                          "checkpoint: the recomputation called sigmoid, which the checkpointed "
                          "forward did not call"));
}

TEST(SelectiveCheckpointTest, RefusesReentrantCheckpointsAndOpsNoPolicySees) {
  const Tensor x = LeafOf(6, 1, {2, 3});
  CheckpointOptions reentrant;
  reentrant.reentrant = true;
  reentrant.context_fn = [] { return CreateSelectiveCheckpointContexts({OpId::kExp}); };
  // PyTorch: "Passing `context_fn`, ... is only supported when use_reentrant=False."
  EXPECT_TRUE(ThrowsError(
      [&] { Checkpoint([](const VariableList& in) { return Exp(in[0]); }, {x}, reentrant); },
      "checkpoint: CheckpointOptions::context_fn (selective checkpointing) works only with "
      "reentrant = false"));
  EXPECT_TRUE(ThrowsError([] { CreateSelectiveCheckpointContexts({OpId::kReshape}); },
                          "CreateSelectiveCheckpointContexts: Reshape is not a dispatched op"));
  EXPECT_TRUE(ThrowsError([] { CreateSelectiveCheckpointContexts(CheckpointPolicyFn()); },
                          "the policy function is empty"));
}

// A kept dropout leaves the generator where a recomputed one would: the second dropout draws
// the same mask in the recomputation as in the forward.
TEST(SelectiveCheckpointTest, AKeptDropoutKeepsTheRandomStreamAligned) {
  auto run = [](bool checkpointed) {
    const Tensor x = LeafOf(12, 3, {3, 4});
    Generator gen(7);
    auto fn = [&gen](const VariableList& in) {
      return Mul(Dropout(Exp(Dropout(in[0], 0.5, gen)), 0.5, gen), in[0]);
    };
    Tensor out;
    if (checkpointed) {
      CheckpointOptions o = NonReentrant([] {
        return CreateSelectiveCheckpointContexts({OpId::kDropout});  // the first one's output kept
      });
      o.generators = {&gen};
      out = Checkpoint(fn, {x}, o);
    } else {
      out = fn({x});
    }
    Sum(out).backward();
    return x.grad().data().to_vector<double>();
  };
  EXPECT_EQ(run(true), run(false));
}

TEST(OpDispatchModeTest, ModesStackAndAModeHandsWhatItRunsToTheOnesBelow) {
  Names outer_log, inner_log;
  LogMode outer(&outer_log), inner(&inner_log);
  const Tensor x = LeafOf(6, 1, {2, 3});
  {
    const OpDispatchModeGuard a(&outer);
    {
      const OpDispatchModeGuard b(&inner);
      Exp(x);
    }
    Sigmoid(x);
  }
  Tanh(x);  // no mode
  EXPECT_EQ(inner_log, (Names{"exp"}));
  EXPECT_EQ(outer_log, (Names{"exp", "sigmoid"}));
}

}  // namespace
}  // namespace tg
