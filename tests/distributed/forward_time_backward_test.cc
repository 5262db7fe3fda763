// Backward calls issued during forward (issue 39, items 5 and 6): a tiled logits loss whose
// custom function computes the head's gradient tile by tile with Engine::Backward inside its
// Forward, an auxiliary loss back-propagated from a forward hook, a head weight that also gets a
// gradient in the user's backward, gradient accumulation over two user backward calls (under
// DDP's no_sync too) and a step() that follows a forward-time backward without a user backward.
// Every training setup -- amp::MixedPrecisionOptimizer alone, DDP + MixedPrecisionOptimizer on
// 2 Gloo ranks (stage 0) and ZeroOptimizer stages 1, 2 and 3 on 2 ranks -- must give the update
// of an independent reference (plain f64 autograd in one process over both ranks' data, the
// gradient averaged over the ranks, SGD by hand), in f32 and f16, with exactly one epilogue
// (master-gradient update / reduction / unscale) per user backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "distributed/ddp.h"
#include "distributed/zero.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/sgd.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tests/distributed/multiprocess.h"

namespace tg::dist {
namespace {

using ::tg::dist::testing::ExpectAllSucceeded;
using ::tg::dist::testing::Rank;
using ::tg::dist::testing::RunRanks;

constexpr int64_t kIn = 5, kHidden = 8, kVocab = 6, kTile = 2, kRows = 4;
constexpr double kLr = 0.5;
constexpr double kAux = 0.05;  // the forward hook's auxiliary loss: kAux * sum(body(x)^2)
constexpr double kTie = 0.1;   // the user-graph term on the head: kTie * sum(head^2)
constexpr int kSteps = 2;
constexpr double kInitScale = 1024;  // f16: a PyTorch scaler from here

// The tiled loss: mean((h head^T - y)^2) over [rows, vocab], computed tile by tile (kTile rows
// of the head at a time). Forward runs, per tile, a backward of its own through the head's
// weight (seeded with `seed`: the loss scale times the multiplier the caller will apply to the
// loss, so that the head's gradient is scaled exactly like the user's backward), which
// accumulates the head's gradient into head.grad and the gradient of h into a local leaf.
// Backward returns that h gradient (times the incoming gradient over the seed) and no gradient
// for the head: it is already accumulated.
struct TiledLoss : Function<TiledLoss> {
  static constexpr const char* kName = "TiledLoss";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in, const RawTensor& targets,
                              double seed) {
    const Tensor& h = in[0];
    const Tensor& head = in[1];
    Tensor hd(h.data(), /*requires_grad=*/true);
    const int64_t rows = h.shape()[0];
    double total = 0;
    EnableGradGuard grad;
    for (int64_t t = 0; t < kVocab / kTile; ++t) {
      const Tensor w = Narrow(head, 0, t * kTile, kTile);
      const Tensor logits = Cast(Matmul(hd, Transpose(w, 0, 1)), kF32);
      const Tensor d = Sub(logits, Tensor(targets.narrow(1, t * kTile, kTile)));
      const Tensor l = MulScalar(Sum(Mul(d, d)), 1.0 / static_cast<double>(rows * kVocab));
      total += l.data().item();
      Engine::Backward({l}, {Tensor(RawTensor::Full({}, seed, kF32))});
    }
    ctx.saved_data["grad_h"] = hd.grad().data();
    ctx.saved_data["seed"] = seed;
    return {Tensor(RawTensor::Full({}, total, kF32))};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    const RawTensor gh = std::any_cast<RawTensor>(ctx.saved_data["grad_h"]);
    const double factor = grads[0].data().item() / std::any_cast<double>(ctx.saved_data["seed"]);
    return {MulScalar(Tensor(gh), factor), Tensor()};
  }
};

struct Scenario {
  std::string name;
  bool hook = false;            // a forward hook on the body back-propagates an auxiliary loss
  bool tied = false;            // the head also gets a gradient in the user's backward
  int micro = 1;                // user backward calls per step (gradient accumulation)
  bool no_sync = false;         // DDP: the first micro-batch under no_sync (deferred master update)
  bool top_level = false;       // the tiled loss applied outside any module (Function's own scope)
  bool step_only = false;       // forward only (its forward-time backward), then step()
  bool explicit_scope = false;  // the caller also wraps the forward in a ForwardScope
};

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> s(8);
  s[0].name = "tiled loss in the module's forward";
  s[1].name = "plus an auxiliary backward from a forward hook";
  s[1].hook = true;
  s[2].name = "head weight also in the user's graph";
  s[2].tied = true;
  s[3].name = "two user backward calls per step";
  s[3].micro = 2;
  s[3].hook = true;
  s[3].tied = true;
  s[4].name = "two micro-batches, the first under no_sync";
  s[4].micro = 2;
  s[4].no_sync = true;
  s[5].name = "tiled loss applied outside any module";
  s[5].top_level = true;
  s[6].name = "step() after a forward-time backward only";
  s[6].step_only = true;
  s[6].hook = true;
  s[7].name = "forward inside an explicit ForwardScope";
  s[7].explicit_scope = true;
  return s;
}

// body (Linear kIn -> kHidden, then tanh) and a head weight [kVocab, kHidden] owned by the model
// (its own stage 3 unit); forward returns the tiled loss (plus the tied term), or h when the
// caller applies the loss itself.
class TiledModel : public nn::Module {
 public:
  explicit TiledModel(DType dtype) : Module("TiledModel") {
    Generator gen(11);
    body_ = register_module("body", std::make_shared<nn::LinearImpl>(kIn, kHidden, gen));
    head_ = register_parameter("head", RandNormal({kVocab, kHidden}, gen, 0.0, 0.5));
    if (dtype != kF32) to(dtype);
    body_->register_forward_hook([this](Module&, const Tensor&, const Tensor& out) {
      if (!hook) return Tensor();
      const Tensor o = Cast(out, kF32);
      const Tensor aux = MulScalar(Sum(Mul(o, o)), kAux);
      BackwardOptions bo;
      bo.retain_graph = true;  // the user's backward goes through `out` again
      Engine::Backward({aux}, {Tensor(RawTensor::Full({}, seed, kF32))}, bo);
      return Tensor();
    });
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = Tanh((*body_)(x));
    if (return_h) return h;
    Tensor loss = TiledLoss::Apply({h, head_}, targets, seed)[0];
    if (tied) loss = Add(loss, MulScalar(Sum(Mul(Cast(head_, kF32), Cast(head_, kF32))), kTie));
    return loss;
  }
  const Tensor& head() const { return head_; }

  // Set before each forward.
  RawTensor targets;  // [rows, kVocab] f32
  double seed = 1;    // loss scale x the multiplier applied to the loss
  bool hook = false;  // Scenario::hook
  bool tied = false;
  bool return_h = false;

 private:
  std::shared_ptr<nn::LinearImpl> body_;
  Tensor head_;
};

struct Batch {
  RawTensor x, y;
};
// Micro-batch k of step s: rank r's m-th micro-batch is k = m * world + r.
Batch MakeBatch(int s, int k, DType dtype) {
  Generator gen(500 + 10 * s + k);
  Batch b;
  b.x = RandNormal({kRows, kIn}, gen).to(dtype);
  b.y = RandNormal({kRows, kVocab}, gen);
  return b;
}

enum class Mode { kMixedPrecision, kDdp, kZero1, kZero2, kZero3 };

// ZeroOptions::bucket_cap_bytes of the runs (stage 2 tries two).
int64_t bucket_cap_bytes = int64_t{16} << 20;

struct Outcome {
  std::vector<float> params;  // f32 values in model->parameters() order
  int64_t epilogues = 0;      // master-gradient updates / ZeRO epilogues
  int64_t synchronized = 0;   // DDP: synchronised backwards
};

std::vector<float> Concat(const std::vector<RawTensor>& tensors) {
  std::vector<float> out;
  for (const RawTensor& t : tensors) {
    const std::vector<float> v = t.to(kF32).to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The f32 masters of the optimizer's state_dict ("master.<i>") where a parameter has one, else
// the parameter itself: f16 runs compare the masters (the model values are their f16 rounding).
std::vector<float> MastersOrParams(const StateDict& sd, const std::vector<RawTensor>& params) {
  std::vector<RawTensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = absl::StrCat("master.", i);
    out.push_back(sd.has_tensor(key) ? sd.tensor(key) : params[i]);
  }
  return Concat(out);
}

amp::MixedPrecisionOptions MixedOptions(DType dtype) {
  amp::MixedPrecisionOptions o;
  if (dtype == kF16) {
    o.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch(kInitScale));
  }
  return o;
}

std::unique_ptr<optim::Optimizer> MakeSgd(const std::vector<Tensor>& params) {
  optim::SGDOptions o;
  o.lr(kLr);
  return std::make_unique<optim::SGD>(params, o);
}

// One micro-batch of the scenario through `call` (the module, or DDP around it); returns the
// loss (undefined for step_only: the forward's own backward is all there is).
template <class Call>
Tensor Forward(TiledModel& model, Call&& call, const Scenario& sc, int s, int k, DType dtype,
               double loss_scale) {
  const Batch b = MakeBatch(s, k, dtype);
  const double multiplier = 1.0 / sc.micro;
  model.targets = b.y;
  model.seed = loss_scale * multiplier;
  model.hook = sc.hook;
  model.tied = sc.tied;
  model.return_h = sc.top_level;
  Tensor loss;
  if (sc.explicit_scope) {
    ForwardScope forward;
    loss = call(Tensor(b.x));
  } else {
    loss = call(Tensor(b.x));
  }
  if (sc.top_level) loss = TiledLoss::Apply({loss, model.head()}, b.y, model.seed)[0];
  if (sc.step_only) return Tensor();
  return sc.micro > 1 ? MulScalar(loss, multiplier) : loss;
}

Outcome Train(Mode mode, const Scenario& sc, DType dtype, const std::shared_ptr<ProcessGroup>& pg) {
  auto model = std::make_shared<TiledModel>(dtype);
  const int world = pg ? pg->size() : 1;
  const int rank = pg ? pg->rank() : 0;
  Outcome out;
  if (mode == Mode::kMixedPrecision || mode == Mode::kDdp) {
    std::unique_ptr<DistributedDataParallel> ddp;
    if (mode == Mode::kDdp) ddp = std::make_unique<DistributedDataParallel>(model, pg);
    amp::MixedPrecisionOptions mo = MixedOptions(dtype);
    if (pg) mo.reduce_found_inf = MaxFoundInfAcrossRanks(pg);
    amp::MixedPrecisionOptimizer opt(MakeSgd(model->parameters()), mo);
    opt.attach();  // after DDP: DDP's finaliser runs first
    auto call = [&](const Tensor& x) { return ddp ? (*ddp)(x) : (*model)(x); };
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      for (int m = 0; m < sc.micro; ++m) {
        if (sc.no_sync && m == 0 && ddp) {
          auto guard = ddp->no_sync();
          const Tensor loss =
              Forward(*model, call, sc, s, m * world + rank, dtype, opt.loss_scale());
          amp::MasterBackwardOptions defer;
          defer.update_master_grads = false;
          opt.backward(loss, defer);
          continue;
        }
        const Tensor loss = Forward(*model, call, sc, s, m * world + rank, dtype, opt.loss_scale());
        if (loss.defined()) opt.scale(loss).backward();
      }
      opt.step();
    }
    out.params = MastersOrParams(opt.state_dict(), [&] {
      std::vector<RawTensor> t;
      for (const Tensor& p : model->parameters()) t.push_back(p.data());
      return t;
    }());
    out.epilogues = opt.master_grad_updates();
    if (ddp) out.synchronized = ddp->stats().synchronized_backwards;
    return out;
  }
  ZeroOptions zo;
  zo.stage = mode == Mode::kZero1 ? 1 : mode == Mode::kZero2 ? 2 : 3;
  zo.module = model;
  zo.mixed_precision = MixedOptions(dtype);
  zo.bucket_cap_bytes = bucket_cap_bytes;
  ZeroOptimizer opt(pg, MakeSgd(model->parameters()), zo);
  auto call = [&](const Tensor& x) { return (*model)(x); };
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    for (int m = 0; m < sc.micro; ++m) {
      const Tensor loss = Forward(*model, call, sc, s, m * world + rank, dtype, opt.loss_scale());
      if (loss.defined()) opt.scale(loss).backward();
    }
    opt.step();
  }
  out.params = MastersOrParams(opt.state_dict(), opt.full_parameters());
  out.epilogues = opt.stats().epilogues;
  return out;
}

// The reference: the same initial values in f64, plain autograd on one process over every
// rank's micro-batches (each loss over world * micro), the terms the forward-time backward
// computes written into the loss, SGD by hand.
std::vector<float> Reference(const Scenario& sc, DType dtype, int world) {
  auto model = std::make_shared<TiledModel>(dtype);
  std::map<std::string, Tensor> p;
  std::vector<std::string> order;
  for (const auto& [name, v] : model->named_parameters()) {
    p[name] = Tensor(v.data().to(kF64), /*requires_grad=*/true);
    order.push_back(name);
  }
  for (int s = 0; s < kSteps; ++s) {
    for (auto& [name, v] : p) v.set_grad(Tensor());
    for (int m = 0; m < sc.micro; ++m) {
      for (int r = 0; r < world; ++r) {
        const Batch b = MakeBatch(s, m * world + r, dtype);
        const Tensor pre = Linear(Tensor(b.x.to(kF64)), p["body.weight"], p["body.bias"]);
        Tensor h = Tanh(pre);
        // step_only: the function's Backward never runs, so nothing flows into the body.
        if (sc.step_only) h = Tensor(h.data());
        const Tensor d = Sub(Matmul(h, Transpose(p["head"], 0, 1)), Tensor(b.y.to(kF64)));
        Tensor loss = MulScalar(Sum(Mul(d, d)), 1.0 / (kRows * kVocab));
        if (sc.hook) loss = Add(loss, MulScalar(Sum(Mul(pre, pre)), kAux));
        if (sc.tied && !sc.step_only) {
          loss = Add(loss, MulScalar(Sum(Mul(p["head"], p["head"])), kTie));
        }
        MulScalar(loss, 1.0 / (world * sc.micro)).backward();
      }
    }
    NoGradGuard no_grad;
    for (auto& [name, v] : p) {
      if (!v.grad().defined()) continue;
      v = Tensor(tg::Sub(v.data(), tg::MulScalar(v.grad().data(), kLr)), /*requires_grad=*/true);
    }
  }
  std::vector<RawTensor> out;
  for (const std::string& name : order) out.push_back(p[name].data());
  return Concat(out);
}

std::vector<float> Initial(DType dtype) {
  std::vector<RawTensor> t;
  for (const Tensor& v : TiledModel(dtype).parameters()) t.push_back(v.data());
  return Concat(t);
}

// Over elements [from, to) (all by default).
double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b, size_t from = 0,
                  size_t to = std::numeric_limits<size_t>::max()) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = from; i < std::min({a.size(), b.size(), to}); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kMixedPrecision:
      return "MixedPrecisionOptimizer";
    case Mode::kDdp:
      return "DDP + MixedPrecisionOptimizer";
    case Mode::kZero1:
      return "ZeRO stage 1";
    case Mode::kZero2:
      return "ZeRO stage 2";
    case Mode::kZero3:
      return "ZeRO stage 3";
  }
  return "?";
}

// Where the head's elements start among the concatenated parameters.
constexpr size_t kHeadNumel = kVocab * kHidden;
size_t HeadOffset(DType dtype) {
  size_t offset = 0;
  for (const auto& [name, v] : TiledModel(dtype).named_parameters()) {
    if (name == "head") return offset;
    offset += static_cast<size_t>(v.numel());
  }
  ADD_FAILURE() << "no head parameter";
  return 0;
}

void ExpectMatchesReference(Mode mode, const Scenario& sc, DType dtype,
                            const std::shared_ptr<ProcessGroup>& pg) {
  const int world = pg ? pg->size() : 1;
  const Outcome got = Train(mode, sc, dtype, pg);
  const std::vector<float> ref = Reference(sc, dtype, world);
  const std::vector<float> init = Initial(dtype);
  // f32 against f64: the forward's f32 rounding; f16: its f16 activations and logits.
  const double tol = dtype == kF32 ? 5e-7 : 5e-4;
  const std::string what =
      absl::StrCat(ModeName(mode), ", ", DTypeName(dtype), ", ", sc.name,
                   mode == Mode::kZero2 ? absl::StrCat(", bucket cap ", bucket_cap_bytes) : "");
  const size_t head = HeadOffset(dtype);
  const double diff = MaxAbsDiff(got.params, ref);
  const double head_moved = MaxAbsDiff(ref, init, head, head + kHeadNumel);
  const double got_head_moved = MaxAbsDiff(got.params, init, head, head + kHeadNumel);
  if (!pg || pg->rank() == 0) {
    std::printf(
        "forward-time backward: %s: max |param - reference| = %.3g (head moved %.4g, "
        "reference %.4g), epilogues %lld\n",
        what.c_str(), diff, got_head_moved, head_moved, static_cast<long long>(got.epilogues));
  }
  EXPECT_LE(diff, tol) << what << " (the head moved by " << got_head_moved
                       << ", the reference's by " << head_moved << ")";
  EXPECT_GT(head_moved, 20 * tol) << what;  // the comparison is not vacuous
  // One epilogue per user backward (step_only: the one step() runs for the forward-time
  // gradient); DDP's deferred no_sync micro-batch is folded into the next update.
  int64_t per_step = sc.step_only ? 1 : sc.micro;
  if (mode == Mode::kDdp && sc.no_sync) per_step = 1;
  EXPECT_EQ(got.epilogues, kSteps * per_step) << what;
  if (mode == Mode::kDdp) {
    EXPECT_EQ(got.synchronized, kSteps * (sc.no_sync ? sc.micro - 1 : sc.micro)) << what;
  }
}

// Which scenarios a mode runs: DDP does not own step(), so a step after a forward-time backward
// alone (no user backward to reduce it) is not a DDP program; a stage 3 head is gathered only
// inside its unit's forward, so the loss cannot be applied outside the module.
bool Runs(Mode mode, const Scenario& sc) {
  if (sc.no_sync) return mode == Mode::kDdp;
  if (sc.step_only && mode == Mode::kDdp) return false;
  if (sc.top_level && mode == Mode::kZero3) return false;
  return true;
}

void RunMode(Mode mode, const std::vector<int64_t>& caps = {int64_t{16} << 20}) {
  auto results = RunRanks(2, [&](const Rank&) {
    auto pg = testing::JoinDefaultGroup();
    for (const DType dtype : {kF32, kF16}) {
      for (const Scenario& sc : Scenarios()) {
        if (!Runs(mode, sc)) continue;
        for (const int64_t cap : caps) {
          bucket_cap_bytes = cap;
          ExpectMatchesReference(mode, sc, dtype, pg);
        }
      }
    }
  });
  ExpectAllSucceeded(results);
  for (const auto& r : results) {
    if (r.rank == 0) std::printf("%s", r.output.c_str());
  }
}

TEST(ForwardTimeBackwardTest, MixedPrecisionOptimizerAlone) {
  for (const DType dtype : {kF32, kF16}) {
    for (const Scenario& sc : Scenarios()) {
      if (Runs(Mode::kMixedPrecision, sc)) {
        ExpectMatchesReference(Mode::kMixedPrecision, sc, dtype, nullptr);
      }
    }
  }
}

TEST(ForwardTimeBackwardTest, DdpWithMixedPrecisionOptimizer) { RunMode(Mode::kDdp); }

TEST(ForwardTimeBackwardTest, ZeroStage1) { RunMode(Mode::kZero1); }

// One bucket for everything, and one bucket per parameter (the head's bucket then holds only a
// forward-time gradient).
TEST(ForwardTimeBackwardTest, ZeroStage2) { RunMode(Mode::kZero2, {int64_t{16} << 20, 64}); }

TEST(ForwardTimeBackwardTest, ZeroStage3) { RunMode(Mode::kZero3); }

}  // namespace
}  // namespace tg::dist
