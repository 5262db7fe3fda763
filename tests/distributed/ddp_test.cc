// DistributedDataParallel: training on 2 and 3 real ranks (Gloo over loopback) equals training
// on the concatenated batch in one process, with one or several buckets, gradient accumulation
// (no_sync), unused parameters and reentrant checkpointing; overlap of the bucket all-reduce with
// backward; f16 loss scaling with an overflow on one rank; the pinned bucket layout and the error
// text. Single-process cases run on a fake group whose collectives complete at once.
#include "distributed/ddp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "distributed/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "tensor/generator.h"
#include "tests/distributed/multiprocess.h"
#include "tests/tensor/throws.h"

namespace tg::dist {
namespace {

using ::tg::dist::testing::ExpectAllSucceeded;
using ::tg::dist::testing::Rank;
using ::tg::dist::testing::RunRanks;
using ::tg::testing::ThrowsError;

constexpr int64_t kIn = 8, kHidden = 16, kOut = 4;
constexpr uint64_t kInitSeed = 100;

// ---- Models and data ---------------------------------------------------------------------------

std::shared_ptr<nn::Mlp> MakeMlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::Mlp>(std::vector<int64_t>{kIn, kHidden, kHidden, kOut}, gen,
                                   nn::Mlp::Options{});
}

// The Mlp's three layers (same parameter names: fc0, fc1, fc2) plus `extra` (registered last),
// with switches for reentrant checkpointing of fc1, a second use of fc1 outside the checkpoint,
// and whether `extra` takes part.
class Net : public nn::Module {
 public:
  struct Options {
    bool checkpoint_fc1 = false;
    bool reuse_fc1 = false;
    bool use_extra = false;
    // The forward back-propagates sum(extra.weight^2) + sum(extra.bias) itself (a gradient
    // computed during forward, like a tiled loss's head).
    bool extra_backward_in_forward = false;
  };
  Net(uint64_t seed, Options options) : Module("Net"), options_(options) {
    Generator gen(seed);
    fc0_ = register_module("fc0", std::make_shared<nn::LinearImpl>(kIn, kHidden, gen));
    fc1_ = register_module("fc1", std::make_shared<nn::LinearImpl>(kHidden, kHidden, gen));
    fc2_ = register_module("fc2", std::make_shared<nn::LinearImpl>(kHidden, kOut, gen));
    extra_ = register_module("extra", std::make_shared<nn::LinearImpl>(kOut, kOut, gen));
  }
  Tensor forward(const Tensor& x) override {
    if (options_.extra_backward_in_forward) {
      EnableGradGuard grad;
      const Tensor& w = extra_->weight;
      Add(Sum(Mul(w, w)), Sum(extra_->bias)).backward();
    }
    Tensor h = Relu((*fc0_)(x));
    if (options_.checkpoint_fc1) {
      h = Checkpoint([this](const VariableList& in) { return Relu((*fc1_)(in[0])); }, {h},
                     CheckpointOptions{/*reentrant=*/true, {}, {}});
    } else {
      h = Relu((*fc1_)(h));
    }
    if (options_.reuse_fc1) h = Relu((*fc1_)(h));
    Tensor out = (*fc2_)(h);
    if (options_.use_extra) out = Add(out, (*extra_)(out));
    return out;
  }
  Options& options() { return options_; }

 private:
  Options options_;
  std::shared_ptr<nn::LinearImpl> fc0_, fc1_, fc2_, extra_;
};

struct Batch {
  RawTensor x;  // [rows, kIn] f32
  RawTensor y;  // [rows, kOut] f32
};

// The global batch of a step (the same on every rank).
Batch GlobalBatch(int64_t rows, int step) {
  Generator gen(1000 + step);
  return {RandNormal({rows, kIn}, gen), RandNormal({rows, kOut}, gen)};
}

Batch Rows(const Batch& b, int64_t begin, int64_t n) {
  return {b.x.narrow(0, begin, n).contiguous(), b.y.narrow(0, begin, n).contiguous()};
}

Tensor MseOf(nn::Module& m, const Batch& b) { return nn::MseLoss(m(Tensor(b.x)), b.y); }
Tensor MseOf(DistributedDataParallel& ddp, const Batch& b) {
  return nn::MseLoss(ddp(Tensor(b.x)), b.y);
}

optim::SGDOptions Sgd() {
  optim::SGDOptions o;
  o.lr(0.05);
  o.momentum(0.9);
  return o;
}

// Rank 0 builds from kInitSeed, the others from other seeds: DDP's broadcast must fix that.
uint64_t SeedOf(int rank) { return kInitSeed + 17 * rank; }

// Largest |a - b| / (1e-1 + |b|) over all parameter elements (f32 results differ from the
// reference only by summation order).
double MaxRelDiff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const std::vector<double> va = a[i].data().to_vector<double>();
    const std::vector<double> vb = b[i].data().to_vector<double>();
    EXPECT_EQ(va.size(), vb.size());
    for (size_t k = 0; k < va.size() && k < vb.size(); ++k) {
      worst = std::max(worst, std::abs(va[k] - vb[k]) / (0.1 + std::abs(vb[k])));
    }
  }
  return worst;
}

std::vector<std::string> Names(const nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& [name, p] : m.named_parameters()) names.push_back(name);
  return names;
}

// All of this rank's parameters as one f32 vector, gathered from every rank: [world][n].
std::vector<std::vector<float>> GatherParams(ProcessGroup& pg, const std::vector<Tensor>& ps) {
  int64_t n = 0;
  for (const Tensor& p : ps) n += p.numel();
  RawTensor mine = RawTensor::Empty({n}, kF32);
  int64_t offset = 0;
  for (const Tensor& p : ps) {
    mine.narrow(0, offset, p.numel()).view(p.shape()).copy_(p.data());
    offset += p.numel();
  }
  RawTensor all = RawTensor::Empty({pg.size() * n}, kF32);
  TG_DIST_CHECK_OK(pg.all_gather(all, mine)->wait());
  std::vector<std::vector<float>> out;
  for (int r = 0; r < pg.size(); ++r) out.push_back(all.narrow(0, r * n, n).to_vector<float>());
  return out;
}

std::vector<float> GatherScalar(ProcessGroup& pg, double value) {
  RawTensor all = RawTensor::Empty({pg.size()}, kF32);
  TG_DIST_CHECK_OK(pg.all_gather(all, RawTensor::Full({1}, value, kF32))->wait());
  return all.to_vector<float>();
}

// ---- A fake group: every collective completes at once (world size 1), optionally failing ----

class DoneWork : public Work {
 public:
  explicit DoneWork(absl::Status status) : Work(absl::Seconds(1)), status_(std::move(status)) {}
  absl::Status wait(absl::Duration) override { return status_; }
  bool is_completed() override { return true; }

 private:
  absl::Status status_;
};

class FakeGroup : public ProcessGroup {
 public:
  FakeGroup() : ProcessGroup(0, 1, "fake", absl::Seconds(1), Device::Cpu()) {}
  const char* backend() const override { return "fake"; }
  std::shared_ptr<Work> all_reduce(const RawTensor& t, ReduceOp op) override {
    CheckTensor("all_reduce", "tensor", t);
    CheckReduceOp("all_reduce", t, op);
    all_reduce_numels.push_back(t.numel());
    return std::make_shared<DoneWork>(fail);
  }
  std::shared_ptr<Work> reduce_scatter(const RawTensor& o, const RawTensor& i, ReduceOp) override {
    o.copy_(i);
    return std::make_shared<DoneWork>(fail);
  }
  std::shared_ptr<Work> all_gather(const RawTensor& o, const RawTensor& i) override {
    o.copy_(i);
    return std::make_shared<DoneWork>(fail);
  }
  std::shared_ptr<Work> broadcast(const RawTensor&, int) override {
    return std::make_shared<DoneWork>(fail);
  }
  std::shared_ptr<Work> barrier() override { return std::make_shared<DoneWork>(fail); }

  absl::Status fail;
  std::vector<int64_t> all_reduce_numels;
};

// ---- Single process --------------------------------------------------------------------------

TEST(DdpLayoutTest, BucketsInReverseRegistrationOrderCappedByBytes) {
  auto pg = std::make_shared<FakeGroup>();
  auto model = MakeMlp(kInitSeed);
  // Reverse order: fc2.bias 16 B, fc2.weight 256 B, fc1.bias 64 B, fc1.weight 1024 B (over the
  // cap: alone), fc0.bias 64 B, fc0.weight 512 B (over the cap: alone).
  DdpOptions o;
  o.bucket_cap_bytes = 300;
  DistributedDataParallel ddp(model, pg, o);
  const std::vector<DdpBucketLayout> layout = ddp.bucket_layout();
  ASSERT_EQ(layout.size(), 5u);
  const std::vector<std::vector<std::string>> names = {
      {"fc2.bias", "fc2.weight"}, {"fc1.bias"}, {"fc1.weight"}, {"fc0.bias"}, {"fc0.weight"}};
  const std::vector<int64_t> numels = {68, 16, 256, 16, 128};
  for (size_t b = 0; b < layout.size(); ++b) {
    EXPECT_EQ(layout[b].param_names, names[b]) << "bucket " << b;
    EXPECT_EQ(layout[b].numel, numels[b]) << "bucket " << b;
    EXPECT_EQ(layout[b].dtype, kF32);
  }
  EXPECT_EQ(layout[0].offsets, (std::vector<int64_t>{0, 4}));

  // The default cap: one bucket of every parameter.
  DistributedDataParallel one(MakeMlp(kInitSeed), pg);
  ASSERT_EQ(one.num_buckets(), 1);
  EXPECT_EQ(one.bucket_layout()[0].numel, 16 * 8 + 16 + 16 * 16 + 16 + 4 * 16 + 4);
  EXPECT_EQ(one.bucket_layout()[0].param_names,
            (std::vector<std::string>{"fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight",
                                      "fc0.bias", "fc0.weight"}));
}

// Parameters of several dtypes: a dtype change starts a bucket.
class Mixed : public nn::Module {
 public:
  Mixed() : Module("Mixed") {
    register_parameter("a", RawTensor::Zeros({10}, kF32));
    register_parameter("b", RawTensor::Zeros({3}, kF64));
    register_parameter("c", RawTensor::Zeros({2}, kF64));
    register_parameter("frozen", RawTensor::Zeros({7}, kF32), /*requires_grad=*/false);
    register_parameter("d", RawTensor::Zeros({100}, kF32));
  }
};

TEST(DdpLayoutTest, OneDtypePerBucketAndFrozenParametersLeftOut) {
  DdpOptions o;
  o.bucket_cap_bytes = 64;
  DistributedDataParallel ddp(std::make_shared<Mixed>(), std::make_shared<FakeGroup>(), o);
  const std::vector<DdpBucketLayout> layout = ddp.bucket_layout();
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_EQ(layout[0].param_names, std::vector<std::string>{"d"});  // 400 B > cap: alone
  EXPECT_EQ(layout[1].param_names, (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(layout[1].dtype, kF64);
  EXPECT_EQ(layout[1].offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(layout[2].param_names, std::vector<std::string>{"a"});
  EXPECT_EQ(layout[2].dtype, kF32);
}

TEST(DdpSingleProcessTest, WorldOfOneGivesTheLocalGradientsAsBucketViews) {
  auto pg = std::make_shared<FakeGroup>();
  auto model = MakeMlp(kInitSeed);
  auto plain = MakeMlp(kInitSeed);
  DdpOptions o;
  o.bucket_cap_bytes = 300;
  DistributedDataParallel ddp(model, pg, o);
  const Batch b = GlobalBatch(6, 0);
  for (int rep = 0; rep < 2; ++rep) {  // the second backward accumulates into the bucket views
    MseOf(ddp, b).backward();
    MseOf(*plain, b).backward();
    const auto ps = model->parameters(), qs = plain->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(ps[i].grad().data().to_vector<float>(), qs[i].grad().data().to_vector<float>())
          << Names(*model)[i] << " rep " << rep;
    }
  }
  EXPECT_EQ(pg->all_reduce_numels,
            (std::vector<int64_t>{68, 16, 256, 16, 128, 68, 16, 256, 16, 128}));
  EXPECT_EQ(ddp.stats().synchronized_backwards, 2);
  EXPECT_EQ(ddp.stats().launched_from_hooks, 10);
  // After a reduction .grad is a view of its bucket: fc2.weight and fc2.bias share bucket 0.
  const auto ps = model->parameters();  // fc0.weight, fc0.bias, ..., fc2.weight, fc2.bias
  EXPECT_TRUE(ps[4].grad().data().shares_storage(ps[5].grad().data()));
  EXPECT_EQ(ps[5].grad().data().offset(), 0);
  EXPECT_EQ(ps[4].grad().data().offset(), 4);
  EXPECT_FALSE(ps[4].grad().data().shares_storage(ps[3].grad().data()));
}

TEST(DdpSingleProcessTest, NoSyncAndForwardIssuedBackwardDoNotCommunicate) {
  auto pg = std::make_shared<FakeGroup>();
  auto model = MakeMlp(kInitSeed);
  DistributedDataParallel ddp(model, pg);
  const Batch b = GlobalBatch(6, 0);
  {
    auto no_sync = ddp.no_sync();
    EXPECT_FALSE(ddp.sync_enabled());
    MseOf(ddp, b).backward();
  }
  EXPECT_TRUE(ddp.sync_enabled());
  {
    ForwardScope forward;  // an auxiliary backward issued by a model's forward
    MseOf(*model, b).backward();
  }
  EXPECT_TRUE(pg->all_reduce_numels.empty());
  EXPECT_EQ(ddp.stats().grads_copied, 0);
  MseOf(ddp, b).backward();
  EXPECT_EQ(pg->all_reduce_numels.size(), 1u);
  EXPECT_EQ(ddp.stats().synchronized_backwards, 1);
}

// A parameter whose only gradient came from a backward issued in forward is reduced by the
// next backward with that gradient (not reported as unused, not zeroed); the others as usual.
TEST(DdpSingleProcessTest, ForwardTimeGradientIsReducedByTheNextBackward) {
  auto pg = std::make_shared<FakeGroup>();
  Net::Options o;
  o.extra_backward_in_forward = true;
  auto model = std::make_shared<Net>(kInitSeed, o);
  DistributedDataParallel ddp(model, pg);  // find_unused_parameters = false
  const Batch b = GlobalBatch(6, 0);
  Tensor loss = MseOf(ddp, b);
  EXPECT_TRUE(pg->all_reduce_numels.empty());  // the forward's backward communicates nothing
  loss.backward();
  EXPECT_EQ(ddp.stats().synchronized_backwards, 1);
  EXPECT_EQ(ddp.stats().forward_grads_reduced, 2);
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    if (name == "extra.weight") {
      std::vector<float> twice = p.data().to_vector<float>();
      for (float& v : twice) v *= 2;
      EXPECT_EQ(p.grad().data().to_vector<float>(), twice);
    } else if (name == "extra.bias") {
      EXPECT_EQ(p.grad().data().to_vector<float>(), std::vector<float>(kOut, 1.0f));
    }
  }
  // The next backward reduces only what it and its own forward accumulate.
  for (const Tensor& p : model->parameters()) p.set_grad(Tensor());
  MseOf(ddp, b).backward();
  EXPECT_EQ(ddp.stats().synchronized_backwards, 2);
  EXPECT_EQ(ddp.stats().forward_grads_reduced, 4);
}

TEST(DdpSingleProcessTest, FailedAllReducePropagatesOutOfBackward) {
  auto pg = std::make_shared<FakeGroup>();
  auto model = MakeMlp(kInitSeed);
  DistributedDataParallel ddp(model, pg);
  pg->fail = absl::UnavailableError("all_reduce on group 'fake' (rank 0 of 1): peer 1 exited");
  const Batch b = GlobalBatch(6, 0);
  EXPECT_TRUE(ThrowsError([&] { MseOf(ddp, b).backward(); },
                          "DistributedDataParallel: the gradient all_reduce failed: all_reduce on "
                          "group 'fake' (rank 0 of 1): peer 1 exited"));
  EXPECT_EQ(ddp.stats().synchronized_backwards, 0);
  // The group works again: the next backward starts afresh.
  pg->fail = absl::OkStatus();
  MseOf(ddp, b).backward();
  EXPECT_EQ(ddp.stats().synchronized_backwards, 1);
}

TEST(DdpSingleProcessTest, UnusedParametersNamedInTheError) {
  auto pg = std::make_shared<FakeGroup>();
  DistributedDataParallel ddp(std::make_shared<Net>(kInitSeed, Net::Options{}), pg);
  const Batch b = GlobalBatch(6, 0);
  EXPECT_TRUE(ThrowsError(
      [&] { MseOf(ddp, b).backward(); },
      "DistributedDataParallel: parameters got no gradient in this backward: extra.weight, "
      "extra.bias (pass find_unused_parameters=true in DdpOptions"));
}

TEST(DdpSingleProcessTest, BadOptionsAndModules) {
  auto pg = std::make_shared<FakeGroup>();
  DdpOptions o;
  o.bucket_cap_bytes = 0;
  EXPECT_TRUE(ThrowsError([&] { DistributedDataParallel ddp(MakeMlp(1), pg, o); },
                          "DistributedDataParallel: bucket_cap_bytes must be positive, got 0"));
  o = DdpOptions();
  o.reduce_op = ReduceOp::kMax;
  EXPECT_TRUE(ThrowsError([&] { DistributedDataParallel ddp(MakeMlp(1), pg, o); },
                          "reduce_op must be avg or sum, got max"));
  auto frozen = MakeMlp(1);
  for (const Tensor& p : frozen->parameters()) p.set_requires_grad(false);
  EXPECT_TRUE(ThrowsError([&] { DistributedDataParallel ddp(frozen, pg); },
                          "DistributedDataParallel: the module (Mlp) has no parameter that "
                          "requires grad"));
}

// ---- Real ranks ------------------------------------------------------------------------------

struct Trained {
  std::unique_ptr<DistributedDataParallel> ddp;  // holds the model
  double max_rel_diff = 0;                       // against the reference
};

// `steps` SGD steps with DDP on this rank's rows of a global batch of `rows`, against the same
// steps on the whole batch in this process.
Trained TrainAgainstReference(const Rank& r, const std::shared_ptr<ProcessGroup>& pg,
                              const DdpOptions& options, int steps, int64_t rows,
                              Net::Options net = {}, Net::Options reference_net = {}) {
  auto model = std::make_shared<Net>(SeedOf(r.rank), net);
  auto reference = std::make_shared<Net>(kInitSeed, reference_net);
  Trained t;
  t.ddp = std::make_unique<DistributedDataParallel>(model, pg, options);
  optim::SGD opt(model->parameters(), Sgd());
  optim::SGD ref_opt(reference->parameters(), Sgd());
  const int64_t local = rows / r.world_size;
  for (int step = 0; step < steps; ++step) {
    const Batch global = GlobalBatch(rows, step);
    opt.zero_grad();
    MseOf(*t.ddp, Rows(global, r.rank * local, local)).backward();
    opt.step();
    ref_opt.zero_grad();
    MseOf(*reference, global).backward();
    ref_opt.step();
  }
  t.max_rel_diff = MaxRelDiff(model->parameters(), reference->parameters());
  return t;
}

TEST(DdpTest, TrainsMlpLikeOneProcessOnTheGlobalBatch) {
  for (const int world : {2, 3}) {
    auto results = RunRanks(world, [](const Rank& r) {
      auto pg = testing::JoinDefaultGroup();
      auto model = MakeMlp(SeedOf(r.rank));
      auto reference = MakeMlp(kInitSeed);
      DistributedDataParallel ddp(model, pg);
      optim::SGD opt(model->parameters(), Sgd());
      optim::SGD ref_opt(reference->parameters(), Sgd());
      // Broadcast from rank 0 at construction.
      EXPECT_EQ(MaxRelDiff(model->parameters(), reference->parameters()), 0.0);
      const int64_t rows = 12, local = rows / r.world_size;
      for (int step = 0; step < 20; ++step) {
        const Batch global = GlobalBatch(rows, step);
        opt.zero_grad();
        MseOf(ddp, Rows(global, r.rank * local, local)).backward();
        opt.step();
        ref_opt.zero_grad();
        MseOf(*reference, global).backward();
        ref_opt.step();
      }
      EXPECT_LE(MaxRelDiff(model->parameters(), reference->parameters()), 1e-5);
      EXPECT_EQ(ddp.num_buckets(), 1);
      EXPECT_EQ(ddp.stats().synchronized_backwards, 20);
      EXPECT_EQ(ddp.stats().bucket_launches, 20);
      const auto gathered = GatherParams(*pg, model->parameters());
      for (int k = 1; k < r.world_size; ++k) EXPECT_EQ(gathered[k], gathered[0]) << "rank " << k;
    });
    ExpectAllSucceeded(results);
  }
}

TEST(DdpTest, SeveralBucketsGiveTheSameResult) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    DdpOptions o;
    o.bucket_cap_bytes = 300;
    o.find_unused_parameters = true;  // Net's `extra` is unused
    const Trained t = TrainAgainstReference(r, pg, o, 20, 12);
    EXPECT_LE(t.max_rel_diff, 1e-5);
    const DistributedDataParallel* ddp = t.ddp.get();
    // extra.bias + extra.weight (80 B) + fc2.bias (16 B) = 96 B; fc2.weight 256 B; fc1.bias;
    // fc1.weight; fc0.bias; fc0.weight.
    const std::vector<DdpBucketLayout> layout = ddp->bucket_layout();
    ASSERT_EQ(layout.size(), 6u);
    EXPECT_EQ(layout[0].param_names,
              (std::vector<std::string>{"extra.bias", "extra.weight", "fc2.bias"}));
    EXPECT_EQ(layout[1].param_names, std::vector<std::string>{"fc2.weight"});
    EXPECT_EQ(layout[5].param_names, std::vector<std::string>{"fc0.weight"});
    EXPECT_EQ(ddp->stats().bucket_launches, 20 * 6);
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, FirstBucketIsLaunchedWhileBackwardStillRuns) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    auto model = MakeMlp(SeedOf(r.rank));
    DdpOptions o;
    o.bucket_cap_bytes = 300;  // 5 buckets, see DdpLayoutTest
    DistributedDataParallel ddp(model, pg, o);
    const Tensor fc0_weight = model->named_parameters()[0].second;
    std::vector<std::string> events;
    bool fc0_weight_grad_at_first_launch = true;
    ddp.set_bucket_launch_observer([&](int bucket) {
      if (bucket == 0) fc0_weight_grad_at_first_launch = fc0_weight.grad().defined();
      events.push_back("launch " + std::to_string(bucket));
    });
    std::vector<HookHandle> probes;
    for (const auto& [name, p] : model->named_parameters()) {
      probes.push_back(p.register_post_accumulate_grad_hook(
          [&events, name = name](const Tensor&) { events.push_back("grad " + name); }));
    }
    const Batch b = Rows(GlobalBatch(12, 0), r.rank * 6, 6);
    MseOf(ddp, b).backward();
    const auto at = [&](const std::string& e) {
      return std::find(events.begin(), events.end(), e) - events.begin();
    };
    ASSERT_LT(at("launch 0"), static_cast<ptrdiff_t>(events.size()));
    EXPECT_LT(at("launch 0"), at("grad fc1.weight"));
    EXPECT_LT(at("launch 0"), at("grad fc0.weight"));
    EXPECT_FALSE(fc0_weight_grad_at_first_launch);  // the first layer's gradient was not there
    EXPECT_EQ(ddp.stats().launched_from_hooks, 5);  // every bucket overlapped with backward
    for (HookHandle& h : probes) h.remove();
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, NoSyncAccumulationEqualsOneStepOnTheCombinedBatch) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    auto model = MakeMlp(SeedOf(r.rank));
    auto reference = MakeMlp(kInitSeed);
    DistributedDataParallel ddp(model, pg);
    optim::SGD opt(model->parameters(), Sgd());
    optim::SGD ref_opt(reference->parameters(), Sgd());
    const int64_t local = 4, rows = local * r.world_size;
    for (int step = 0; step < 3; ++step) {
      const Batch global = GlobalBatch(rows, step);
      const Batch mine = Rows(global, r.rank * local, local);
      opt.zero_grad();
      const int64_t launches = ddp.stats().bucket_launches;
      {
        auto no_sync = ddp.no_sync();
        MulScalar(MseOf(ddp, Rows(mine, 0, 2)), 0.5).backward();
      }
      EXPECT_EQ(ddp.stats().bucket_launches, launches);  // nothing communicated
      MulScalar(MseOf(ddp, Rows(mine, 2, 2)), 0.5).backward();
      EXPECT_EQ(ddp.stats().bucket_launches, launches + 1);
      opt.step();
      ref_opt.zero_grad();
      MseOf(*reference, global).backward();
      ref_opt.step();
    }
    EXPECT_LE(MaxRelDiff(model->parameters(), reference->parameters()), 1e-5);
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, UnusedParameters) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    const Batch b = Rows(GlobalBatch(12, 0), r.rank * 6, 6);
    {  // Without find_unused_parameters: the finaliser's error, on every rank.
      DistributedDataParallel ddp(std::make_shared<Net>(SeedOf(r.rank), Net::Options{}), pg);
      EXPECT_TRUE(ThrowsError(
          [&] { MseOf(ddp, b).backward(); },
          "DistributedDataParallel: parameters got no gradient in this backward: extra.weight, "
          "extra.bias (pass find_unused_parameters=true"));
    }
    {  // Unused on every rank: zero gradients, the parameters do not move.
      auto model = std::make_shared<Net>(SeedOf(r.rank), Net::Options{});
      DdpOptions o;
      o.find_unused_parameters = true;
      o.bucket_cap_bytes = 300;
      DistributedDataParallel ddp(model, pg, o);
      auto reference = std::make_shared<Net>(kInitSeed, Net::Options{});
      optim::SGD opt(model->parameters(), Sgd());
      for (int step = 0; step < 3; ++step) {
        opt.zero_grad();
        MseOf(ddp, Rows(GlobalBatch(12, step), r.rank * 6, 6)).backward();
        for (const auto& [name, p] : model->named_parameters()) {
          if (name.rfind("extra.", 0) != 0) continue;
          ASSERT_TRUE(p.grad().defined()) << name;
          for (float g : p.grad().data().to_vector<float>()) EXPECT_EQ(g, 0.0f) << name;
        }
        opt.step();
      }
      const auto ps = model->named_parameters(), qs = reference->named_parameters();
      for (size_t i = 6; i < 8; ++i) {  // extra.weight, extra.bias
        EXPECT_EQ(ps[i].second.data().to_vector<float>(), qs[i].second.data().to_vector<float>())
            << ps[i].first;
      }
    }
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, ParameterUsedOnSomeRanksOnly) {
  // `extra` takes part on rank 1 only: its averaged gradient is rank 1's / world size. The
  // reference sums each rank's loss (with that rank's switch) over the world size.
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Net::Options mine;
    mine.use_extra = r.rank == 1;
    auto model = std::make_shared<Net>(SeedOf(r.rank), mine);
    auto reference = std::make_shared<Net>(kInitSeed, Net::Options{});
    DdpOptions o;
    o.find_unused_parameters = true;
    o.bucket_cap_bytes = 300;
    DistributedDataParallel ddp(model, pg, o);
    optim::SGD opt(model->parameters(), Sgd());
    optim::SGD ref_opt(reference->parameters(), Sgd());
    const int64_t local = 6;
    for (int step = 0; step < 10; ++step) {
      const Batch global = GlobalBatch(local * r.world_size, step);
      opt.zero_grad();
      MseOf(ddp, Rows(global, r.rank * local, local)).backward();
      opt.step();
      ref_opt.zero_grad();
      Tensor total;
      for (int k = 0; k < r.world_size; ++k) {
        reference->options().use_extra = k == 1;
        Tensor l = MseOf(*reference, Rows(global, k * local, local));
        total = total.defined() ? Add(total, l) : l;
      }
      MulScalar(total, 1.0 / r.world_size).backward();
      ref_opt.step();
    }
    EXPECT_LE(MaxRelDiff(model->parameters(), reference->parameters()), 1e-5);
    const auto extra_weight = model->named_parameters()[6];
    ASSERT_EQ(extra_weight.first, "extra.weight");
    EXPECT_GT(std::abs(extra_weight.second.grad().data().to_vector<float>()[0]), 0.0f);
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, ReentrantCheckpointReducesEachParameterOnce) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Net::Options checkpointed, plain;
    checkpointed.checkpoint_fc1 = true;
    checkpointed.use_extra = plain.use_extra = true;
    for (const int64_t cap : {int64_t{25} << 20, int64_t{300}}) {
      DdpOptions o;
      o.bucket_cap_bytes = cap;
      o.find_unused_parameters = true;
      const Trained t = TrainAgainstReference(r, pg, o, 20, 12, checkpointed, plain);
      EXPECT_LE(t.max_rel_diff, 1e-5) << "cap " << cap;
      const DdpStats& stats = t.ddp->stats();
      EXPECT_EQ(stats.synchronized_backwards, 20);
      EXPECT_EQ(stats.bucket_launches, 20 * t.ddp->num_buckets());
      EXPECT_EQ(stats.launched_from_hooks, stats.bucket_launches);
      EXPECT_EQ(stats.recopies, 0);
      EXPECT_EQ(stats.grads_copied, 20 * 8);  // once per parameter and backward
    }
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, ParameterUsedInsideAndOutsideAReentrantCheckpoint) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Net::Options both;
    both.checkpoint_fc1 = true;
    both.reuse_fc1 = true;
    both.use_extra = true;
    Net::Options plain;
    plain.reuse_fc1 = true;
    plain.use_extra = true;
    {  // One bucket: fc1's second gradient arrives before the bucket is launched -> copied again.
      const Trained t = TrainAgainstReference(r, pg, DdpOptions(), 10, 12, both, plain);
      EXPECT_LE(t.max_rel_diff, 1e-5);
      EXPECT_EQ(t.ddp->stats().recopies, 10 * 2);  // fc1.weight and fc1.bias, every step
    }
    {  // fc1's buckets are already in flight when the nested task adds to its gradient.
      DdpOptions o;
      o.bucket_cap_bytes = 300;  // [extra.*, fc2.bias] [fc2.weight] [fc1.bias] [fc1.weight] ...
      auto model = std::make_shared<Net>(SeedOf(r.rank), both);
      DistributedDataParallel ddp(model, pg, o);
      const Batch b = Rows(GlobalBatch(12, 0), r.rank * 6, 6);
      EXPECT_TRUE(ThrowsError([&] { MseOf(ddp, b).backward(); },
                              "was produced a second time in this backward after the all_reduce "
                              "of its bucket"));
      EXPECT_TRUE(ThrowsError([&] { MseOf(ddp, b).backward(); },
                              "DistributedDataParallel: the gradient of parameter fc1."));
    }
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, F16OverflowOnOneRankSkipsTheStepOnEveryRank) {
  auto results = RunRanks(2, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    for (const bool reduce_found_inf : {false, true}) {
      auto model = MakeMlp(SeedOf(r.rank));
      model->to(kF16);
      DistributedDataParallel ddp(model, pg);  // before attach(): DDP's epilogue runs first
      amp::MixedPrecisionOptimizer::Options mp;
      mp.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch(1024));
      if (reduce_found_inf) mp.reduce_found_inf = MaxFoundInfAcrossRanks(pg);
      optim::SGDOptions sgd;
      sgd.lr(0.05);
      amp::MixedPrecisionOptimizer opt(std::make_unique<optim::SGD>(model->parameters(), sgd), mp);
      opt.attach();
      constexpr int kOverflowStep = 3;
      for (int step = 0; step < 6; ++step) {
        Batch b = Rows(GlobalBatch(12, step), r.rank * 6, 6);
        RawTensor x = b.x.to(kF16);
        if (step == kOverflowStep && r.rank == 1) {
          x.narrow(0, 0, 1).narrow(1, 0, 1).fill_(std::numeric_limits<double>::infinity());
        }
        opt.zero_grad();
        opt.scale(nn::MseLoss(ddp(Tensor(x)), b.y.to(kF16))).backward();
        // The master gradients were made from the averaged gradients: equal on every rank.
        const std::optional<std::vector<RawTensor>> masters = opt.inspect_master_grads();
        ASSERT_TRUE(masters.has_value());
        std::vector<Tensor> mv;
        for (const RawTensor& t : *masters) mv.push_back(Tensor(t));
        const auto gathered = GatherParams(*pg, mv);
        if (step != kOverflowStep) {
          EXPECT_EQ(gathered[1], gathered[0]) << "step " << step;
        }
        const amp::StepResult result = opt.step();
        EXPECT_EQ(result.skipped, step == kOverflowStep) << "step " << step;
      }
      EXPECT_EQ(opt.skipped_steps(), 1);
      EXPECT_EQ(opt.master_grad_updates(), 6);
      EXPECT_EQ(opt.loss_scale(), 512);
      EXPECT_EQ(GatherScalar(*pg, opt.loss_scale()), (std::vector<float>{512, 512}));
      EXPECT_EQ(GatherScalar(*pg, static_cast<double>(opt.skipped_steps())),
                (std::vector<float>{1, 1}));
      const auto params = GatherParams(*pg, model->parameters());
      EXPECT_EQ(params[1], params[0]);
      opt.detach();
    }
  });
  ExpectAllSucceeded(results);
}

TEST(DdpTest, MaxFoundInfAcrossRanks) {
  auto results = RunRanks(3, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    const auto reduce = MaxFoundInfAcrossRanks(pg);
    RawTensor found_inf = RawTensor::Scalar(r.rank == 1 ? 1.0 : 0.0);
    reduce(found_inf);
    EXPECT_EQ(found_inf.item(), 1.0);
    found_inf.zero_();
    reduce(found_inf);
    EXPECT_EQ(found_inf.item(), 0.0);
  });
  ExpectAllSucceeded(results);
}

}  // namespace
}  // namespace tg::dist

namespace tg::dist {
namespace {

// A rank killed mid-training: the survivors' backward fails (tg::Error out of backward, naming
// the all_reduce) within the configured timeout instead of hanging.
TEST(DdpTest, KilledRankMakesTheOthersFailWithinTheTimeout) {
  testing::RunOptions options;
  options.dist_timeout = absl::Seconds(5);
  auto results = RunRanks(
      3,
      [](const Rank& r) {
        auto pg = testing::JoinDefaultGroup();
        auto model = MakeMlp(kInitSeed);
        DistributedDataParallel ddp(model, pg);
        optim::SGD opt(model->parameters(), Sgd());
        const absl::Time start = absl::Now();
        absl::Time killed_at = absl::InfiniteFuture();
        std::string error;
        for (int step = 0; step < 1000 && error.empty(); ++step) {
          if (step == 5) {
            if (r.rank == 1) raise(SIGKILL);
            killed_at = absl::Now();
          }
          const Batch global = GlobalBatch(12, step);
          opt.zero_grad();
          try {
            MseOf(ddp, Rows(global, r.rank * 4, 4)).backward();
          } catch (const Error& e) {
            error = e.what();
          }
          opt.step();
        }
        ASSERT_FALSE(error.empty()) << "training went on without rank 1";
        EXPECT_NE(error.find("all_reduce on group 'default' (rank " + std::to_string(r.rank) +
                             " of 3, gloo)"),
                  std::string::npos)
            << error;
        EXPECT_LT(absl::Now() - killed_at, absl::Seconds(5 + 3)) << error;
        EXPECT_LT(absl::Now() - start, absl::Seconds(20));
        std::fflush(stdout);
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0);  // skip the broken group's teardown
      },
      options);
  if (testing::IsRankProcess()) return;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0].output;
  EXPECT_TRUE(results[2].ok()) << results[2].output;
  EXPECT_EQ(results[1].signal, SIGKILL);
}

}  // namespace
}  // namespace tg::dist
