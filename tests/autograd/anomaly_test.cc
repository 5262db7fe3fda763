// Anomaly mode (autograd/engine.h): a backward whose node produces NaN/inf throws, naming the
// node and where its forward op was created; without it the NaN silently reaches .grad.
#include <cmath>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;

// sum(where(x > 0, log(x), 0)) at x = [0, 2]: the forward is finite (log(0) = -inf is not
// selected), but LogBackward divides the zero gradient WhereBackward sends it by x = 0.
struct MaskedLog {
  Tensor x{RawTensor::FromVector<double>({0, 2}, {2}, kF64), /*requires_grad=*/true};
  Tensor loss;

  MaskedLog() {
    const RawTensor zeros = RawTensor::Zeros({2}, kF64);
    loss = Sum(Where(tg::Gt(x.data(), zeros), Log(x), Tensor(zeros)));
  }
};

TEST(AnomalyTest, NanFromLogBackwardThrowsNamingTheNodeAndItsCreationSite) {
  DetectAnomalyGuard anomaly;
  MaskedLog f;
  ASSERT_TRUE(std::isfinite(f.loss.item()));
  std::string message;
  try {
    f.loss.backward();
  } catch (const Error& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "backward did not throw";
  EXPECT_EQ(message.rfind("anomaly detected: LogBackward returned NaN or inf in its gradient for "
                          "input 0; it was created at:",
                          0),
            0u)
      << message;
  // The creation trace is symbolised: it names the op and this test's fixture that built it.
  EXPECT_NE(message.find("tg::Log("), std::string::npos) << message;
  EXPECT_NE(message.find("MaskedLog"), std::string::npos) << message;
  EXPECT_FALSE(f.x.grad().defined());  // the failing backward accumulated nothing
}

TEST(AnomalyTest, WithoutAnomalyModeTheNanReachesTheGradient) {
  ASSERT_FALSE(AnomalyMode::is_enabled());
  MaskedLog f;
  f.loss.backward();
  const std::vector<double> g = f.x.grad().data().to_vector<double>();
  EXPECT_TRUE(std::isnan(g[0]));
  EXPECT_EQ(g[1], 0.5);
}

TEST(AnomalyTest, TheGuardRestoresThePreviousSetting) {
  EXPECT_FALSE(AnomalyMode::is_enabled());
  {
    DetectAnomalyGuard outer;
    {
      DetectAnomalyGuard inner;
      EXPECT_TRUE(AnomalyMode::is_enabled());
    }
    EXPECT_TRUE(AnomalyMode::is_enabled());
  }
  EXPECT_FALSE(AnomalyMode::is_enabled());
}

TEST(AnomalyTest, NodesCreatedOutsideAnomalyModeHaveNoTrace) {
  MaskedLog f;
  EXPECT_TRUE(f.loss.grad_fn()->creation_trace().empty());
  DetectAnomalyGuard anomaly;
  MaskedLog g;
  EXPECT_FALSE(g.loss.grad_fn()->creation_trace().empty());
}

}  // namespace
}  // namespace tg
