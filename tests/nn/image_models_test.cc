// Conv2d/MaxPool2d layers and the Fashion-MNIST models: PyTorch's init bounds, shapes, parameter
// names and counts, the layer equals the op, autocast, and a few steps that learn.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/conv.h"
#include "nn/loss.h"
#include "nn/models/image.h"
#include "optim/adam.h"

namespace tg {
namespace nn {
namespace {

TEST(Conv2dLayerTest, InitBoundsAndForwardEqualsTheOp) {
  Generator gen(0);
  Conv2dParams p;
  p.padding = {1, 1};
  Conv2dImpl conv(Conv2dOptions(3, 8, {3, 3}).padding({1, 1}), gen);
  const double bound = 1 / std::sqrt(3.0 * 3 * 3);
  for (float w : conv.weight.data().to_vector<float>()) EXPECT_LE(std::fabs(w), bound);
  for (float b : conv.bias.data().to_vector<float>()) EXPECT_LE(std::fabs(b), bound);
  EXPECT_EQ(conv.weight.shape(), (Shape{8, 3, 3, 3}));
  Tensor x(RandNormal({2, 3, 5, 5}, gen));
  EXPECT_EQ(conv(x).data().to_vector<float>(),
            tg::Conv2d(x, conv.weight, conv.bias, p).data().to_vector<float>());
  EXPECT_EQ(conv.extra_repr(), "3, 8, kernel=(3, 3), stride=(1, 1), padding=(1, 1), bias=true");
  amp::AutocastGuard autocast(kBF16);
  EXPECT_EQ(conv(x).dtype(), kBF16);
}

TEST(Conv2dLayerTest, OptionsDefaultsChainingAndTheGeneratorContract) {
  const Conv2dOptions d(3, 8, {3, 3});
  EXPECT_EQ(d.stride(), (std::array<int64_t, 2>{1, 1}));
  EXPECT_EQ(d.padding(), (std::array<int64_t, 2>{0, 0}));
  EXPECT_EQ(d.dilation(), (std::array<int64_t, 2>{1, 1}));
  EXPECT_TRUE(d.bias());
  Conv2dOptions o = Conv2dOptions(3, 8, {3, 3}).stride({2, 2}).padding({1, 0}).bias(false);
  EXPECT_EQ(o.stride(), (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(o.padding(), (std::array<int64_t, 2>{1, 0}));
  EXPECT_FALSE(o.bias());
  // The same seed draws the same weight with or without a bias (the bias is drawn after it),
  // and the short constructor is the options one.
  Generator g1(3), g2(3), g3(3);
  Conv2dImpl with(3, 8, {3, 3}, g1), without(o, g2), full(Conv2dOptions(3, 8, {3, 3}), g3);
  EXPECT_FALSE(without.bias.defined());
  EXPECT_EQ(with.weight.data().to_vector<float>(), without.weight.data().to_vector<float>());
  EXPECT_EQ(with.bias.data().to_vector<float>(), full.bias.data().to_vector<float>());
  EXPECT_EQ(without.extra_repr(), "3, 8, kernel=(3, 3), stride=(2, 2), padding=(1, 0), bias=false");
  Tensor x(RandNormal({1, 3, 5, 5}, g1));
  EXPECT_EQ(without(x).shape(), (Shape{1, 8, 3, 2}));
}

TEST(MaxPool2dLayerTest, StrideDefaultsToTheKernel) {
  MaxPool2dImpl pool({2, 2});
  EXPECT_EQ(pool.options().stride(), (std::array<int64_t, 2>{2, 2}));
  Tensor x(RawTensor::Arange(0, 16).reshape({1, 1, 4, 4}));
  EXPECT_EQ(pool(x).data().to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  MaxPool2dImpl overlapping(MaxPool2dOptions({2, 2}).stride({1, 1}));
  EXPECT_EQ(overlapping(x).data().to_vector<float>(),
            (std::vector<float>{5, 6, 7, 9, 10, 11, 13, 14, 15}));
  EXPECT_EQ(overlapping.extra_repr(), "kernel=(2, 2), stride=(1, 1)");
}

TEST(ImageModelsTest, ShapesNamesAndCounts) {
  Generator gen(1);
  auto mlp = MakeImageMlp(gen);
  auto cnn = MakeImageCnn(gen);
  Tensor images(RandNormal({4, 1, 28, 28}, gen));
  EXPECT_EQ((*mlp)(images).shape(), (Shape{4, 10}));
  EXPECT_EQ((*cnn)(images).shape(), (Shape{4, 10}));
  EXPECT_EQ(mlp->num_parameters(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(cnn->num_parameters(),
            (32 * 9 + 32) + (64 * 32 * 9 + 64) + (64 * 7 * 7 * 128 + 128) + (128 * 10 + 10));
  std::vector<std::string> names;
  for (const auto& e : cnn->named_parameters()) names.push_back(e.first);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias", "7.weight",
                                             "7.bias", "9.weight", "9.bias"}));
}

TEST(ImageModelsTest, CnnLearnsASmallBatch) {
  Generator gen(2);
  auto cnn = MakeImageCnn(gen, {4, 8});
  RawTensor images = RandNormal({16, 1, 28, 28}, gen);
  RawTensor labels =
      RawTensor::FromVector<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16});
  optim::AdamOptions o;
  o.lr(3e-3);
  optim::Adam opt(cnn->parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    Tensor loss = CrossEntropyLoss((*cnn)(Tensor(images)), labels);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.1 * first) << first << " -> " << last;  // memorises 16 random images
}

}  // namespace
}  // namespace nn
}  // namespace tg
