#include "tensor/cuda/axpy.h"

#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace {

TEST(CudaAxpyTest, MatchesHostLoop) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> x(1000), y(1000), expected(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = 0.5f * i;
    y[i] = 3.0f - i;
    expected[i] = 2.0f * x[i] + y[i];
  }
  ASSERT_EQ(AxpySync(2.0f, x, y), "");
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(y[i], expected[i]) << i;
}

TEST(CudaAxpyTest, EmptyVectorsLaunchNothing) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> x, y;
  EXPECT_EQ(AxpySync(1.0f, x, y), "");  // a 0-block grid would be an invalid configuration
}

TEST(CudaAxpyTest, RejectsLengthMismatch) {
  std::vector<float> x(3), y(4);
  EXPECT_EQ(AxpySync(1.0f, x, y), "AxpySync: x and y differ in length");
}

}  // namespace
}  // namespace tg::cuda
