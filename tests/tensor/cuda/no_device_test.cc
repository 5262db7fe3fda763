// A binary with the CUDA backend on a machine without a GPU (the CI machine): creating a CUDA
// tensor throws a tg::Error that says why, never crashes. Skips where a GPU is present.
#include <string>

#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device_backend.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsErrorExactly;

constexpr char kNoDevice[] =
    "no CUDA device is available (DeviceCount() = 0: no CUDA driver or no GPU)";

TEST(NoCudaDeviceTest, CreatingACudaTensorThrowsAClearError) {
  ASSERT_NE(FindDeviceBackend(DeviceType::kCuda), nullptr);  // linked and registered
  if (cuda::Available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(cuda::DeviceCount(), 0);
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        RawTensor::Empty({2, 3}, kF32, Device::Cuda(0));
      },
      std::string("empty: cannot allocate on cuda:0: ") + kNoDevice));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Zeros({2}, kF16, Device::Cuda(1)); },
                                 std::string("empty: cannot allocate on cuda:1: ") + kNoDevice));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Ones({2}).to(Device::Cuda(0)); },
                                 std::string("to: cannot allocate on cuda:0: ") + kNoDevice));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Ones({2}).to(Device::Cuda(0), kBF16); },
                                 std::string("to: cannot allocate on cuda:0: ") + kNoDevice));
  // The CPU is unaffected.
  EXPECT_EQ(RawTensor::Full({2}, 2).to(Device::Cpu()).to_vector<float>(),
            (std::vector<float>{2, 2}));
}

}  // namespace
}  // namespace tg
