// The optimizer entries of the kernel list (tensor/kernel_list.inc: FusedAdam, FusedSgd,
// GlobalGradNorm, ClipByNorm) on the CPU: the kernels are reached through the CPU's kernel table
// and agree bit for bit with the composed forms (tensor/composed.h); a declined case (a kernel
// table whose entry returns kNoKernel, installed for the test) runs the composed form and gives
// the kernel's result. Argument errors name the op.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/composed.h"
#include "tensor/generator.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

bool SameBits(const RawTensor& a, const RawTensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const RawTensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.numel() * ElementSize(x.dtype())) == 0;
}

std::vector<RawTensor> Clones(const std::vector<RawTensor>& ts) {
  std::vector<RawTensor> out;
  for (const RawTensor& t : ts) out.push_back(t.clone());
  return out;
}

// Installs a copy of the CPU's kernel table with the optimizer entries declining every case, and
// puts the real table back when it goes out of scope.
class DecliningCpuKernels {
 public:
  DecliningCpuKernels() : saved_(KernelsFor(Device::Cpu())) {
    KernelTable t = saved_;
    t.FusedAdam = [](const AdamTensorLists&, const FusedAdamOptions&) {
      return KernelStatus::kNoKernel;
    };
    t.FusedSgd = [](const SgdTensorLists&, const FusedSgdOptions&) {
      return KernelStatus::kNoKernel;
    };
    t.GlobalGradNorm = [](const RawTensor&, const std::vector<RawTensor>&, double) {
      return KernelStatus::kNoKernel;
    };
    t.ClipByNorm = [](const std::vector<RawTensor>&, const RawTensor&, double) {
      return KernelStatus::kNoKernel;
    };
    ReplaceKernels(DeviceType::kCpu, t);
  }
  ~DecliningCpuKernels() { ReplaceKernels(DeviceType::kCpu, saved_); }

 private:
  KernelTable saved_;
};

// Parameters of each floating dtype (one of them a strided view) with gradients and zero state.
struct AdamCase {
  AdamTensorLists lists;

  AdamCase(bool amsgrad, uint64_t seed) {
    Generator gen(seed);
    const std::vector<DType> dtypes = {kF32, kF64, kF16, kBF16, kF32};
    for (size_t i = 0; i < dtypes.size(); ++i) {
      const DType d = dtypes[i];
      const DType cd = d == kF64 ? kF64 : kF32;
      RawTensor p = RandNormal({7, 5}, gen, 0, 1, d);
      if (i == 4) p = RandNormal({5, 7}, gen).transpose(0, 1);  // strided
      lists.params.push_back(p);
      lists.grads.push_back(RandNormal({7, 5}, gen, 0, 1, i == 2 ? kF32 : d));
      lists.exp_avgs.push_back(RawTensor::Zeros({7, 5}, cd));
      lists.exp_avg_sqs.push_back(RawTensor::Zeros({7, 5}, cd));
      if (amsgrad) lists.max_exp_avg_sqs.push_back(RawTensor::Zeros({7, 5}, cd));
    }
    lists.model_params = {RawTensor::Zeros({7, 5}, kBF16), RawTensor(), RawTensor(), RawTensor(),
                          RawTensor()};
  }
  AdamCase Clone() const {
    AdamCase c = *this;
    c.lists.params = Clones(lists.params);
    c.lists.exp_avgs = Clones(lists.exp_avgs);
    c.lists.exp_avg_sqs = Clones(lists.exp_avg_sqs);
    c.lists.max_exp_avg_sqs = Clones(lists.max_exp_avg_sqs);
    c.lists.model_params = {RawTensor::Zeros({7, 5}, kBF16), RawTensor(), RawTensor(), RawTensor(),
                            RawTensor()};
    return c;
  }
};

void ExpectSameAdam(const AdamTensorLists& a, const AdamTensorLists& b) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(SameBits(a.params[i], b.params[i])) << "param " << i;
    EXPECT_TRUE(SameBits(a.exp_avgs[i], b.exp_avgs[i])) << "exp_avg " << i;
    EXPECT_TRUE(SameBits(a.exp_avg_sqs[i], b.exp_avg_sqs[i])) << "exp_avg_sq " << i;
    if (!a.max_exp_avg_sqs.empty()) {
      EXPECT_TRUE(SameBits(a.max_exp_avg_sqs[i], b.max_exp_avg_sqs[i])) << "max " << i;
    }
  }
  EXPECT_TRUE(SameBits(a.model_params[0], b.model_params[0]));
}

FusedAdamOptions AdamOptionsFor(WeightDecay decay, bool amsgrad) {
  FusedAdamOptions o;
  o.lr = 1e-2;
  o.beta2 = 0.95;
  o.weight_decay = decay == WeightDecay::kNone ? 0 : 0.1;
  o.decay = decay;
  o.amsgrad = amsgrad;
  return o;
}

TEST(OptimizerOpsTest, CpuFusedAdamIsReachedThroughTheOpListAndMatchesTheComposedForm) {
  for (WeightDecay decay : {WeightDecay::kNone, WeightDecay::kL2, WeightDecay::kDecoupled}) {
    for (bool amsgrad : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "decay " << static_cast<int>(decay) << " amsgrad " << amsgrad);
      AdamCase kernel(amsgrad, 5);
      AdamCase composed = kernel.Clone();
      FusedAdamOptions o = AdamOptionsFor(decay, amsgrad);
      for (int step = 1; step <= 3; ++step) {
        o.step = step;
        ASSERT_EQ(KernelsFor(Device::Cpu()).FusedAdam(kernel.lists, o), KernelStatus::kDone);
        composed::FusedAdam(composed.lists, o);
      }
      ExpectSameAdam(kernel.lists, composed.lists);
      // The model copy is the f32 parameter rounded once.
      EXPECT_TRUE(SameBits(kernel.lists.model_params[0], kernel.lists.params[0].to(kBF16)));
    }
  }
}

TEST(OptimizerOpsTest, DeclinedFusedAdamRunsTheComposedFormWithTheKernelsResult) {
  AdamCase kernel(true, 6);
  AdamCase declined = kernel.Clone();
  FusedAdamOptions o = AdamOptionsFor(WeightDecay::kDecoupled, true);
  // inv_scale, found_inf and device_step: read on the host by the composed form.
  o.inv_scale = RawTensor::Scalar(1.0 / 384.0, kF32);
  o.found_inf = RawTensor::Zeros({}, kF32);
  for (int step = 1; step <= 2; ++step) {
    o.device_step = RawTensor::Scalar(step - 1, kF64);
    FusedAdam(kernel.lists, o);
    EXPECT_EQ(o.device_step.item(), step);
    o.device_step = RawTensor::Scalar(step - 1, kF64);
    {
      DecliningCpuKernels declining;
      FusedAdam(declined.lists, o);
    }
    EXPECT_EQ(o.device_step.item(), step);
  }
  ExpectSameAdam(kernel.lists, declined.lists);
  // found_inf != 0: nothing is written, device_step stays.
  AdamCase skipped = kernel.Clone();
  o.found_inf.fill_(1);
  o.device_step = RawTensor::Scalar(2, kF64);
  FusedAdam(skipped.lists, o);
  {
    DecliningCpuKernels declining;
    FusedAdam(skipped.lists, o);
  }
  EXPECT_EQ(o.device_step.item(), 2);
  for (size_t i = 0; i < kernel.lists.params.size(); ++i) {
    EXPECT_TRUE(SameBits(skipped.lists.params[i], kernel.lists.params[i])) << i;
  }
}

TEST(OptimizerOpsTest, FusedSgdKernelAndDeclinedCaseMatch) {
  for (bool nesterov : {false, true}) {
    Generator gen(7);
    SgdTensorLists a;
    for (DType d : {kF32, kF64, kBF16}) {
      a.params.push_back(RandNormal({33}, gen, 0, 1, d));
      a.grads.push_back(RandNormal({33}, gen, 0, 1, d));
      a.momentum_buffers.push_back(RawTensor::Empty({33}, d == kF64 ? kF64 : kF32));
    }
    SgdTensorLists b = a;
    b.params = Clones(a.params);
    b.momentum_buffers = Clones(a.momentum_buffers);
    FusedSgdOptions o;
    o.lr = 0.1;
    o.weight_decay = 0.01;
    o.momentum = 0.9;
    o.nesterov = nesterov;
    for (int step = 0; step < 3; ++step) {
      o.init_momentum_buffers = step == 0;
      ASSERT_EQ(KernelsFor(Device::Cpu()).FusedSgd(a, o), KernelStatus::kDone);
      DecliningCpuKernels declining;
      FusedSgd(b, o);
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      EXPECT_TRUE(SameBits(a.params[i], b.params[i])) << i;
      EXPECT_TRUE(SameBits(a.momentum_buffers[i], b.momentum_buffers[i])) << i;
    }
  }
}

TEST(OptimizerOpsTest, GlobalGradNormAndClipByNormKernelAndDeclinedCaseMatch) {
  Generator gen(8);
  const std::vector<RawTensor> grads = {RandNormal({1000}, gen), RandNormal({64}, gen, 0, 1, kBF16),
                                        RandNormal({9, 4}, gen, 0, 1, kF64).transpose(0, 1)};
  for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(p);
    const RawTensor kernel = GlobalGradNorm(grads, p);
    EXPECT_EQ(kernel.dtype(), kF64);
    EXPECT_EQ(kernel.dim(), 0);
    RawTensor declined;
    {
      DecliningCpuKernels declining;
      declined = GlobalGradNorm(grads, p);
    }
    // Summed in another order: equal to f64 rounding (the max is exact).
    EXPECT_NEAR(declined.item(), kernel.item(), 1e-12 * kernel.item());
    if (std::isinf(p)) {
      EXPECT_EQ(declined.item(), kernel.item());
    }
  }
  std::vector<RawTensor> nan = Clones(grads);
  nan[1].fill_(std::nan(""));
  EXPECT_TRUE(std::isnan(GlobalGradNorm(nan, 2).item()));
  {
    DecliningCpuKernels declining;
    EXPECT_TRUE(std::isnan(GlobalGradNorm(nan, std::numeric_limits<double>::infinity()).item()));
  }

  const RawTensor norm = GlobalGradNorm(grads, 2);
  const double max_norm = norm.item() / 3;
  std::vector<RawTensor> a = Clones(grads), b = Clones(grads), c = Clones(grads);
  ClipByNorm(a, norm, max_norm);
  {
    DecliningCpuKernels declining;
    ClipByNorm(b, norm, max_norm);
  }
  MulScalarInPlace(c, max_norm / (norm.item() + 1e-6));
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(SameBits(a[i], b[i])) << i;
    EXPECT_TRUE(SameBits(a[i], c[i])) << i;
  }
  std::vector<RawTensor> untouched = Clones(grads);
  ClipByNorm(untouched, norm, norm.item() * 2);  // clip_coef >= 1
  ClipByNorm(untouched, RawTensor::Scalar(std::numeric_limits<double>::infinity(), kF64), 1);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(SameBits(untouched[i], grads[i])) << i;
}

TEST(OptimizerOpsTest, ErrorsNameTheOp) {
  const RawTensor x = RawTensor::Zeros({4});
  AdamTensorLists lists;
  lists.params = {x};
  lists.grads = {x};
  lists.exp_avgs = {x};
  lists.exp_avg_sqs = {RawTensor::Zeros({3})};
  FusedAdamOptions o;
  o.step = 1;
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { FusedAdam(lists, o); }, "FusedAdam: exp_avg_sqs[0] has shape [3], its parameter [4]"));
  lists.exp_avg_sqs = {RawTensor::Zeros({4}, kF64)};
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { FusedAdam(lists, o); },
      "FusedAdam: exp_avg_sqs[0] is f64; expected f32 for a f32 parameter"));
  o.step = 0;
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { FusedAdam(lists, o); },
      "FusedAdam: step must be >= 1 (the update's step number), got 0"));
  EXPECT_TRUE(testing::ThrowsErrorExactly([&] { GlobalGradNorm({x}, 0); },
                                          "GlobalGradNorm: norm_type must be > 0 (or inf), got 0"));
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { ClipByNorm({x}, RawTensor::Zeros({2}), 1); },
      "ClipByNorm: total_norm must be a one-element f64 or f32 tensor, got f32 [2]"));
}

}  // namespace
}  // namespace tg
