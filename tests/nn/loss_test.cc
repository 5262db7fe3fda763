// Losses against reference formulas in f64: cross-entropy with label smoothing and ignore_index,
// each reduction, gradcheck; MSE.
#include "nn/loss.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "tensor/generator.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace nn {
namespace {

// Per-row smoothed cross-entropy: (1 - eps) * nll + eps * mean_c(-log p); 0 for ignored rows.
std::vector<double> Reference(const std::vector<double>& logits, const std::vector<int64_t>& y,
                              int64_t classes, double eps, int64_t ignore) {
  std::vector<double> out;
  for (size_t r = 0; r < y.size(); ++r) {
    if (y[r] == ignore) {
      out.push_back(0);
      continue;
    }
    double mx = -1e300, total = 0;
    for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, logits[r * classes + c]);
    for (int64_t c = 0; c < classes; ++c) total += std::exp(logits[r * classes + c] - mx);
    double lse = mx + std::log(total), mean_neg_logp = 0;
    for (int64_t c = 0; c < classes; ++c)
      mean_neg_logp += (lse - logits[r * classes + c]) / classes;
    out.push_back((1 - eps) * (lse - logits[r * classes + y[r]]) + eps * mean_neg_logp);
  }
  return out;
}

TEST(CrossEntropyLossTest, LabelSmoothingAndIgnoreIndexMatchTheFormula) {
  Generator gen(0);
  RawTensor logits = RandNormal({2, 3, 5}, gen, 0, 2, kF64);  // [batch, seq, classes]
  std::vector<int64_t> y = {1, -1, 4, 0, 3, -1};
  RawTensor targets = RawTensor::FromVector<int64_t>(y, {2, 3});
  for (double eps : {0.0, 0.1, 1.0}) {
    std::vector<double> ref = Reference(logits.to_vector<double>(), y, 5, eps, -1);
    CrossEntropyOptions o;
    o.ignore_index = -1;
    o.label_smoothing = eps;
    o.reduction = Reduction::kNone;
    if (eps > 0) {  // the unsmoothed path is the op's own kNone
      std::vector<double> rows =
          CrossEntropyLoss(Tensor(logits), targets, o).data().to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(rows[i], ref[i], 1e-12) << eps << " " << i;
    }
    double sum = 0;
    for (double v : ref) sum += v;
    o.reduction = Reduction::kSum;
    EXPECT_NEAR(CrossEntropyLoss(Tensor(logits), targets, o).item(), sum, 1e-12) << eps;
    o.reduction = Reduction::kMean;
    EXPECT_NEAR(CrossEntropyLoss(Tensor(logits), targets, o).item(), sum / 4, 1e-12) << eps;
  }
}

TEST(CrossEntropyLossTest, SmoothedLossGradchecks) {
  Generator gen(1);
  Tensor logits(RandNormal({4, 3}, gen, 0, 1, kF64), true);
  RawTensor targets = RawTensor::FromVector<int64_t>({2, 0, -100, 1}, {4});
  CrossEntropyOptions o;
  o.label_smoothing = 0.2;
  GradcheckResult r = Gradcheck(
      [&](const VariableList& in) { return CrossEntropyLoss(in[0], targets, o); }, {logits});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(CrossEntropyLossTest, AllIgnoredIsNaNAndBadInputsThrow) {
  Tensor logits(RawTensor::Zeros({2, 3}));
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  EXPECT_TRUE(std::isnan(
      CrossEntropyLoss(logits, RawTensor::FromVector<int64_t>({-100, -100}, {2}), o).item()));
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        CrossEntropyLoss(logits, RawTensor::FromVector<int64_t>({0, 1, 2}, {3}));
      },
      "CrossEntropyLoss: targets [3] do not match the 2 rows of logits [2, 3]"));
  o.label_smoothing = 1.5;
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        CrossEntropyLoss(logits, RawTensor::FromVector<int64_t>({0, 1}, {2}), o);
      },
      "CrossEntropyLoss: label_smoothing must be in [0, 1], got 1.5"));
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        CrossEntropyLoss(Tensor(RawTensor::Zeros({2, 0})),
                         RawTensor::FromVector<int64_t>({0, 1}, {2}));
      },
      "CrossEntropyLoss: logits [2, 0] have an empty class dim"));
}

TEST(MseLossTest, MeanSumNone) {
  Tensor p(RawTensor::FromVector<double>({1, 2, 4}, {3}), true);
  RawTensor t = RawTensor::FromVector<double>({0, 2, 1}, {3});
  EXPECT_EQ(MseLoss(p, t).item(), 10.0 / 3);
  EXPECT_EQ(MseLoss(p, t, Reduction::kSum).item(), 10.0);
  EXPECT_EQ(MseLoss(p, t, Reduction::kNone).data().to_vector<double>(),
            (std::vector<double>{1, 0, 9}));
  MseLoss(p, t).backward();
  EXPECT_EQ(p.grad().data().to_vector<double>(), (std::vector<double>{2.0 / 3, 0, 2.0}));
}

}  // namespace
}  // namespace nn
}  // namespace tg
