#include "optim/clip_grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "amp/mixed_precision_optimizer.h"
#include "optim/sgd.h"
#include "tensor/composed.h"
#include "tensor/ops.h"
#include "tensor/optimizer_kernels.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

Tensor WithGrad(std::vector<float> grad, DType dtype = kF32) {
  const int64_t n = static_cast<int64_t>(grad.size());
  Tensor p(RawTensor::Zeros({n}, dtype), true);
  p.set_grad(Tensor(RawTensor::FromVector<float>(grad, {n}).to(dtype)));
  return p;
}

std::vector<float> Grad(const Tensor& p) { return p.grad().data().to_vector<float>(); }

// Total 5; clip_coef = 1 / (5 + 1e-6) = 0.199999960000008, rounded to f32 (0.19999995827674866)
// and multiplied in f32: 3 -> 0.599999905, 4 -> 0.799999833 (reference: Python with
// struct.pack('f') rounding; exact equality because both sides do the same two roundings).
TEST(ClipGradTest, TwoNormClipsInPlace) {
  Tensor a = WithGrad({3}), b = WithGrad({0, 4}), none(RawTensor::Zeros({2}), true);
  const uint64_t version = a.grad().version();
  const double total = clip_grad_norm({a, none, b}, 1.0);
  EXPECT_EQ(total, 5.0);
  EXPECT_EQ(Grad(a), (std::vector<float>{0.599999905f}));
  EXPECT_EQ(Grad(b), (std::vector<float>{0, 0.799999833f}));
  EXPECT_GT(a.grad().version(), version);
  EXPECT_FALSE(none.grad().defined());
}

TEST(ClipGradTest, BelowMaxNormLeavesGradsAlone) {
  Tensor a = WithGrad({3, -4});
  const uint64_t version = a.grad().version();
  EXPECT_EQ(clip_grad_norm({a}, 5.0), 5.0);  // clip_coef = 5 / (5 + 1e-6) < 1: clipped
  EXPECT_GT(a.grad().version(), version);
  Tensor b = WithGrad({3, -4});
  const uint64_t vb = b.grad().version();
  EXPECT_EQ(clip_grad_norm({b}, 6.0), 5.0);
  EXPECT_EQ(Grad(b), (std::vector<float>{3, -4}));
  EXPECT_EQ(b.grad().version(), vb);
}

TEST(ClipGradTest, OtherNormTypes) {
  Tensor a = WithGrad({3, -4}), b = WithGrad({-1});
  EXPECT_EQ(clip_grad_norm({a, b}, 100, kInfNorm), 4.0);
  EXPECT_EQ(clip_grad_norm({a, b}, 100, 1), 8.0);
  EXPECT_EQ(clip_grad_norm({a, b}, 100, 3), std::pow(27.0 + 64.0 + 1.0, 1.0 / 3.0));
  // inf norm clipping: coef = 2 / (4 + 1e-6).
  EXPECT_EQ(clip_grad_norm({a, b}, 2, kInfNorm), 4.0);
  const float coef = static_cast<float>(2 / (4 + 1e-6));
  EXPECT_EQ(Grad(a), (std::vector<float>{3 * coef, -4 * coef}));
  EXPECT_EQ(Grad(b), (std::vector<float>{-1 * coef}));
}

// Accumulation in double: squares that overflow f32 (1e20^2) still give a finite norm.
TEST(ClipGradTest, AccumulatesInDouble) {
  Tensor a = WithGrad({1e20f, 1e20f});
  const double x = static_cast<double>(1e20f);
  EXPECT_EQ(clip_grad_norm({a}, 1e30), std::sqrt(x * x + x * x));
  // f16 grads: the norm of the exact f16 values (65504^2 overflows f16); the scaling computes
  // 65504 * f32(65504 / (92636.64518968722 + 1e-6)) = 46318.3203125 in f32 and rounds it to f16
  // (46304; Python reference with struct 'f' and 'e' rounding).
  Tensor h = WithGrad({65504, 65504}, kF16);
  EXPECT_EQ(clip_grad_norm({h}, 65504), 92636.64518968722);
  EXPECT_EQ(h.grad().dtype(), kF16);
  EXPECT_EQ(Grad(h), (std::vector<float>{46304, 46304}));
}

// A non-finite total is returned as is and the grads are not touched (PyTorch would multiply
// them by NaN or 0).
TEST(ClipGradTest, NonFiniteNormLeavesGradsAlone) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = WithGrad({1, inf}), b = WithGrad({3, 4});
  const uint64_t version = b.grad().version();
  EXPECT_EQ(clip_grad_norm({a, b}, 1.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(Grad(b), (std::vector<float>{3, 4}));
  EXPECT_EQ(b.grad().version(), version);
  Tensor n = WithGrad({nan, 1});
  EXPECT_TRUE(std::isnan(clip_grad_norm({n, b}, 1.0)));
  EXPECT_TRUE(std::isnan(clip_grad_norm({b, n}, 1.0, kInfNorm)));
  EXPECT_EQ(clip_grad_norm({a, b}, 1.0, kInfNorm), std::numeric_limits<double>::infinity());
  EXPECT_EQ(Grad(b), (std::vector<float>{3, 4}));
}

TEST(ClipGradTest, DuplicatesCountOnceAndEmptyIsZero) {
  Tensor a = WithGrad({3, 4});
  EXPECT_EQ(clip_grad_norm({a, a}, 10), 5.0);
  EXPECT_EQ(clip_grad_norm({}, 1), 0.0);
}

TEST(ClipGradTest, ErrorsAreNamed) {
  Tensor a = WithGrad({3, 4});
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly([&] { clip_grad_norm({a}, -1); },
                                              "clip_grad_norm: max_norm must be >= 0, got -1"));
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] { clip_grad_norm({a}, 1, 0); }, "clip_grad_norm: norm_type must be > 0 (or inf), got 0"));
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] {
        clip_grad_norm({a, Tensor()}, 1);
      },
      "clip_grad_norm: parameter 1 is undefined"));
}

// The clip rule is written once (tg::ClipCoefficient) and every path that clips takes it: the
// rule's own answer at its edges, then each path on a one-element gradient [t] (its 2-norm is
// exactly t) gives t * f32(clip_coef) or leaves it, bit for bit: clip_grad_norm, the kernel
// behind tg::ClipByNorm, its composed form, and amp::StepCore through
// MixedPrecisionOptimizer::clip_master_grads (dist::ZeroOptimizer's is in
// tests/distributed/zero_test OneRankRunsTheSingleProcessStepCore).
TEST(ClipGradTest, OneClipRuleForEveryPath) {
  double coef = -1;
  EXPECT_TRUE(ClipCoefficient(5.0, 1.0, &coef));
  EXPECT_EQ(coef, 1.0 / (5.0 + 1e-6));
  coef = -1;
  EXPECT_FALSE(ClipCoefficient(1.0 - 1e-6, 1.0, &coef));  // clip_coef == 1: not < 1
  EXPECT_EQ(coef, -1);
  EXPECT_TRUE(ClipCoefficient(1.0, 1.0, &coef));  // 1 / (1 + 1e-6) < 1
  EXPECT_FALSE(ClipCoefficient(std::numeric_limits<double>::infinity(), 1.0, &coef));
  EXPECT_FALSE(ClipCoefficient(std::nan(""), 1.0, &coef));
  EXPECT_TRUE(ClipCoefficient(0.0, 0.0, &coef));  // max_norm 0 zeroes every gradient
  EXPECT_EQ(coef, 0.0);

  const double inf = std::numeric_limits<double>::infinity();
  for (const float t : {5.0f, 0.999999f, 1.0f, 3e-7f, 0.0f, static_cast<float>(inf)}) {
    for (const double max_norm : {1.0, 0.0, 2.5}) {
      float expected = t;
      if (ClipCoefficient(t, max_norm, &coef)) expected = t * static_cast<float>(coef);
      const std::string where = "t " + std::to_string(t) + ", max_norm " + std::to_string(max_norm);

      Tensor p = WithGrad({t});
      EXPECT_EQ(clip_grad_norm({p}, max_norm), static_cast<double>(t)) << where;
      EXPECT_EQ(Grad(p), std::vector<float>{expected}) << "clip_grad_norm: " << where;

      const RawTensor g = RawTensor::FromVector<float>({t}, {1});
      tg::ClipByNorm({g}, GlobalGradNorm({g}, 2.0), max_norm);
      EXPECT_EQ(g.to_vector<float>(), std::vector<float>{expected}) << "ClipByNorm: " << where;

      const RawTensor c = RawTensor::FromVector<float>({t}, {1});
      composed::ClipByNorm({c}, GlobalGradNorm({c}, 2.0), max_norm);
      EXPECT_EQ(c.to_vector<float>(), std::vector<float>{expected}) << "composed: " << where;

      // The master gradient of an f32 parameter with loss scale 1: its .grad moves into it.
      Tensor w(RawTensor::Zeros({1}), true);
      amp::MixedPrecisionOptimizer opt(std::make_unique<SGD>(std::vector<Tensor>{w}));
      w.set_grad(Tensor(RawTensor::FromVector<float>({t}, {1})));
      EXPECT_EQ(opt.clip_master_grads(max_norm), static_cast<double>(t)) << where;
      EXPECT_EQ((*opt.inspect_master_grads())[0].to_vector<float>(), std::vector<float>{expected})
          << "StepCore: " << where;
    }
  }
}

}  // namespace
}  // namespace tg::optim
