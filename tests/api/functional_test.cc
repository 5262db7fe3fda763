// tg::nn::functional (nn/functional.h): values and gradients of the losses and activations,
// worked by hand from PyTorch's definitions, and the options' errors.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tapegrad.h"

namespace {

namespace F = tg::nn::functional;

std::vector<float> Values(const tg::Tensor& t) { return t.data().to_vector<float>(); }

TEST(Functional, SmoothL1LossQuadraticInsideBetaLinearOutside) {
  tg::Tensor x = tg::tensor({0.0, 2.0, 0.5, -3.0}, tg::requires_grad());
  tg::Tensor y = tg::zeros({4});
  tg::Tensor loss = F::smooth_l1_loss(x, y);  // 0, 1.5, 0.125, 2.5
  EXPECT_FLOAT_EQ(loss.item<float>(), (0 + 1.5f + 0.125f + 2.5f) / 4);
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{0, 0.25f, 0.125f, -0.25f}));
  EXPECT_FLOAT_EQ(F::smooth_l1_loss(x, y, F::SmoothL1LossFuncOptions().beta(4).reduction(tg::kSum))
                      .item<float>(),
                  (0 + 0.5f + 0.03125f + 1.125f));
  EXPECT_EQ(Values(F::smooth_l1_loss(x, y, F::SmoothL1LossFuncOptions().reduction(tg::kNone))),
            (std::vector<float>{0, 1.5f, 0.125f, 2.5f}));
}

TEST(Functional, MseAndL1) {
  tg::Tensor x = tg::tensor({1.0, 2.0}, tg::requires_grad());
  tg::Tensor y = tg::zeros({2});
  tg::Tensor loss = F::mse_loss(x, y);
  EXPECT_EQ(loss.item<float>(), 2.5f);
  loss.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{1, 2}));
  EXPECT_EQ(F::l1_loss(x, tg::tensor({3.0, 0.0})).item<float>(), 2.0f);
  try {
    F::mse_loss(x, tg::zeros({3}));
    FAIL() << "shapes differ";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(), "mse_loss: input [2] and target [3] differ in shape");
  }
}

TEST(Functional, BinaryCrossEntropyClampsItsLogs) {
  tg::Tensor x = tg::tensor({0.5, 0.9});
  tg::Tensor y = tg::tensor({1.0, 0.0});
  EXPECT_NEAR(F::binary_cross_entropy(x, y).item<double>(),
              (-std::log(0.5) - std::log(1 - 0.9f)) / 2, 1e-6);
  // log(0) is clamped to -100: the loss of a certain wrong answer is 100, not inf.
  EXPECT_EQ(F::binary_cross_entropy(tg::tensor({0.0}), tg::tensor({1.0})).item<float>(), 100.0f);
}

TEST(Functional, NllLossIgnoresRowsAndCrossEntropyAgrees) {
  tg::Tensor logp = tg::tensor({{-1.0, -2.0}, {-3.0, -4.0}, {-5.0, -6.0}}, tg::requires_grad());
  tg::Tensor target = tg::tensor({1, -100, 0});
  tg::Tensor loss = F::nll_loss(logp, target);  // mean of 2 and 5
  EXPECT_EQ(loss.item<float>(), 3.5f);
  loss.backward();
  EXPECT_EQ(Values(logp.grad()), (std::vector<float>{0, -0.5f, 0, 0, -0.5f, 0}));
  EXPECT_EQ(F::nll_loss(logp, target, F::NLLLossFuncOptions().reduction(tg::kSum)).item<float>(),
            7.0f);
  tg::Tensor logits = tg::tensor({{0.5, -1.0, 2.0}, {1.0, 1.0, 0.0}});
  tg::Tensor labels = tg::tensor({2, 0});
  EXPECT_NEAR(F::cross_entropy(logits, labels).item<double>(),
              F::nll_loss(logits.log_softmax(1), labels).item<double>(), 1e-6);
  EXPECT_THROW(F::nll_loss(logp, tg::tensor({2, 0, 0})), tg::Error);  // class 2 of 2
}

TEST(Functional, Activations) {
  tg::Tensor x = tg::tensor({-2.0, 3.0}, tg::requires_grad());
  F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.1)).sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{0.1f, 1.0f}));
  EXPECT_EQ(Values(F::relu(x)), (std::vector<float>{0, 3}));
  EXPECT_EQ(Values(F::gelu(x, F::GELUFuncOptions().approximate("tanh"))), Values(tg::GeluTanh(x)));
  EXPECT_THROW(F::gelu(x, F::GELUFuncOptions().approximate("fast")), tg::Error);
  EXPECT_EQ(Values(F::softmax(x, 0)), Values(x.softmax(0)));
  // Dropout: the identity in eval mode, all zeros at p = 1, kept values scaled by 1 / (1 - p).
  EXPECT_EQ(Values(F::dropout(x, F::DropoutFuncOptions().training(false))), Values(x));
  EXPECT_EQ(Values(F::dropout(x, F::DropoutFuncOptions().p(1))), (std::vector<float>{0, 0}));
  tg::Generator gen(3);
  for (float v : Values(F::dropout(tg::ones({100}), F::DropoutFuncOptions().p(0.5), gen))) {
    EXPECT_TRUE(v == 0 || v == 2) << v;
  }
}

}  // namespace
