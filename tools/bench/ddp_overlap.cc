// DistributedDataParallel on the CPU: what the bucketed all-reduce, overlapped with backward,
// costs per training step, and what DDP's hook + bucket bookkeeping costs per parameter.
//
//   bazel run -c opt //tools/bench:ddp_overlap
//
// 1. Bookkeeping (one process, a fake group whose collectives complete at once): backward of
//    N one-element parameters (loss = sum(cat(params))) with and without DDP, N = 10 .. 10^4;
//    the difference per parameter is the cost of DDP's hook (copy into the bucket slot, ready
//    counters, launch) plus its finaliser (wait, .grad = bucket view). Target < 1 us, constant
//    in N. Two cases: .grad set to none before each backward (the hook copies the fresh gradient
//    into the slot) and .grad kept (it is already the bucket view; backward accumulates in it).
// 2. Step time (forward + backward + AdamW step) of the tiny GPT (GptConfig::Tiny(65), batch
//    --batch_size x --seq tokens) on 2 ranks that this binary starts itself (it re-executes
//    itself with RANK / WORLD_SIZE / TG_RDZV=file://<fresh temp dir>, OPENBLAS_NUM_THREADS and
//    OMP_NUM_THREADS 1 so each rank computes on one core), Gloo over loopback:
//      (a) no communication (each rank trains alone): the baseline;
//      (b) one all_reduce(avg) of all gradients (one flat buffer) after backward, then the step;
//      (c) DDP with the default 25 MiB buckets (the tiny model fits one bucket: no overlap);
//      (d) DDP with --small_bucket_kib buckets (several buckets, launched during backward).
//    Printed: best ms/step over --rounds rounds of --steps_per_round steps, each block of steps
//    between two barriers so that every mode is timed on the slower rank (modes interleaved
//    within each round so that load changes hit all alike), x ratio against (a), the share of
//    (b)'s communication cost that (d) hides, the raw cost of the all_reduce alone, and how long
//    DDP's finaliser waited per step (communication not hidden by backward, plus waiting for the
//    slower rank). Rank 0 prints.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "distributed/process_group.h"
#include "nn/loss.h"
#include "nn/models/gpt.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "tensor/generator.h"

ABSL_FLAG(int64_t, batch_size, 16, "sequences per rank and step");
ABSL_FLAG(int64_t, seq, 64, "tokens per sequence (<= the tiny config's block size, 64)");
ABSL_FLAG(int, steps_per_round, 5, "timed steps per mode and round");
ABSL_FLAG(int, rounds, 5, "rounds (the best round counts)");
ABSL_FLAG(int64_t, small_bucket_kib, 64, "bucket cap of mode (d), KiB");
ABSL_FLAG(bool, rank_worker, false, "internal: this process is a rank started by the benchmark");

namespace {

using Clock = std::chrono::steady_clock;
using tg::Tensor;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- 1. Bookkeeping ---------------------------------------------------------------------------

class DoneWork : public tg::dist::Work {
 public:
  DoneWork() : Work(absl::Seconds(1)) {}
  absl::Status wait(absl::Duration) override { return absl::OkStatus(); }
  bool is_completed() override { return true; }
};

// World size 1: every collective is already done (the average of one rank is its value).
class ImmediateGroup : public tg::dist::ProcessGroup {
 public:
  ImmediateGroup() : ProcessGroup(0, 1, "immediate", absl::Seconds(1), tg::Device::Cpu()) {}
  const char* backend() const override { return "immediate"; }
  std::shared_ptr<tg::dist::Work> all_reduce(const tg::RawTensor&, tg::dist::ReduceOp) override {
    return done_;
  }
  std::shared_ptr<tg::dist::Work> reduce_scatter(const tg::RawTensor&, const tg::RawTensor&,
                                                 tg::dist::ReduceOp) override {
    return done_;
  }
  std::shared_ptr<tg::dist::Work> all_gather(const tg::RawTensor&, const tg::RawTensor&) override {
    return done_;
  }
  std::shared_ptr<tg::dist::Work> broadcast(const tg::RawTensor&, int) override { return done_; }
  std::shared_ptr<tg::dist::Work> barrier() override { return done_; }

 private:
  std::shared_ptr<tg::dist::Work> done_ = std::make_shared<DoneWork>();
};

// N one-element parameters.
class ManyParams : public tg::nn::Module {
 public:
  explicit ManyParams(int n) : Module("ManyParams") {
    for (int i = 0; i < n; ++i) {
      params_.push_back(register_parameter(absl::StrCat("p", i), tg::RawTensor::Full({1}, 0.5)));
    }
  }
  Tensor forward(const Tensor&) override {
    tg::VariableList all(params_.begin(), params_.end());
    return tg::Sum(tg::Cat(all, 0));
  }

 private:
  std::vector<Tensor> params_;
};

// Best backward time (seconds) of `model` over `reps` backwards; forward and zero_grad untimed.
double BestBackward(tg::nn::Module& model, int reps, bool set_to_none) {
  double best = 1e30;
  const std::vector<Tensor> params = model.parameters();
  for (int rep = 0; rep <= reps; ++rep) {
    if (set_to_none) {
      for (const Tensor& p : params) p.set_grad(Tensor());
    }
    Tensor loss = model(Tensor());
    const auto start = Clock::now();
    loss.backward();
    const double s = Since(start);
    if (rep > 0) best = std::min(best, s);
  }
  return best;
}

void BenchBookkeeping() {
  std::printf(
      "DDP hook + bucket bookkeeping per parameter (1-element parameters, a group whose\n"
      "collectives complete at once; backward with DDP minus backward without)\n");
  std::printf("  %8s  %14s  %14s  %18s  %18s\n", "params", "plain bwd us", "DDP bwd us",
              "ns/param (copy)", "ns/param (view)");
  auto pg = std::make_shared<ImmediateGroup>();
  for (const int n : {10, 100, 1000, 10000}) {
    const int reps = std::max(20, 200000 / n);
    auto plain = std::make_shared<ManyParams>(n);
    auto wrapped = std::make_shared<ManyParams>(n);
    tg::dist::DistributedDataParallel ddp(wrapped, pg);
    // Interleaved repetitions, best of each: both see the same machine load.
    double plain_none = 1e30, ddp_none = 1e30, plain_keep = 1e30, ddp_keep = 1e30;
    for (int round = 0; round < 3; ++round) {
      plain_none = std::min(plain_none, BestBackward(*plain, reps, true));
      ddp_none = std::min(ddp_none, BestBackward(*wrapped, reps, true));
      plain_keep = std::min(plain_keep, BestBackward(*plain, reps, false));
      ddp_keep = std::min(ddp_keep, BestBackward(*wrapped, reps, false));
    }
    std::printf("  %8d  %14.1f  %14.1f  %18.0f  %18.0f\n", n, plain_none * 1e6, ddp_none * 1e6,
                (ddp_none - plain_none) / n * 1e9, (ddp_keep - plain_keep) / n * 1e9);
    if (ddp.stats().synchronized_backwards == 0) std::printf("  (DDP did not run!)\n");
  }
  std::printf("  target: < 1000 ns/param, flat in the number of parameters\n\n");
}

// ---- 2. Step time on 2 ranks ------------------------------------------------------------------

enum Mode { kAlone, kAllReduceAfter, kDdpDefault, kDdpSmall, kNumModes };
const char* const kModeNames[kNumModes] = {"(a) no communication",
                                           "(b) one all_reduce of all grads after bwd",
                                           "(c) DDP, 25 MiB buckets", "(d) DDP, small buckets"};

struct Trainer {
  std::shared_ptr<tg::nn::Gpt> model;
  std::unique_ptr<tg::optim::AdamW> opt;
  std::unique_ptr<tg::dist::DistributedDataParallel> ddp;
  std::vector<Tensor> params;
  tg::RawTensor flat;  // [all gradient elements] f32, mode (b)
};

int RankMain() {
  absl::StatusOr<std::shared_ptr<tg::dist::ProcessGroup>> pg_or = tg::dist::InitProcessGroup();
  if (!pg_or.ok()) {
    std::fprintf(stderr, "ddp_overlap: %s\n", pg_or.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<tg::dist::ProcessGroup> pg = *pg_or;
  const bool print = pg->rank() == 0;
  const tg::nn::GptConfig config = tg::nn::GptConfig::Tiny(65);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size), seq = absl::GetFlag(FLAGS_seq);
  const int64_t small_cap = absl::GetFlag(FLAGS_small_bucket_kib) * 1024;

  std::vector<Trainer> trainers(kNumModes);
  for (int m = 0; m < kNumModes; ++m) {
    tg::Generator gen(1337);
    Trainer& t = trainers[m];
    t.model = std::make_shared<tg::nn::Gpt>(config, gen);
    t.params = t.model->parameters();
    tg::optim::AdamWOptions o;
    o.lr(1e-3);
    t.opt = std::make_unique<tg::optim::AdamW>(t.params, o);
    int64_t n = 0;
    for (const Tensor& p : t.params) n += p.numel();
    if (m == kAllReduceAfter) t.flat = tg::RawTensor::Empty({n}, tg::kF32);
    if (m == kDdpDefault || m == kDdpSmall) {
      tg::dist::DdpOptions d;
      if (m == kDdpSmall) d.bucket_cap_bytes = small_cap;
      t.ddp = std::make_unique<tg::dist::DistributedDataParallel>(t.model, pg, d);
    }
    if (print && m == 0) {
      std::printf(
          "tiny GPT: %lld parameters in %zu tensors (%.0f KiB of f32 gradients); "
          "%lld x %lld tokens per rank and step, 2 ranks\n",
          static_cast<long long>(n), t.params.size(), n * 4 / 1024.0, static_cast<long long>(batch),
          static_cast<long long>(seq));
    }
    if (print && t.ddp) {
      std::printf("  %s: %d bucket(s)\n", kModeNames[m], t.ddp->num_buckets());
    }
  }
  // Each rank its own tokens.
  tg::Generator data_gen(7 + pg->rank());
  std::vector<int64_t> tokens(batch * (seq + 1));
  for (int64_t& v : tokens) v = data_gen.NextU32() % config.vocab_size;
  tg::RawTensor all = tg::RawTensor::FromVector(tokens, {batch, seq + 1});
  const tg::RawTensor x = all.slice(1, 0, seq).contiguous();
  const tg::RawTensor y = all.slice(1, 1, seq + 1).contiguous();

  auto step = [&](int m) {
    Trainer& t = trainers[m];
    t.opt->zero_grad();
    const Tensor logits = t.ddp ? (*t.ddp)(Tensor(x)) : (*t.model)(Tensor(x));
    tg::nn::CrossEntropyLoss(logits, y).backward();
    if (m == kAllReduceAfter) {
      int64_t offset = 0;
      for (const Tensor& p : t.params) {
        t.flat.narrow(0, offset, p.numel()).view(p.shape()).copy_(p.grad().data());
        offset += p.numel();
      }
      TG_DIST_CHECK_OK(pg->all_reduce(t.flat, tg::dist::ReduceOp::kAvg)->wait());
      offset = 0;
      for (const Tensor& p : t.params) {
        p.grad().data().copy_(t.flat.narrow(0, offset, p.numel()).view(p.shape()));
        offset += p.numel();
      }
    }
    t.opt->step();
  };

  const int steps = absl::GetFlag(FLAGS_steps_per_round), rounds = absl::GetFlag(FLAGS_rounds);
  // The all-reduce of (b) alone, between two barriers: the raw cost of the communication.
  double best_all_reduce = 1e30;
  for (int rep = 0; rep <= 10; ++rep) {
    TG_DIST_CHECK_OK(pg->barrier()->wait());
    const auto start = Clock::now();
    TG_DIST_CHECK_OK(
        pg->all_reduce(trainers[kAllReduceAfter].flat, tg::dist::ReduceOp::kAvg)->wait());
    if (rep > 0) best_all_reduce = std::min(best_all_reduce, Since(start));
  }
  std::vector<double> best(kNumModes, 1e30);
  std::vector<double> exposed(kNumModes, 0);       // DDP finaliser time per step in the best round
  for (int round = 0; round <= rounds; ++round) {  // round 0: warm-up
    for (int m = 0; m < kNumModes; ++m) {
      TG_DIST_CHECK_OK(pg->barrier()->wait());  // both ranks start together
      const auto start = Clock::now();
      const double exposed_before =
          trainers[m].ddp ? trainers[m].ddp->stats().exposed_comm_seconds : 0;
      for (int s = 0; s < steps; ++s) step(m);
      // The closing barrier makes every mode the time of the slower rank ((a) included).
      TG_DIST_CHECK_OK(pg->barrier()->wait());
      const double per_step = Since(start) / steps;
      if (round > 0 && per_step < best[m]) {
        best[m] = per_step;
        if (trainers[m].ddp) {
          exposed[m] = (trainers[m].ddp->stats().exposed_comm_seconds - exposed_before) / steps;
        }
      }
    }
  }
  if (print) {
    std::printf("\nms/step (forward + backward + AdamW step), best of %d rounds x %d steps\n",
                rounds, steps);
    for (int m = 0; m < kNumModes; ++m) {
      std::printf("  %-44s %8.2f ms  x%.3f%s\n", kModeNames[m], best[m] * 1e3,
                  best[m] / best[kAlone], m == kAlone ? "  (baseline)" : "");
    }
    const double comm = best[kAllReduceAfter] - best[kAlone];
    if (comm > 0) {
      std::printf(
          "  communication cost after backward (b - a): %.2f ms; DDP small buckets "
          "(d - a): %.2f ms, i.e. %.0f%% of it hidden by overlap\n",
          comm * 1e3, (best[kDdpSmall] - best[kAlone]) * 1e3,
          100.0 * (1.0 - (best[kDdpSmall] - best[kAlone]) / comm));
    }
    std::printf("  one all_reduce of the %.0f KiB alone (between barriers): %.2f ms\n",
                trainers[kAllReduceAfter].flat.numel() * 4 / 1024.0, best_all_reduce * 1e3);
    for (int m : {kDdpDefault, kDdpSmall}) {
      const tg::dist::DdpStats& s = trainers[m].ddp->stats();
      std::printf(
          "  %s: %lld of %lld bucket launches during backward; the finaliser waited "
          "%.2f ms/step (communication not hidden)\n",
          kModeNames[m], static_cast<long long>(s.launched_from_hooks),
          static_cast<long long>(s.bucket_launches), exposed[m] * 1e3);
    }
  }
  return 0;
}

// Starts 2 ranks of this binary over a fresh file store and waits for them.
int LaunchRanks(int argc, char** argv) {
  std::string dir = (std::filesystem::temp_directory_path() / "ddp_overlap_XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::perror("ddp_overlap: mkdtemp");
    return 1;
  }
  constexpr int kWorld = 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("ddp_overlap: fork");
      return 1;
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(kWorld).c_str(), 1);
      setenv("TG_RDZV", ("file://" + dir).c_str(), 1);
      setenv("TG_JOB_ID", ("ddp_overlap-" + std::to_string(getppid())).c_str(), 1);
      setenv("OPENBLAS_NUM_THREADS", "1", 1);  // one core per rank (GEMM and the kernels' loops)
      setenv("OMP_NUM_THREADS", "1", 1);
      std::vector<std::string> args = {"/proc/self/exe", "--rank_worker"};
      for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
      std::vector<char*> cargs;
      for (std::string& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      execv("/proc/self/exe", cargs.data());
      std::perror("ddp_overlap: execv");
      _exit(127);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (const pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (failed > 0) std::fprintf(stderr, "ddp_overlap: %d rank(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_rank_worker)) return RankMain();
  BenchBookkeeping();
  std::fflush(stdout);
  return LaunchRanks(argc, argv);
}
