// train/evaluate.h: the evaluation loss of the training binaries is the loss PyTorch's
// autocast gives (cross-entropy of f16/bf16 logits in f32, the sums in f64), in every precision
// and at any batch size: exact values where the loss is exact, else a double reference of the
// same logits to f32 rounding.
#include "train/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg::train {
namespace {

// Rows [0, -10000] with target 1: each row's loss is 10000 + log1p(e^-10000), exactly 10000 in
// f32 and wider; 8 rows sum to 80000, past f16's largest finite value 65504.
TEST(CrossEntropyEvalTest, F16LogitsWhoseSummedLossOverflowsF16) {
  NoGradGuard no_grad;
  const int64_t rows = 8;
  std::vector<float> values;
  for (int64_t i = 0; i < rows; ++i) values.insert(values.end(), {0.0f, -10000.0f});
  const RawTensor logits = RawTensor::FromVector(values, {rows, 2}, kF16);
  const RawTensor targets = RawTensor::Full({rows}, 1, kI64);

  CrossEntropyEval eval(kF16);
  const Tensor returned = eval.Add([&] { return Tensor(logits); }, targets);
  EXPECT_EQ(returned.dtype(), kF16);  // the logits as the forward made them
  EXPECT_EQ(eval.total(), 80000.0);
  EXPECT_EQ(eval.rows(), rows);
  EXPECT_EQ(eval.mean(), 10000.0);

  // What the binaries did before: the loss of the logits after the autocast scope closed, in
  // their dtype, which cannot hold the sum.
  nn::CrossEntropyOptions sum;
  sum.reduction = Reduction::kSum;
  EXPECT_TRUE(std::isinf(nn::CrossEntropyLoss(Tensor(logits), targets, sum).item()));
}

// A bf16 model's logits: the double reference of the same (bf16-exact) logits, to f32 rounding
// of each row (2^-24 relative), over 3 batches of 1000 rows. Rounding the sums to bf16 (8
// significant bits) is off by up to 2^-9.
TEST(CrossEntropyEvalTest, Bf16LogitsMatchTheDoubleReference) {
  NoGradGuard no_grad;
  const std::vector<float> classes = {1.5f, -2.25f, 0.75f, 3.125f, -0.5f};  // bf16-exact
  const int64_t c = static_cast<int64_t>(classes.size()), rows = 1000;
  CrossEntropyEval eval(kBF16);
  double reference = 0;
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<float> values;
    std::vector<int64_t> target;
    for (int64_t i = 0; i < rows; ++i) {
      // Row i: the classes rotated by i + batch, target (2 i + batch) mod C.
      for (int64_t k = 0; k < c; ++k) values.push_back(classes[(k + i + batch) % c]);
      target.push_back((2 * i + batch) % c);
      double lse = 0;
      for (float v : classes) lse += std::exp(static_cast<double>(v));
      reference += std::log(lse) - values[i * c + target.back()];
    }
    const RawTensor logits = RawTensor::FromVector(values, {rows, c}, kBF16);
    eval.Add([&] { return Tensor(logits); }, RawTensor::FromVector(target, {rows}));
  }
  EXPECT_EQ(eval.rows(), 3 * rows);
  EXPECT_NEAR(eval.total(), reference, 1e-6 * reference);
  EXPECT_NEAR(eval.mean(), reference / (3 * rows), 1e-6 * reference / (3 * rows));
}

// The forward runs under the run's autocast: an f32 input through an f16 Linear gives f16 logits
// [0, -10000] (the matmul in f16), and the loss is still the f32 one. Targets and logits with
// leading dims [B, T], as train_gpt's.
TEST(CrossEntropyEvalTest, ForwardRunsUnderAutocastWithBatchAndTimeDims) {
  NoGradGuard no_grad;
  Generator gen(0);
  nn::LinearImpl head(1, 2, gen);
  StateDict weights;
  weights.tensors["weight"] = RawTensor::FromVector(std::vector<float>{0.0f, -1.0f}, {2, 1});
  weights.tensors["bias"] = RawTensor::Zeros({2});
  head.load_state_dict(weights);
  head.to(kF16);
  const RawTensor x = RawTensor::Full({16, 64, 1}, 10000);  // f32, cast to f16 by autocast
  const RawTensor y = RawTensor::Full({16, 64}, 1, kI64);
  CrossEntropyEval eval(kF16);
  const Tensor logits = eval.Add([&] { return head(Tensor(x)); }, y);
  EXPECT_EQ(logits.dtype(), kF16);
  EXPECT_EQ(eval.total(), 16 * 64 * 10000.0);  // 10.24e6
  EXPECT_EQ(eval.mean(), 10000.0);
}

// f32 runs have no autocast: each row's f32 loss, summed in f64.
TEST(CrossEntropyEvalTest, F32AndEmpty) {
  NoGradGuard no_grad;
  CrossEntropyEval eval(kF32);
  EXPECT_TRUE(std::isnan(eval.mean()));
  const RawTensor logits =
      RawTensor::FromVector(std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}, {1, 4});
  eval.Add([&] { return Tensor(logits); }, RawTensor::Full({1}, 2, kI64));
  eval.Add([&] { return Tensor(logits); }, RawTensor::Full({1}, 0, kI64));
  EXPECT_EQ(eval.rows(), 2);
  EXPECT_NEAR(eval.total(), 2 * std::log(4.0), 1e-6);  // log 4 in f32, twice
  EXPECT_NEAR(eval.mean(), std::log(4.0), 1e-6);
}

}  // namespace
}  // namespace tg::train
