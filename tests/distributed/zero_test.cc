// ZeroOptimizer on 1, 2 and 4 real ranks (Gloo over loopback): stages 1, 2 and 3 train exactly
// like DDP (the single-process reference: the MixedPrecisionOptimizer over every rank's
// micro-batch, each loss divided by the number of micro-batches) and like DDP itself; f16/bf16
// models; two param groups and a plain backward of the scaled loss; the exact
// bytes of masters + optimizer state per rank; an overflow on one rank skips the step on all;
// the clip norm is the global norm; stage 3 keeps no full parameter after forward and backward;
// stage 2 releases every .grad at once and bounds its bucket memory; state_dict round trips
// (exact resume, the single-process format, across world sizes and stages); the error text.
#include "distributed/zero.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "optim/adam.h"
#include "optim/muon.h"
#include "optim/sgd.h"
#include "tensor/generator.h"
#include "tensor/io/safetensors.h"
#include "tests/distributed/multiprocess.h"
#include "tests/tensor/throws.h"

namespace tg::dist {
namespace {

using ::tg::dist::testing::ExpectAllSucceeded;
using ::tg::dist::testing::Rank;
using ::tg::dist::testing::RankResult;
using ::tg::dist::testing::RunRanks;
using ::tg::testing::ThrowsErrorExactly;

// 7*13 + 13 + 13*5 + 5 = 174 parameters: 174 = 2 * 87, and 4 ranks pad to 176 = 4 * 44.
constexpr int64_t kIn = 7, kHidden = 13, kOut = 5;
constexpr int64_t kNumParams = 174;
constexpr int64_t kRows = 4;  // rows of one micro-batch

std::shared_ptr<nn::Mlp> MakeMlp(DType dtype) {
  Generator gen(7);
  auto model =
      std::make_shared<nn::Mlp>(std::vector<int64_t>{kIn, kHidden, kOut}, gen, nn::Mlp::Options{});
  if (dtype != kF32) model->to(dtype);
  return model;
}

std::unique_ptr<optim::Optimizer> MakeAdamW(const std::vector<Tensor>& params) {
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.weight_decay(0.01);
  return std::make_unique<optim::AdamW>(params, o);
}

// The layers' weights and biases, each in layer order.
struct WeightsAndBiases {
  explicit WeightsAndBiases(const nn::Mlp& model) {
    for (size_t i = 0; i < model.num_layers(); ++i) {
      weights.push_back(model.layer(i)->weight);
      biases.push_back(model.layer(i)->bias);
    }
  }
  std::vector<Tensor> weights, biases;
};

// Two groups: weights with decay 0.1, biases without (and a larger lr).
std::unique_ptr<optim::Optimizer> MakeGroupedAdamW(const nn::Mlp& model) {
  const auto [weights, biases] = WeightsAndBiases(model);
  optim::AdamWOptions o;
  o.lr(1e-2);
  o.weight_decay(0.1);
  optim::AdamWOptions no_decay = o;
  no_decay.weight_decay(0);
  no_decay.lr(2e-2);
  return std::make_unique<optim::AdamW>(
      std::vector<optim::ParamGroup>{optim::ParamGroup(weights),
                                     optim::ParamGroup(biases, no_decay)},
      o);
}

// Micro-batch k of step `step`: rank r's m-th micro-batch is k = m * world + r.
Tensor Loss(nn::Module& model, int step, int k, DType dtype) {
  Generator gen(1000 + 100 * step + k);
  const RawTensor x = RandNormal({kRows, kIn}, gen).to(dtype);
  const RawTensor y = RandNormal({kRows, kOut}, gen);
  return nn::MseLoss(Cast(model(Tensor(x)), kF32), y);
}

struct Config {
  int stage = 1;
  DType dtype = kF32;
  int micro = 1;  // micro-batches per rank per step
  int steps = 20;
  bool reduce_in_f32 = false;
  int64_t bucket_cap_bytes = int64_t{16} << 20;
  int max_inflight_buckets = 2;
  double init_scale = 0;  // > 0: a PyTorch scaler starting there
  // clip_master_grads(clip) every step; the default (inf) only measures the gradient norm.
  double clip = std::numeric_limits<double>::infinity();
  // Overflow injection: at this step, the gradient of fc0.weight's last element becomes inf in
  // the micro-batch of this rank (k = rank, m = 0).
  int inf_step = -1;
  int inf_rank = 0;
  bool two_groups = false;      // MakeGroupedAdamW
  bool sgd = false;             // plain SGD (linear in the gradient: a clip difference shows)
  bool muon = false;            // MuonWithAdamW: the weights to Muon, the biases to AdamW
  bool plain_backward = false;  // opt.scale(loss).backward() instead of opt.backward(loss)
  // Module backward pre-hooks and hooks on every layer (observing: they replace nothing), so the
  // graph holds their identity nodes; the epilogue must still run once per backward.
  bool module_hooks = false;
};

std::unique_ptr<optim::Optimizer> MakeMuonWithAdamW(const nn::Mlp& model) {
  const auto [weights, biases] = WeightsAndBiases(model);
  optim::AdamWOptions adamw;
  adamw.lr(1e-2);
  return std::make_unique<optim::MuonWithAdamW>(std::vector<optim::ParamGroup>{
      optim::ParamGroup(weights, optim::MuonOptions(0.02)), optim::ParamGroup(biases, adamw)});
}

std::unique_ptr<optim::Optimizer> MakeOptimizer(const nn::Mlp& model, const Config& c) {
  if (c.muon) return MakeMuonWithAdamW(model);
  if (c.sgd) {
    optim::SGDOptions o;
    o.lr(0.1);
    return std::make_unique<optim::SGD>(model.parameters(), o);
  }
  return c.two_groups ? MakeGroupedAdamW(model) : MakeAdamW(model.parameters());
}

struct Outcome {
  std::vector<float> params;   // all parameters, f32, concatenated in optimizer order
  std::vector<float> initial;  // the same before training (reference only)
  std::vector<double> norms;
  int64_t skipped = 0;
  double scale = 0;
  int64_t host_reads = 0;      // amp::StepCore::host_reads(): found_inf and norm reads
  int64_t module_hook_calls = 0;  // backward pre-hook and hook calls (Config::module_hooks)
  std::vector<float> masters;  // the f32 masters ("master.<i>" of state_dict), f16/bf16 models
};

std::vector<float> Masters(const StateDict& sd, int64_t n) {
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string key = absl::StrCat("master.", i);
    if (!sd.has_tensor(key)) continue;
    const std::vector<float> v = sd.tensor(key).to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> Concat(const std::vector<RawTensor>& tensors) {
  std::vector<float> out;
  for (const RawTensor& t : tensors) {
    const std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> Concat(const std::vector<Tensor>& vars) {
  std::vector<RawTensor> data;
  for (const Tensor& v : vars) data.push_back(v.data());
  return Concat(data);
}

std::vector<float> MakeMlpParams(DType dtype) { return Concat(MakeMlp(dtype)->parameters()); }

amp::MixedPrecisionOptions MixedOptions(const Config& c) {
  amp::MixedPrecisionOptions o;
  if (c.init_scale > 0) {
    o.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch(c.init_scale));
  }
  return o;
}

// A tensor hook on fc0.weight that makes its last element inf while *armed.
HookHandle InjectInf(nn::Mlp& model, const bool* armed) {
  return model.layer(0)->weight.register_hook([armed](const Tensor& g) -> Tensor {
    if (!*armed) return Tensor();
    RawTensor t = g.data().clone();
    t.view({t.numel()}).narrow(0, t.numel() - 1, 1).fill_(std::numeric_limits<double>::infinity());
    return Tensor(t);
  });
}

// Config::module_hooks: a counting backward pre-hook and hook on every layer of `model`.
std::vector<HookHandle> AddModuleHooks(const Config& c, nn::Mlp& model, int64_t* calls) {
  std::vector<HookHandle> handles;
  if (!c.module_hooks) return handles;
  for (size_t i = 0; i < model.num_layers(); ++i) {
    handles.push_back(
        model.layer(i)->register_full_backward_pre_hook([calls](nn::Module&, const VariableList&) {
          ++*calls;
          return VariableList();
        }));
    handles.push_back(model.layer(i)->register_full_backward_hook(
        [calls](nn::Module&, const VariableList&, const VariableList&) {
          ++*calls;
          return VariableList();
        }));
  }
  return handles;
}

ZeroOptions MakeZeroOptions(const Config& c, std::shared_ptr<nn::Module> model) {
  ZeroOptions zo;
  zo.stage = c.stage;
  zo.module = std::move(model);
  zo.reduce_in_f32 = c.reduce_in_f32;
  zo.bucket_cap_bytes = c.bucket_cap_bytes;
  zo.max_inflight_buckets = c.max_inflight_buckets;
  zo.mixed_precision = MixedOptions(c);
  return zo;
}

Outcome TrainZero(const std::shared_ptr<ProcessGroup>& pg, const Config& c) {
  auto model = MakeMlp(c.dtype);
  ZeroOptimizer opt(pg, MakeOptimizer(*model, c), MakeZeroOptions(c, model));
  bool armed = false;
  HookHandle inject = InjectInf(*model, &armed);
  Outcome out;
  const std::vector<HookHandle> module_hooks = AddModuleHooks(c, *model, &out.module_hook_calls);
  for (int s = 0; s < c.steps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < c.micro; ++m) {
      Tensor loss = Loss(*model, s, m * pg->size() + pg->rank(), c.dtype);
      if (c.micro > 1) loss = MulScalar(loss, 1.0 / c.micro);
      armed = s == c.inf_step && m == 0 && pg->rank() == c.inf_rank;
      if (c.plain_backward) {
        opt.scale(loss).backward();  // the hooks run the same epilogue
      } else {
        opt.backward(loss);
      }
      armed = false;
    }
    out.norms.push_back(opt.clip_master_grads(c.clip));
    opt.step();
  }
  inject.remove();
  out.params = Concat(opt.full_parameters());
  out.host_reads = opt.step_core().host_reads();  // before the reads asked for below
  out.skipped = opt.skipped_steps();
  out.scale = opt.loss_scale();
  out.masters = Masters(opt.state_dict(), static_cast<int64_t>(opt.model_params().size()));
  return out;
}

// What DDP computes, in one process: every micro-batch of every rank, each loss divided by the
// number of micro-batches of the step, accumulated by the MixedPrecisionOptimizer.
Outcome TrainReference(int world, const Config& c) {
  auto model = MakeMlp(c.dtype);
  amp::MixedPrecisionOptimizer opt(MakeOptimizer(*model, c), MixedOptions(c));
  bool armed = false;
  HookHandle inject = InjectInf(*model, &armed);
  Outcome out;
  const std::vector<HookHandle> module_hooks = AddModuleHooks(c, *model, &out.module_hook_calls);
  out.initial = Concat(opt.model_params());
  for (int s = 0; s < c.steps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < c.micro; ++m) {
      for (int r = 0; r < world; ++r) {
        armed = s == c.inf_step && m == 0 && r == c.inf_rank;
        opt.backward(MulScalar(Loss(*model, s, m * world + r, c.dtype), 1.0 / (world * c.micro)));
        armed = false;
      }
    }
    out.norms.push_back(opt.clip_master_grads(c.clip));
    opt.step();
  }
  inject.remove();
  out.params = Concat(opt.model_params());
  out.host_reads = opt.step_core().host_reads();  // before the reads asked for below
  out.skipped = opt.skipped_steps();
  out.scale = opt.loss_scale();
  out.masters = Masters(opt.state_dict(), static_cast<int64_t>(opt.model_params().size()));
  return out;
}

// Copies the rank processes' lines that start with `prefix` into this process's log.
void PrintRankLines(const std::vector<RankResult>& results, const std::string& prefix) {
  for (const RankResult& res : results) {
    std::istringstream lines(res.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(prefix, 0) == 0) std::cout << line << "\n";
    }
  }
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

// Trains with ZeRO on every rank and compares with the reference (computed on each rank).
// Every step's gradient norm (over all shards) must agree within the relative `norm_rtol`:
// AdamW hardly reacts to a wrong gradient scale, the norm does.
void ExpectMatchesReference(int world, const Config& c, double tol, double norm_rtol) {
  auto results = RunRanks(world, [&](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    const Outcome zero = TrainZero(pg, c);
    const Outcome ref = TrainReference(world, c);
    const double diff = MaxAbsDiff(zero.params, ref.params);
    if (r.rank == 0) {
      std::printf(
          "ZeRO parity: stage %d, world %d, %s, micro %d%s: max |param - reference| = "
          "%.3g\n",
          c.stage, world, DTypeName(c.dtype), c.micro,
          c.two_groups ? ", two groups, plain backward" : "", diff);
    }
    EXPECT_LE(diff, tol) << "rank " << r.rank;
    ASSERT_EQ(zero.norms.size(), ref.norms.size());
    for (size_t s = 0; s < ref.norms.size(); ++s) {
      EXPECT_NEAR(zero.norms[s], ref.norms[s], norm_rtol * ref.norms[s]) << "step " << s;
    }
    EXPECT_EQ(zero.skipped, ref.skipped);
    EXPECT_EQ(zero.scale, ref.scale);
    if (c.module_hooks) {  // 2 layers x (pre-hook + hook) per backward, as many backwards
      EXPECT_EQ(zero.module_hook_calls, int64_t{4} * c.steps * c.micro);
      EXPECT_EQ(ref.module_hook_calls, int64_t{4} * c.steps * c.micro * world);
    }
    // The parameters moved (the comparison is not vacuous).
    EXPECT_GT(MaxAbsDiff(ref.params, ref.initial), 0.05);
  });
  ExpectAllSucceeded(results);
  PrintRankLines(results, "ZeRO parity:");
}

// ---- Parity with data-parallel training -------------------------------------------------------

// f32: a power-of-two world makes the reduce-scatter's (g0 + g1 + ...) / W equal, bit for bit,
// to the reference's g0 / W + g1 / W + ..., so the parameters match exactly.
// Two param groups (stage 1/2: a flat buffer each; with the reverse order every parameter
// starts a bucket) and a plain backward of the scaled loss.
TEST(ZeroTest, Stage1MatchesDataParallelTraining) {
  Config c;
  c.stage = 1;
  ExpectMatchesReference(2, c, 0.0, 1e-12);
  ExpectMatchesReference(4, c, 0.0, 1e-12);
  c.two_groups = true;
  c.plain_backward = true;
  ExpectMatchesReference(2, c, 0.0, 1e-12);
}

// Stage 2 with one bucket per parameter (64-byte cap) and one reduction in flight, and with
// gradient accumulation over two micro-batches per rank (summation order differs: f32 tolerance).
TEST(ZeroTest, Stage2MatchesDataParallelTraining) {
  Config c;
  c.stage = 2;
  c.bucket_cap_bytes = 64;
  c.max_inflight_buckets = 1;
  ExpectMatchesReference(2, c, 0.0, 1e-12);
  ExpectMatchesReference(4, c, 0.0, 1e-12);
  c.micro = 2;
  ExpectMatchesReference(2, c, 1e-5, 1e-6);
}

TEST(ZeroTest, Stage3MatchesDataParallelTraining) {
  Config c;
  c.stage = 3;
  ExpectMatchesReference(2, c, 0.0, 1e-12);
  ExpectMatchesReference(4, c, 0.0, 1e-12);
  c.micro = 2;
  ExpectMatchesReference(2, c, 1e-5, 1e-6);
  c.micro = 1;
  c.two_groups = true;  // two flat buffers per unit
  c.plain_backward = true;
  ExpectMatchesReference(4, c, 0.0, 1e-12);
}

// Muon (the weights; AdamW for the biases) under every stage on 2 and 4 ranks: the training is
// one process's bit for bit (the momentum runs on the shards, each matrix is orthogonalised by
// its owner and its result broadcast), and each of the two matrices is orthogonalised once per
// step in the whole group: by rank 0 (the 13 x 7 weight, the larger iteration) and rank 1.
TEST(ZeroTest, MuonMatchesOneProcessAndOrthogonalisesEachMatrixOnce) {
  for (int stage : {1, 2, 3}) {
    Config c;
    c.stage = stage;
    c.muon = true;
    c.bucket_cap_bytes = stage == 2 ? 64 : c.bucket_cap_bytes;  // stage 2: a bucket per matrix
    ExpectMatchesReference(2, c, 0.0, 1e-12);
    ExpectMatchesReference(4, c, 0.0, 1e-12);
  }
  for (int stage : {1, 3}) {
    Config c;
    c.stage = stage;
    c.muon = true;
    c.steps = 3;
    auto results = RunRanks(2, [&](const Rank& r) {
      auto pg = testing::JoinDefaultGroup();
      auto model = MakeMlp(c.dtype);
      ZeroOptimizer opt(pg, MakeOptimizer(*model, c), MakeZeroOptions(c, model));
      for (int s = 0; s < c.steps; ++s) {
        opt.zero_grad();
        opt.backward(Loss(*model, s, r.rank, c.dtype));
        opt.step();
      }
      const int64_t mine =
          dynamic_cast<optim::MuonWithAdamW&>(opt.optimizer()).orthogonalised_matrices();
      EXPECT_EQ(mine, c.steps) << "stage " << stage << ", rank " << r.rank;
      const RawTensor total = RawTensor::Scalar(static_cast<double>(mine), kF64);
      TG_DIST_CHECK_OK(pg->all_reduce(total, ReduceOp::kSum)->wait());
      EXPECT_EQ(total.item(), 2.0 * c.steps) << "stage " << stage;
    });
    ExpectAllSucceeded(results);
  }
}

// Module backward hooks on every layer (their identity nodes in the graph) leave every stage's
// epilogue once per backward and the training identical to the reference's.
TEST(ZeroTest, EveryStageWithModuleBackwardHooks) {
  for (int stage = 1; stage <= 3; ++stage) {
    Config c;
    c.stage = stage;
    c.module_hooks = true;
    ExpectMatchesReference(2, c, 0.0, 1e-12);
    c.plain_backward = true;
    ExpectMatchesReference(2, c, 0.0, 1e-12);
  }
}

// A world size that is not a power of two (3 ranks: one flat buffer of 174 elements in shards of
// 58; in stage 2 one bucket per parameter, each padded to a multiple of 3): summation and
// division orders differ from the reference, so within f32 rounding.
TEST(ZeroTest, EveryStageOnThreeRanks) {
  for (int stage = 1; stage <= 3; ++stage) {
    Config c;
    c.stage = stage;
    if (stage == 2) c.bucket_cap_bytes = 64;
    ExpectMatchesReference(3, c, 1e-5, 1e-5);
  }
}

// The same against DistributedDataParallel itself: equal parameters after 20 steps for every
// stage; bit for bit on 2 ranks (its all_reduce of two ranks adds the same two numbers), within
// f32 summation order on 4 (gloo's ring adds in another order than the rank-ordered
// reduce-scatter).
TEST(ZeroTest, MatchesDistributedDataParallel) {
  for (const int world : {2, 4}) {
    auto results = RunRanks(world, [](const Rank& r) {
      auto pg = testing::JoinDefaultGroup();
      Outcome ddp_out;
      {
        auto model = MakeMlp(kF32);
        DistributedDataParallel ddp(model, pg);
        amp::MixedPrecisionOptimizer opt(MakeAdamW(model->parameters()));
        for (int s = 0; s < 20; ++s) {
          opt.zero_grad();
          Generator gen(1000 + 100 * s + r.rank);  // Loss()'s micro-batch k = rank
          const RawTensor x = RandNormal({kRows, kIn}, gen);
          const RawTensor y = RandNormal({kRows, kOut}, gen);
          opt.backward(nn::MseLoss(Cast(ddp(Tensor(x)), kF32), y));
          opt.step();
        }
        ddp_out.params = Concat(opt.model_params());
      }
      for (int stage = 1; stage <= 3; ++stage) {
        Config c;
        c.stage = stage;
        EXPECT_LE(MaxAbsDiff(TrainZero(pg, c).params, ddp_out.params),
                  r.world_size == 2 ? 0.0 : 1e-5)
            << "stage " << stage;
      }
    });
    ExpectAllSucceeded(results);
  }
}

// f16 and bf16 models: f32 masters, the scaled f16 gradients reduced in f16 (one rounding of
// the f32 sum) or in f32; the reference divides each loss by the world size before backward.
TEST(ZeroTest, LowPrecisionModelsMatchDataParallelTraining) {
  Config c;
  c.dtype = kF16;
  c.init_scale = 1024;
  c.stage = 1;
  ExpectMatchesReference(2, c, 2e-3, 1e-3);
  c.stage = 3;
  c.reduce_in_f32 = true;
  ExpectMatchesReference(2, c, 2e-3, 1e-3);
  Config b;
  b.dtype = kBF16;
  b.stage = 2;
  ExpectMatchesReference(2, b, 1e-2, 1e-2);
}

// The run both step-core tests compare: f16 with a dynamic scaler from 1024, an overflow at
// step 3 and clipping to 0.05 every step, 8 SGD steps (linear in the gradient, so a clip
// coefficient one f32 ulp off shows; AdamW would hide it).
Config StepCoreConfig(int stage) {
  Config c;
  c.stage = stage;
  c.dtype = kF16;
  c.steps = 8;
  c.init_scale = 1024;
  c.inf_step = 3;
  c.clip = 0.05;
  c.sgd = true;
  return c;
}

// One training-step core (amp::StepCore): ZeroOptimizer on one rank is the single-process
// MixedPrecisionOptimizer with its masters cut differently, so an f16 run with a dynamic scaler,
// an overflow and clipping every step must agree on everything the core decides -- the skipped
// step, the scale after every update, the clipped norm -- and on the f32 masters and the f16
// parameters, bit for bit (SGD: linear in the gradient, so a clip coefficient one f32 ulp off
// shows; AdamW would hide it), with the same number of host reads (one found_inf read per step, one
// norm read per clip; the rank's local overflow count stays on the device). Before the core,
// ZeroOptimizer read found_inf twice per step.
TEST(ZeroTest, OneRankRunsTheSingleProcessStepCore) {
  for (int stage = 1; stage <= 3; ++stage) {
    auto results = RunRanks(1, [&](const Rank&) {
      auto pg = testing::JoinDefaultGroup();
      Config c = StepCoreConfig(stage);
      const Outcome zero = TrainZero(pg, c);
      const Outcome ref = TrainReference(1, c);
      EXPECT_EQ(ref.skipped, 1);
      EXPECT_EQ(zero.skipped, ref.skipped) << "stage " << stage;
      EXPECT_EQ(zero.scale, ref.scale) << "stage " << stage;
      ASSERT_EQ(zero.norms.size(), ref.norms.size());
      for (size_t s = 0; s < ref.norms.size(); ++s) {
        if (s == 3) {
          EXPECT_TRUE(std::isinf(zero.norms[s]) && std::isinf(ref.norms[s])) << "step " << s;
          continue;
        }
        EXPECT_GT(ref.norms[s], c.clip) << "step " << s;  // it clips
        // The f64 sum runs over the flat buffer (reverse order in stage 1/2): equal to the
        // last bits.
        EXPECT_DOUBLE_EQ(zero.norms[s], ref.norms[s]) << "stage " << stage << " step " << s;
      }
      EXPECT_EQ(MaxAbsDiff(zero.params, ref.params), 0.0) << "stage " << stage;
      ASSERT_EQ(ref.masters.size(), static_cast<size_t>(kNumParams));
      EXPECT_EQ(zero.masters, ref.masters) << "stage " << stage;  // f32, bit for bit
      EXPECT_EQ(zero.host_reads, 2 * c.steps) << "stage " << stage;
      EXPECT_EQ(ref.host_reads, 2 * c.steps);
      EXPECT_GT(MaxAbsDiff(ref.params, MakeMlpParams(c.dtype)), 1e-3);  // not vacuous
    });
    ExpectAllSucceeded(results);
  }
}

// ---- Memory ------------------------------------------------------------------------------------

// Masters (f32) + AdamW's exp_avg and exp_avg_sq (f32): 12 bytes per element this rank owns.
// Stage 1/2: one bucket of 174 elements, padded to 176 for 4 ranks. Stage 3: units fc0 (104
// elements: 52 / 26 per rank) and fc1 (70: 35 / 18 after padding to 72).
TEST(ZeroTest, ShardedBytesFallAsOneOverWorldSize) {
  struct Case {
    int stage;
    DType dtype;
    int world;
    int64_t shard;        // elements per rank
    int64_t param_bytes;  // model parameter storage held after the step
  };
  const std::vector<Case> cases = {
      {1, kF32, 1, 174, 174 * 4}, {1, kF32, 2, 87, 174 * 4}, {1, kF32, 4, 44, 176 * 4},
      {2, kF32, 4, 44, 176 * 4},  {3, kF32, 1, 174, 0},      {3, kF32, 2, 87, 0},
      {3, kF32, 4, 44, 0},        {3, kF16, 4, 44, 44 * 2},  {1, kBF16, 4, 44, 176 * 2},
  };
  for (const Case& cs : cases) {
    auto results = RunRanks(cs.world, [&](const Rank& r) {
      auto pg = testing::JoinDefaultGroup();
      Config c;
      c.stage = cs.stage;
      c.dtype = cs.dtype;
      auto model = MakeMlp(cs.dtype);
      ZeroOptimizer opt(pg, MakeAdamW(model->parameters()), MakeZeroOptions(c, model));
      EXPECT_EQ(opt.shard_numel(), cs.shard);
      opt.backward(Loss(*model, 0, r.rank, cs.dtype));
      opt.step();
      const ZeroMemory m = opt.memory();
      EXPECT_EQ(m.master_bytes, cs.shard * 4);
      EXPECT_EQ(m.optimizer_state_bytes, cs.shard * 8);
      EXPECT_EQ(m.master_grad_bytes, cs.shard * 4);
      EXPECT_EQ(m.param_bytes, cs.param_bytes);
      if (r.rank == 0) {
        std::printf(
            "ZeRO bytes: stage %d %s world %d: masters %lld + optimizer state %lld = %lld "
            "bytes per rank (master grads %lld, model params %lld)\n",
            cs.stage, DTypeName(cs.dtype), cs.world, static_cast<long long>(m.master_bytes),
            static_cast<long long>(m.optimizer_state_bytes),
            static_cast<long long>(m.sharded_bytes()), static_cast<long long>(m.master_grad_bytes),
            static_cast<long long>(m.param_bytes));
      }
    });
    ExpectAllSucceeded(results);
    PrintRankLines(results, "ZeRO bytes:");  // the figures in the parent's log too
  }
}

// ---- Overflow on one rank ----------------------------------------------------------------------

// Rank 0 makes one gradient element inf at step 3. That element is owned by rank 1 in every
// stage's layout, so only rank 1's shard sees it; the max-reduced found_inf makes both ranks
// skip step 3, back the scale off identically, and keep identical parameters (also equal to
// the reference, which skips the same step).
TEST(ZeroTest, OverflowOnOneRankSkipsTheSameStepOnEveryRank) {
  for (int stage = 1; stage <= 3; ++stage) {
    auto results = RunRanks(2, [&](const Rank& r) {
      auto pg = testing::JoinDefaultGroup();
      Config c;
      c.stage = stage;
      c.steps = 6;
      c.init_scale = 1024;
      c.inf_step = 3;
      c.inf_rank = 0;
      auto model = MakeMlp(kF32);
      ZeroOptimizer opt(pg, MakeAdamW(model->parameters()), MakeZeroOptions(c, model));
      bool armed = false;
      HookHandle inject = InjectInf(*model, &armed);
      std::vector<int> skipped_at;
      for (int s = 0; s < c.steps; ++s) {
        opt.zero_grad();
        armed = s == c.inf_step && r.rank == c.inf_rank;
        opt.backward(Loss(*model, s, r.rank, kF32));
        armed = false;
        if (opt.step().skipped) skipped_at.push_back(s);
      }
      EXPECT_EQ(skipped_at, std::vector<int>{3});
      EXPECT_EQ(opt.skipped_steps(), 1);
      EXPECT_EQ(opt.loss_scale(), 512.0);
      // Only the owner of the element saw the overflow in its own shard.
      EXPECT_EQ(opt.stats().local_overflow_steps, r.rank == 1 ? 1 : 0) << "stage " << stage;
      // Identical parameters on both ranks, and equal to the reference.
      const std::vector<float> mine = Concat(opt.full_parameters());
      RawTensor all = RawTensor::Empty({2 * static_cast<int64_t>(mine.size())});
      TG_DIST_CHECK_OK(pg->all_gather(all, RawTensor::FromVector<float>(
                                               mine, {static_cast<int64_t>(mine.size())}))
                           ->wait());
      const std::vector<float> both = all.to_vector<float>();
      EXPECT_TRUE(std::equal(both.begin(), both.begin() + mine.size(), both.begin() + mine.size()));
      const Outcome ref = TrainReference(2, c);
      EXPECT_EQ(ref.skipped, 1);
      EXPECT_EQ(MaxAbsDiff(mine, ref.params), 0.0);
    });
    ExpectAllSucceeded(results);
  }
}

// ---- Gradient clipping -------------------------------------------------------------------------

// clip_master_grads returns the norm of the whole gradient (every rank's shard), equal to the
// single-process norm, and clips to the same parameters.
TEST(ZeroTest, ClipNormIsTheGlobalNorm) {
  for (int stage : {2, 3}) {
    const int world = stage == 2 ? 2 : 4;
    auto results = RunRanks(world, [&](const Rank&) {
      auto pg = testing::JoinDefaultGroup();
      Config c;
      c.stage = stage;
      c.steps = 6;
      c.clip = 0.05;
      const Outcome zero = TrainZero(pg, c);
      const Outcome ref = TrainReference(world, c);
      ASSERT_EQ(zero.norms.size(), ref.norms.size());
      for (size_t s = 0; s < ref.norms.size(); ++s) {
        EXPECT_GT(ref.norms[s], c.clip);  // it clips
        EXPECT_NEAR(zero.norms[s], ref.norms[s], 1e-12 * ref.norms[s]) << "step " << s;
      }
      EXPECT_LE(MaxAbsDiff(zero.params, ref.params), 1e-6);
    });
    ExpectAllSucceeded(results);
  }
}

// ---- Stage 3: what is resident ------------------------------------------------------------------

TEST(ZeroTest, Stage3KeepsNoFullParameterAfterForwardAndBackward) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Config c;
    c.stage = 3;
    auto model = MakeMlp(kF32);
    ZeroOptimizer opt(pg, MakeAdamW(model->parameters()), MakeZeroOptions(c, model));
    const nn::Linear& fc0 = model->layer(0);
    const Tensor weight = fc0->weight;
    // Between uses: a 1-element NaN placeholder expanded to [13, 7].
    EXPECT_EQ(weight.shape(), (Shape{kHidden, kIn}));
    EXPECT_EQ(weight.data().storage()->nbytes(), 4u);
    EXPECT_TRUE(std::isnan(weight.data().to_vector<float>()[0]));

    std::weak_ptr<Storage> in_forward, in_backward;
    HookHandle pre = fc0->register_forward_pre_hook([&](nn::Module&, const Tensor&) -> Tensor {
      in_forward = weight.data().storage();  // after the gather: the unit's flat buffer
      EXPECT_EQ(weight.data().storage()->nbytes(), 104u * 4);  // 91 + 13, padded to 104
      return Tensor();
    });
    HookHandle grad_hook = weight.register_hook([&](const Tensor&) -> Tensor {
      in_backward = weight.data().storage();  // gathered again for fc0's backward
      EXPECT_EQ(weight.data().storage()->nbytes(), 104u * 4);
      return Tensor();
    });
    for (int s = 0; s < 3; ++s) {
      opt.zero_grad();
      Tensor loss = Loss(*model, s, r.rank, kF32);
      // The forward freed both units: nothing (saved tensors included) holds the buffer.
      EXPECT_TRUE(in_forward.expired());
      EXPECT_EQ(weight.data().storage()->nbytes(), 4u);
      EXPECT_EQ(opt.memory().param_bytes, 0);
      opt.backward(loss);
      EXPECT_TRUE(in_backward.expired());
      EXPECT_EQ(weight.data().storage()->nbytes(), 4u);
      EXPECT_FALSE(weight.grad().defined());  // reduce-scattered and released
      EXPECT_EQ(opt.memory().param_bytes, 0);
      EXPECT_EQ(opt.stats().grad_buffer_bytes, 0);
      opt.step();
    }
    // Every step: each unit gathered once in forward and once in backward; one reduce-scatter
    // per unit, launched from the hooks.
    EXPECT_EQ(opt.stats().forward_gathers, 6);
    EXPECT_EQ(opt.stats().backward_gathers, 6);
    EXPECT_EQ(opt.stats().reduce_scatters, 6);
    EXPECT_EQ(opt.stats().launched_from_hooks, 6);
    // A forward without grad gathers and frees too.
    {
      NoGradGuard no_grad;
      (void)(*model)(Tensor(RawTensor::Zeros({1, kIn})));
    }
    EXPECT_EQ(weight.data().storage()->nbytes(), 4u);
    EXPECT_EQ(opt.stats().forward_gathers, 8);
    pre.remove();
    grad_hook.remove();
  });
  ExpectAllSucceeded(results);
}

// A module with a parameter of its own around a Linear: by default each is a unit of its own
// parameters, and the outer unit's forward (whose saved-tensor hooks are active around the inner
// unit's) nests correctly. One process: the result equals the MixedPrecisionOptimizer's exactly.
class ScaledLinear : public nn::Module {
 public:
  explicit ScaledLinear(uint64_t seed) : Module("ScaledLinear") {
    Generator gen(seed);
    fc_ = register_module("fc", std::make_shared<nn::LinearImpl>(kIn, kOut, gen));
    scale_ = register_parameter("scale", RandNormal({kOut}, gen));
  }
  Tensor forward(const Tensor& x) override { return Mul(Relu((*fc_)(x)), scale_); }

 private:
  std::shared_ptr<nn::LinearImpl> fc_;
  Tensor scale_;
};

TEST(ZeroTest, Stage3UnitsOwnTheirOwnParametersAndNest) {
  auto pg = testing::JoinDefaultGroup();  // one process
  auto model = std::make_shared<ScaledLinear>(3);
  auto ref_model = std::make_shared<ScaledLinear>(3);
  ZeroOptions o;
  o.stage = 3;
  o.module = model;
  ZeroOptimizer opt(pg, MakeAdamW(model->parameters()), o);
  amp::MixedPrecisionOptimizer ref(MakeAdamW(ref_model->parameters()));
  const std::vector<ZeroFlatLayout> layout = opt.layout();
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[0].unit, 0);
  EXPECT_EQ(layout[0].param_names, (std::vector<std::string>{"scale"}));
  EXPECT_EQ(layout[1].unit, 1);
  EXPECT_EQ(layout[1].param_names, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(layout[1].numel, kIn * kOut + kOut);
  for (int s = 0; s < 3; ++s) {
    opt.zero_grad();
    ref.zero_grad();
    opt.backward(Loss(*model, s, 0, kF32));
    ref.backward(Loss(*ref_model, s, 0, kF32));
    // The norm sums squares in chunks of each tensor: ZeRO's flat units group the same
    // gradient's squares differently from separate tensors, so the norms agree to f64 rounding.
    const double norm = ref.clip_master_grads(std::numeric_limits<double>::infinity());
    EXPECT_NEAR(opt.clip_master_grads(std::numeric_limits<double>::infinity()), norm, 1e-12 * norm);
    opt.step();
    ref.step();
  }
  EXPECT_EQ(opt.stats().backward_gathers, 6);
  EXPECT_EQ(Concat(opt.full_parameters()), Concat(ref.model_params()));
  EXPECT_EQ(model->parameters()[0].data().storage()->nbytes(), 4u);  // freed again
}

// ---- Stage 2: no full gradient ------------------------------------------------------------------

TEST(ZeroTest, Stage2ReleasesEveryGradAndBoundsItsBuckets) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Config c;
    c.stage = 2;
    c.bucket_cap_bytes = 64;  // fc1.bias | fc1.weight | fc0.bias | fc0.weight
    c.max_inflight_buckets = 1;
    auto model = MakeMlp(kF32);
    ZeroOptimizer opt(pg, MakeAdamW(model->parameters()), MakeZeroOptions(c, model));
    const std::vector<ZeroFlatLayout> layout = opt.layout();
    ASSERT_EQ(layout.size(), 1u);
    EXPECT_EQ(layout[0].bucket_numels, (std::vector<int64_t>{6, 66, 14, 92}));
    EXPECT_EQ(layout[0].param_names,
              (std::vector<std::string>{"bias", "weight", "bias", "weight"}));
    EXPECT_EQ(opt.shard_numel(), 3 + 33 + 7 + 46);
    // Hooks registered after the optimizer's: the .grad is already gone.
    int seen = 0;
    std::vector<HookHandle> hooks;
    for (const Tensor& p : model->parameters()) {
      hooks.push_back(p.register_post_accumulate_grad_hook([&seen](const Tensor& leaf) {
        EXPECT_FALSE(leaf.grad().defined());
        ++seen;
      }));
    }
    opt.backward(Loss(*model, 0, r.rank, kF32));
    EXPECT_EQ(seen, 4);
    EXPECT_EQ(opt.stats().reduce_scatters, 4);
    EXPECT_EQ(opt.stats().launched_from_hooks, 4);
    // At most two buckets (one in flight, one filling) and their shard outputs at once, below
    // the 696 bytes of the full f32 gradient.
    EXPECT_LE(opt.stats().peak_grad_buffer_bytes, (92 + 66 + 46 + 33) * 4);
    EXPECT_LT(opt.stats().peak_grad_buffer_bytes, kNumParams * 4);
    EXPECT_EQ(opt.stats().grad_buffer_bytes, 0);
    EXPECT_FALSE(opt.step().skipped);
    for (HookHandle& h : hooks) h.remove();
  });
  ExpectAllSucceeded(results);
}

// ---- Errors ------------------------------------------------------------------------------------

// A group on cuda:0 without collectives (no GPU needed): for the device check.
class CudaFakeGroup final : public ProcessGroup {
 public:
  CudaFakeGroup() : ProcessGroup(0, 1, "fake", absl::Seconds(1), Device::Cuda(0)) {}
  const char* backend() const override { return "fake"; }
  std::shared_ptr<Work> all_reduce(const RawTensor&, ReduceOp) override { return Fail(); }
  std::shared_ptr<Work> reduce_scatter(const RawTensor&, const RawTensor&, ReduceOp) override {
    return Fail();
  }
  std::shared_ptr<Work> all_gather(const RawTensor&, const RawTensor&) override { return Fail(); }
  std::shared_ptr<Work> broadcast(const RawTensor&, int) override { return Fail(); }
  std::shared_ptr<Work> barrier() override { return Fail(); }

 private:
  static std::shared_ptr<Work> Fail() { throw Error("CudaFakeGroup: no collectives"); }
};

// ---- state_dict / load_state_dict ------------------------------------------------------------

// Steps [from, to) of TrainZero's loop (no overflow injection, no clipping).
void TrainZeroSteps(ZeroOptimizer& opt, nn::Module& model, const ProcessGroup& pg, const Config& c,
                    int from, int to) {
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    for (int m = 0; m < c.micro; ++m) {
      opt.backward(MulScalar(Loss(model, s, m * pg.size() + pg.rank(), c.dtype), 1.0 / c.micro));
    }
    opt.step();
  }
}

// The same for the single-process reference over `world` micro-batches per step.
void TrainReferenceSteps(amp::MixedPrecisionOptimizer& opt, nn::Module& model, int world,
                         const Config& c, int from, int to) {
  for (int s = from; s < to; ++s) {
    opt.zero_grad();
    for (int k = 0; k < world; ++k) {
      opt.backward(MulScalar(Loss(model, s, k, c.dtype), 1.0 / world));
    }
    opt.step();
  }
}

// `values` in optimizer order: the model's order, or with Muon the weights, then the biases
// (MakeMuonWithAdamW's groups).
void LoadParameters(nn::Mlp& model, const std::vector<RawTensor>& values, bool muon = false) {
  NoGradGuard no_grad;
  std::vector<Tensor> params = model.parameters();
  if (muon) {
    const WeightsAndBiases split(model);
    params = split.weights;
    params.insert(params.end(), split.biases.begin(), split.biases.end());
  }
  ASSERT_EQ(params.size(), values.size());
  for (size_t i = 0; i < params.size(); ++i) params[i].data().copy_(values[i]);
}

// Every key, dtype, shape and scalar of two state dicts, and every tensor value bit for bit
// (tol 0) or within `tol` of the largest magnitude of the tensor.
void ExpectSameState(const StateDict& a, const StateDict& b, const std::string& what,
                     double tol = 0) {
  std::vector<std::string> ka, kb;
  for (const auto& [k, t] : a.tensors) ka.push_back(k);
  for (const auto& [k, t] : b.tensors) kb.push_back(k);
  ASSERT_EQ(ka, kb) << what;
  EXPECT_EQ(a.scalars, b.scalars) << what;
  for (const auto& [k, t] : a.tensors) {
    const RawTensor& u = b.tensor(k);
    ASSERT_EQ(t.dtype(), u.dtype()) << what << " " << k;
    ASSERT_EQ(t.shape(), u.shape()) << what << " " << k;
    const std::vector<double> x = t.to(kF64).to_vector<double>(),
                              y = u.to(kF64).to_vector<double>();
    if (tol == 0) {
      EXPECT_EQ(x, y) << what << " " << k;
      continue;
    }
    double scale = 0, diff = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      scale = std::max(scale, std::abs(y[i]));
      diff = std::max(diff, std::abs(x[i] - y[i]));
    }
    EXPECT_LE(diff, tol * scale) << what << " " << k;
  }
}

// A checkpoint taken after 4 steps and loaded into a fresh model and optimizer of the same
// stage and world size continues exactly like the uninterrupted run (with a dynamic scaler, and
// in f16 with masters, so masters, AdamW state and the scaler all travel). On 2 ranks the
// dictionary is also, key for key, the single-process MixedPrecisionOptimizer's after the same
// steps: bit for bit in f32 (see Stage1MatchesDataParallelTraining), within the f16 reduction's
// rounding in f16.
TEST(ZeroTest, StateDictResumesExactlyAndIsTheSingleProcessOne) {
  for (int run = 0; run < 9; ++run) {  // f32, f16, then f32 with Muon (its momentum buffers)
    const int stage = 1 + run % 3;
    const DType dtype = run < 3 || run >= 6 ? kF32 : kF16;
    const bool muon = run >= 6;
    auto results = RunRanks(2, [stage, dtype, muon](const Rank&) {
      auto pg = testing::JoinDefaultGroup();
      Config c;
      c.stage = stage;
      c.dtype = dtype;
      c.muon = muon;
      c.init_scale = 1024;
      if (stage == 2) c.bucket_cap_bytes = 64;  // several buckets: shards are not contiguous
      auto whole_model = MakeMlp(c.dtype);
      ZeroOptimizer whole(pg, MakeOptimizer(*whole_model, c), MakeZeroOptions(c, whole_model));
      TrainZeroSteps(whole, *whole_model, *pg, c, 0, 8);

      auto first_model = MakeMlp(c.dtype);
      ZeroOptimizer first(pg, MakeOptimizer(*first_model, c), MakeZeroOptions(c, first_model));
      TrainZeroSteps(first, *first_model, *pg, c, 0, 4);
      const StateDict saved = first.state_dict();
      const std::vector<RawTensor> saved_params = first.full_parameters();

      auto ref_model = MakeMlp(c.dtype);
      amp::MixedPrecisionOptimizer ref(MakeOptimizer(*ref_model, c), MixedOptions(c));
      TrainReferenceSteps(ref, *ref_model, 2, c, 0, 4);
      ExpectSameState(saved, ref.state_dict(), "ZeRO vs single process", dtype == kF32 ? 0 : 2e-3);

      auto resumed_model = MakeMlp(c.dtype);
      LoadParameters(*resumed_model, saved_params, muon);  // before: stage 3 shards at construction
      ZeroOptimizer resumed(pg, MakeOptimizer(*resumed_model, c),
                            MakeZeroOptions(c, resumed_model));
      resumed.load_state_dict(saved);
      ExpectSameState(resumed.state_dict(), saved, "after load_state_dict");
      TrainZeroSteps(resumed, *resumed_model, *pg, c, 4, 8);
      EXPECT_EQ(Concat(resumed.full_parameters()), Concat(whole.full_parameters()))
          << "stage " << stage << " " << DTypeName(dtype) << (muon ? " Muon" : "");
      EXPECT_EQ(resumed.loss_scale(), whole.loss_scale());
    });
    ExpectAllSucceeded(results);
  }
}

// A checkpoint moves between world sizes and stages and to a single process. The global batch
// is the same six micro-batches throughout (2 ranks x 3, then 3 ranks x 2), so 4 steps on 2 ranks
// (stage 1) + 4 steps on 3 ranks (stage 3) from the checkpoint equal 8 single-process steps,
// within f32 summation order; so do 4 single-process steps resumed from the same checkpoint.
TEST(ZeroTest, StateDictMovesBetweenWorldSizesStagesAndOneProcess) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/zero_checkpoint.safetensors");
  Config c;
  c.dtype = kBF16;
  ExpectAllSucceeded(RunRanks(2, [&](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Config two = c;
    two.stage = 1;
    two.micro = 3;
    auto model = MakeMlp(c.dtype);
    ZeroOptimizer opt(pg, MakeOptimizer(*model, two), MakeZeroOptions(two, model));
    TrainZeroSteps(opt, *model, *pg, two, 0, 4);
    StateDict sd = opt.state_dict();
    const std::vector<RawTensor> params = opt.full_parameters();
    for (size_t i = 0; i < params.size(); ++i) sd.tensors[absl::StrCat("model.", i)] = params[i];
    if (r.rank == 0) {
      ASSERT_TRUE(io::SaveStateDict(path, sd).ok());
    }
  }));

  // The single-process reference: 8 steps of the six micro-batches.
  auto ref_model = MakeMlp(c.dtype);
  amp::MixedPrecisionOptimizer ref(MakeOptimizer(*ref_model, c), MixedOptions(c));
  TrainReferenceSteps(ref, *ref_model, 6, c, 0, 8);
  const std::vector<float> expected = Concat(ref.model_params());

  absl::StatusOr<StateDict> loaded = io::LoadStateDict(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<RawTensor> params;
  for (size_t i = 0; loaded->has_tensor(absl::StrCat("model.", i)); ++i) {
    params.push_back(loaded->tensor(absl::StrCat("model.", i)));
  }
  StateDict opt_state = *loaded;
  for (size_t i = 0; i < params.size(); ++i) opt_state.tensors.erase(absl::StrCat("model.", i));

  auto three_ranks = RunRanks(3, [&](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Config three = c;
    three.stage = 3;
    three.micro = 2;
    auto model = MakeMlp(c.dtype);
    LoadParameters(*model, params);
    ZeroOptimizer opt(pg, MakeOptimizer(*model, three), MakeZeroOptions(three, model));
    opt.load_state_dict(opt_state);
    TrainZeroSteps(opt, *model, *pg, three, 4, 8);
    const double diff = MaxAbsDiff(Concat(opt.full_parameters()), expected);
    EXPECT_LE(diff, 1e-2) << "bf16 parameters: within a few bf16 ulps of the reference";
    if (r.rank == 0) {
      std::printf("ZeRO checkpoint: 2 ranks stage 1 -> 3 ranks stage 3: max |diff| %.3g\n", diff);
    }
  });
  ExpectAllSucceeded(three_ranks);
  PrintRankLines(three_ranks, "ZeRO checkpoint:");

  auto one_model = MakeMlp(c.dtype);
  LoadParameters(*one_model, params);
  amp::MixedPrecisionOptimizer one(MakeOptimizer(*one_model, c), MixedOptions(c));
  one.load_state_dict(opt_state);
  TrainReferenceSteps(one, *one_model, 6, c, 4, 8);
  const double one_diff = MaxAbsDiff(Concat(one.model_params()), expected);
  EXPECT_LE(one_diff, 1e-2);
  std::printf("ZeRO checkpoint: 2 ranks stage 1 -> one process: max |diff| %.3g\n", one_diff);
  EXPECT_GT(MaxAbsDiff(expected, Concat(MakeMlp(c.dtype)->parameters())), 0.05)
      << "the parameters moved: the comparison is not vacuous";
}

TEST(ZeroTest, LoadStateDictValidatesBeforeChangingAnything) {
  auto pg = testing::JoinDefaultGroup();  // one process, world size 1
  Config c;
  c.dtype = kBF16;
  c.two_groups = true;
  auto model = MakeMlp(c.dtype);
  ZeroOptimizer opt(pg, MakeOptimizer(*model, c), MakeZeroOptions(c, model));
  TrainZeroSteps(opt, *model, *pg, c, 0, 2);
  const StateDict good = opt.state_dict();
  auto expect_error = [&](const StateDict& sd, const std::string& text) {
    EXPECT_TRUE(ThrowsErrorExactly([&] { opt.load_state_dict(sd); }, text));
    ExpectSameState(opt.state_dict(), good, "after a refused load: " + text);
  };
  StateDict missing = good;
  missing.tensors.erase("master.1");
  expect_error(missing, "ZeroOptimizer: load_state_dict: missing 'master.1'");
  StateDict shape = good;
  shape.tensors["master.0"] = RawTensor::Zeros({7, 13}, kF32);
  expect_error(shape,
               "ZeroOptimizer: load_state_dict: 'master.0' is f32 [7, 13] but parameter 0 "
               "'weight' has an f32 master of shape [13, 7]");
  StateDict steps = good;  // the biases (parameters 2 and 3) are one flat buffer
  steps.scalars["optimizer.state.3.step"] = 5;
  expect_error(steps,
               "ZeroOptimizer: load_state_dict: the optimizer state of parameter 3 'bias' "
               "differs in its keys or scalars (e.g. the step count) from that of parameter 2 "
               "'bias'; ZeroOptimizer steps them together in one flat buffer");
  StateDict extra = good;
  extra.tensors["optimizer.state.9.exp_avg"] = RawTensor::Zeros({1}, kF32);
  expect_error(extra,
               "ZeroOptimizer: load_state_dict: unexpected tensor 'optimizer.state.9.exp_avg' "
               "(this optimizer has 4 parameters in 2 groups)");
  opt.load_state_dict(good);  // the untouched dictionary still loads
  ExpectSameState(opt.state_dict(), good, "after a good load");
}

TEST(ZeroTest, ErrorsNameTheProblem) {
  {
    auto m = MakeMlp(kF32);
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { ZeroOptimizer opt(std::make_shared<CudaFakeGroup>(), MakeAdamW(m->parameters())); },
        "ZeroOptimizer: parameter 0 ('weight', f32 [13, 7]) is on cpu but the process group "
        "'fake' (fake) works on cuda:0; move the model (Module::to) before making the "
        "optimizer"));
  }
  auto pg = testing::JoinDefaultGroup();  // one process, world size 1
  auto model = MakeMlp(kF32);
  auto make = [&](ZeroOptions o) {
    return std::make_unique<ZeroOptimizer>(pg, MakeAdamW(model->parameters()), std::move(o));
  };
  ZeroOptions bad_stage;
  bad_stage.stage = 4;
  EXPECT_TRUE(ThrowsErrorExactly([&] { make(bad_stage); },
                                 "ZeroOptimizer: stage must be 1, 2 or 3, got 4"));
  ZeroOptions bad_op;
  bad_op.reduce_op = ReduceOp::kMax;
  EXPECT_TRUE(ThrowsErrorExactly([&] { make(bad_op); },
                                 "ZeroOptimizer: reduce_op must be avg or sum, got max"));
  ZeroOptions no_module;
  no_module.stage = 3;
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { make(no_module); },
      "ZeroOptimizer: stage 3 shards the parameters of a module; set ZeroOptions::module"));
  ZeroOptions reduce;
  reduce.mixed_precision.reduce_found_inf = [](const RawTensor&) {};
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { make(reduce); },
      "ZeroOptimizer: MixedPrecisionOptions::reduce_found_inf must be empty; ZeroOptimizer "
      "max-reduces found_inf over its process group itself"));
  {
    Tensor extra(RawTensor::Zeros({3}), true);
    extra.set_name("extra");
    std::vector<Tensor> params = model->parameters();
    params.push_back(extra);
    ZeroOptions o;
    o.stage = 3;
    o.module = model;
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { ZeroOptimizer opt(pg, MakeAdamW(params), o); },
        "ZeroOptimizer: stage 3: parameter 4 of the optimizer ('extra', f32 [3]) is not a "
        "parameter of any unit of the module; every parameter the optimizer updates must "
        "belong to a module whose forward gathers it"));
  }
  {
    Tensor w(RawTensor::Ones({2}), true);
    auto adamw = MakeAdamW({w});
    w.set_grad(Tensor(RawTensor::Ones({2})));
    adamw->step();
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { ZeroOptimizer opt(pg, std::move(adamw)); },
        "ZeroOptimizer: the wrapped optimizer already has state; wrap it before its first step "
        "(its parameters are replaced by the f32 master shards)"));
  }
  {
    auto m = MakeMlp(kF32);
    ZeroOptions o;
    o.stage = 2;
    ZeroOptimizer opt(pg, MakeAdamW(m->parameters()), o);
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { opt.step(); },
        "ZeroOptimizer: step() found no gradients; run a backward (opt.backward(loss) or "
        "opt.scale(loss).backward()) between zero_grad() and step()"));
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] {
          opt.backward(Loss(*m, 0, 0, kF32), amp::MasterBackwardOptions{false, false});
        },
        "ZeroOptimizer: backward with update_master_grads=false needs stage 1; stage 2 "
        "reduce-scatters the gradients during backward"));
    // After a backward (and after zero_grad, again not).
    opt.backward(Loss(*m, 0, 0, kF32));
    EXPECT_FALSE(opt.step().skipped);
    opt.zero_grad();
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { opt.step(); },
        "ZeroOptimizer: step() found no gradients; run a backward (opt.backward(loss) or "
        "opt.scale(loss).backward()) between zero_grad() and step()"));
  }
  {
    // Stage 1 defers the reduction: the .grad accumulates over two backward calls and step()
    // reduces it once.
    auto m = MakeMlp(kF32);
    ZeroOptimizer opt(pg, MakeAdamW(m->parameters()));
    opt.backward(Loss(*m, 0, 0, kF32), amp::MasterBackwardOptions{false, false});
    opt.backward(Loss(*m, 0, 1, kF32), amp::MasterBackwardOptions{false, false});
    EXPECT_TRUE(m->layer(0)->weight.grad().defined());
    EXPECT_EQ(opt.stats().reduce_scatters, 0);
    EXPECT_FALSE(opt.step().skipped);
    EXPECT_EQ(opt.stats().reduce_scatters, 1);
    EXPECT_FALSE(m->layer(0)->weight.grad().defined());
  }
}

}  // namespace
}  // namespace tg::dist
