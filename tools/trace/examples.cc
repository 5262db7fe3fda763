#include "tools/trace/examples.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/graph_dot.h"
#include "autograd/ops.h"
#include "autograd/trace.h"
#include "distributed/ddp.h"
#include "distributed/gloo_process_group.h"
#include "distributed/store.h"
#include "nn/layers.h"
#include "optim/sgd.h"
#include "tensor/generator.h"

namespace tg::tools {
namespace {

// y = sum(checkpoint(tanh(x * w))^2) with a tensor hook on the checkpoint's output, a
// post-accumulate-grad hook on w that queues a callback on the outermost task (the way amp and
// DDP queue their epilogue), and a retained grad.
std::string Checkpointed(bool reentrant) {
  Tensor x(RawTensor::FromVector<float>({1, 2}, {2}), true);
  Tensor w(RawTensor::FromVector<float>({0.5, -0.5}, {2}), true);
  x.set_name("x");
  w.set_name("w");
  CheckpointOptions options;
  options.reentrant = reentrant;
  Tensor h = Checkpoint([&w](const VariableList& in) { return Tanh(Mul(in[0], w)); }, {x}, options);
  h.set_name("h");
  h.retain_grad();
  h.register_hook([](const Tensor&) { return Tensor(); });
  w.register_post_accumulate_grad_hook(
      [](const Tensor&) { queue_callback_on_outermost_task([] {}); });
  Tensor loss = Sum(Mul(h, h));
  loss.set_name("loss");
  std::string dot = BackwardGraphToDot(loss);
  loss.backward();
  return dot;
}

// An f16 parameter whose scaled gradient overflows: the master-gradient update finds inf, the
// step is skipped and the scaler backs off.
std::string AmpSkippedStep() {
  Tensor w(RawTensor::FromVector<float>({1, 2}, {2}, kF16), true);
  w.set_name("w");
  auto sgd = std::make_unique<optim::SGD>(std::vector<Tensor>{w});
  amp::MixedPrecisionOptimizer opt(std::move(sgd));
  opt.attach();  // a plain backward of the scaled loss runs the master-grad update
  // 60000 * 65536 (the initial scale) overflows f16: the gradient of w is inf.
  Tensor x(RawTensor::FromVector<float>({60000, 1}, {2}, kF16));
  Tensor loss = Sum(Mul(w, x));
  loss.set_name("loss");
  Tensor scaled = opt.scale(loss);
  std::string dot = BackwardGraphToDot(scaled);
  scaled.backward();
  opt.step();
  return dot;
}

// Two ranks (threads) of DDP over Gloo on loopback; both record into the caller's scope.
absl::StatusOr<std::string> Ddp2Ranks() {
  TraceScope* trace = trace_internal::current;
  std::shared_ptr<dist::Store> store = dist::Store::InMemory();
  std::string dot;
  absl::Status status[2];
  auto rank_main = [&](int rank) {
    TraceScope::ThreadGuard trace_guard(trace);
    auto pg = dist::GlooProcessGroup::Create(rank, 2, "trace", absl::Seconds(30),
                                             store->WithPrefix("trace"));
    if (!pg.ok()) {
      status[rank] = pg.status();
      return;
    }
    Generator gen(0);
    auto model = std::make_shared<nn::LinearImpl>(2, 1, gen);
    dist::DdpOptions options;
    options.bucket_cap_bytes = 4;  // one bucket per parameter: two launches per backward
    dist::DistributedDataParallel ddp(model, *pg, options);
    Tensor x(RawTensor::FromVector<float>({1.0f + rank, 2}, {1, 2}));
    Tensor loss = Sum(ddp(x));
    if (rank == 0) dot = BackwardGraphToDot(loss);
    loss.backward();
  };
  std::thread rank1(rank_main, 1);
  rank_main(0);
  rank1.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return dot;
}

}  // namespace

std::vector<std::string> TraceExampleNames() {
  return {"reentrant_checkpoint", "non_reentrant_checkpoint", "amp_skipped_step", "ddp_2_ranks"};
}

absl::StatusOr<std::string> RunTraceExample(const std::string& name) {
  if (name == "reentrant_checkpoint") return Checkpointed(true);
  if (name == "non_reentrant_checkpoint") return Checkpointed(false);
  if (name == "amp_skipped_step") return AmpSkippedStep();
  if (name == "ddp_2_ranks") return Ddp2Ranks();
  return absl::NotFoundError(absl::StrCat("no trace example named '", name, "'"));
}

}  // namespace tg::tools
