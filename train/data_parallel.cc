#include "train/data_parallel.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "distributed/init.h"
#include "tensor/error.h"

namespace tg::train {

DataParallel::~DataParallel() {
  if (log_ != stderr) std::fclose(log_);
}

absl::StatusOr<dist::DistEnv> DataParallel::ResolveWorldSize(const Flags& flags) {
  if (flags.world_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--world_size must be >= 1 (or 0: from the launcher's environment), got ",
                     flags.world_size));
  }
  if (flags.rank >= 0 && flags.world_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank=", flags.rank, " starts a rank by hand and needs --world_size (the ranks' count)"));
  }
  dist::DistOptions options;
  options.rdzv = flags.rdzv;
  if (flags.rank >= 0) {  // by hand: the flags decide, not a launcher's environment
    options.rank = static_cast<int>(flags.rank);
    options.world_size = static_cast<int>(flags.world_size);
  }
  absl::StatusOr<dist::DistEnv> env = dist::ResolveDistEnv(options);
  if (!env.ok()) return env.status();
  // --world_size=0 (the default): the launcher's world size, as a PyTorch script's env:// init
  // reads it (torchrun, srun, mpirun, tools:launch), 1 without a launcher. An explicit value
  // only confirms it: a different one is a mistake in the command line.
  const int64_t world_size = flags.world_size == 0 ? env->world_size : flags.world_size;
  if (env->world_size != world_size) {
    const std::string variable = env->launcher == "Open MPI" ? "OMPI_COMM_WORLD_SIZE"
                                 : env->launcher == "SLURM"  ? "SLURM_NTASKS"
                                                             : "WORLD_SIZE";
    return absl::InvalidArgumentError(absl::StrCat(
        "--world_size=", world_size, " but the environment has ", variable, "=", env->world_size,
        world_size > 1 && env->world_size == 1
            ? absl::StrCat(" (start the ranks with: bazel run //tools:launch -- --nproc=",
                           world_size, " -- <binary>)")
            : " (leave --world_size out to take the launcher's)"));
  }
  return env;
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Start(const Flags& flags,
                                                                  int64_t global_batch,
                                                                  Device device) {
  auto dp = std::make_unique<DataParallel>();
  dp->device_ = device;
  absl::StatusOr<dist::DistEnv> env = ResolveWorldSize(flags);
  if (!env.ok()) return env.status();
  const int64_t world_size = env->world_size;
  dist::DistOptions options;
  options.rdzv = flags.rdzv;
  if (flags.rank >= 0) {
    options.rank = static_cast<int>(flags.rank);
    options.world_size = static_cast<int>(flags.world_size);
  }
  // The CPU pool (threads.h): tools:launch and torchrun set OMP_NUM_THREADS, srun and mpirun do
  // not, and every rank would then start one thread per core.
  dp->local_world_size_ = env->local_world_size > 0 ? env->local_world_size
                          : env->launcher.empty()   ? 1
                                                    : -1;
  dp->threads_ = ChooseThreads(ReadThreadEnv(dp->local_world_size_));
  // Only a change is applied: setting the pool to the size it already has made the CNN's step
  // about 7% slower on a 2-vCPU EPYC (train_mnist, 120 steps, 2026-11-28), the default one
  // process always has.
  if (dp->threads_.set && dp->threads_.threads != omp_get_max_threads()) {
    omp_set_num_threads(dp->threads_.threads);
  }
  if (flags.zero_stage < 0 || flags.zero_stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--zero_stage=", flags.zero_stage,
                     " is not a ZeRO stage (expected 0 for DDP, or 1, 2 or 3)"));
  }
  if (flags.zero_stage > 0 && world_size == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--zero_stage=", flags.zero_stage,
        " shards across ranks and needs --world_size >= 2 (one process: --zero_stage=0)"));
  }
  if (flags.grad_accum_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad_accum_steps must be >= 1, got ", flags.grad_accum_steps));
  }
  if (global_batch % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the batch size ", global_batch,
                                                   " does not split evenly across ", world_size,
                                                   " ranks"));
  }
  if (global_batch % (world_size * flags.grad_accum_steps) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch size ", global_batch, " does not split evenly across ", world_size,
                     world_size == 1 ? " rank" : " ranks", " x ", flags.grad_accum_steps,
                     " micro-batches (--grad_accum_steps)"));
  }
  dp->zero_stage_ = static_cast<int>(flags.zero_stage);
  dp->grad_accum_steps_ = flags.grad_accum_steps;
  if (world_size == 1) return dp;
  if (device.is_cuda()) {
    options.backend = "nccl";
    dp->device_ = Device::Cuda(env->local_rank);
  }
  absl::StatusOr<std::shared_ptr<dist::ProcessGroup>> group = dist::InitProcessGroup(options);
  if (!group.ok()) return group.status();
  dp->group_ = *group;
  dp->rank_ = dp->group_->rank();
  dp->world_size_ = dp->group_->size();
  if (dp->rank_ != 0) {
    dp->log_ = std::fopen("/dev/null", "w");
    if (dp->log_ == nullptr) dp->log_ = stderr;
  }
  return dp;
}

void DataParallel::Wrap(std::shared_ptr<nn::Module> model,
                        std::vector<std::shared_ptr<nn::Module>> zero_units) {
  model_ = model;
  zero_units_ = std::move(zero_units);
  // f16 (dynamic loss scaling): every rank's backward starts from loss / world_size and DDP or
  // ZeRO sums, so that each row's backward values are those of one process on the global batch.
  // With the local mean loss and an average after, they are world_size times larger, and at a
  // loss scale near f16's limit a rank's backward overflows where one process's does not (one
  // epoch of the f16 MLP on 4 ranks skipped step 13, one process step 25). The sum (in f32,
  // rounded once) then equals the average of before. f32 and bf16 keep the average, bit for bit
  // as before (dividing the seed by a world size that is not a power of two rounds differently).
  sum_gradients_ = false;
  if (group_ != nullptr) {
    for (const Tensor& p : model->parameters()) {
      if (p.requires_grad() && p.dtype() == kF16) sum_gradients_ = true;
    }
  }
  if (group_ != nullptr && zero_stage_ == 0) {
    dist::DdpOptions options;
    if (sum_gradients_) options.reduce_op = dist::ReduceOp::kSum;
    ddp_ = std::make_unique<dist::DistributedDataParallel>(std::move(model), group_, options);
  }
}

absl::StatusOr<std::unique_ptr<amp::TrainingOptimizer>> DataParallel::MakeOptimizer(
    const OptimizerConfig& config, const PrecisionConfig& precision) {
  TG_CHECK(model_ != nullptr, "DataParallel::MakeOptimizer: call Wrap(model) first");
  if (zero_stage_ == 0) {
    absl::StatusOr<std::unique_ptr<amp::MixedPrecisionOptimizer>> mp =
        MakeMixedPrecisionOptimizer(model_->parameters(), config, precision);
    if (!mp.ok()) return mp.status();
    return std::unique_ptr<amp::TrainingOptimizer>(std::move(*mp));
  }
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> opt =
      train::MakeOptimizer(model_->parameters(), config);
  if (!opt.ok()) return opt.status();
  PrecisionConfig own = precision;
  own.reduce_found_inf = nullptr;  // ZeroOptimizer max-reduces found_inf itself
  absl::StatusOr<amp::MixedPrecisionOptions> mp = MakeMixedPrecisionOptions(own);
  if (!mp.ok()) return mp.status();
  dist::ZeroOptions zo;
  zo.stage = zero_stage_;
  if (sum_gradients_) zo.reduce_op = dist::ReduceOp::kSum;  // see Wrap
  zo.mixed_precision = std::move(*mp);
  if (zero_stage_ == 3) {
    zo.module = model_;
    zo.units = zero_units_;
  }
  auto zero = std::make_unique<dist::ZeroOptimizer>(group_, std::move(*opt), std::move(zo));
  zero_ = zero.get();
  return std::unique_ptr<amp::TrainingOptimizer>(std::move(zero));
}

RunState::Sharding DataParallel::sharding() const {
  RunState::Sharding s;
  if (zero_ == nullptr) return s;
  s.collective = true;
  s.model_preloaded = zero_stage_ == 3;
  if (zero_stage_ == 3) {
    dist::ZeroOptimizer* zero = zero_;
    std::shared_ptr<nn::Module> model = model_;
    s.model_state = [zero, model] {
      // The placeholders replaced by the gathered parameters (optimizer order -> names).
      StateDict state = model->state_dict();
      const std::vector<RawTensor> full = zero->full_parameters();
      const std::vector<Tensor>& params = zero->model_params();
      for (const auto& [name, p] : model->named_parameters()) {
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].impl() == p.impl()) state.tensors[name] = full[i];
        }
      }
      return state;
    };
  }
  return s;
}

Accumulation DataParallel::accumulation() {
  Accumulation a;
  a.micro_batches = grad_accum_steps_;
  if (sum_gradients_) a.summed_ranks = world_size_;
  if (ddp_ != nullptr) {
    dist::DistributedDataParallel* ddp = ddp_.get();
    a.sync_scope = [ddp](bool sync, const std::function<void()>& body) {
      if (sync) {
        body();
      } else {
        auto no_sync = ddp->no_sync();
        body();
      }
    };
  }
  return a;
}

RawTensor DataParallel::Micro(const RawTensor& rows, int64_t k) const {
  if (grad_accum_steps_ == 1) return rows;
  const int64_t n = rows.size(0) / grad_accum_steps_;
  TG_CHECK(n * grad_accum_steps_ == rows.size(0), "DataParallel::Micro: ", rows.size(0),
           " rows do not split evenly into ", grad_accum_steps_, " micro-batches");
  TG_CHECK(k >= 0 && k < grad_accum_steps_, "DataParallel::Micro: micro-batch ", k,
           " is outside [0, ", grad_accum_steps_, ")");
  return rows.narrow(0, k * n, n);
}

Tensor DataParallel::Forward(nn::Module& model, const Tensor& input) {
  if (ddp_ != nullptr) {
    TG_CHECK(ddp_->module().get() == &model,
             "DataParallel::Forward: the model is not the one passed to Wrap()");
    return (*ddp_)(input);
  }
  return model(input);
}

RawTensor DataParallel::Local(const RawTensor& global) const {
  if (world_size_ == 1) return global;
  const int64_t rows = global.size(0) / world_size_;
  TG_CHECK(rows * world_size_ == global.size(0), "DataParallel::Local: ", global.size(0),
           " rows do not split evenly across ", world_size_, " ranks");
  return global.narrow(0, rank_ * rows, rows);
}

DataParallel::Agreement DataParallel::Agree(double loss, int signal) const {
  if (group_ == nullptr) return {loss, StopRequest{signal, -1, 0}};
  // [loss sum, the signal of rank 0, ..., of rank world-1], reduced with one sum.
  std::vector<double> v(1 + world_size_, 0.0);
  v[0] = loss;
  v[1 + rank_] = signal;
  RawTensor t = RawTensor::FromVector(v, {static_cast<int64_t>(v.size())}).to(group_->device());
  TG_DIST_CHECK_OK(group_->all_reduce(t, dist::ReduceOp::kSum)->wait());
  v = t.to_vector<double>();
  Agreement agreed;
  agreed.mean_loss = v[0] / world_size_;
  agreed.stop.this_rank = rank_;
  for (int r = 0; r < world_size_ && agreed.stop.signal == 0; ++r) {
    if (v[1 + r] != 0) agreed.stop = StopRequest{static_cast<int>(v[1 + r]), r, rank_};
  }
  return agreed;
}

namespace {

// FNV-1a of the fingerprint text; it travels as two 32-bit halves in an i64 tensor.
uint64_t Fingerprint(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::Status DataParallel::CheckSameRun(const std::vector<std::string>& lines) const {
  if (group_ == nullptr) return absl::OkStatus();
  std::string text;
  for (const std::string& line : lines) absl::StrAppend(&text, line, "\n");
  const int world = world_size_;
  auto gather = [&](const RawTensor& mine) -> absl::StatusOr<RawTensor> {
    RawTensor all = RawTensor::Empty({world * mine.numel()}, mine.dtype(), group_->device());
    absl::Status s = group_->all_gather(all, mine.to(group_->device()))->wait();
    if (!s.ok()) return s;
    return all.to(Device::Cpu());
  };
  // 1. The hash and the length: equal everywhere is the common case, one small collective.
  const uint64_t h = Fingerprint(text);
  absl::StatusOr<RawTensor> heads = gather(RawTensor::FromVector(
      std::vector<int64_t>{static_cast<int64_t>(h >> 32), static_cast<int64_t>(h & 0xffffffffu),
                           static_cast<int64_t>(text.size())},
      {3}));
  if (!heads.ok()) return heads.status();
  const std::vector<int64_t> head = heads->to_vector<int64_t>();
  int64_t longest = 0;
  bool same = true;
  for (int r = 0; r < world; ++r) {
    same = same && head[3 * r] == head[0] && head[3 * r + 1] == head[1] &&
           head[3 * r + 2] == head[2];
    longest = std::max(longest, head[3 * r + 2]);
  }
  if (same) return absl::OkStatus();
  // 2. The texts, padded to the longest (the same size on every rank), a byte per i32 (the
  // collectives take no u8).
  std::vector<int32_t> padded(static_cast<size_t>(std::max<int64_t>(longest, 1)), 0);
  std::copy(text.begin(), text.end(), padded.begin());
  absl::StatusOr<RawTensor> texts =
      gather(RawTensor::FromVector(padded, {static_cast<int64_t>(padded.size())}));
  if (!texts.ok()) return texts.status();
  const std::vector<int32_t> chars = texts->to_vector<int32_t>();
  auto lines_of = [&](int r) -> std::vector<std::string> {
    const auto begin = chars.begin() + static_cast<int64_t>(r * padded.size());
    const std::string rank_text(begin, begin + head[3 * r + 2]);
    return absl::StrSplit(rank_text, '\n', absl::SkipEmpty());
  };
  // Every rank computes the same message: the first rank that differs from rank 0, at the first
  // line where it differs.
  const std::vector<std::string> first = lines_of(0);
  for (int r = 1; r < world; ++r) {
    const std::vector<std::string> other = lines_of(r);
    if (other == first) continue;
    size_t i = 0;
    while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
    const std::string mine = i < other.size() ? other[i] : "nothing more";
    const std::string theirs = i < first.size() ? first[i] : "nothing more";
    return absl::FailedPreconditionError(absl::StrCat(
        "the ranks disagree on the run: rank ", r, " has ", mine, ", rank 0 has ", theirs,
        " (start every rank with the same flags and data)"));
  }
  return absl::OkStatus();  // equal texts with a hash collision: impossible, but not an error
}

std::function<void(const RawTensor&)> DataParallel::ReduceFoundInf() const {
  if (group_ == nullptr) return nullptr;
  return dist::MaxFoundInfAcrossRanks(group_);
}

std::function<void(std::vector<float>&)> DataParallel::AmaxReducer() const {
  if (group_ == nullptr) return nullptr;
  return dist::MaxAmaxesAcrossRanks(group_, device_);
}

absl::StatusOr<RunStart> StartRun(const RunStartOptions& options, Device device) {
  absl::StatusOr<dist::DistEnv> launcher = DataParallel::ResolveWorldSize(options.parallel);
  if (!launcher.ok()) return launcher.status();
  absl::StatusOr<BatchSizes> batch =
      ResolveBatchSizes(options.batch_size, options.micro_batch_size, options.default_batch_size,
                        options.parallel.grad_accum_steps, launcher->world_size);
  absl::StatusOr<std::unique_ptr<DataParallel>> dp = DataParallel::Start(
      options.parallel, batch.ok() ? batch->global : options.batch_size.value_or(1), device);
  if (!dp.ok()) return dp.status();
  if (!batch.ok()) return batch.status();
  RunStart start{std::move(*dp), *batch};
  std::fprintf(start.dp->log(), "%s\n", start.dp->threads().reason.c_str());
  absl::StatusOr<int> restart_count = ElasticRestartCount();
  if (!restart_count.ok()) return restart_count.status();
  std::string resume_line;
  absl::StatusOr<bool> resume =
      DecideResume(options.resume, options.checkpoint_dir, *restart_count, &resume_line);
  if (!resume.ok()) return resume.status();
  start.resume = *resume;
  if (!resume_line.empty()) std::fprintf(start.dp->log(), "%s\n", resume_line.c_str());
  return start;
}

}  // namespace tg::train
