// The tensor core's device dispatch on the CPU: without a backend every CUDA path throws a
// clear error; with a fake backend ("cuda" tensors in host memory) Empty/Zeros/Full, copy_,
// fill_, to(Device), contiguous(), clone(), item(), to_vector() and ToString() reach it with
// the arguments its contract promises (src broadcast to dst's shape), and CPU-only work never
// does.
#include "tensor/device_backend.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/convert.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

// Host memory that claims to live on cuda:<index>.
class FakeDeviceAllocator final : public Allocator {
 public:
  explicit FakeDeviceAllocator(int index) : index_(index) {}
  void* Allocate(size_t nbytes) override { return CpuAllocator()->Allocate(nbytes); }
  void Deallocate(void* ptr, size_t nbytes) override { CpuAllocator()->Deallocate(ptr, nbytes); }
  Device device() const override { return Device::Cuda(index_); }

 private:
  int index_;
};

struct CopyCall {
  Device dst_device, src_device;
  Shape src_shape, src_strides;
  DType dst_dtype, src_dtype;
};

// Elementwise through double (exact for the small values used here), any strides.
void StridedCopy(const RawTensor& dst, const RawTensor& src) {
  const Shape strides = ContiguousStrides(dst.shape());
  for (int64_t i = 0; i < dst.numel(); ++i) {
    int64_t d_off = 0, s_off = 0;
    for (size_t d = 0; d < dst.shape().size(); ++d) {
      const int64_t idx = i / strides[d] % dst.shape()[d];
      d_off += idx * dst.strides()[d];
      s_off += idx * src.strides()[d];
    }
    const double v = Visit(src.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return Convert<double>(static_cast<const T*>(src.raw_data())[s_off]);
    });
    Visit(dst.dtype(), [&](auto tag) {
      using T = decltype(tag);
      static_cast<T*>(dst.raw_data())[d_off] = Convert<T>(v);
    });
  }
}

// The fake "cuda" device's memory (host memory); the kernels registered with it (Install) are the
// CPU's, which work on such tensors, and its preferences are given.
class FakeBackend final : public DeviceBackend {
 public:
  explicit FakeBackend(DevicePreferences preferences = DevicePreferences())
      : FakeBackend(KernelsFor(Device::Cpu()), preferences) {}
  FakeBackend(const KernelTable& kernels, DevicePreferences preferences)
      : DeviceBackend(DeviceType::kCuda), kernels(kernels), preferences(preferences) {}
  int DeviceCount() override { return 2; }
  Allocator* allocator(int index) override {
    TG_CHECK(index >= 0 && index < 2, "cuda:", index, " does not exist (fake)");
    return &allocators_[index];
  }
  void Copy(const RawTensor& dst, const RawTensor& src) override {
    copies.push_back(
        {dst.device(), src.device(), src.shape(), src.strides(), dst.dtype(), src.dtype()});
    EXPECT_EQ(dst.shape(), src.shape());
    StridedCopy(dst, src);
  }
  void Fill(const RawTensor& dst, double value) override {
    fills.push_back(value);
    const RawTensor v = RawTensor::Scalar(value, kF64).expand(dst.shape());
    StridedCopy(dst, v);
  }
  void Synchronize(int) override {}
  void* CurrentStream(int) override { return nullptr; }

  // Registers this memory backend and its kernels as CUDA's; Remove undoes both.
  void Install() {
    RegisterDeviceBackend(this);
    RegisterKernels(DeviceType::kCuda, kernels, preferences);
  }
  static void Remove() {
    UnregisterDeviceBackend(DeviceType::kCuda);
    UnregisterKernels(DeviceType::kCuda);
  }

  KernelTable kernels;
  DevicePreferences preferences;
  std::vector<CopyCall> copies;
  std::vector<double> fills;

 private:
  FakeDeviceAllocator allocators_[2] = {FakeDeviceAllocator(0), FakeDeviceAllocator(1)};
};

constexpr char kNoBackend[] = "no CUDA backend in this binary: link //tensor:devices";

TEST(DeviceBackendTest, WithoutABackendEveryCudaPathSaysWhatToLink) {
  ASSERT_EQ(FindDeviceBackend(DeviceType::kCuda), nullptr);
  EXPECT_TRUE(ThrowsErrorExactly([] { GetDeviceBackend(DeviceType::kCuda); }, kNoBackend));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Empty({2}, kF32, Device::Cuda(0)); },
                                 std::string("empty: cannot allocate on cuda:0: ") + kNoBackend));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Zeros({2}, kF16, Device::Cuda(1)); },
                                 std::string("empty: cannot allocate on cuda:1: ") + kNoBackend));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Ones({2}).to(Device::Cuda(0)); },
                                 std::string("to: cannot allocate on cuda:0: ") + kNoBackend));

  // A device tensor made without the registry (its allocator directly).
  FakeDeviceAllocator fake(0);
  const RawTensor g(std::make_shared<Storage>(8, &fake), {2}, {1}, 0, kF32);
  const RawTensor h = RawTensor::Zeros({2});
  EXPECT_TRUE(ThrowsErrorExactly([&] { h.copy_(g); },
                                 std::string("copy_: from cuda:0 to cpu: ") + kNoBackend));
  EXPECT_TRUE(ThrowsErrorExactly([&] { g.copy_(h); },
                                 std::string("copy_: from cpu to cuda:0: ") + kNoBackend));
  EXPECT_TRUE(ThrowsErrorExactly([&] { g.fill_(1); },
                                 std::string("fill_: tensor on cuda:0: ") + kNoBackend));
  EXPECT_TRUE(ThrowsError([&] { g.select(0, 0).item(); }, kNoBackend));
  EXPECT_TRUE(ThrowsError([&] { g.to_vector<float>(); }, kNoBackend));
  // The CPU keeps working.
  EXPECT_EQ(RawTensor::Full({2}, 3).to_vector<float>(), (std::vector<float>{3, 3}));
}

class FakeBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_.Install(); }
  void TearDown() override { FakeBackend::Remove(); }
  FakeBackend backend_;
};

TEST_F(FakeBackendTest, EmptyAllocatesThroughTheBackend) {
  const RawTensor t = RawTensor::Empty({2, 3}, kF16, Device::Cuda(1));
  EXPECT_EQ(t.device(), Device::Cuda(1));
  EXPECT_EQ(t.storage()->allocator(), backend_.allocator(1));
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.storage()->nbytes(), 12u);
  EXPECT_TRUE(backend_.copies.empty());
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Empty({2}, kF32, Device::Cuda(5)); },
                                 "empty: cannot allocate on cuda:5: cuda:5 does not exist (fake)"));
}

TEST_F(FakeBackendTest, ZerosOnesAndFullFillOnTheBackend) {
  const RawTensor z = RawTensor::Zeros({2, 2}, kF32, Device::Cuda(0));
  const RawTensor o = RawTensor::Ones({3}, kBF16, Device::Cuda(0));
  const RawTensor f = RawTensor::Full({2}, -2.5, kF64, Device::Cuda(1));
  EXPECT_EQ(backend_.fills, (std::vector<double>{0, 1, -2.5}));
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(o.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(f.to_vector<double>(), (std::vector<double>{-2.5, -2.5}));
  EXPECT_EQ(f.device(), Device::Cuda(1));
}

TEST_F(FakeBackendTest, ToDeviceCopiesOnceAndReturnsSelfWhenEqual) {
  const RawTensor x = RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const RawTensor g = x.to(Device::Cuda(0));
  EXPECT_EQ(g.device(), Device::Cuda(0));
  ASSERT_EQ(backend_.copies.size(), 1u);
  EXPECT_EQ(backend_.copies[0].dst_device, Device::Cuda(0));
  EXPECT_EQ(backend_.copies[0].src_device, Device::Cpu());
  EXPECT_TRUE(g.to(Device::Cuda(0)).shares_storage(g));
  EXPECT_TRUE(g.to(Device::Cuda(0), kF32).shares_storage(g));
  EXPECT_TRUE(x.to(Device::Cpu()).shares_storage(x));
  EXPECT_EQ(backend_.copies.size(), 1u);

  // Device and dtype change in one copy; the backend converts.
  const RawTensor h = x.to(Device::Cuda(1), kF16);
  EXPECT_EQ(h.dtype(), kF16);
  ASSERT_EQ(backend_.copies.size(), 2u);
  EXPECT_EQ(backend_.copies[1].dst_dtype, kF16);
  EXPECT_EQ(backend_.copies[1].src_dtype, kF32);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(h.to(Device::Cpu()).device(), Device::Cpu());
}

TEST_F(FakeBackendTest, CopyHandsTheBackendABroadcastSource) {
  const RawTensor dst = RawTensor::Zeros({2, 3}, kF32, Device::Cuda(0));
  dst.copy_(RawTensor::FromVector<double>({7, 8, 9}, {3}));
  ASSERT_EQ(backend_.copies.size(), 1u);
  EXPECT_EQ(backend_.copies[0].src_shape, (Shape{2, 3}));
  EXPECT_EQ(backend_.copies[0].src_strides, (Shape{0, 1}));
  EXPECT_EQ(backend_.copies[0].src_dtype, kF64);
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{7, 8, 9, 7, 8, 9}));

  EXPECT_TRUE(ThrowsErrorExactly([&] { dst.copy_(RawTensor::Zeros({4})); },
                                 "copy_: source shape [4] cannot be broadcast to [2, 3]"));
  const RawTensor row = RawTensor::Zeros({3}, kF32, Device::Cuda(0));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        row.expand({2, 3}).copy_(dst);
      },
      "copy_: the destination of shape [2, 3] is an expanded view (stride 0); writing to it is "
      "ambiguous"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        row.expand({2, 3}).fill_(1);
      },
      "fill_: the destination of shape [2, 3] is an expanded view (stride 0); writing to it is "
      "ambiguous"));
}

TEST_F(FakeBackendTest, ViewsCopiesAndHostReads) {
  const RawTensor g = RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).to(Device::Cuda(0));
  backend_.copies.clear();
  const RawTensor t = g.transpose(0, 1).contiguous();
  EXPECT_EQ(t.device(), Device::Cuda(0));
  ASSERT_EQ(backend_.copies.size(), 1u);
  EXPECT_EQ(backend_.copies[0].src_device, Device::Cuda(0));
  EXPECT_EQ(backend_.copies[0].src_strides, (Shape{1, 3}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(g.contiguous().shares_storage(g));

  const RawTensor c = g.clone();
  EXPECT_FALSE(c.shares_storage(g));
  EXPECT_EQ(c.device(), Device::Cuda(0));
  const RawTensor i = g.to(kI32);
  EXPECT_EQ(i.device(), Device::Cuda(0));
  EXPECT_EQ(i.dtype(), kI32);

  EXPECT_EQ(g.select(0, 1).select(0, 2).item(), 6);
  EXPECT_EQ(g.ToString(), "tensor([[1, 2, 3], [4, 5, 6]], f32, shape=[2, 3], device=cuda:0)");
  EXPECT_EQ(g.ToString(2), "tensor(... 6 elements ..., f32, shape=[2, 3], device=cuda:0)");

  const RawTensor host = RawTensor::Zeros({3, 2});
  host.transpose(0, 1).copy_(g);  // device -> strided host view
  EXPECT_EQ(host.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));

  g.fill_(2);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>(6, 2)));
}

TEST_F(FakeBackendTest, CpuWorkNeverReachesTheBackend) {
  const RawTensor x = RawTensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
  const RawTensor y = x.transpose(0, 1).contiguous().to(kF16).clone();
  RawTensor::Zeros({3}).fill_(4);
  RawTensor::Ones({2, 2}).copy_(y);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 3, 2, 4}));
  EXPECT_EQ(x.select(0, 1).select(0, 0).item(), 3);
  EXPECT_EQ(x.ToString(), "tensor([[1, 2], [3, 4]], f32, shape=[2, 2])");
  EXPECT_TRUE(backend_.copies.empty());
  EXPECT_TRUE(backend_.fills.empty());
}

// Memory and kernels are registered apart: a device with memory only allocates, copies and
// fills (the tensor core needs nothing else), while an op on it says what to link, and the op
// tables do not count it as a device to test. With its kernels it is tested against the CPU.
TEST(DeviceRegistryTest, MemoryWorksWithoutKernelsAndOpsSayWhatToLink) {
  FakeBackend backend;
  RegisterDeviceBackend(&backend);
  const RawTensor t = RawTensor::Full({3}, 2, kF32, Device::Cuda(0));
  EXPECT_EQ(t.to(Device::Cpu()).to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_TRUE(ThrowsErrorExactly([&] { KernelsFor(t.device()); }, kNoBackend));
  EXPECT_EQ(RegisteredDeviceTypes(), std::vector<DeviceType>{DeviceType::kCpu});
  RegisterKernels(DeviceType::kCuda, backend.kernels, backend.preferences);
  EXPECT_EQ(RegisteredDeviceTypes(),
            (std::vector<DeviceType>{DeviceType::kCpu, DeviceType::kCuda}));
  EXPECT_EQ(DevicesToTestAgainstTheCpu(), std::vector<Device>{Device::Cuda(0)});
  EXPECT_EQ(Add(t, t).to(Device::Cpu()).to_vector<float>(), (std::vector<float>{4, 4, 4}));
  FakeBackend::Remove();
}

// The CPU is a backend like any other: registered by its sub-package (tensor/cpu/backend.cc),
// with its allocator, kernel table, stream (none) and preferences, all asked of the registry.
TEST(DeviceRegistryTest, TheCpuIsRegisteredLikeAnyDevice) {
  DeviceBackend* cpu = FindDeviceBackend(DeviceType::kCpu);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->type(), DeviceType::kCpu);
  EXPECT_EQ(DeviceCount(DeviceType::kCpu), 1);
  EXPECT_EQ(DeviceCount(DeviceType::kCuda), 0);  // no CUDA backend in this binary
  EXPECT_EQ(CpuAllocator(), cpu->allocator(0));
  EXPECT_EQ(RawTensor::Empty({2}).storage()->allocator(), cpu->allocator(0));
  EXPECT_TRUE(HasKernels(DeviceType::kCpu));
  EXPECT_EQ(RegisteredDeviceTypes(), std::vector<DeviceType>{DeviceType::kCpu});
  EXPECT_TRUE(DevicesToTestAgainstTheCpu().empty());
  EXPECT_EQ(cpu->CurrentStream(0), nullptr);
  EXPECT_EQ(PreferencesFor(Device::Cpu()).attention_layout,
            DevicePreferences::AttentionLayout::kTokensMajor);
  EXPECT_FALSE(PreferencesFor(Device::Cpu()).attention_grad_out_contiguous);
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { cpu->allocator(1); }, "cpu:1 does not exist (the CPU is device 0)"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        RawTensor::Empty({2}, kF32, Device{DeviceType::kCpu, 1});
      },
      "empty: cannot allocate on cpu: cpu:1 does not exist (the CPU "
      "is device 0)"));
}

TEST(DeviceRegistryTest, AKernelTableMissingAnEntryIsRefused) {
  KernelTable table = KernelsFor(Device::Cpu());
  table.Matmul = nullptr;
  EXPECT_TRUE(ThrowsErrorExactly([&] { ReplaceKernels(DeviceType::kCpu, table); },
                                 "kernel table: no kernel for Matmul"));
  EXPECT_NE(KernelsFor(Device::Cpu()).Matmul, nullptr);  // the CPU's table is unchanged
}

// What the attention backward kernel was handed, recorded by a wrapper around the CPU's.
bool grad_out_was_contiguous = false;
KernelStatus RecordingAttentionBackward(const RawTensor& gq, const RawTensor& gk,
                                        const RawTensor& gv, const RawTensor& go,
                                        const RawTensor& q, const RawTensor& k, const RawTensor& v,
                                        const RawTensor& out, const RawTensor& stats, bool causal,
                                        double scale) {
  grad_out_was_contiguous = go.is_contiguous();
  return KernelsFor(Device::Cpu())
      .ScaledDotProductAttentionBackward(gq, gk, gv, go, q, k, v, out, stats, causal, scale);
}

// The ops take the attention layout and grad_out's contiguity from the device's preferences (no
// branch on the device): the same fake device gives a contiguous [B, H, T, D] output and a
// contiguous grad_out under one set, a [B, T, H, D] one and a strided grad_out under the other,
// with the CPU's values either way.
TEST(DevicePreferencesTest, AttentionLayoutAndGradOutComeFromTheBackend) {
  const RawTensor q =
      RawTensor::FromVector<float>({0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, 0.7f, 0.8f, -0.9f, 1.0f,
                                    0.2f, 0.3f, -0.4f, 0.5f, 0.6f, -0.7f},
                                   {1, 2, 2, 4});
  const RawTensor k = MulScalar(q, -0.5), v = AddScalar(q, 0.25);
  // A strided gradient: the transpose of a [1, 2, 4, 2] tensor.
  const RawTensor dout = RawTensor::FromVector<float>(
                             {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8}, {1, 2, 4, 2})
                             .transpose(2, 3);
  const AttentionResult want = ScaledDotProductAttention(q, k, v, /*causal=*/true, 0.5);
  const AttentionGrads want_grads = ScaledDotProductAttentionBackward(
      dout, q, k, v, want.output, want.stats, /*causal=*/true, 0.5);
  KernelTable kernels = KernelsFor(Device::Cpu());
  kernels.ScaledDotProductAttentionBackward = &RecordingAttentionBackward;
  for (const auto layout : {DevicePreferences::AttentionLayout::kHeadsMajor,
                            DevicePreferences::AttentionLayout::kTokensMajor}) {
    const bool heads_major = layout == DevicePreferences::AttentionLayout::kHeadsMajor;
    DevicePreferences preferences;
    preferences.attention_layout = layout;
    preferences.attention_grad_out_contiguous = heads_major;
    FakeBackend backend(kernels, preferences);
    backend.Install();
    const Device dev = Device::Cuda(0);
    const RawTensor dq = q.to(dev), dk = k.to(dev), dv = v.to(dev);
    const AttentionResult got = ScaledDotProductAttention(dq, dk, dv, /*causal=*/true, 0.5);
    EXPECT_EQ(got.output.device(), dev);
    EXPECT_EQ(got.output.shape(), (Shape{1, 2, 2, 4}));
    EXPECT_EQ(got.output.strides(), heads_major ? (Shape{16, 8, 4, 1}) : (Shape{16, 4, 8, 1}));
    EXPECT_EQ(got.output.to_vector<float>(), want.output.to_vector<float>());
    grad_out_was_contiguous = !heads_major;
    const AttentionGrads grads =
        ScaledDotProductAttentionBackward(dout.to(dev).transpose(2, 3).contiguous().transpose(2, 3),
                                          dq, dk, dv, got.output, got.stats, /*causal=*/true, 0.5);
    EXPECT_EQ(grad_out_was_contiguous, heads_major);
    EXPECT_EQ(grads.grad_q.strides(), got.output.strides());
    EXPECT_EQ(grads.grad_q.to_vector<float>(), want_grads.grad_q.to_vector<float>());
    EXPECT_EQ(grads.grad_v.to_vector<float>(), want_grads.grad_v.to_vector<float>());
    FakeBackend::Remove();
  }
}

}  // namespace
}  // namespace tg
