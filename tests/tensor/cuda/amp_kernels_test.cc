// The CUDA kernels of mixed precision (tensor/cuda/amp_kernels.h) against the CPU code they
// mirror: the loss-scale update of every LossScaler preset on the device (bit for bit; the same
// cases on the host are loss_scale_update_test), the non-finite check + unscale (tensor/ops.h),
// and the optimizer kernels of the kernel list on CUDA (tensor/cuda/optimizer_kernels.cu): FusedAdam
// (optim::AdamW, fused path, and MixedPrecisionOptimizer's skip/backoff steps), and the global
// grad norm with clipping (optim::clip_grad_norm). Tests that need a GPU skip without one; the
// argument checks run everywhere.
#include "tensor/cuda/amp_kernels.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/variable.h"
#include "gtest/gtest.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/generator.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tests/amp/scaler_cases.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using amp::LossScaler;
using ::tg::testing::RunScalerCase;
using ::tg::testing::SameState;
using ::tg::testing::ScalerCase;
using ::tg::testing::ScalerCases;
using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::Available()) GTEST_SKIP() << "no CUDA device"

const Device kGpu = Device::Cuda(0);

RawTensor ToGpu(const RawTensor& t) { return t.to(kGpu); }
RawTensor ToCpu(const RawTensor& t) { return t.to(Device::Cpu()); }

// Same dtype, shape and bit pattern element by element (any two NaNs count as equal: the CPU
// keeps NaN payloads through f16/bf16 rounding, the GPU's conversions make a canonical NaN).
::testing::AssertionResult SameBits(const RawTensor& expected, const RawTensor& actual) {
  if (expected.dtype() != actual.dtype() || expected.shape() != actual.shape()) {
    return ::testing::AssertionFailure()
           << "expected " << DTypeName(expected.dtype()) << " " << ShapeToString(expected.shape())
           << ", got " << DTypeName(actual.dtype()) << " " << ShapeToString(actual.shape());
  }
  const RawTensor e = ToCpu(expected).contiguous();
  const RawTensor a = ToCpu(actual).contiguous();
  const std::vector<double> ev = e.to_vector<double>();
  const std::vector<double> av = a.to_vector<double>();
  const size_t size = e.element_size();
  const auto* eb = static_cast<const unsigned char*>(e.raw_data());
  const auto* ab = static_cast<const unsigned char*>(a.raw_data());
  int64_t mismatches = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < e.numel(); ++i) {
    if (std::isnan(ev[i]) && std::isnan(av[i])) continue;
    if (std::memcmp(eb + i * size, ab + i * size, size) != 0) {
      if (first < 0) first = i;
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << e.numel() << " elements differ; first at " << first
         << ": expected " << ev[first] << ", got " << av[first] << " (" << DTypeName(e.dtype())
         << ")";
}

// ---- Loss scaler -------------------------------------------------------------------------------

TEST(CudaAmpKernelsTest, ScalerUpdateOnDeviceMatchesLossScalerForEveryPreset) {
  SKIP_WITHOUT_GPU();
  for (const ScalerCase& c : ScalerCases()) {
    const LossScaleState initial = c.make().state();
    const RawTensor state = cuda::UploadScalerState(initial, kGpu);
    const RawTensor found_inf = RawTensor::Zeros({}, kF32, kGpu);
    const RawTensor scale = RawTensor::Zeros({}, kF32, kGpu);
    const RawTensor inv_scale = RawTensor::Zeros({}, kF32, kGpu);
    cuda::WriteScaleOnDevice(state, scale, inv_scale);
    EXPECT_EQ(scale.item(), static_cast<float>(initial.scale));
    RunScalerCase(
        c,
        [&](bool flag) {
          found_inf.fill_(flag ? 1 : 0);
          cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale);
          const LossScaleState s = cuda::DownloadScalerState(state);
          // What the host facade hands to the loss multiply and to the unscale.
          EXPECT_EQ(scale.item(), static_cast<float>(s.scale));
          EXPECT_EQ(inv_scale.item(), static_cast<float>(1.0 / s.scale));
          return s;
        },
        initial);
  }
}

// ---- Non-finite check and unscale ---------------------------------------------------------------

// Tensors of every floating dtype and of sizes around the 64K-element chunk; normal values times
// `magnitude` (with f16 overflow to inf for large magnitudes, as in real scaled gradients).
std::vector<RawTensor> GradList(uint64_t seed, double magnitude) {
  Generator gen(seed);
  std::vector<RawTensor> out;
  const int64_t sizes[] = {1, 1000, 65536, 65537, 200003, 0, 77};
  const DType dtypes[] = {kF32, kF16, kBF16, kF64, kF16, kF32, kBF16};
  for (size_t i = 0; i < 7; ++i) {
    out.push_back(RandNormal({sizes[i]}, gen, 0, magnitude).to(dtypes[i]));
  }
  return out;
}

std::vector<RawTensor> Clones(const std::vector<RawTensor>& ts) {
  std::vector<RawTensor> out;
  for (const RawTensor& t : ts) out.push_back(t.clone());
  return out;
}

std::vector<RawTensor> ToGpu(const std::vector<RawTensor>& ts) {
  std::vector<RawTensor> out;
  for (const RawTensor& t : ts) out.push_back(ToGpu(t));
  return out;
}

void Set(const RawTensor& t, int64_t index, double value) {
  t.flatten().slice(0, index, index + 1).fill_(value);
}

TEST(CudaAmpKernelsTest, NonFiniteCheckAndUnscaleMatchesTheCpuOp) {
  SKIP_WITHOUT_GPU();
  for (int poison = 0; poison < 3; ++poison) {
    SCOPED_TRACE(::testing::Message() << "poison " << poison);
    std::vector<RawTensor> cpu = GradList(11, 1000);
    if (poison == 1) Set(cpu[4], 70000, std::numeric_limits<double>::infinity());
    if (poison == 2) Set(cpu[2], 65535, std::nan(""));
    std::vector<RawTensor> gpu = ToGpu(cpu);
    // 1/3 is not a power of two: every product rounds.
    const RawTensor inv = RawTensor::Scalar(1.0 / 3.0, kF32);
    const RawTensor found_cpu = RawTensor::Zeros({}, kF32);
    const RawTensor found_gpu = RawTensor::Zeros({}, kF32, kGpu);
    NonFiniteCheckAndUnscale(cpu, found_cpu, inv);
    cuda::NonFiniteCheckAndUnscale(gpu, found_gpu, ToGpu(inv));
    EXPECT_EQ(found_gpu.item(), poison == 0 ? 0 : 1);
    EXPECT_EQ(found_gpu.item(), found_cpu.item());
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(SameBits(cpu[i], gpu[i])) << i;
  }
}

TEST(CudaAmpKernelsTest, NonFiniteCheckAccumulatesAndReadsOnly) {
  SKIP_WITHOUT_GPU();
  const std::vector<RawTensor> cpu = GradList(12, 1e5);  // 1e5 overflows f16: inf in the f16 ones
  const std::vector<RawTensor> gpu = ToGpu(cpu);
  const RawTensor found = RawTensor::Zeros({}, kF32, kGpu);
  cuda::NonFiniteCheck({gpu[0], gpu[3]}, found);  // f32 and f64: finite
  EXPECT_EQ(found.item(), 0);
  cuda::NonFiniteCheck(gpu, found);
  EXPECT_EQ(found.item(), 1);
  cuda::NonFiniteCheck({gpu[0]}, found);  // never reset here
  EXPECT_EQ(found.item(), 1);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(SameBits(cpu[i], gpu[i])) << i;
}

TEST(CudaAmpKernelsTest, ManyTensorsSpanSeveralLaunches) {
  SKIP_WITHOUT_GPU();
  Generator gen(13);
  std::vector<RawTensor> cpu;
  for (int i = 0; i < 400; ++i) cpu.push_back(RandNormal({1 + (i * 37) % 3000}, gen).to(kF16));
  Set(cpu[399], 5, std::numeric_limits<double>::infinity());  // in the last launch only
  const std::vector<RawTensor> gpu = ToGpu(cpu);
  const RawTensor inv = RawTensor::Scalar(0.125, kF32);
  const RawTensor found = RawTensor::Zeros({}, kF32, kGpu);
  NonFiniteCheckAndUnscale(cpu, RawTensor::Zeros({}, kF32), inv);
  cuda::NonFiniteCheckAndUnscale(gpu, found, ToGpu(inv));
  EXPECT_EQ(found.item(), 1);
  for (size_t i = 0; i < cpu.size(); ++i) ASSERT_TRUE(SameBits(cpu[i], gpu[i])) << i;
}

// ---- FusedAdam
// -----------------------------------------------------------------------------------

// Plain AdamW on f32 parameters (the master is the parameter): host step numbers, with and
// without weight decay and amsgrad, f32 gradients.
TEST(CudaAmpKernelsTest, FusedAdamMatchesCpuAdamW) {
  SKIP_WITHOUT_GPU();
  for (bool amsgrad : {false, true}) {
    for (double wd : {0.0, 0.1}) {
      SCOPED_TRACE(::testing::Message() << "amsgrad " << amsgrad << " wd " << wd);
      Generator gen(21);
      std::vector<Tensor> params;
      for (int64_t n : {3, 65536 + 100, 1000}) params.emplace_back(RandNormal({n}, gen), true);
      optim::AdamWOptions o;
      o.lr(1e-2);
      o.beta1(0.9);
      o.beta2(0.95);
      o.eps(1e-8);
      o.weight_decay(wd);
      o.amsgrad(amsgrad);
      optim::AdamW cpu(params, o);
      AdamTensorLists lists;
      for (const Tensor& p : params) {
        lists.params.push_back(ToGpu(p.data()));
        lists.exp_avgs.push_back(RawTensor::Zeros(p.shape(), kF32, kGpu));
        lists.exp_avg_sqs.push_back(RawTensor::Zeros(p.shape(), kF32, kGpu));
        if (amsgrad) lists.max_exp_avg_sqs.push_back(RawTensor::Zeros(p.shape(), kF32, kGpu));
      }
      FusedAdamOptions g;
      g.lr = o.lr();
      g.beta1 = o.beta1();
      g.beta2 = o.beta2();
      g.eps = o.eps();
      g.weight_decay = wd;
      g.decay = wd != 0 ? WeightDecay::kDecoupled : WeightDecay::kNone;
      g.amsgrad = amsgrad;
      for (int step = 1; step <= 5; ++step) {
        lists.grads.clear();
        for (const Tensor& p : params) {
          // Shrinking gradients from step 3 on: amsgrad's max then differs from v.
          const RawTensor grad = RandNormal(p.shape(), gen, 0, step < 3 ? 1.0 : 0.1);
          p.set_grad(Tensor(grad));
          lists.grads.push_back(ToGpu(grad));
        }
        cpu.step();
        g.step = step;
        ASSERT_EQ(KernelsFor(kGpu).FusedAdam(lists, g), KernelStatus::kDone);
        for (size_t i = 0; i < params.size(); ++i) {
          const StateDict& s = *cpu.param_state(params[i]);
          ASSERT_TRUE(SameBits(params[i].data(), lists.params[i])) << "param " << i;
          ASSERT_TRUE(SameBits(s.tensor("exp_avg"), lists.exp_avgs[i])) << i;
          ASSERT_TRUE(SameBits(s.tensor("exp_avg_sq"), lists.exp_avg_sqs[i])) << i;
          if (amsgrad) {
            ASSERT_TRUE(SameBits(s.tensor("max_exp_avg_sq"), lists.max_exp_avg_sqs[i])) << i;
          }
        }
      }
    }
  }
}

// A model of f16, bf16 and f32 parameters under MixedPrecisionOptimizer(AdamW) with a PyTorch
// scaler on the CPU, and the same steps driven by the device kernels with no host decision:
// NonFiniteCheck on the scaled low-precision gradients, FusedAdam (unscaling in f32, skipping on
// found_inf, the step count on the device), UpdateScaleOnDevice. Every step starts with
// zero_grad: the optimizer's master gradients accumulate until then (like .grad in PyTorch),
// while the device lists hold only this step's gradients. Step 3 overflows (an inf in an
// f16 gradient), step 6 has a NaN in the f32 parameter's gradient: both are skipped and back the
// scale off; growth happens after two clean steps. Masters, model parameters, moments, step
// counts and the scaler agree bit for bit after every step (the bias corrections come from
// CUDA's pow here, which matches glibc's after rounding to f32 for these steps; see
// FusedAdamOptions::device_step).
TEST(CudaAmpKernelsTest, OverflowSkipBackoffMatchesMixedPrecisionOptimizer) {
  SKIP_WITHOUT_GPU();
  Generator gen(31);
  const std::vector<Tensor> params = {
      Tensor(RandNormal({300, 257}, gen).to(kF16), true),  // two chunks
      Tensor(RandNormal({257}, gen).to(kF16), true),
      Tensor(RandNormal({1000}, gen).to(kBF16), true),
      Tensor(RandNormal({7}, gen), true),  // f32: its own master
  };
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.beta1(0.9);
  o.beta2(0.95);
  o.weight_decay(0.1);
  amp::MixedPrecisionOptimizer::Options mo;
  mo.scaler = std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2.0, 0.5, 2));
  amp::MixedPrecisionOptimizer cpu(std::make_unique<optim::AdamW>(params, o), mo);

  AdamTensorLists lists;
  std::vector<RawTensor> model;  // the device copies of the model parameters
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& master = cpu.master_params()[i];
    lists.params.push_back(ToGpu(master.data()));
    lists.exp_avgs.push_back(RawTensor::Zeros(master.shape(), kF32, kGpu));
    lists.exp_avg_sqs.push_back(RawTensor::Zeros(master.shape(), kF32, kGpu));
    model.push_back(ToGpu(params[i].data()));
    lists.model_params.push_back(master.is_same(params[i]) ? RawTensor() : model.back());
  }
  const RawTensor state = cuda::UploadScalerState(cpu.scaler().state(), kGpu);
  const RawTensor scale = RawTensor::Zeros({}, kF32, kGpu);
  const RawTensor inv_scale = RawTensor::Zeros({}, kF32, kGpu);
  const RawTensor found_inf = RawTensor::Zeros({}, kF32, kGpu);
  const RawTensor step = RawTensor::Zeros({}, kF64, kGpu);
  cuda::WriteScaleOnDevice(state, scale, inv_scale);
  FusedAdamOptions g;
  g.lr = o.lr();
  g.beta1 = o.beta1();
  g.beta2 = o.beta2();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.decay = WeightDecay::kDecoupled;
  g.device_step = step;
  g.inv_scale = inv_scale;
  g.found_inf = found_inf;

  int64_t applied = 0;
  for (int k = 1; k <= 9; ++k) {
    SCOPED_TRACE(::testing::Message() << "step " << k);
    // The scaled gradients a backward would leave in the model's .grad, in the model dtype.
    const double loss_scale = cpu.loss_scale();
    ASSERT_EQ(scale.item(), static_cast<float>(loss_scale));
    cpu.zero_grad();
    lists.grads.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      const RawTensor grad =
          RandNormal(params[i].shape(), gen, 0, 0.01 * loss_scale).to(params[i].dtype());
      if (k == 3 && i == 0) Set(grad, 70000, std::numeric_limits<double>::infinity());
      if (k == 6 && i == 3) Set(grad, 2, std::nan(""));
      params[i].set_grad(Tensor(grad.clone()));
      lists.grads.push_back(ToGpu(grad));
    }
    const amp::StepResult r = cpu.step();
    EXPECT_EQ(r.skipped, k == 3 || k == 6);
    applied += r.skipped ? 0 : 1;

    found_inf.zero_();
    cuda::NonFiniteCheck(lists.grads, found_inf);
    ASSERT_EQ(KernelsFor(kGpu).FusedAdam(lists, g), KernelStatus::kDone);
    cuda::UpdateScaleOnDevice(state, found_inf, scale, inv_scale);

    EXPECT_EQ(found_inf.item(), r.skipped ? 1 : 0);
    EXPECT_EQ(step.item(), applied);
    EXPECT_TRUE(SameState(cpu.scaler().state(), cuda::DownloadScalerState(state)));
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "param " << i);
      const Tensor& master = cpu.master_params()[i];
      ASSERT_TRUE(SameBits(master.data(), lists.params[i]));
      ASSERT_TRUE(
          SameBits(params[i].data(), master.is_same(params[i]) ? lists.params[i] : model[i]));
      const StateDict* s = cpu.optimizer().param_state(master);
      if (s == nullptr) continue;  // no step applied yet: the device moments are still zero
      EXPECT_EQ(s->scalar("step"), applied);
      ASSERT_TRUE(SameBits(s->tensor("exp_avg"), lists.exp_avgs[i]));
      ASSERT_TRUE(SameBits(s->tensor("exp_avg_sq"), lists.exp_avg_sqs[i]));
    }
  }
  EXPECT_EQ(cpu.skipped_steps(), 2);
}

// bf16 gradients straight into f32 masters with host step numbers and inv_scale: the same as
// unscaling f32 copies first and running the CPU AdamW on the masters.
TEST(CudaAmpKernelsTest, FusedAdamUnscalesLowPrecisionGradsInF32) {
  SKIP_WITHOUT_GPU();
  Generator gen(41);
  const Tensor master(RandNormal({5000}, gen), true);
  optim::AdamWOptions o;
  o.lr(3e-3);
  o.weight_decay(0.05);
  optim::AdamW cpu(std::vector<Tensor>{master}, o);
  AdamTensorLists lists;
  lists.params = {ToGpu(master.data())};
  lists.exp_avgs = {RawTensor::Zeros({5000}, kF32, kGpu)};
  lists.exp_avg_sqs = {RawTensor::Zeros({5000}, kF32, kGpu)};
  const RawTensor model = ToGpu(master.data().to(kBF16));
  lists.model_params = {model};
  FusedAdamOptions g;
  g.lr = o.lr();
  g.beta1 = o.beta1();
  g.beta2 = o.beta2();
  g.eps = o.eps();
  g.weight_decay = o.weight_decay();
  g.decay = WeightDecay::kDecoupled;
  const RawTensor inv = RawTensor::Scalar(1.0 / 384.0, kF32);  // not a power of two
  g.inv_scale = ToGpu(inv);
  for (int step = 1; step <= 3; ++step) {
    const RawTensor scaled = RandNormal({5000}, gen, 0, 384).to(kBF16);
    RawTensor grad = scaled.to(kF32);
    NonFiniteCheckAndUnscale({grad}, RawTensor::Zeros({}, kF32), inv);
    master.set_grad(Tensor(grad));
    cpu.step();
    lists.grads = {ToGpu(scaled)};
    g.step = step;
    ASSERT_EQ(KernelsFor(kGpu).FusedAdam(lists, g), KernelStatus::kDone);
    ASSERT_TRUE(SameBits(master.data(), lists.params[0])) << step;
    ASSERT_TRUE(SameBits(master.data().to(kBF16), model)) << step;
  }
}

// ---- Gradient norm and clipping -----------------------------------------------------------------

std::vector<Tensor> WithGrads(const std::vector<RawTensor>& grads) {
  std::vector<Tensor> params;
  for (const RawTensor& g : grads) {
    params.emplace_back(RawTensor::Zeros(g.shape(), g.dtype()), true);
    params.back().set_grad(Tensor(g.clone()));
  }
  return params;
}

TEST(CudaAmpKernelsTest, GlobalGradNormMatchesClipGradNorm) {
  SKIP_WITHOUT_GPU();
  const std::vector<RawTensor> cpu = GradList(51, 3);
  const std::vector<RawTensor> gpu = ToGpu(cpu);
  // 2-norm: f64 sums in another order than the CPU's, so about one f32 ulp from it.
  const double two = optim::clip_grad_norm(WithGrads(cpu), 1e30);
  const RawTensor norm2 = GlobalGradNorm(gpu, 2, kF32);
  EXPECT_EQ(norm2.dtype(), kF32);
  EXPECT_EQ(norm2.dim(), 0);
  EXPECT_NEAR(norm2.item(), two, two * 1e-6);
  // The inf norm is exact: the max of values that f32 holds (f64 elements rounded once).
  const double inf = optim::clip_grad_norm(WithGrads(cpu), 1e30, optim::kInfNorm);
  EXPECT_EQ(GlobalGradNorm(gpu, optim::kInfNorm, kF32).item(), static_cast<float>(inf));
  // NaN anywhere: NaN for both norms.
  Set(gpu[4], 100, std::nan(""));
  EXPECT_TRUE(std::isnan(GlobalGradNorm(gpu, 2, kF32).item()));
  EXPECT_TRUE(std::isnan(GlobalGradNorm(gpu, optim::kInfNorm, kF32).item()));
  // Other norm types: the CUDA kernel declines (the op composes them).
  EXPECT_EQ(KernelsFor(kGpu).GlobalGradNorm(RawTensor::Zeros({}, kF64, kGpu), gpu, 1),
            KernelStatus::kNoKernel);
}

TEST(CudaAmpKernelsTest, ClipByNormScalesLikeClipGradNorm) {
  SKIP_WITHOUT_GPU();
  const std::vector<RawTensor> cpu = GradList(52, 3);
  const std::vector<RawTensor> gpu = ToGpu(cpu);
  const RawTensor norm = GlobalGradNorm(gpu, 2, kF32);
  const double total = norm.item();
  // Not clipped: max_norm above the norm.
  ClipByNorm(gpu, norm, total * 2);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(SameBits(cpu[i], gpu[i])) << i;
  // Clipped: clip_grad_norm's coefficient computed from the device norm, applied as the CPU's
  // MulScalarInPlace does.
  const double max_norm = total / 4;
  ClipByNorm(gpu, norm, max_norm);
  const std::vector<RawTensor> expected = Clones(cpu);
  MulScalarInPlace(expected, max_norm / (total + 1e-6));
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(SameBits(expected[i], gpu[i])) << i;
  // And close to what clip_grad_norm itself leaves: its coefficient comes from the f64 norm, so
  // it may round differently in f32, and then an element may round to the neighbouring value of
  // its dtype (bf16: up to 2^-7 relative).
  const std::vector<Tensor> params = WithGrads(cpu);
  optim::clip_grad_norm(params, max_norm);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::vector<double> e = params[i].grad().data().to_vector<double>();
    const std::vector<double> a = ToCpu(gpu[i]).to_vector<double>();
    for (size_t k = 0; k < e.size(); ++k) {
      ASSERT_NEAR(a[k], e[k], std::fabs(e[k]) * 0x1p-7) << i << " " << k;
    }
  }
  // A non-finite norm leaves the gradients alone (clip_grad_norm's refusal).
  const std::vector<RawTensor> before = Clones(cpu);
  const std::vector<RawTensor> gpu2 = ToGpu(cpu);
  Set(gpu2[1], 3, std::numeric_limits<double>::infinity());
  const RawTensor clipped_norm = GlobalGradNorm(gpu2, 2, kF32);
  ClipByNorm(gpu2, clipped_norm, 1.0);
  EXPECT_TRUE(std::isinf(clipped_norm.item()));
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (i == 1) continue;
    EXPECT_TRUE(SameBits(before[i], gpu2[i])) << i;
  }
}

// f32 gradients whose squares overflow f32 (|x| > 1.8e19) but whose norm does not: the CPU sums
// the squares in double, so its norm is finite and it clips; the device must agree (a sum of
// squares kept in f32 would make the norm inf and leave the gradients unclipped).
TEST(CudaAmpKernelsTest, HugeF32GradsHaveTheCpusFiniteNormAndAreClipped) {
  SKIP_WITHOUT_GPU();
  Generator gen(53);
  const std::vector<RawTensor> cpu = {RawTensor::FromVector<float>({1e20f, -3e20f, 2.0f}, {3}),
                                      RandNormal({70000}, gen, 0, 1e18),
                                      RandNormal({100}, gen).to(kBF16)};
  const std::vector<RawTensor> gpu = ToGpu(cpu);
  const double expected = optim::clip_grad_norm(WithGrads(cpu), 1e30);  // not clipped
  ASSERT_TRUE(std::isfinite(expected));
  const RawTensor norm = GlobalGradNorm(gpu, 2, kF32);
  ASSERT_TRUE(std::isfinite(norm.item()));
  EXPECT_NEAR(norm.item(), expected, expected * 1e-6);
  // Both clip to max_norm 1 (coefficients from the f64 and the f32 norm: a few ulps apart).
  const std::vector<Tensor> params = WithGrads(cpu);
  optim::clip_grad_norm(params, 1.0);
  ClipByNorm(gpu, norm, 1.0);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::vector<double> e = params[i].grad().data().to_vector<double>();
    const std::vector<double> a = ToCpu(gpu[i]).to_vector<double>();
    for (size_t k = 0; k < e.size(); ++k) {
      ASSERT_NEAR(a[k], e[k], std::fabs(e[k]) * 0x1p-7) << i << " " << k;  // bf16's ulp
    }
  }
  // -3e20 / 4.12e20: the 70000 squares of ~1e36 add 7e40 to the first tensor's 1e41.
  EXPECT_NEAR(ToCpu(gpu[0]).to_vector<double>()[1], -3e20 / expected, 1e-5);
}

// ---- Argument checks (no GPU needed: they throw before any CUDA call) ---------------------------

TEST(CudaAmpKernelsTest, RejectsHostTensorsAndBadArguments) {
  const RawTensor x = RawTensor::Zeros({4});
  const RawTensor found = RawTensor::Zeros({});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { cuda::NonFiniteCheckAndUnscale({x}, found, found); },
      "non_finite_check_and_unscale: tensors[0] is on cpu; expected a CUDA tensor"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { cuda::NonFiniteCheck({RawTensor()}, found); },
                                 "non_finite_check: tensors[0] is an undefined tensor"));
  cuda::NonFiniteCheck({}, found);  // nothing to check
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { GlobalGradNorm({}, 2); }, "GlobalGradNorm: tensors is empty"));
  // The CUDA kernels decline what they do not handle before looking at the tensors.
  EXPECT_EQ(cuda::GlobalGradNorm(RawTensor::Zeros({}, kF64), {x}, 3), KernelStatus::kNoKernel);
  EXPECT_TRUE(ThrowsError([&] { cuda::UpdateScaleOnDevice(x, found, RawTensor(), RawTensor()); },
                          "UpdateScaleOnDevice: expected the scaler state of UploadScalerState"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { cuda::UploadScalerState(LossScaleState{}, Device::Cpu()); },
                                 "UploadScalerState: expected a CUDA device, got cpu"));
  AdamTensorLists lists;
  lists.params = {x};
  lists.grads = {x, x};
  lists.exp_avgs = {x};
  lists.exp_avg_sqs = {x};
  FusedAdamOptions options;
  options.step = 1;
  EXPECT_TRUE(ThrowsErrorExactly([&] { FusedAdam(lists, options); },
                                 "FusedAdam: grads has 2 tensors, params has 1"));
  lists.grads = {x};
  EXPECT_TRUE(ThrowsErrorExactly([&] { cuda::FusedAdam(lists, options); },
                                 "FusedAdam: params[0] is on cpu; expected a CUDA tensor"));
  FusedAdamOptions bad = options;
  bad.beta1 = 1;
  EXPECT_TRUE(ThrowsError([&] { FusedAdam(lists, bad); }, "FusedAdam: invalid options"));
  bad = options;
  bad.decay = WeightDecay::kL2;  // no CUDA kernel for L2 decay: declined, nothing read
  EXPECT_EQ(cuda::FusedAdam(lists, bad), KernelStatus::kNoKernel);
}

}  // namespace
}  // namespace tg
