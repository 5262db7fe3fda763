// Autocast: which ops cast to what, that gradients reach the original dtypes, the weight-cast
// cache's lifetime, module scopes, and checkpoint recomputation under the forward's state.
#include "autograd/autocast.h"

#include <gtest/gtest.h>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/generator.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using amp::AutocastGuard;

Tensor Param(const Shape& shape, uint64_t seed, DType dtype = kF32) {
  Generator gen(seed);
  return Tensor(RandNormal(shape, gen).to(dtype), true);
}

TEST(AutocastTest, OpPolicy) {
  const Tensor x = Param({4, 3}, 1), w = Param({3, 5}, 2), b = Param({5}, 3);
  const Tensor w_lin = Param({5, 3}, 4);
  const RawTensor targets = RawTensor::FromVector<int64_t>({0, 1, 2, 3}, {4});
  for (DType low : {kF16, kBF16}) {
    AutocastGuard autocast(low);
    const Tensor h = Matmul(x, w);
    EXPECT_EQ(h.dtype(), low);
    EXPECT_EQ(Linear(x, w_lin, b).dtype(), low);
    EXPECT_EQ(Bmm(Reshape(x, {1, 4, 3}), Reshape(w, {1, 3, 5})).dtype(), low);
    // f32 ops take the low-precision activation back to f32.
    EXPECT_EQ(Softmax(h).dtype(), kF32);
    EXPECT_EQ(LogSoftmax(h).dtype(), kF32);
    EXPECT_EQ(LayerNorm(h, Tensor(), Tensor()).dtype(), kF32);
    EXPECT_EQ(LayerNorm(h, Param({5}, 5, low), Param({5}, 6, low)).dtype(), kF32);
    EXPECT_EQ(CrossEntropy(h, targets).dtype(), kF32);
    EXPECT_EQ(Exp(h).dtype(), kF32);
    EXPECT_EQ(Log(Abs(h)).dtype(), kF32);
    EXPECT_EQ(Pow(h, 2.0).dtype(), kF32);
    EXPECT_EQ(Pow(h, h).dtype(), kF32);
    EXPECT_EQ(Sum(h).dtype(), kF32);
    EXPECT_EQ(Mean(h, {0}).dtype(), kF32);
    // Ops outside the lists keep their input dtype; mixed binary ops promote to the widest.
    EXPECT_EQ(Relu(h).dtype(), low);
    EXPECT_EQ(Add(h, b).dtype(), kF32);
    EXPECT_EQ(Mul(h, h).dtype(), low);
    // f64 and integer tensors are never cast.
    const Tensor x64 = Param({4, 3}, 7, kF64), w64 = Param({3, 5}, 8, kF64);
    EXPECT_EQ(Matmul(x64, w64).dtype(), kF64);
    EXPECT_EQ(Exp(x64).dtype(), kF64);
    EXPECT_EQ(Sum(Tensor(RawTensor::FromVector<int64_t>({1, 2}, {2}))).dtype(), kI64);
  }
  // Outside the guard nothing is cast.
  EXPECT_EQ(Matmul(x, w).dtype(), kF32);
  EXPECT_EQ(Sum(Matmul(x.detach().data().to(kF16), w.data().to(kF16))).dtype(), kF16);
}

// The four policies of the op list (tensor/op_list.h), as AutocastTargetDType applies them: only
// kLowPrecision and kFloat32 cast; kPromote and kNone (ops whose mixed inputs promote, or that
// keep their dtype) leave every dtype alone, as do f64, integers and autocast off.
TEST(AutocastTest, TargetDTypeOfEachPolicy) {
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kF32), kF32);  // autocast off
  AutocastGuard autocast(kF16);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kF32), kF16);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kBF16), kF16);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kF64), kF64);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kFloat32, kF16), kF32);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kFloat32, kBF16), kF32);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kFloat32, kI64), kI64);
  for (CastPolicy policy : {CastPolicy::kPromote, CastPolicy::kNone}) {
    for (DType dtype : {kF16, kBF16, kF32, kF64, kI32}) {
      EXPECT_EQ(amp::AutocastTargetDType(policy, dtype), dtype) << CastPolicyName(policy);
    }
  }
  amp::AutocastModuleScope unsafe("Softmax");  // not low-precision safe: low precision runs f32
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kF32), kF32);
  EXPECT_EQ(amp::AutocastTargetDType(CastPolicy::kLowPrecision, kBF16), kF32);
}

// An op's inputs are cast last to first (bias, weight, then x for linear), so the casts' nodes
// have the sequence numbers they had when each op spelled its casts out as call arguments
// (evaluated right to left): the engine, which runs the highest sequence number first, reaches
// x's cast before the weight's and the weight's before the bias's.
TEST(AutocastTest, InputsAreCastLastToFirst) {
  // Non-leaves, so no cast comes from the cache.
  const Tensor x = MulScalar(Param({2, 3}, 1), 1), w = MulScalar(Param({4, 3}, 2), 1),
               b = MulScalar(Param({4}, 3), 1);
  AutocastGuard autocast(kBF16);
  const Tensor y = Linear(x, w, b, Activation::kNone);
  ASSERT_EQ(y.dtype(), kBF16);
  const EdgeList& edges = y.grad_fn()->next_edges();  // bias, x, weight (addmm's order)
  ASSERT_EQ(edges.size(), 3u);
  for (const Edge& e : edges) ASSERT_EQ(e.fn->name(), "CastBackward");
  const uint64_t bias_cast = edges[0].fn->sequence_nr(), x_cast = edges[1].fn->sequence_nr(),
                 weight_cast = edges[2].fn->sequence_nr();
  EXPECT_LT(bias_cast, weight_cast);
  EXPECT_LT(weight_cast, x_cast);
}

TEST(AutocastTest, GradientsReachTheF32LeavesInTheirDtype) {
  const Tensor x = Param({4, 3}, 1), w = Param({3, 5}, 2);
  Tensor loss;
  {
    AutocastGuard autocast(kF16);
    loss = Sum(Matmul(x, w));
  }
  loss.backward();
  ASSERT_EQ(w.grad().dtype(), kF32);
  ASSERT_EQ(x.grad().dtype(), kF32);
  // d sum(x w) / dw = x^T 1: the f16 matmul of the f16 casts, cast back to f32.
  const RawTensor expected_w =
      tg::Matmul(x.data().to(kF16).transpose(0, 1), RawTensor::Ones({4, 5}, kF16)).to(kF32);
  EXPECT_EQ(w.grad().data().to_vector<float>(), expected_w.to_vector<float>());
  const RawTensor expected_x =
      tg::Matmul(RawTensor::Ones({4, 5}, kF16), w.data().to(kF16).transpose(0, 1)).to(kF32);
  EXPECT_EQ(x.grad().data().to_vector<float>(), expected_x.to_vector<float>());
}

TEST(AutocastTest, WeightCastIsCachedUntilTheOutermostGuardExits) {
  const Tensor w = Param({3, 3}, 1);
  const Tensor x = Param({2, 3}, 2);
  {
    AutocastGuard outer(kBF16);
    const Tensor a = Matmul(x, w);
    EXPECT_EQ(amp::CachedCastCount(), 2u);  // x and w are both f32 leaves requiring grad
    {
      AutocastGuard inner(kBF16);
      const Tensor b = Matmul(a, w);
      // w's cast is reused: both matmuls point at the same CastBackward node.
      EXPECT_EQ(amp::CachedCastCount(), 2u);
      EXPECT_EQ(a.grad_fn()->next_edges()[1].fn, b.grad_fn()->next_edges()[1].fn);
    }
    EXPECT_EQ(amp::CachedCastCount(), 2u);  // the inner guard's exit does not clear it
    {
      NoGradGuard no_grad;  // casts under no_grad have no history: never cached
      Matmul(Param({2, 3}, 3), Param({3, 3}, 4));
      EXPECT_EQ(amp::CachedCastCount(), 2u);
    }
    Matmul(Matmul(x, w), Tensor(RawTensor::Ones({3, 3})));  // non-leaves and constants: no entry
    EXPECT_EQ(amp::CachedCastCount(), 2u);
    Sum(Matmul(x, w)).backward();
    // Both uses of w fed one gradient through the cached cast.
    EXPECT_EQ(w.grad().dtype(), kF32);
  }
  EXPECT_EQ(amp::CachedCastCount(), 0u);
}

TEST(AutocastTest, GuardsNestAndRestore) {
  EXPECT_FALSE(amp::AutocastEnabled());
  {
    AutocastGuard f16(kF16);
    EXPECT_TRUE(amp::AutocastEnabled());
    EXPECT_EQ(amp::AutocastDType(), kF16);
    {
      AutocastGuard off(kF16, /*enabled=*/false);
      EXPECT_FALSE(amp::AutocastEnabled());
      EXPECT_EQ(Matmul(Param({2, 2}, 1), Param({2, 2}, 2)).dtype(), kF32);
      AutocastGuard bf16(kBF16);
      EXPECT_EQ(amp::AutocastDType(), kBF16);
    }
    EXPECT_TRUE(amp::AutocastEnabled());
    EXPECT_EQ(amp::AutocastDType(), kF16);
  }
  EXPECT_FALSE(amp::AutocastEnabled());
  EXPECT_TRUE(testing::ThrowsErrorExactly([] { AutocastGuard g(kF32); },
                                          "AutocastGuard: the autocast dtype must be f16 or bf16, "
                                          "got f32"));
}

TEST(AutocastTest, ModuleScopeRunsUnsafeModuleTypesInF32) {
  const Tensor x = Param({2, 3}, 1), w = Param({3, 3}, 2);
  AutocastGuard autocast(kF16, true, {"Linear", "Attention"});
  {
    amp::AutocastModuleScope scope("Linear");
    EXPECT_EQ(Matmul(x, w).dtype(), kF16);
  }
  {
    amp::AutocastModuleScope scope("MyGatingNetwork");
    EXPECT_EQ(Matmul(x, w).dtype(), kF32);
    EXPECT_EQ(Matmul(x.data().to(kF16), w.data().to(kF16)).dtype(), kF16);  // tensor op: untouched
    EXPECT_EQ(Matmul(Tensor(x.data().to(kF16)), Tensor(w.data().to(kF16))).dtype(), kF32);
    amp::AutocastModuleScope inner("Linear");  // inside an unsafe module: stays f32
    EXPECT_EQ(Matmul(x, w).dtype(), kF32);
  }
  amp::AutocastModuleScope scope("Attention");
  EXPECT_EQ(Matmul(x, w).dtype(), kF16);
}

// The checkpointed segment recomputes under the forward's autocast state although backward runs
// outside the guard: the gradients equal those of the plain autocast run, bit for bit.
TEST(AutocastTest, CheckpointRecomputesUnderTheForwardsState) {
  for (bool reentrant : {true, false}) {
    SCOPED_TRACE(reentrant ? "reentrant" : "non-reentrant");
    const Tensor x = Param({4, 6}, 1), w1 = Param({6, 6}, 2), w2 = Param({6, 3}, 3);
    auto segment = [&](const VariableList& in) {
      return Softmax(Matmul(Tanh(Matmul(in[0], w1)), w2));
    };
    Tensor plain_loss, ckpt_loss;
    {
      AutocastGuard autocast(kF16);
      plain_loss = Sum(segment({x}));
    }
    plain_loss.backward();
    const std::vector<float> g1 = w1.grad().data().to_vector<float>();
    const std::vector<float> g2 = w2.grad().data().to_vector<float>();
    const std::vector<float> gx = x.grad().data().to_vector<float>();
    for (const Tensor& v : {x, w1, w2}) v.set_grad(Tensor());
    {
      AutocastGuard autocast(kF16);
      ckpt_loss = Sum(Checkpoint(segment, {x}, CheckpointOptions{reentrant, {}, {}}));
    }
    EXPECT_EQ(ckpt_loss.item(), plain_loss.item());
    ckpt_loss.backward();
    EXPECT_EQ(w1.grad().data().to_vector<float>(), g1);
    EXPECT_EQ(w2.grad().data().to_vector<float>(), g2);
    EXPECT_EQ(x.grad().data().to_vector<float>(), gx);
    EXPECT_FALSE(amp::AutocastEnabled());  // the recomputation's state did not leak
  }
}

}  // namespace
}  // namespace tg
