// MixedPrecisionOptimizer with its model on CUDA, step by step against the same run on the CPU:
// the overflow / skip / backoff scenarios of mixed_precision_optimizer_test (every scaler preset,
// with hysteresis and growth, a fused AdamW and a generic SGD, gradient accumulation with an
// overflowing micro-batch, bf16 without scaling) must skip the same steps with the same scales,
// keep the device scaler equal to the host's after every step, and leave parameters within a
// tolerance of the CPU run's (the forward's matmuls round differently on the two devices). Also:
// optim::AdamW on f32 CUDA parameters (the kernel list's FusedAdam kernel) is bit-identical to the
// CPU for the same gradients, SGD and clip_grad_norm agree, and a state_dict saved on CUDA resumes
// on either device. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tensor/cuda/runtime.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace amp {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda::Available()) GTEST_SKIP() << "no CUDA device"

const Device kCpu = Device::Cpu();
const Device kGpu = Device::Cuda(0);

// y = (x w + b) * s: w, b in the model dtype, s an f32 parameter (its own master). Made on the
// CPU from the seed, then moved, so both devices start from the same bits.
struct Model {
  Tensor w, b, s;
  Model(DType dtype, uint64_t seed, Device device) {
    Generator gen(seed);
    w = Tensor(RandNormal({8, 6}, gen).to(dtype).to(device), true);
    b = Tensor(RandNormal({6}, gen).to(dtype).to(device), true);
    s = Tensor(RandNormal({6}, gen).to(device), true);
  }
  std::vector<Tensor> params() const { return {w, b, s}; }
  Tensor Forward(const Tensor& x) const { return Mul(Add(Matmul(x, w), b), s); }
};

Tensor Inputs(DType dtype, uint64_t seed, Device device) {
  Generator gen(seed);
  return Tensor(RandNormal({5, 8}, gen).to(dtype).to(device));
}

Tensor Loss(const Tensor& y) { return Mean(Mul(y, y)); }

std::vector<float> Values(const RawTensor& t) { return t.to_vector<float>(); }

// Equal element by element, any two NaNs counting as equal (an overflowed run's NaN payloads
// depend on the conversion that made them).
::testing::AssertionResult SameValues(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

enum class Opt { kAdamW, kSgd };

std::unique_ptr<optim::Optimizer> MakeOptimizer(Opt which, const Model& m) {
  if (which == Opt::kAdamW) {
    optim::AdamWOptions o;
    o.lr(1e-3);
    o.weight_decay(0.1);
    return std::make_unique<optim::AdamW>(m.params(), o);
  }
  optim::SGDOptions o;
  o.lr(1e-2);
  o.momentum(0.9);
  return std::make_unique<optim::SGD>(m.params(), o);
}

// What one step left behind, for the comparison of the two devices.
struct StepState {
  bool skipped = false;
  double scale_used = 0;
  double scale_after = 0;
  int64_t skipped_steps = 0;
  int64_t iteration = 0;
  std::vector<std::vector<float>> masters;
  std::vector<float> model_w;  // the f16/bf16 model weight, as f32
};

struct Scenario {
  DType dtype = kF16;
  std::function<LossScaler()> scaler;  // null: the optimizer's default for the dtype
  std::optional<bool> check_non_finite;
  Opt optimizer = Opt::kAdamW;
  int steps = 10;
  int micro_batches = 1;
  // Whether micro-batch `micro` of step `step` gets a loss large enough to overflow f16.
  std::function<bool(int step, int micro)> overflow = [](int, int) { return false; };
  double overflow_factor = 1e8;
};

// Runs the scenario on `device`; after every step on CUDA also checks that the device scaler
// equals the host's.
std::vector<StepState> RunScenario(const Scenario& sc, Device device) {
  Model m(sc.dtype, 1, device);
  MixedPrecisionOptimizer::Options o;
  if (sc.scaler) o.scaler = std::make_shared<LossScaler>(sc.scaler());
  o.check_non_finite = sc.check_non_finite;
  MixedPrecisionOptimizer opt(MakeOptimizer(sc.optimizer, m), o);
  EXPECT_EQ(opt.device(), device);
  std::vector<StepState> out;
  for (int step = 0; step < sc.steps; ++step) {
    opt.zero_grad();
    for (int micro = 0; micro < sc.micro_batches; ++micro) {
      Tensor loss = Loss(m.Forward(Inputs(sc.dtype, 100 * step + micro, device)));
      if (sc.overflow(step, micro)) loss = MulScalar(loss, sc.overflow_factor);
      opt.backward(loss);
    }
    const StepResult r = opt.step();
    StepState s;
    s.skipped = r.skipped;
    s.scale_used = r.scale;
    s.scale_after = opt.loss_scale();
    s.skipped_steps = opt.skipped_steps();
    s.iteration = opt.scaler().iteration();
    for (const Tensor& p : opt.master_params()) s.masters.push_back(Values(p.data()));
    s.model_w = Values(m.w.data());
    if (sc.dtype != kF32) {
      // The model weight is its master rounded once (on CUDA: written by the update's own pass).
      EXPECT_TRUE(SameValues(s.model_w, Values(opt.master_params()[0].data().to(sc.dtype))))
          << "step " << step;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The same skips and scales exactly; parameters within `atol` (the forward rounds differently
// on the two devices, but a step applied on one device and skipped on the other would differ by
// a whole update, far more than atol).
void ExpectSameRun(const Scenario& sc, double atol = 2e-4) {
  const std::vector<StepState> cpu = RunScenario(sc, kCpu);
  const std::vector<StepState> gpu = RunScenario(sc, kGpu);
  ASSERT_EQ(cpu.size(), gpu.size());
  int skipped = 0;
  for (size_t step = 0; step < cpu.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(gpu[step].skipped, cpu[step].skipped);
    EXPECT_EQ(gpu[step].scale_used, cpu[step].scale_used);
    EXPECT_EQ(gpu[step].scale_after, cpu[step].scale_after);
    EXPECT_EQ(gpu[step].skipped_steps, cpu[step].skipped_steps);
    EXPECT_EQ(gpu[step].iteration, cpu[step].iteration);
    skipped += cpu[step].skipped;
    ASSERT_EQ(gpu[step].masters.size(), cpu[step].masters.size());
    for (size_t p = 0; p < cpu[step].masters.size(); ++p) {
      const std::vector<float>& c = cpu[step].masters[p];
      const std::vector<float>& g = gpu[step].masters[p];
      ASSERT_EQ(c.size(), g.size());
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_NEAR(g[i], c[i], atol + 1e-4 * std::fabs(c[i])) << "param " << p << " elem " << i;
      }
    }
  }
  if (sc.overflow(1, 0)) {
    EXPECT_GT(skipped, 0) << "the scenario was meant to overflow";
  }
}

// Overflows at steps 1, 2 (consecutive: hysteresis) and 6, clean steps between them long enough
// for growth (interval 3).
bool Overflows(int step, int) { return step == 1 || step == 2 || step == 6; }

TEST(CudaMixedPrecisionTest, PyTorchScalerSkipsBacksOffAndGrowsLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  for (Opt opt : {Opt::kAdamW, Opt::kSgd}) {
    SCOPED_TRACE(opt == Opt::kAdamW ? "AdamW (fused on the device)" : "SGD (tensor ops)");
    Scenario sc;
    sc.scaler = [] { return LossScaler::PyTorch(1024, 2, 0.5, 3); };
    sc.optimizer = opt;
    sc.overflow = Overflows;
    ExpectSameRun(sc);
  }
}

TEST(CudaMixedPrecisionTest, MegatronScalerWithHysteresisMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.scaler = [] { return LossScaler::MegatronDynamic(1024, 1, 2, 0.5, 3, 2); };
  sc.overflow = Overflows;
  ExpectSameRun(sc);
}

TEST(CudaMixedPrecisionTest, DeepSpeedScalerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.scaler = [] { return LossScaler::DeepSpeedDynamic(1024, 2, 3, 1, 2); };
  sc.overflow = Overflows;
  ExpectSameRun(sc);
}

TEST(CudaMixedPrecisionTest, AnOverflowInOneMicroBatchSkipsTheEffectiveBatch) {
  SKIP_WITHOUT_GPU();
  Scenario sc;
  sc.scaler = [] { return LossScaler::PyTorch(1024, 2, 0.5, 3); };
  sc.micro_batches = 3;
  sc.steps = 6;
  sc.overflow = [](int step, int micro) { return (step == 1 && micro == 2) || step == 3; };
  ExpectSameRun(sc);
}

TEST(CudaMixedPrecisionTest, Bf16WithoutScalingSkipsOnlyWhenAskedToCheck) {
  SKIP_WITHOUT_GPU();
  for (bool check : {false, true}) {
    SCOPED_TRACE(check ? "check_non_finite" : "no check (the default)");
    Scenario sc;
    sc.dtype = kBF16;
    if (check) sc.check_non_finite = true;
    sc.steps = 4;
    sc.overflow = [](int step, int) { return step == 2; };
    sc.overflow_factor = HUGE_VAL;  // bf16 has f32's range: only an inf loss overflows it
    const std::vector<StepState> cpu = RunScenario(sc, kCpu);
    const std::vector<StepState> gpu = RunScenario(sc, kGpu);
    for (size_t step = 0; step < cpu.size(); ++step) {
      EXPECT_EQ(gpu[step].skipped, cpu[step].skipped) << step;
      EXPECT_EQ(gpu[step].scale_after, 1.0) << step;
    }
    EXPECT_EQ(gpu[2].skipped, check);
    // Without the check the inf gradients reach the masters on both devices.
    EXPECT_EQ(std::isfinite(gpu[3].masters[0][0]), check);
  }
}

TEST(CudaMixedPrecisionTest, StateDictSavedOnCudaResumesOnEitherDevice) {
  SKIP_WITHOUT_GPU();
  const auto scaler = [] {
    return std::make_shared<LossScaler>(LossScaler::PyTorch(1024, 2, 0.5, 2));
  };
  auto run = [](MixedPrecisionOptimizer& opt, const Model& m, Device device, int from, int to) {
    for (int step = from; step < to; ++step) {
      opt.zero_grad();
      Tensor loss = Loss(m.Forward(Inputs(kF16, 100 + step, device)));
      if (step == 1) loss = MulScalar(loss, 1e8);
      opt.backward(loss);
      opt.step();
    }
  };
  MixedPrecisionOptimizer::Options o;
  o.scaler = scaler();
  Model straight_model(kF16, 1, kGpu);
  MixedPrecisionOptimizer straight(MakeOptimizer(Opt::kAdamW, straight_model), o);
  run(straight, straight_model, kGpu, 0, 6);

  o.scaler = scaler();
  Model first_model(kF16, 1, kGpu);
  MixedPrecisionOptimizer first(MakeOptimizer(Opt::kAdamW, first_model), o);
  run(first, first_model, kGpu, 0, 3);
  StateDict saved = first.state_dict();
  for (auto& [key, t] : saved.tensors) t = t.to(kCpu);  // as a checkpoint file holds it

  for (Device device : {kGpu, kCpu}) {
    SCOPED_TRACE("resumed on " + device.ToString());
    o.scaler = scaler();
    Model resumed_model(kF16, 7, device);
    MixedPrecisionOptimizer resumed(MakeOptimizer(Opt::kAdamW, resumed_model), o);
    resumed_model.s.data().copy_(first_model.s.data());  // f32 params come with the model
    resumed.load_state_dict(saved);
    run(resumed, resumed_model, device, 3, 6);
    EXPECT_EQ(resumed.loss_scale(), straight.loss_scale());
    EXPECT_EQ(resumed.skipped_steps() + first.skipped_steps(), straight.skipped_steps());
    for (size_t p = 0; p < 3; ++p) {
      const std::vector<float> got = Values(resumed.master_params()[p].data());
      const std::vector<float> want = Values(straight.master_params()[p].data());
      for (size_t i = 0; i < got.size(); ++i) {
        // Bit for bit on the same device; within the forward's rounding across devices.
        EXPECT_NEAR(got[i], want[i], device.is_cuda() ? 0.0 : 2e-4) << p << " " << i;
      }
    }
  }
}

// ---- Optimizers on CUDA parameters --------------------------------------------------------------

// f32 parameters on `device` with the same values, and the same gradients for `steps` steps.
std::vector<Tensor> Params(Device device) {
  Generator gen(5);
  return {Tensor(RandNormal({64, 33}, gen).to(device), true),
          Tensor(RandNormal({33}, gen).to(device), true),
          Tensor(RandNormal({7, 3, 5}, gen).to(device), true)};
}

void SetGrads(const std::vector<Tensor>& params, int step) {
  Generator gen(1000 + step);
  for (const Tensor& p : params) {
    p.set_grad(Tensor(RandNormal(p.shape(), gen).to(p.data().device())));
  }
}

TEST(CudaOptimizerTest, AdamWOnF32CudaParamsIsBitIdenticalToTheCpu) {
  SKIP_WITHOUT_GPU();
  for (bool amsgrad : {false, true}) {
    optim::AdamWOptions o;
    o.lr(1e-2);
    o.weight_decay(0.1);
    o.amsgrad(amsgrad);
    optim::AdamWOptions no_decay = o;
    no_decay.weight_decay(0);
    const std::vector<Tensor> cpu = Params(kCpu), gpu = Params(kGpu);
    // Two groups, one without decay, as the training binaries make them.
    optim::AdamW cpu_opt(
        {optim::ParamGroup({cpu[0], cpu[2]}), optim::ParamGroup({cpu[1]}, no_decay)}, o);
    optim::AdamW gpu_opt(
        {optim::ParamGroup({gpu[0], gpu[2]}), optim::ParamGroup({gpu[1]}, no_decay)}, o);
    for (int step = 0; step < 4; ++step) {
      SetGrads(cpu, step);
      SetGrads(gpu, step);
      cpu_opt.step();
      gpu_opt.step();
    }
    for (size_t p = 0; p < cpu.size(); ++p) {
      EXPECT_EQ(Values(gpu[p].data()), Values(cpu[p].data())) << "param " << p;
      EXPECT_EQ(Values(gpu_opt.param_state(gpu[p])->tensor("exp_avg_sq")),
                Values(cpu_opt.param_state(cpu[p])->tensor("exp_avg_sq")));
      EXPECT_EQ(gpu_opt.param_state(gpu[p])->scalar("step"), 4);
    }
  }
}

// Parameters of one group at different step counts (one skipped a step without a gradient) go
// to the FusedAdam kernel in one launch per count; in each launch some masters have a bf16 model
// copy and others none, and one gradient is bf16. Everything stays bit-identical to the CPU's
// fused loop, the state is f32 on the device, and each copy is its master rounded once.
TEST(CudaOptimizerTest, AdamWGroupsByStepCountWithAndWithoutModelCopies) {
  SKIP_WITHOUT_GPU();
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.weight_decay(0.1);
  const std::vector<Tensor> cpu = Params(kCpu), gpu = Params(kGpu);
  optim::AdamW cpu_opt(cpu, o), gpu_opt(gpu, o);
  // Copies for params 0 and 2; param 1 is its own model parameter.
  const RawTensor cpu_copies[] = {cpu[0].data().to(kBF16), cpu[2].data().to(kBF16)};
  const RawTensor gpu_copies[] = {gpu[0].data().to(kBF16), gpu[2].data().to(kBF16)};
  cpu_opt.set_model_copy(cpu[0], cpu_copies[0]);
  cpu_opt.set_model_copy(cpu[2], cpu_copies[1]);
  gpu_opt.set_model_copy(gpu[0], gpu_copies[0]);
  gpu_opt.set_model_copy(gpu[2], gpu_copies[1]);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    SetGrads(cpu, step);
    SetGrads(gpu, step);
    // Param 2's gradient in bf16 (the kernel reads it in its own format).
    cpu[2].set_grad(Tensor(cpu[2].grad().data().to(kBF16)));
    gpu[2].set_grad(Tensor(gpu[2].grad().data().to(kBF16)));
    if (step == 1) {  // param 0 skips this step: from now on it is one step behind
      cpu[0].set_grad(Tensor());
      gpu[0].set_grad(Tensor());
    }
    cpu_opt.step();
    gpu_opt.step();
    for (size_t p = 0; p < cpu.size(); ++p) {
      EXPECT_EQ(Values(gpu[p].data()), Values(cpu[p].data())) << "param " << p;
    }
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(Values(gpu_copies[c]), Values(cpu_copies[c])) << "copy " << c;
      EXPECT_EQ(Values(gpu_copies[c]), Values(gpu[c == 0 ? 0 : 2].data().to(kBF16)))
          << "copy " << c;
    }
  }
  const double want_steps[] = {3, 4, 4};
  for (size_t p = 0; p < gpu.size(); ++p) {
    const StateDict* st = gpu_opt.param_state(gpu[p]);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->scalar("step"), want_steps[p]) << "param " << p;
    for (const char* key : {"exp_avg", "exp_avg_sq"}) {
      const RawTensor& t = st->tensor(key);
      EXPECT_TRUE(t.device() == kGpu) << key;
      EXPECT_EQ(t.dtype(), kF32) << key;
      EXPECT_EQ(Values(t), Values(cpu_opt.param_state(cpu[p])->tensor(key))) << key << " " << p;
    }
  }
}

TEST(CudaOptimizerTest, SgdAndAdamWithL2TakeTheTensorOpsOnTheDevice) {
  SKIP_WITHOUT_GPU();
  optim::SGDOptions so;
  so.lr(0.1);
  so.momentum(0.9);
  so.nesterov(true);
  so.weight_decay(1e-2);
  optim::AdamOptions ao;
  ao.weight_decay(1e-2);  // L2: not the fused kernel's decoupled decay
  const std::vector<Tensor> cpu = Params(kCpu), gpu = Params(kGpu);
  optim::SGD cpu_sgd(std::vector<Tensor>{cpu[0], cpu[1]}, so);
  optim::SGD gpu_sgd(std::vector<Tensor>{gpu[0], gpu[1]}, so);
  optim::Adam cpu_adam(std::vector<Tensor>{cpu[2]}, ao);
  optim::Adam gpu_adam(std::vector<Tensor>{gpu[2]}, ao);
  for (int step = 0; step < 3; ++step) {
    SetGrads(cpu, step);
    SetGrads(gpu, step);
    cpu_sgd.step();
    gpu_sgd.step();
    cpu_adam.step();
    gpu_adam.step();
  }
  for (size_t p = 0; p < cpu.size(); ++p) {
    const std::vector<float> c = Values(cpu[p].data()), g = Values(gpu[p].data());
    for (size_t i = 0; i < c.size(); ++i) EXPECT_NEAR(g[i], c[i], 1e-6 * (1 + std::fabs(c[i])));
  }
}

TEST(CudaOptimizerTest, ClipGradNormOnTheDeviceMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (double norm_type : {2.0, optim::kInfNorm, 1.0}) {
    SCOPED_TRACE(norm_type);
    const std::vector<Tensor> cpu = Params(kCpu), gpu = Params(kGpu);
    SetGrads(cpu, 0);
    SetGrads(gpu, 0);
    const double want = optim::clip_grad_norm(cpu, 0.5, norm_type);
    const double got = optim::clip_grad_norm(gpu, 0.5, norm_type);
    EXPECT_NEAR(got, want, 1e-5 * want);
    for (size_t p = 0; p < cpu.size(); ++p) {
      const std::vector<float> c = Values(cpu[p].grad().data()), g = Values(gpu[p].grad().data());
      for (size_t i = 0; i < c.size(); ++i)
        EXPECT_NEAR(g[i], c[i], 1e-5 * (1e-3 + std::fabs(c[i])));
    }
  }
}

// The host waits of a step on CUDA, counted by the runtime (cuda::HostSyncCount): they are
// amp::StepCore's host reads and nothing else -- f16 with the dynamic scaler one per step (the
// found_inf read that decides the skip; the scale is updated on the device and never read
// back), bf16 (constant scale, no overflow check) none, and a clip one more (its norm). The
// inputs are made before counting (an upload of pageable memory may wait).
TEST(CudaMixedPrecisionTest, HostWaitsPerStepAreStepCoresHostReads) {
  SKIP_WITHOUT_GPU();
  for (const DType dtype : {kF16, kBF16}) {
    Model m(dtype, 1, kGpu);
    MixedPrecisionOptimizer opt(MakeOptimizer(Opt::kAdamW, m));
    std::vector<Tensor> inputs;
    for (int step = 0; step < 4; ++step) inputs.push_back(Inputs(dtype, 100 * step, kGpu));
    auto run = [&](int step, bool clip) {
      opt.zero_grad();
      opt.backward(Loss(m.Forward(inputs[step])));
      if (clip) opt.clip_master_grads(1.0);
      opt.step();
    };
    run(0, false);  // the first step creates the optimizer state
    cuda::Synchronize();
    const int64_t syncs = cuda::HostSyncCount();
    const int64_t reads = opt.step_core().host_reads();
    run(1, false);
    run(2, false);
    run(3, true);
    EXPECT_EQ(cuda::HostSyncCount() - syncs, opt.step_core().host_reads() - reads)
        << DTypeName(dtype);
    EXPECT_EQ(opt.step_core().host_reads() - reads, dtype == kF16 ? 4 : 1) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace amp
}  // namespace tg
