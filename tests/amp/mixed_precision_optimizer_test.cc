// MixedPrecisionOptimizer semantics: overflow skips, underflow rescue, accumulation, shared
// scalers, the plain-backward epilogue (scalar, non-scalar, reentrant checkpoint, forward-issued
// backward), unscale/inspect/clip, and bit-exact resume.
#include "amp/mixed_precision_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/optimizer_kernels.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace amp {
namespace {

using testing::ThrowsErrorExactly;

// y = (x w1 + b1) * s, with w1/b1 in the model dtype and s an f32 parameter (its own master).
struct Model {
  Tensor w, b, s;
  Model(DType dtype, uint64_t seed) {
    Generator gen(seed);
    w = Tensor(RandNormal({4, 3}, gen).to(dtype), true);
    b = Tensor(RandNormal({3}, gen).to(dtype), true);
    s = Tensor(RandNormal({3}, gen), true);
  }
  std::vector<Tensor> params() const { return {w, b, s}; }
  Tensor Hidden(const Tensor& x) const { return Add(Matmul(x, w), b); }
  Tensor Forward(const Tensor& x) const { return Mul(Hidden(x), s); }
};

Tensor Inputs(DType dtype, uint64_t seed) {
  Generator gen(seed);
  return Tensor(RandNormal({5, 4}, gen).to(dtype));
}

Tensor Loss(const Tensor& y) { return Mean(Mul(y, y)); }

std::unique_ptr<optim::Optimizer> Sgd(const Model& m, double lr = 0.1) {
  optim::SGDOptions o;
  o.lr(lr);
  return std::make_unique<optim::SGD>(m.params(), o);
}

// A PyTorch scaler starting at `init`: the test model's gradients are O(1), so 2^16 would overflow
// f16 on every step.
MixedPrecisionOptimizer::Options Scaled(double init) {
  MixedPrecisionOptimizer::Options o;
  o.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(init));
  return o;
}

std::vector<float> Values(const Tensor& v) { return v.data().to_vector<float>(); }
std::vector<float> Values(const RawTensor& t) { return t.to_vector<float>(); }

std::vector<std::vector<float>> MasterValues(const MixedPrecisionOptimizer& opt) {
  std::vector<std::vector<float>> out;
  for (const Tensor& m : opt.master_params()) out.push_back(Values(m));
  return out;
}

TEST(MixedPrecisionOptimizerTest, F16ParamsGetF32MastersAndF32ParamsAreTheirOwn) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m));
  ASSERT_EQ(opt.master_params().size(), 3u);
  EXPECT_EQ(opt.master_params()[0].dtype(), kF32);
  EXPECT_FALSE(opt.master_params()[0].is_same(m.w));
  EXPECT_EQ(Values(opt.master_params()[0]), Values(m.w.data().to(kF32)));
  EXPECT_TRUE(opt.master_params()[2].is_same(m.s));
  EXPECT_TRUE(opt.optimizer().param_groups()[0].params[0].is_same(opt.master_params()[0]));
  EXPECT_EQ(opt.loss_scale(), 65536.0);  // f16: PyTorch's dynamic scaler by default
}

// The host reads of a step are StepCore's, counted: f16 (dynamic scaler, overflow check) one
// found_inf read per step plus one norm read per clip; bf16 (constant scale 1, no check) none
// per step. A GPU step syncs exactly there (tests/amp/cuda_mixed_precision_test counts
// cuda::HostSyncCount()); the device scaler's state is never read back by a step.
TEST(MixedPrecisionOptimizerTest, HostReadsPerStepAreTheFoundInfReadAndTheNormRead) {
  for (const DType dtype : {kF16, kBF16}) {
    Model m(dtype, 1);
    MixedPrecisionOptimizer opt(Sgd(m), dtype == kF16 ? Scaled(1024) : MixedPrecisionOptions());
    const Tensor x = Inputs(dtype, 2);
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      opt.backward(Loss(m.Forward(x)));
      opt.step();
    }
    EXPECT_EQ(opt.step_core().host_reads(), dtype == kF16 ? 3 : 0) << DTypeName(dtype);
    opt.zero_grad();
    opt.backward(Loss(m.Forward(x)));
    opt.clip_master_grads(1.0);
    opt.step();
    EXPECT_EQ(opt.step_core().host_reads(), dtype == kF16 ? 5 : 1) << DTypeName(dtype);
    EXPECT_EQ(opt.step_core().skipped_steps(), 0);
  }
}

// The scale has one truth, the host scaler: a change made through scaler() between steps (here
// load_state, as a resume does) is the scale of the next backward and of its unscale, with no
// copy to bring up to date, and every f16 step reads exactly one value back (found_inf).
TEST(MixedPrecisionOptimizerTest, TheHostScalerIsTheOneTruthOfTheScale) {
  Model a(kF16, 1), b(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(a), Scaled(1024));
  MixedPrecisionOptimizer ref(Sgd(b), Scaled(64));
  const Tensor x = Inputs(kF16, 2);
  opt.backward(MulScalar(Loss(a.Forward(x)), 1e8));
  EXPECT_TRUE(opt.step().skipped);
  EXPECT_EQ(opt.loss_scale(), 512.0);
  opt.zero_grad();
  opt.scaler().load_state(ref.scaler().state());
  EXPECT_EQ(opt.loss_scale(), 64.0);
  opt.backward(Loss(a.Forward(x)));
  ref.backward(Loss(b.Forward(x)));
  const std::vector<RawTensor> got = *opt.inspect_master_grads();
  const std::vector<RawTensor> want = *ref.inspect_master_grads();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].to_vector<float>(), want[i].to_vector<float>()) << i;
  }
  const StepResult r = opt.step(), r_ref = ref.step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.scale, 64.0);
  EXPECT_EQ(r_ref.scale, 64.0);
  EXPECT_EQ(MasterValues(opt), MasterValues(ref));
  EXPECT_EQ(Values(a.w), Values(b.w));
  EXPECT_EQ(opt.loss_scale(), ref.loss_scale());
  EXPECT_EQ(opt.scaler().growth_tracker(), ref.scaler().growth_tracker());
  EXPECT_EQ(opt.step_core().host_reads(), 2);
  EXPECT_EQ(ref.step_core().host_reads(), 1);
}

TEST(MixedPrecisionOptimizerTest, OverflowSkipsTheStepBacksOffAndTheNextCleanStepApplies) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  const Tensor x = Inputs(kF16, 2);
  const auto masters_before = MasterValues(opt);
  const auto w_before = Values(m.w);
  // A huge loss: its scaled gradients overflow f16.
  opt.backward(MulScalar(Loss(m.Forward(x)), 1e8));
  StepResult r = opt.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.scale, 1024.0);
  EXPECT_EQ(MasterValues(opt), masters_before);  // bit-identical
  EXPECT_EQ(Values(m.w), w_before);
  EXPECT_EQ(opt.loss_scale(), 512.0);
  EXPECT_EQ(opt.skipped_steps(), 1);
  ASSERT_TRUE(opt.inspect_master_grads().has_value());
  const std::vector<RawTensor> zeroed = *opt.inspect_master_grads();
  for (const RawTensor& g : zeroed) EXPECT_FALSE(g.defined());
  // The next clean step applies: masters move by -lr * grad, the model gets them in f16.
  opt.backward(Loss(m.Forward(x)));
  const std::vector<RawTensor> grads = *opt.inspect_master_grads();
  const std::vector<float> w_master = Values(opt.master_params()[0]);
  r = opt.step();
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.scale, 512.0);
  const std::vector<float> g = Values(grads[0]);
  const std::vector<float> after = Values(opt.master_params()[0]);
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i], w_master[i] - static_cast<float>(0.1) * g[i]) << i;
  }
  EXPECT_EQ(Values(m.w), Values(opt.master_params()[0].data().to(kF16)));
  EXPECT_EQ(opt.loss_scale(), 512.0);
}

// A scale whose unscale cannot be finite skips the step, whatever the overflow check saw: a
// scale of 1e-40 (1 / scale is inf in f32) makes the f16 gradients 0 (no overflow found) and
// 0 * inf = NaN, which used to reach every master weight; the f32 model with a constant scale
// (no overflow check at all) got inf * finite gradients.
TEST(MixedPrecisionOptimizerTest, AScaleThatCannotUnscaleFinitelySkipsTheStep) {
  EXPECT_TRUE(UnscalesFinitely(65536));
  EXPECT_TRUE(UnscalesFinitely(1e-30));
  EXPECT_FALSE(UnscalesFinitely(1e-40));
  EXPECT_FALSE(UnscalesFinitely(0));
  EXPECT_FALSE(UnscalesFinitely(-1));
  EXPECT_FALSE(UnscalesFinitely(INFINITY));
  EXPECT_FALSE(UnscalesFinitely(NAN));
  for (const bool dynamic : {true, false}) {
    SCOPED_TRACE(dynamic ? "f16, dynamic scaler" : "f32, constant scale");
    Model m(dynamic ? kF16 : kF32, 3);
    MixedPrecisionOptimizer::Options o;
    o.scaler = std::make_shared<LossScaler>(dynamic ? LossScaler::PyTorch(1e-40)
                                                    : LossScaler::Constant(1e-40));
    MixedPrecisionOptimizer opt(Sgd(m), o);
    const std::vector<std::vector<float>> before = MasterValues(opt);
    const std::vector<float> w_before = Values(m.w.data().to(kF32));
    opt.zero_grad();
    opt.backward(Loss(m.Forward(Inputs(m.w.dtype(), 4))));
    const StepResult r = opt.step();
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(opt.skipped_steps(), 1);
    EXPECT_EQ(MasterValues(opt), before);
    EXPECT_EQ(Values(m.w.data().to(kF32)), w_before);
  }
}

TEST(MixedPrecisionOptimizerTest, SmallGradientUnderflowsWithoutScalingAndSurvivesWithIt) {
  const float tiny = 1e-8f;
  for (double scale : {1.0, 65536.0}) {
    const Tensor w(RawTensor::Ones({1}, kF16), true);
    MixedPrecisionOptimizer::Options o;
    o.scaler = std::make_shared<LossScaler>(LossScaler::Constant(scale));
    MixedPrecisionOptimizer opt(std::make_unique<optim::SGD>(std::vector<Tensor>{w}), o);
    // d loss / d w = 1e-8, computed in f32 and handed to the f16 parameter.
    opt.backward(Sum(MulScalar(Cast(w, kF32), tiny)));
    const float master_grad = Values((*opt.inspect_master_grads())[0])[0];
    if (scale == 1.0) {
      EXPECT_EQ(master_grad, 0.0f);  // 1e-8 is below f16's smallest subnormal (6e-8)
    } else {
      // The scaled gradient 1e-8 * 2^16 = 6.6e-4 is a normal f16: one f16 rounding, then an
      // exact division by 2^16.
      const float expected =
          static_cast<float>(RawTensor::Scalar(tiny * 65536.0f).to(kF16).item()) / 65536.0f;
      EXPECT_EQ(master_grad, expected);
      EXPECT_NEAR(master_grad, tiny, tiny * std::ldexp(1.0, -11));
    }
  }
}

TEST(MixedPrecisionOptimizerTest, GradientAccumulationChecksAndUpdatesOncePerEffectiveBatch) {
  for (bool defer : {true, false}) {
    SCOPED_TRACE(defer ? "deferred master-grad update" : "update after every micro-batch");
    Model m(kF16, 1), ref(kF32, 1);
    MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
    std::vector<double> scales;
    Tensor ref_loss;
    for (int micro = 0; micro < 4; ++micro) {
      const Tensor x = Inputs(kF16, 10 + micro);
      scales.push_back(opt.loss_scale());
      MasterBackwardOptions bo;
      bo.update_master_grads = !defer || micro == 3;
      opt.backward(Loss(m.Forward(x)), bo);
      const Tensor l = Loss(ref.Forward(Tensor(x.data().to(kF32))));
      ref_loss = ref_loss.defined() ? Add(ref_loss, l) : l;
    }
    EXPECT_EQ(scales, std::vector<double>(4, 1024.0));  // constant during accumulation
    EXPECT_EQ(opt.master_grad_updates(), defer ? 1 : 4);
    ref_loss.backward();
    // The accumulated master grads are the f32 gradients of the summed loss, up to the f16
    // rounding of the forward and of each micro-batch's gradient (relative ~1e-3).
    const std::vector<RawTensor> grads = *opt.inspect_master_grads();
    const std::vector<Tensor> ref_params = ref.params();
    for (size_t p = 0; p < grads.size(); ++p) {
      const std::vector<float> got = Values(grads[p]), want = Values(ref_params[p].grad());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 2e-2 * (1 + std::fabs(want[i])));
    }
    EXPECT_FALSE(opt.step().skipped);
    EXPECT_EQ(opt.scaler().iteration(), 1);  // one scaler update per effective batch
  }
}

TEST(MixedPrecisionOptimizerTest, AnOverflowInOneMicroBatchSkipsTheEffectiveBatch) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  const auto before = MasterValues(opt);
  for (int micro = 0; micro < 4; ++micro) {
    Tensor loss = Loss(m.Forward(Inputs(kF16, 10 + micro)));
    if (micro == 2) loss = MulScalar(loss, 1e8);
    opt.backward(loss);
  }
  EXPECT_TRUE(opt.step().skipped);
  EXPECT_EQ(MasterValues(opt), before);
  EXPECT_EQ(opt.loss_scale(), 512.0);
}

TEST(MixedPrecisionOptimizerTest, TwoOptimizersDecideTheirOwnSkipAndTheSharedScalerBacksOffOnce) {
  Model m1(kF16, 1), m2(kF16, 2);
  auto scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024));
  MixedPrecisionOptimizer::Options o;
  o.scaler = scaler;
  o.update_scaler = false;
  MixedPrecisionOptimizer opt1(Sgd(m1), o), opt2(Sgd(m2), o);
  const auto before1 = MasterValues(opt1), before2 = MasterValues(opt2);
  const Tensor x = Inputs(kF16, 3);
  opt1.backward(MulScalar(Loss(m1.Forward(x)), 1e8));  // overflows
  opt2.backward(Loss(m2.Forward(x)));                  // clean
  const StepResult r1 = opt1.step(), r2 = opt2.step();
  EXPECT_TRUE(r1.skipped);
  EXPECT_FALSE(r2.skipped);
  EXPECT_EQ(MasterValues(opt1), before1);
  EXPECT_NE(MasterValues(opt2), before2);
  scaler->update(r1.skipped || r2.skipped);
  EXPECT_EQ(scaler->scale(), 512.0);  // once: 1024 -> 512
  EXPECT_EQ(opt1.loss_scale(), 512.0);
  EXPECT_EQ(opt2.loss_scale(), 512.0);
}

// The master grads of opt.backward(loss) on a fresh copy of the model (same seeds).
std::vector<std::vector<float>> FacadeMasterGrads(bool checkpointed) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  Tensor x = Inputs(kF16, 2);
  (void)checkpointed;
  opt.backward(Loss(m.Forward(x)));
  std::vector<std::vector<float>> out;
  const std::vector<RawTensor> grads = *opt.inspect_master_grads();
  for (const RawTensor& g : grads) out.push_back(Values(g));
  return out;
}

std::vector<std::vector<float>> MasterGrads(const MixedPrecisionOptimizer& opt) {
  std::vector<std::vector<float>> out;
  const std::vector<RawTensor> grads = *opt.inspect_master_grads();
  for (const RawTensor& g : grads) out.push_back(Values(g));
  return out;
}

TEST(MixedPrecisionOptimizerTest, PlainScalarBackwardMatchesTheFacade) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  opt.attach();
  opt.scale(Loss(m.Forward(Inputs(kF16, 2)))).backward();
  EXPECT_EQ(opt.master_grad_updates(), 1);
  EXPECT_FALSE(m.w.grad().defined());  // moved into the master grads by the epilogue
  EXPECT_EQ(MasterGrads(opt), FacadeMasterGrads(false));
  // The facade's own backward does not run the epilogue a second time.
  opt.zero_grad();
  opt.backward(Loss(m.Forward(Inputs(kF16, 2))));
  EXPECT_EQ(opt.master_grad_updates(), 2);
  EXPECT_EQ(MasterGrads(opt), FacadeMasterGrads(false));
}

TEST(MixedPrecisionOptimizerTest, PlainNonScalarBackwardWithGradOutputMatchesTheFacade) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  opt.attach();
  const Tensor y = m.Forward(Inputs(kF16, 2));  // [5, 3] f32 (s is f32)
  // d Loss / dy = 2 y / numel, times the scale: what the facade's backward sends into y.
  const double scale = opt.loss_scale();
  const RawTensor grad =
      tg::MulScalar(tg::MulScalar(y.data(), 2.0 / static_cast<double>(y.numel())), scale);
  y.backward(Tensor(grad));
  EXPECT_EQ(opt.master_grad_updates(), 1);
  const auto got = MasterGrads(opt), want = FacadeMasterGrads(false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < got.size(); ++p) {
    for (size_t i = 0; i < got[p].size(); ++i) EXPECT_FLOAT_EQ(got[p][i], want[p][i]);
  }
}

TEST(MixedPrecisionOptimizerTest, ReentrantCheckpointRunsTheEpilogueOnceAfterAllPhases) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  opt.attach();
  int updates_seen_in_nested_task = -1;
  const Tensor x(Inputs(kF16, 2).data(), /*requires_grad=*/true);
  // w and b are used inside the checkpoint: their hooks fire in the nested task; s's in the
  // outer one, which must still be pending when the nested task ends.
  const Tensor h = Checkpoint(
      [&](const VariableList& in) {
        Tensor out = m.Hidden(in[0]);
        return out;
      },
      {x}, CheckpointOptions{/*reentrant=*/true, {}, {}});
  HookHandle probe = m.w.register_post_accumulate_grad_hook([&](const Tensor&) {
    EXPECT_EQ(current_reentrant_depth(), 1);
    updates_seen_in_nested_task = static_cast<int>(opt.master_grad_updates());
  });
  opt.scale(Loss(Mul(h, m.s))).backward();
  probe.remove();
  EXPECT_EQ(updates_seen_in_nested_task, 0);  // not run at the end of the nested task
  EXPECT_EQ(opt.master_grad_updates(), 1);
  EXPECT_EQ(MasterGrads(opt), FacadeMasterGrads(true));
}

TEST(MixedPrecisionOptimizerTest, BackwardIssuedInsideForwardDoesNotTriggerTheEpilogue) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  opt.attach();
  {
    ForwardScope forward;
    Sum(Mul(m.s, m.s)).backward();  // an auxiliary backward issued by a model's forward
  }
  EXPECT_EQ(opt.master_grad_updates(), 0);
  EXPECT_TRUE(m.s.grad().defined());  // left to the model
  m.s.set_grad(Tensor());
  opt.scale(Loss(m.Forward(Inputs(kF16, 2)))).backward();
  EXPECT_EQ(opt.master_grad_updates(), 1);
  EXPECT_EQ(MasterGrads(opt), FacadeMasterGrads(false));
}

// The epilogue with module backward hooks present (their identity nodes in the graph, hooks
// that replace nothing) and with a custom function that runs a backward of its own inside its
// forward: once per user backward, with the same master gradients.
struct HiddenLayer : nn::Module {
  explicit HiddenLayer(const Model& m) : m(m) {}
  Tensor forward(const Tensor& x) override { return m.Hidden(x); }
  const Model& m;
};

struct AuxiliaryBackward : Function<AuxiliaryBackward> {
  static constexpr const char* kName = "AuxiliaryBackward";
  static VariableList Forward(FunctionCtx&, const VariableList& in, const Tensor& s) {
    EnableGradGuard grad;
    Sum(Mul(s, s)).backward();  // issued in forward: not the user's backward
    return {in[0].clone()};
  }
  static VariableList Backward(FunctionCtx&, const VariableList& grads) { return grads; }
};

TEST(MixedPrecisionOptimizerTest, ModuleBackwardHooksAndABackwardInsideForwardRunTheEpilogueOnce) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  opt.attach();
  HiddenLayer layer(m);
  int pre = 0, hooks = 0;
  layer.register_full_backward_pre_hook([&](nn::Module&, const VariableList&) {
    ++pre;
    return VariableList();
  });
  layer.register_full_backward_hook([&](nn::Module&, const VariableList&, const VariableList&) {
    ++hooks;
    EXPECT_EQ(opt.master_grad_updates(), 0);  // the epilogue comes after the whole backward
    return VariableList();
  });
  const Tensor x(Inputs(kF16, 2).data(), /*requires_grad=*/true);
  const Tensor h = AuxiliaryBackward::Apply({layer(x)}, m.s)[0];
  EXPECT_EQ(opt.master_grad_updates(), 0);  // the auxiliary backward did not trigger it
  m.s.set_grad(Tensor());                   // what the auxiliary backward left
  opt.scale(Loss(Mul(h, m.s))).backward();
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(hooks, 1);
  EXPECT_EQ(opt.master_grad_updates(), 1);
  EXPECT_EQ(MasterGrads(opt), FacadeMasterGrads(false));
}

TEST(MixedPrecisionOptimizerTest, UnscaleOncePerStepInspectAndClip) {
  Model m(kF16, 1);
  MixedPrecisionOptimizer opt(Sgd(m), Scaled(1024));
  MasterBackwardOptions defer;
  defer.update_master_grads = false;
  opt.backward(Loss(m.Forward(Inputs(kF16, 2))), defer);
  EXPECT_FALSE(opt.inspect_master_grads().has_value());  // still in the model's .grad
  opt.unscale();
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { opt.unscale(); },
      "MixedPrecisionOptimizer: unscale() has already been called since the last step()"));
  const std::vector<RawTensor> grads = *opt.inspect_master_grads();
  double sq = 0;
  for (const RawTensor& g : grads) {
    for (float v : Values(g)) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 0.5);
  EXPECT_DOUBLE_EQ(opt.clip_master_grads(0.5), norm);
  double clipped = 0;
  const std::vector<RawTensor> after = *opt.inspect_master_grads();
  for (const RawTensor& g : after) {
    for (float v : Values(g)) clipped += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(std::sqrt(clipped), 0.5, 1e-6);
  opt.step();
  opt.unscale();  // allowed again after the step
}

TEST(MixedPrecisionOptimizerTest, Bf16DefaultsToNoScalingAndNoSkipping) {
  for (bool check : {false, true}) {
    Model m(kBF16, 1);
    MixedPrecisionOptimizer::Options o;
    if (check) o.check_non_finite = true;
    MixedPrecisionOptimizer opt(Sgd(m), o);
    EXPECT_EQ(opt.loss_scale(), 1.0);
    const auto before = MasterValues(opt);
    // Infinite gradients (bf16 has f32's range: only an inf loss overflows it).
    opt.backward(MulScalar(Loss(m.Forward(Inputs(kBF16, 2))), HUGE_VAL));
    const StepResult r = opt.step();
    EXPECT_EQ(r.skipped, check);
    EXPECT_EQ(MasterValues(opt) == before, check);
    EXPECT_EQ(opt.loss_scale(), 1.0);
  }
}

TEST(MixedPrecisionOptimizerTest, StateDictResumesTheRunBitForBit) {
  auto run = [](MixedPrecisionOptimizer& opt, Model& m, int from, int to) {
    for (int step = from; step < to; ++step) {
      opt.zero_grad();
      Tensor loss = Loss(m.Forward(Inputs(kF16, 100 + step)));
      if (step == 1) loss = MulScalar(loss, 1e8);  // one overflow on the way
      opt.backward(loss);
      opt.step();
    }
  };
  auto adamw = [](const Model& m) {
    optim::AdamWOptions o;
    o.lr(1e-2);
    return std::make_unique<optim::AdamW>(m.params(), o);
  };
  MixedPrecisionOptimizer::Options o;
  o.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2, 0.5, 2));
  Model straight_model(kF16, 1);
  MixedPrecisionOptimizer straight(adamw(straight_model), o);
  run(straight, straight_model, 0, 6);

  Model first_model(kF16, 1);
  o.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2, 0.5, 2));
  MixedPrecisionOptimizer first(adamw(first_model), o);
  run(first, first_model, 0, 3);
  const StateDict saved = first.state_dict();
  EXPECT_TRUE(saved.has_tensor("master.0"));
  EXPECT_FALSE(saved.has_tensor("master.2"));  // f32 params are their own masters
  EXPECT_TRUE(saved.has_scalar("scaler.scale"));

  Model resumed_model(kF16, 7);  // different weights: everything comes from the checkpoint
  o.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2, 0.5, 2));
  MixedPrecisionOptimizer resumed(adamw(resumed_model), o);
  resumed_model.s.data().copy_(first_model.s.data());  // f32 params come with the model weights
  resumed.load_state_dict(saved);
  run(resumed, resumed_model, 3, 6);
  EXPECT_EQ(MasterValues(resumed), MasterValues(straight));
  EXPECT_EQ(Values(resumed_model.w), Values(straight_model.w));
  EXPECT_EQ(resumed.loss_scale(), straight.loss_scale());
  EXPECT_EQ(resumed.scaler().iteration(), straight.scaler().iteration());

  StateDict broken = saved;
  broken.tensors.erase("master.1");
  EXPECT_TRUE(ThrowsErrorExactly([&] { resumed.load_state_dict(broken); },
                                 "MixedPrecisionOptimizer: load_state_dict: missing 'master.1'"));
  // A NaN master (valid checksum, valid shape) skipped every step of a resumed run.
  StateDict nan_master = saved;
  std::vector<float> m = nan_master.tensor("master.1").to_vector<float>();
  m[0] = NAN;
  nan_master.tensors["master.1"] =
      RawTensor::FromVector<float>(m, saved.tensor("master.1").shape());
  const std::vector<std::vector<float>> before = MasterValues(resumed);
  EXPECT_TRUE(ThrowsErrorExactly([&] { resumed.load_state_dict(nan_master); },
                                 "MixedPrecisionOptimizer: load_state_dict: 'master.1' holds a NaN "
                                 "or infinite value; master weights must be finite"));
  EXPECT_EQ(MasterValues(resumed), before);
}

// The device-side protocol of tests/tensor/cuda/amp_kernels_test's
// OverflowSkipBackoffMatchesMixedPrecision- Optimizer, here with the kernel list on the CPU: per step a
// zero_grad, scaled f16/bf16/f32 gradients, found_inf from them, one tg::FusedAdam that unscales
// (inv_scale), skips (found_inf) and counts its steps (device_step), and tg::StepLossScale; against
// MixedPrecisionOptimizer(AdamW) bit for bit after every step. (Without the zero_grad the
// optimizer's master gradients accumulate over the steps, like .grad in PyTorch, and the two part
// at the second step.)
TEST(MixedPrecisionOptimizerTest, MatchesFusedAdamWithDeviceStepInvScaleAndFoundInf) {
  Generator gen(31);
  const std::vector<Tensor> params = {
      Tensor(RandNormal({300, 257}, gen).to(kF16), true),
      Tensor(RandNormal({1000}, gen).to(kBF16), true),
      Tensor(RandNormal({7}, gen), true),  // f32: its own master
  };
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.beta1(0.9);
  o.beta2(0.95);
  o.weight_decay(0.1);
  MixedPrecisionOptimizer::Options mo;
  mo.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2.0, 0.5, 2));
  MixedPrecisionOptimizer opt(std::make_unique<optim::AdamW>(params, o), mo);

  AdamTensorLists lists;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& master = opt.master_params()[i];
    lists.params.push_back(master.data().clone());
    lists.exp_avgs.push_back(RawTensor::Zeros(master.shape(), kF32));
    lists.exp_avg_sqs.push_back(RawTensor::Zeros(master.shape(), kF32));
    lists.model_params.push_back(master.is_same(params[i]) ? RawTensor()
                                                           : params[i].data().clone());
  }
  const RawTensor state = LossScaleStateTensor(opt.scaler().state(), Device::Cpu());
  const RawTensor scale = RawTensor::Zeros({}, kF32);
  const RawTensor inv_scale = RawTensor::Zeros({}, kF32);
  const RawTensor found_inf = RawTensor::Zeros({}, kF32);
  WriteLossScale(state, scale, inv_scale);
  FusedAdamOptions f;
  f.lr = o.lr();
  f.beta1 = o.beta1();
  f.beta2 = o.beta2();
  f.eps = o.eps();
  f.weight_decay = o.weight_decay();
  f.decay = WeightDecay::kDecoupled;
  f.device_step = RawTensor::Zeros({}, kF64);
  f.inv_scale = inv_scale;
  f.found_inf = found_inf;

  int64_t applied = 0;
  for (int k = 1; k <= 9; ++k) {
    SCOPED_TRACE(::testing::Message() << "step " << k);
    ASSERT_EQ(scale.item(), static_cast<float>(opt.loss_scale()));
    opt.zero_grad();
    lists.grads.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      const RawTensor grad =
          RandNormal(params[i].shape(), gen, 0, 0.01 * opt.loss_scale()).to(params[i].dtype());
      if (k == 3 && i == 0) {
        grad.flatten().slice(0, 70000, 70001).fill_(std::numeric_limits<double>::infinity());
      }
      if (k == 6 && i == 2) grad.flatten().slice(0, 2, 3).fill_(std::nan(""));
      params[i].set_grad(Tensor(grad.clone()));
      lists.grads.push_back(grad);
    }
    const StepResult r = opt.step();
    EXPECT_EQ(r.skipped, k == 3 || k == 6);
    applied += r.skipped ? 0 : 1;

    found_inf.fill_(AnyNonFinite(lists.grads) ? 1 : 0);
    FusedAdam(lists, f);
    StepLossScale(state, found_inf, scale, inv_scale);

    EXPECT_EQ(f.device_step.item(), applied);
    EXPECT_EQ(ReadLossScaleState(state).scale, opt.scaler().scale());
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      const Tensor& master = opt.master_params()[i];
      ASSERT_EQ(master.data().to_vector<double>(), lists.params[i].to_vector<double>());
      if (lists.model_params[i].defined()) {
        ASSERT_EQ(params[i].data().to_vector<double>(), lists.model_params[i].to_vector<double>());
      }
      const StateDict* s = opt.optimizer().param_state(master);
      if (s == nullptr) continue;  // no step applied yet
      ASSERT_EQ(s->tensor("exp_avg").to_vector<double>(), lists.exp_avgs[i].to_vector<double>());
      ASSERT_EQ(s->tensor("exp_avg_sq").to_vector<double>(),
                lists.exp_avg_sqs[i].to_vector<double>());
    }
  }
  EXPECT_EQ(opt.skipped_steps(), 2);
}

TEST(MixedPrecisionOptimizerTest, RefusesAnOptimizerThatAlreadyStepped) {
  Model m(kF16, 1);
  auto sgd = Sgd(m);
  Sum(m.Forward(Inputs(kF16, 2))).backward();
  sgd->step();
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { MixedPrecisionOptimizer opt(std::move(sgd)); },
      "MixedPrecisionOptimizer: the wrapped optimizer already has state; wrap it before its first "
      "step (its parameters are replaced by f32 masters)"));
}

}  // namespace
}  // namespace amp
}  // namespace tg
