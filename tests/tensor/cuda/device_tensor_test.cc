// CUDA tensors through the tensor core and the CUDA backend: host <-> device and device <->
// device copies with dtype conversion and strided views on either side, fill, item, to(Device),
// ToString, the mixed-device error of ops, and a steady loop without cudaMalloc. Skips without a
// GPU (no_device_test covers that case).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

const Device kGpu = Device::Cuda(0);

class DeviceTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::Available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(DeviceTensorTest, RoundTripEveryDtype) {
  const RawTensor x = RawTensor::FromVector<double>({0, 1, -2, 3.5, 100, -0.25, 7, 65504}, {2, 4});
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) {
    const RawTensor expected = x.to(dtype);
    const RawTensor g = x.to(kGpu, dtype);  // converted on the host, then one copy
    EXPECT_EQ(g.device(), kGpu);
    EXPECT_EQ(g.dtype(), dtype);
    EXPECT_EQ(g.to_vector<double>(), expected.to_vector<double>()) << DTypeName(dtype);
    // Converted on the device (the Copy kernel), then read back.
    const RawTensor h = x.to(kGpu).to(dtype);
    EXPECT_EQ(h.device(), kGpu);
    EXPECT_EQ(h.to(Device::Cpu()).to_vector<double>(), expected.to_vector<double>())
        << DTypeName(dtype);
  }
}

TEST_F(DeviceTensorTest, StridedViewsOnEitherSide) {
  const RawTensor x = RawTensor::Arange(0, 6).view({2, 3});
  // Host source not contiguous: densified on the host.
  EXPECT_EQ(x.transpose(0, 1).to(kGpu).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Device destination not contiguous: landed contiguous, then scattered by the kernel.
  const RawTensor g = RawTensor::Zeros({3, 2}, kF16, kGpu);
  g.transpose(0, 1).copy_(x);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Device source not contiguous: densified on the device; host destination not contiguous.
  const RawTensor host = RawTensor::Full({2, 3}, -1, kF64);
  host.transpose(0, 1).copy_(g);
  EXPECT_EQ(host.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  // Device to device views.
  const RawTensor big = RawTensor::Arange(0, 12).view({3, 4}).to(kGpu);
  const RawTensor s = big.slice(1, 1, 4, 2).transpose(0, 1).contiguous();
  EXPECT_EQ(s.device(), kGpu);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 5, 9, 3, 7, 11}));
  EXPECT_TRUE(big.contiguous().shares_storage(big));
  const RawTensor c = big.clone();
  EXPECT_FALSE(c.shares_storage(big));
  EXPECT_EQ(c.to_vector<float>(), big.to_vector<float>());
}

TEST_F(DeviceTensorTest, OverlappingViewsCopyLikeTheCpu) {
  const RawTensor host = RawTensor::Arange(0, 8);
  const RawTensor g = host.to(kGpu);
  host.slice(0, 1, 8).copy_(host.slice(0, 0, 7));
  g.slice(0, 1, 8).copy_(g.slice(0, 0, 7));  // same dtype, contiguous: would be a memcpy
  EXPECT_EQ(g.to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(host.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4, 5, 6}));
  const RawTensor m = RawTensor::Arange(0, 9).view({3, 3}).to(kGpu);
  m.copy_(m.transpose(0, 1));  // in-place transpose: every element read before written
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  m.copy_(m);  // an exact alias is a no-op
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

TEST_F(DeviceTensorTest, BroadcastCopies) {
  const RawTensor dst = RawTensor::Empty({2, 3}, kF32, kGpu);
  dst.copy_(RawTensor::FromVector<float>({1, 2, 3}, {3}));  // host, broadcast
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  dst.copy_(RawTensor::FromVector<double>({4, 5}, {2, 1}).to(kGpu));  // device, broadcast + f64
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{4, 4, 4, 5, 5, 5}));
  EXPECT_TRUE(ThrowsErrorExactly([&] { dst.copy_(RawTensor::Zeros({4}, kF32, kGpu)); },
                                 "copy_: source shape [4] cannot be broadcast to [2, 3]"));
}

TEST_F(DeviceTensorTest, FillAndItem) {
  const RawTensor t = RawTensor::Full({2, 3}, 1.5, kF16, kGpu);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>(6, 1.5f)));
  t.slice(1, 0, 3, 2).fill_(-4);  // a strided view: only columns 0 and 2
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{-4, 1.5, -4, -4, 1.5, -4}));
  t.zero_();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>(6, 0)));
  t.fill_(-0.0);  // not the memset path: the sign survives
  EXPECT_TRUE(std::signbit(t.select(0, 1).select(0, 1).item()));
  EXPECT_EQ(RawTensor::Ones({1}, kI64, kGpu).item(), 1);
  EXPECT_EQ(RawTensor::Full({}, 3.25, kF32, kGpu).item(), 3.25);
  EXPECT_EQ(RawTensor::Full({}, (1LL << 40) + 1, kI64, kGpu).item(), 1099511627777.0);
  EXPECT_TRUE(ThrowsError([&] { t.item(); }, "item: the tensor has 6 elements"));
  EXPECT_EQ(RawTensor::Zeros({0, 3}, kF32, kGpu).to_vector<float>(), std::vector<float>{});
}

TEST_F(DeviceTensorTest, ToDeviceAndToString) {
  const RawTensor g = RawTensor::FromVector<float>({1, 2}, {2}).to(kGpu);
  EXPECT_TRUE(g.to(kGpu).shares_storage(g));
  EXPECT_TRUE(g.to(kGpu, kF32).shares_storage(g));
  EXPECT_EQ(g.to(Device::Cpu()).device(), Device::Cpu());
  EXPECT_EQ(g.ToString(), "tensor([1, 2], f32, shape=[2], device=cuda:0)");
  const int n = cuda::DeviceCount();
  EXPECT_TRUE(ThrowsErrorExactly([&] { RawTensor::Empty({2}, kF32, Device::Cuda(n)); },
                                 absl::StrCat("empty: cannot allocate on cuda:", n, ": cuda:", n,
                                              " does not exist (DeviceCount() = ", n, ")")));
}

TEST_F(DeviceTensorTest, AcrossDevices) {
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "one CUDA device";
  const RawTensor x = RawTensor::Arange(0, 6).view({2, 3});
  const RawTensor a = x.to(kGpu);
  const RawTensor b = a.to(Device::Cuda(1), kBF16);
  EXPECT_EQ(b.device(), Device::Cuda(1));
  EXPECT_EQ(b.to_vector<float>(), x.to_vector<float>());
  const RawTensor back = RawTensor::Zeros({3, 2}, kF32, kGpu);
  back.transpose(0, 1).copy_(b);
  EXPECT_EQ(back.transpose(0, 1).contiguous().to_vector<float>(), x.to_vector<float>());
}

TEST_F(DeviceTensorTest, OnASideStream) {
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  const RawTensor g = RawTensor::Arange(0, 1 << 20).to(kGpu).to(kF16).to(kF32);
  EXPECT_EQ(g.select(0, 1000).item(), 1000);  // item synchronises the side stream
  cuda::Synchronize();
}

TEST_F(DeviceTensorTest, MixingDevicesInOneOpIsAnError) {
  const RawTensor a = RawTensor::Ones({2});
  const RawTensor b = RawTensor::Ones({2}, kF32, kGpu);
  EXPECT_TRUE(
      ThrowsError([&] { Add(a, b); }, "expected all tensors on one device, got cpu and cuda:0"));
  EXPECT_TRUE(
      ThrowsError([&] { Mul(b, a); }, "expected all tensors on one device, got cuda:0 and cpu"));
}

TEST_F(DeviceTensorTest, SteadyLoopNeedsNoCudaMalloc) {
  const RawTensor host = RawTensor::Arange(0, 4096).view({64, 64});
  auto step = [&] {
    const RawTensor g = host.to(kGpu, kF16);
    const RawTensor t = g.transpose(0, 1).contiguous().to(kF32);
    RawTensor::Zeros({1 << 20}, kF32, kGpu);
    return t.select(0, 3).select(0, 5).item();
  };
  EXPECT_EQ(step(), 5 * 64 + 3);
  const int64_t mallocs = cuda::MemoryStats().segment_mallocs;
  for (int i = 0; i < 50; ++i) step();
  EXPECT_EQ(cuda::MemoryStats().segment_mallocs, mallocs);
}

}  // namespace
}  // namespace tg
