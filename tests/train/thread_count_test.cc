// A training step gives the same bits at every thread count: the MLP, the CNN and the tiny GPT,
// each in f32 and in bf16 (f32 masters), three steps of AdamW at 1, 2, 3 and 4 threads (set in
// process with omp_set_num_threads), every parameter compared byte for byte; and the kernels
// whose libraries choose their split by the thread count (products, convolutions, FP8 GEMMs)
// alone, in every dtype. The same binary runs three times (tests/train/BUILD): with every ISA
// the CPU has, and with oneDNN capped at AVX-512 (no BF16/AMX) and at AVX2, so that one machine
// runs the lower ISAs' kernels too (docs/cpu.md has the table of what ran where). This is what lets
// the CPU thread governor (tensor/cpu/thread_governor.h) change the thread count during a run:
// a run's result must not depend on how busy the machine was.
#include <omp.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/models/image.h"
#include "optim/lr_schedule.h"
#include "tensor/cpu/thread_governor.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "train/optimizer_setup.h"
#include "train/train_step.h"

namespace tg {
namespace {

// The parameters (as f32 masters' bytes) after `steps` steps of `model_name` in `dtype` at
// `threads` threads, from the same seed.
std::vector<std::vector<char>> TrainedBytes(const std::string& model_name, DType dtype, int threads,
                                            int steps = 3) {
  const int saved = omp_get_max_threads();
  // `threads` means that many, even on a machine busy with other tests (the governor would
  // lower 2 to 1 there, and the comparison would hold nothing).
  cpu::SetThreadGovernor(false);
  omp_set_num_threads(threads);
  Generator data_gen(0);
  Generator init(1);
  std::shared_ptr<nn::Module> model;
  std::function<Tensor()> loss_fn;
  RawTensor images, labels, x, y;
  if (model_name == "gpt") {
    nn::GptConfig config = nn::GptConfig::Tiny(65);
    const int64_t batch = 32, t = config.block_size;
    RawTensor tokens = RawTensor::Empty({batch, t + 1}, kI64);
    for (int64_t i = 0; i < tokens.numel(); ++i)
      tokens.data<int64_t>()[i] = data_gen.NextU32() % 65;
    x = tokens.slice(1, 0, t).contiguous();
    y = tokens.slice(1, 1, t + 1).contiguous();
    model = std::make_shared<nn::Gpt>(config, init);
    loss_fn = [&] { return nn::CrossEntropyLoss((*model)(Tensor(x)), y); };
  } else {
    const int64_t batch = 128;
    images = RandNormal({batch, 1, 28, 28}, data_gen);
    labels = RawTensor::Empty({batch}, kI64);
    for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = data_gen.NextU32() % 10;
    model = (model_name == "mlp" ? nn::MakeImageMlp(init) : nn::MakeImageCnn(init)).ptr();
    loss_fn = [&] { return nn::CrossEntropyLoss((*model)(Tensor(images.to(dtype))), labels); };
  }
  model->to(dtype);
  train::OptimizerConfig opt_config;
  opt_config.lr = 1e-3;
  train::PrecisionConfig precision;
  precision.dtype = dtype;
  auto opt = train::MakeMixedPrecisionOptimizer(model->parameters(), opt_config, precision);
  EXPECT_TRUE(opt.ok()) << opt.status();
  optim::ConstantLr schedule((*opt)->optimizer());
  for (int i = 0; i < steps; ++i) train::TrainStep(**opt, schedule, dtype, 1.0, loss_fn);
  std::vector<std::vector<char>> bytes;
  for (const Tensor& p : model->parameters()) {
    RawTensor f = p.data().to(kF32).contiguous();
    bytes.emplace_back(f.numel() * sizeof(float));
    std::memcpy(bytes.back().data(), f.data<float>(), bytes.back().size());
  }
  omp_set_num_threads(saved);
  cpu::SetThreadGovernor(true);
  return bytes;
}

class ThreadCountTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(ThreadCountTest, OneTwoThreeAndFourThreadsGiveTheSameBits) {
  const auto& [model, dtype] = GetParam();
  const auto one = TrainedBytes(model, dtype, 1);
  // 3 and 4 threads too (more than this machine's 2 cores is fine for a comparison): oneDNN's
  // convolution weight gradient differed at 3.
  for (int threads : {2, 3, 4}) {
    const auto other = TrainedBytes(model, dtype, threads);
    ASSERT_EQ(one.size(), other.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(one[i] == other[i]) << model << " " << DTypeName(dtype) << ": parameter " << i
                                      << " differs between 1 and " << threads << " threads";
    }
  }
}

// Products alone, through every path: oneDNN (f32), OpenBLAS (f64; and f32 on the shapes whose
// one-thread and two-thread results differed inside the libraries: a 512x384x1536 product, tall
// and thin activations, weight gradients over a long k), with operands stored transposed.
TEST(ThreadCountProductTest, MatmulGivesTheSameBitsAtOneAndTwoThreads) {
  struct Case {
    int64_t m, k, n;
  };
  for (const Case c : {Case{512, 384, 1536}, Case{2048, 64, 64}, Case{2048, 256, 64},
                       Case{64, 2048, 64}, Case{65, 2048, 64}, Case{256, 2048, 64}}) {
    for (DType dtype : {kF32, kF64, kBF16}) {
      for (int layout = 0; layout < 4; ++layout) {
        Generator gen(7);
        const bool ta = layout & 1, tb = layout & 2;
        RawTensor a = RandNormal(ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, gen).to(dtype);
        RawTensor b = RandNormal(tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, gen).to(dtype);
        if (ta) a = a.transpose(0, 1);
        if (tb) b = b.transpose(0, 1);
        std::vector<std::vector<char>> results;
        for (int threads : {1, 2}) {
          const int saved = omp_get_max_threads();
          cpu::SetThreadGovernor(false);
          omp_set_num_threads(threads);
          RawTensor out = Matmul(a, b).to(kF64).contiguous();
          omp_set_num_threads(saved);
          cpu::SetThreadGovernor(true);
          results.emplace_back(out.numel() * sizeof(double));
          std::memcpy(results.back().data(), out.data<double>(), results.back().size());
        }
        EXPECT_TRUE(results[0] == results[1]) << c.m << "x" << c.k << "x" << c.n << " "
                                              << DTypeName(dtype) << " ta " << ta << " tb " << tb;
      }
    }
  }
}

// The bytes of `tensors` (each as f64, contiguous) computed by fn() at `threads` threads.
std::vector<std::vector<char>> BytesAtThreads(int threads,
                                              const std::function<std::vector<RawTensor>()>& fn) {
  const int saved = omp_get_max_threads();
  cpu::SetThreadGovernor(false);
  omp_set_num_threads(threads);
  const std::vector<RawTensor> tensors = fn();
  omp_set_num_threads(saved);
  cpu::SetThreadGovernor(true);
  std::vector<std::vector<char>> bytes;
  for (const RawTensor& t : tensors) {
    const RawTensor f = t.to(kF64).contiguous();
    bytes.emplace_back(f.numel() * sizeof(double));
    std::memcpy(bytes.back().data(), f.data<double>(), bytes.back().size());
  }
  return bytes;
}

// fn() gives the same bytes at 2, 3 and 4 threads as at 1; `what` names the case.
void ExpectSameBitsAtEveryThreadCount(const std::string& what,
                                      const std::function<std::vector<RawTensor>()>& fn) {
  const auto one = BytesAtThreads(1, fn);
  for (int threads : {2, 3, 4}) {
    const auto other = BytesAtThreads(threads, fn);
    ASSERT_EQ(one.size(), other.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(one[i] == other[i])
          << what << ": result " << i << " differs between 1 and " << threads << " threads";
    }
  }
}

// Muon's Newton-Schulz iteration (tensor/cpu/newton_schulz.cc) in every dtype: its blocks of rows
// and of columns, each one single-threaded product, on batches with a partial last block of rows
// (3 matrices of 130 rows: scheduled by matrix at 3 threads, by block at 2 and 4) and of columns
// (2 matrices of 1100 columns: 512 + 512 + 76; by matrix at 2 and 4 threads, by block at 3).
TEST(ThreadCountKernelTest, NewtonSchulzGivesTheSameBitsAtEveryThreadCount) {
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    for (const Shape& shape : {Shape{3, 130, 200}, Shape{2, 40, 1100}}) {
      Generator gen(9);
      const RawTensor x = RandNormal(shape, gen).to(dtype);
      ExpectSameBitsAtEveryThreadCount(
          absl::StrCat("newton_schulz ", DTypeName(dtype), " ", ShapeToString(shape)),
          [&] { return std::vector<RawTensor>{NewtonSchulz(x, 3.4445, -4.775, 2.0315, 5, 1e-7)}; });
    }
  }
}

// The elementwise kernels with row forms and fused multiply-adds (sigmoid and SiLU through the
// vectorised exp, Swiglu forward and backward, AddScaled's Addcmul) on sizes split at different
// places by different thread counts: each element's value depends on nothing else.
TEST(ThreadCountKernelTest, ElementwiseRowFormsGiveTheSameBitsAtEveryThreadCount) {
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    Generator gen(10);
    const RawTensor g = RandNormal({100003}, gen, 0, 3).to(dtype);
    const RawTensor u = RandNormal({100003}, gen).to(dtype);
    const RawTensor dy = RandNormal({100003}, gen).to(dtype);
    ExpectSameBitsAtEveryThreadCount(absl::StrCat("elementwise ", DTypeName(dtype)), [&] {
      const SwigluGrads grads = SwigluBackward(dy, g, u);
      return std::vector<RawTensor>{Sigmoid(g),      Silu(g),       Swiglu(g, u),
                                    grads.grad_gate, grads.grad_up, Addcmul(g, u, dy, 0.001)};
    });
  }
}

// Convolution alone, forward and the three gradients, in every dtype, on the CNN's shapes and
// on batches that are not a multiple of the minibatch chunk (conv.cc), at 1-4 threads: oneDNN's
// primitives (f32, bf16 where the CPU multiplies bf16) and the im2col + GEMM code (f64, f16 and
// whatever oneDNN declines). A run with ONEDNN_MAX_CPU_ISA capped (the _avx2 and
// _avx512_core targets) takes the lower ISAs' kernels on the same machine.
TEST(ThreadCountKernelTest, ConvolutionGivesTheSameBitsAtEveryThreadCount) {
  struct Case {
    int64_t n, c, h, o, k, stride, pad;
  };
  for (const Case c : {Case{128, 1, 28, 32, 3, 1, 1}, Case{37, 32, 14, 64, 3, 1, 1},
                       Case{5, 3, 11, 8, 5, 2, 2}, Case{1, 16, 9, 16, 1, 1, 0}}) {
    for (DType dtype : {kF32, kBF16, kF16, kF64}) {
      Generator gen(3);
      const RawTensor x = RandNormal({c.n, c.c, c.h, c.h}, gen).to(dtype);
      const RawTensor w = RandNormal({c.o, c.c, c.k, c.k}, gen).to(dtype);
      const RawTensor b = RandNormal({c.o}, gen).to(dtype);
      Conv2dParams p;
      p.stride = {c.stride, c.stride};
      p.padding = {c.pad, c.pad};
      const RawTensor y = Conv2d(x, w, b, p);
      const RawTensor g = RandNormal(y.shape(), gen).to(dtype);
      ExpectSameBitsAtEveryThreadCount(
          absl::StrCat("conv ", c.n, "x", c.c, "x", c.h, "x", c.h, " -> ", c.o, " k", c.k, " ",
                       DTypeName(dtype)),
          [&] {
            const Conv2dGrads grads = Conv2dBackward(g, x, w, p);
            return std::vector<RawTensor>{Conv2d(x, w, b, p), grads.grad_input, grads.grad_weight,
                                          grads.grad_bias};
          });
    }
  }
}

// FP8 GEMMs (per-tensor and block scaling, each output dtype) with their casts and amaxes.
TEST(ThreadCountKernelTest, Fp8CastsAndGemmsGiveTheSameBitsAtEveryThreadCount) {
  constexpr int64_t m = 300, n = 260, k = 384;
  for (const Fp8Tiling tiling : {Fp8Tiling::kTensor, Fp8Tiling::k1x128, Fp8Tiling::k128x128}) {
    for (DType out : {kF32, kBF16}) {
      Generator gen(5);
      const RawTensor a = RandNormal({m, k}, gen).to(kBF16);
      const RawTensor b = RandNormal({n, k}, gen).to(kBF16);
      ExpectSameBitsAtEveryThreadCount(
          absl::StrCat("fp8 ", Fp8TilingName(tiling), " -> ", DTypeName(out)), [&] {
            const Fp8Scales sa = Fp8ScaleFromAmax(Fp8Amax(a, tiling), Fp8ScaleOptions{});
            const Fp8Scales sb = Fp8ScaleFromAmax(Fp8Amax(b, tiling), Fp8ScaleOptions{});
            const Fp8CastResult qa = Fp8Cast(a, sa.scale, tiling, kF8E4M3, true, true);
            const Fp8CastResult qb = Fp8Cast(b, sb.scale, tiling, kF8E4M3);
            const RawTensor y = Fp8Gemm(qa.data, sa.scale_inv, tiling, qb.data, sb.scale_inv,
                                        tiling, RawTensor(), out);
            return std::vector<RawTensor>{qa.data_t, qa.amax, y};
          });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ThreadCountTest,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "gpt"),
                                            ::testing::Values(kF32, kBF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  DTypeName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace tg
