// nn on CUDA: Module::to moves parameters, buffers and gradients in place and back without
// changing a bit; a tiny GPT gives the CPU's loss and gradients on CUDA (f32: within f32
// rounding of differently ordered sums; bf16 autocast: within bf16 rounding), with dropout
// drawing the same mask on both devices; a few AdamW steps through MixedPrecisionOptimizer
// follow the CPU run; sampling picks the same tokens. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/mixed_precision_optimizer.h"
#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "optim/adam.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/generator.h"

namespace tg {
namespace nn {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (DeviceCount(DeviceType::kCuda) == 0) GTEST_SKIP() << "no CUDA device"

const Device kCpu = Device::Cpu();
const Device kGpu = Device::Cuda(0);

std::vector<float> Values(const RawTensor& t) { return t.to_vector<float>(); }

// A layer with a floating and an integer buffer next to its parameters.
class WithBuffers : public Module {
 public:
  explicit WithBuffers(Generator& gen) : Module("WithBuffers") {
    lin_ = register_module("lin", std::make_shared<LinearImpl>(4, 3, gen));
    register_buffer("running", RawTensor::Full({3}, 0.5));
    register_buffer("steps", RawTensor::Full({1}, 7, kI64));
  }
  Tensor forward(const Tensor& x) override { return (*lin_)(x); }

 private:
  std::shared_ptr<LinearImpl> lin_;
};

TEST(CudaModuleTest, ToMovesEverythingInPlaceAndBackBitForBit) {
  SKIP_WITHOUT_GPU();
  Generator gen(0);
  auto m = std::make_shared<WithBuffers>(gen);
  const std::vector<Tensor> params = m->parameters();
  std::vector<std::vector<float>> before;
  for (const Tensor& p : params) before.push_back(Values(p.data()));
  Sum((*m)(Tensor(RawTensor::Ones({2, 4})))).backward();
  const std::vector<float> grad_before = Values(params[0].grad().data());

  m->to(kGpu);
  for (const Tensor& p : m->parameters()) {
    EXPECT_TRUE(p.data().device() == kGpu);
    EXPECT_TRUE(p.grad().data().device() == kGpu);
  }
  EXPECT_TRUE(params[0].is_same(m->parameters()[0]));  // the same Tensors, moved
  EXPECT_TRUE(params[0].data().device() == kGpu);
  for (const auto& [name, b] : m->named_buffers()) EXPECT_TRUE(b.device() == kGpu) << name;
  EXPECT_EQ(m->buffer("steps").dtype(), kI64);

  // Backward on the device accumulates into the moved gradient.
  Sum((*m)(Tensor(RawTensor::Ones({2, 4}, kF32, kGpu)))).backward();
  const std::vector<float> grad_after = Values(params[0].grad().data());
  for (size_t i = 0; i < grad_after.size(); ++i) EXPECT_EQ(grad_after[i], 2 * grad_before[i]);

  m->to(kCpu);
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_TRUE(params[p].data().device().is_cpu());
    EXPECT_EQ(Values(params[p].data()), before[p]);
  }
  EXPECT_EQ(m->buffer("steps").to_vector<int64_t>(), std::vector<int64_t>{7});
  EXPECT_EQ(Values(m->buffer("running")), std::vector<float>(3, 0.5f));
}

// A parameter, then one whose device copy cannot be allocated: 2^38 f32 elements (1 TiB, more
// than any GPU has) held on the host as an expanded scalar.
class TooLargeForTheDevice : public Module {
 public:
  TooLargeForTheDevice() : Module("TooLargeForTheDevice") {
    small_ = register_parameter("small", RawTensor::Full({3}, 1.5));
    huge_ = register_parameter("huge", RawTensor::Scalar(0.25f).expand({int64_t{1} << 38}));
    register_buffer("running", RawTensor::Full({2}, 0.5));
  }
  Tensor small_, huge_;
};

TEST(CudaModuleTest, ToAnUnusableDeviceOrOutOfMemoryMovesNothing) {
  SKIP_WITHOUT_GPU();
  Generator gen(0);
  auto m = std::make_shared<WithBuffers>(gen);
  const RawTensor weight = m->parameters()[0].data();
  const Device missing = Device::Cuda(DeviceCount(DeviceType::kCuda));
  EXPECT_THROW(m->to(missing), Error);
  EXPECT_TRUE(m->parameters()[0].data().shares_storage(weight));
  for (const auto& [name, b] : m->named_buffers()) EXPECT_TRUE(b.device().is_cpu()) << name;

  // The allocation of the second parameter fails after the first one's copy was made: the
  // module is left as it was, not half moved, and the device stays usable.
  auto big = std::make_shared<TooLargeForTheDevice>();
  const RawTensor small = big->small_.data();
  try {
    big->to(kGpu);
    ADD_FAILURE() << "moving 1 TiB to the device did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(big->small_.data().shares_storage(small));
  EXPECT_TRUE(big->huge_.data().device().is_cpu());
  EXPECT_TRUE(big->buffer("running").device().is_cpu());
  EXPECT_EQ(Values(RawTensor::Full({4}, 2, kF32, kGpu)), std::vector<float>(4, 2.0f));
  m->to(kGpu);
  EXPECT_TRUE(m->parameters()[0].data().device() == kGpu);
}

// An optimizer that stepped before the model moved holds its state on the old device: step()
// says so before it changes anything.
TEST(CudaModuleTest, AnOptimizerMadeBeforeTheMoveRefusesToStep) {
  SKIP_WITHOUT_GPU();
  Generator gen(0);
  auto m = std::make_shared<WithBuffers>(gen);
  optim::AdamW opt(m->parameters());
  Sum((*m)(Tensor(RawTensor::Ones({2, 4})))).backward();
  opt.step();
  opt.zero_grad();
  m->to(kGpu);
  Sum((*m)(Tensor(RawTensor::Ones({2, 4}, kF32, kGpu)))).backward();
  std::vector<std::vector<float>> before;
  for (const Tensor& p : m->parameters()) before.push_back(Values(p.data()));
  try {
    opt.step();
    ADD_FAILURE() << "step() with CPU state and CUDA parameters did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("make the optimizer after moving the model"),
              std::string::npos)
        << e.what();
  }
  const std::vector<Tensor> params = m->parameters();
  for (size_t p = 0; p < params.size(); ++p) EXPECT_EQ(Values(params[p].data()), before[p]);
}

GptConfig TinyConfig(double dropout = 0) {
  GptConfig c = GptConfig::Tiny(50);
  c.padded_vocab_size = 64;  // exercises the slice of the padding logits
  c.block_size = 16;
  c.n_embd = 32;
  c.dropout = dropout;
  return c;
}

struct Batch {
  RawTensor x, y;  // [4, 16] i64 on the CPU
};

Batch MakeBatch(uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> x(64), y(64);
  for (auto& v : x) v = gen.NextU32() % 50;
  for (auto& v : y) v = gen.NextU32() % 50;
  return {RawTensor::FromVector(x, {4, 16}), RawTensor::FromVector(y, {4, 16})};
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // in named_parameters() order
};

// The loss and gradients of one forward/backward of a GPT built from `seed` on the CPU and moved
// to `device`, optionally under bf16 autocast.
LossAndGrads ForwardBackward(Device device, bool bf16, double dropout = 0) {
  Generator gen(3), dropout_gen(4);
  Gpt model(TinyConfig(dropout), gen, &dropout_gen);
  model.to(device);
  const Batch b = MakeBatch(9);
  Tensor loss;
  {
    std::optional<amp::AutocastGuard> autocast;
    if (bf16) autocast.emplace(kBF16);
    loss = CrossEntropyLoss(model(Tensor(b.x.to(device))), b.y.to(device));
  }
  loss.backward();
  LossAndGrads out;
  out.loss = loss.item();
  for (const auto& [name, p] : model.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(p.grad().data().device() == device) << name;
    out.grads.push_back(Values(p.grad().data()));
  }
  return out;
}

// |got - want| <= tol * (max |want| of the tensor): gradients are compared relative to their
// scale, since tiny entries carry the absolute error of the large ones they were summed from.
void ExpectGradsClose(const LossAndGrads& got, const LossAndGrads& want, double tol) {
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t p = 0; p < want.grads.size(); ++p) {
    float scale = 0;
    for (float v : want.grads[p]) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < want.grads[p].size(); ++i) {
      EXPECT_NEAR(got.grads[p][i], want.grads[p][i], tol * scale + 1e-9)
          << "parameter " << p << " element " << i;
    }
  }
}

TEST(CudaGptTest, F32LossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const LossAndGrads cpu = ForwardBackward(kCpu, false);
  const LossAndGrads gpu = ForwardBackward(kGpu, false);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  ExpectGradsClose(gpu, cpu, 1e-4);
}

TEST(CudaGptTest, DropoutDrawsTheSameMaskOnBothDevices) {
  SKIP_WITHOUT_GPU();
  const LossAndGrads cpu = ForwardBackward(kCpu, false, /*dropout=*/0.2);
  const LossAndGrads gpu = ForwardBackward(kGpu, false, /*dropout=*/0.2);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  ExpectGradsClose(gpu, cpu, 1e-4);
}

TEST(CudaGptTest, Bf16AutocastLossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const LossAndGrads cpu = ForwardBackward(kCpu, true);
  const LossAndGrads gpu = ForwardBackward(kGpu, true);
  // bf16 keeps 8 bits: products rounded at different points of differently ordered sums.
  EXPECT_NEAR(gpu.loss, cpu.loss, 2e-2 * cpu.loss);
  ExpectGradsClose(gpu, cpu, 5e-2);
}

// Steps of AdamW over bf16 weights with f32 masters, as train_gpt --precision=bf16 does.
std::vector<double> TrainLosses(Device device, int steps) {
  Generator gen(3);
  Gpt model(TinyConfig(), gen);
  model.to(kBF16);
  model.to(device);
  optim::AdamWOptions o;
  o.lr(3e-3);
  o.weight_decay(0.1);
  amp::MixedPrecisionOptimizer opt(std::make_unique<optim::AdamW>(model.parameters(), o));
  std::vector<double> losses;
  const Batch b = MakeBatch(11);
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Tensor loss;
    {
      amp::AutocastGuard autocast(kBF16);
      loss = CrossEntropyLoss(model(Tensor(b.x.to(device))), b.y.to(device));
    }
    opt.backward(loss);
    EXPECT_FALSE(opt.step().skipped);
    losses.push_back(loss.item());
  }
  return losses;
}

TEST(CudaGptTest, Bf16TrainingStepsFollowTheCpuRun) {
  SKIP_WITHOUT_GPU();
  const std::vector<double> cpu = TrainLosses(kCpu, 6), gpu = TrainLosses(kGpu, 6);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 3e-2 * cpu[i]) << i;
  EXPECT_LT(gpu.back(), gpu.front());  // it learns the fixed batch
}

TEST(CudaGptTest, GreedySamplingPicksTheSameTokens) {
  SKIP_WITHOUT_GPU();
  Generator gen(3);
  Gpt cpu(TinyConfig(), gen);
  Generator gen2(3);
  Gpt gpu(TinyConfig(), gen2);
  gpu.to(kGpu);
  Generator s1(1), s2(1);
  EXPECT_EQ(gpu.Generate({1, 2, 3}, 20, s2, 1.0, /*top_k=*/1),
            cpu.Generate({1, 2, 3}, 20, s1, 1.0, /*top_k=*/1));
}

}  // namespace
}  // namespace nn
}  // namespace tg
