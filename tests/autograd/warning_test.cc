// The warnings channel (autograd/warning.h) and the warnings the library gives through it.
#include "autograd/warning.h"

#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"

namespace tg {
namespace {

using Messages = std::vector<std::string>;

TEST(WarningTest, TheDefaultHandlerPrintsEachDistinctMessageOnceToStderr) {
  ::testing::internal::CaptureStderr();
  Warn("warning_test: first");
  Warn("warning_test: second");
  Warn("warning_test: first");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "tapegrad warning: warning_test: first\ntapegrad warning: warning_test: second\n");
}

TEST(WarningTest, AGuardInstallsAHandlerAndPutsThePreviousOneBack) {
  Messages outer, inner;
  {
    WarningHandlerGuard outer_guard([&](const std::string& m) { outer.push_back(m); });
    Warn("a");
    {
      WarningHandlerGuard inner_guard([&](const std::string& m) { inner.push_back(m); });
      Warn("b");
      Warn("b");  // an installed handler sees every call
    }
    Warn("c");
  }
  EXPECT_EQ(outer, (Messages{"a", "c"}));
  EXPECT_EQ(inner, (Messages{"b", "b"}));
  EXPECT_FALSE(SetWarningHandler(nullptr));  // the default is back
}

TEST(WarningTest, CheckpointWarnsWhenReentrancyIsNotChosenAsPyTorchDoes) {
  Tensor x(RawTensor::FromVector<double>({1, 2}, {2}), /*requires_grad=*/true);
  auto square = [](const VariableList& in) { return Mul(in[0], in[0]); };
  Messages seen;
  WarningHandlerGuard guard([&](const std::string& m) { seen.push_back(m); });
  Tensor h = Checkpoint(square, {x});
  EXPECT_EQ(seen, (Messages{kCheckpointReentrancyWarning}));
  Sum(h).backward();  // unset means reentrant, PyTorch's default
  EXPECT_EQ(x.grad().data().to_vector<double>(), (std::vector<double>{2, 4}));
  seen.clear();
  CheckpointOptions reentrant, non_reentrant;
  reentrant.reentrant = true;
  non_reentrant.reentrant = false;
  Checkpoint(square, {x}, reentrant);
  Checkpoint(square, {x}, non_reentrant);
  EXPECT_TRUE(seen.empty());
}

TEST(WarningTest, ReentrantCheckpointOfInputsThatDoNotRequireGradWarns) {
  Tensor c(RawTensor::FromVector<double>({1, 2}, {2}));
  Tensor w(RawTensor::FromVector<double>({3, 4}, {2}), /*requires_grad=*/true);
  auto scale = [&](const VariableList& in) { return Mul(in[0], w); };
  Messages seen;
  WarningHandlerGuard guard([&](const std::string& m) { seen.push_back(m); });
  CheckpointOptions reentrant, non_reentrant;
  reentrant.reentrant = true;
  non_reentrant.reentrant = false;
  EXPECT_FALSE(Checkpoint(scale, {c}, reentrant).requires_grad());
  EXPECT_EQ(seen, (Messages{kCheckpointNoGradInputsWarning}));
  seen.clear();
  EXPECT_TRUE(Checkpoint(scale, {c}, non_reentrant).requires_grad());  // PyTorch: no warning
  EXPECT_TRUE(seen.empty());
}

}  // namespace
}  // namespace tg
