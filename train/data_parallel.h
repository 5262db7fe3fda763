// Data-parallel training for the training binaries (--world_size through tools:launch):
// every rank builds the same model from the same seed, draws the same global batch order and
// reads only its rows of each batch (Rows()); DistributedDataParallel averages the gradients
// during backward (--zero_stage=0), or dist::ZeroOptimizer shards the optimizer state, the
// gradients and the parameters (--zero_stage=1|2|3), so each step equals a single-process step on
// the global batch. --grad_accum_steps=N splits each rank's rows into N micro-batches with one
// optimizer step (DDP's no_sync on all but the last). Rank 0 alone prints, writes metrics and
// checkpoints (every rank can resume from them, at any stage and world size).
//
//   bazel run //tools:launch -- --nproc=2 -- bazel-bin/tools/train_mnist   # world size 2
//   torchrun --nproc-per-node=2 train_mnist      # or srun -n 2 / mpirun -np 2 train_mnist
//   train_mnist --world_size=2 --rank=1 --rdzv=redis://host0:6379   # by hand, on each machine
//
//   auto dp = tg::train::DataParallel::Start({world_size, rank, rdzv}, batch_size, device);
//   dp->Wrap(model);                        // before the optimizer (DDP's epilogue runs first)
//   precision.reduce_found_inf = dp->ReduceFoundInf();
//   auto opt = dp->MakeOptimizer(model, opt_config, precision).value();   // MPO or ZeRO
//   auto b = batcher.Next(dp->rank(), dp->world_size());                  // this rank's rows
//   TrainStep(*opt, schedule, dtype, clip, [&](int64_t k) {
//     return nn::CrossEntropyLoss(dp->Forward(*model, Tensor(dp->Micro(b.images, k))),
//                                 dp->Micro(b.labels, k)); }, dp->accumulation());
#ifndef TAPEGRAD_TRAIN_DATA_PARALLEL_H_
#define TAPEGRAD_TRAIN_DATA_PARALLEL_H_

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "amp/training_optimizer.h"
#include "autograd/variable.h"
#include "distributed/ddp.h"
#include "distributed/init.h"
#include "distributed/process_group.h"
#include "distributed/zero.h"
#include "nn/module.h"
#include "tensor/device.h"
#include "tensor/tensor.h"
#include "train/flag_values.h"
#include "train/optimizer_setup.h"
#include "train/resume_flag.h"
#include "train/run_state.h"
#include "train/stop_signal.h"
#include "train/threads.h"
#include "train/train_step.h"

namespace tg::train {

class DataParallel {
 public:
  // The binaries' flags.
  struct Flags {
    int64_t world_size = 0;        // --world_size: 0: the launcher's (WORLD_SIZE, ...), else 1
    int64_t rank = -1;             // --rank: without a launcher (each process started by hand)
    std::string rdzv;              // --rdzv: file:///dir or redis://host:port (default: TG_RDZV)
    int64_t zero_stage = 0;        // --zero_stage: 0 (DDP) or the ZeRO stage 1..3
    int64_t grad_accum_steps = 1;  // --grad_accum_steps: micro-batches per optimizer step
  };
  // The run's launcher environment with its world size: --world_size, or (0, the default) the
  // launcher's (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS; 1 without a launcher); an
  // explicit value that differs from the environment's is refused. Start calls it first;
  // StartRun calls it before Start to size the batch (train::ResolveBatchSizes).
  static absl::StatusOr<dist::DistEnv> ResolveWorldSize(const Flags& flags);
  // world_size 0 (the default): the launcher's world size (torchrun's and tools:launch's
  // WORLD_SIZE, mpirun's OMPI_COMM_WORLD_SIZE, srun's SLURM_NTASKS; distributed/init.h), 1
  // without one. An explicit world size must match the launcher's (InvalidArgument naming both);
  // with --rank the flags alone say who is who (--world_size is then required, --rdzv names the
  // rendezvous). When OMP_NUM_THREADS is unset, sizes the CPU pool for the ranks on this node
  // (threads.h; threads() says how, for the binary's first output line). The global batch must
  // split evenly across the ranks (and each rank's rows across the --grad_accum_steps
  // micro-batches).
  // --zero_stage must be 0..3, and 1..3 need a group (--world_size >= 2; InvalidArgument says
  // so). Joins the default process group (its errors name missing ranks); a CUDA
  // `device` uses NCCL and each rank's cuda:LOCAL_RANK (device() says which).
  static absl::StatusOr<std::unique_ptr<DataParallel>> Start(const Flags& flags,
                                                             int64_t global_batch, Device device);
  ~DataParallel();

  int rank() const { return rank_; }
  // How the CPU thread pool was sized ("threads: 4 (OMP_NUM_THREADS unset: 8 CPUs / 2 ranks on
  // this node)"); threads.h.
  const ThreadChoice& threads() const { return threads_; }
  int world_size() const { return world_size_; }
  bool is_main() const { return rank_ == 0; }
  bool distributed() const { return group_ != nullptr; }
  // The device this rank trains on.
  Device device() const { return device_; }
  // Where this rank prints progress: stderr on rank 0, /dev/null elsewhere.
  std::FILE* log() const { return log_; }

  int zero_stage() const { return zero_stage_; }
  int64_t grad_accum_steps() const { return grad_accum_steps_; }
  // ZeRO stage 3: the model's parameters are sharded, so every forward (evaluation and
  // sampling included) is a collective that every rank runs.
  bool sharded_parameters() const { return zero_stage_ == 3; }

  // Stage 0: wraps the model in DistributedDataParallel (rank 0's weights broadcast); no-op for
  // one process. A model with f16 parameters gets DDP (or ZeRO) with ReduceOp::kSum, and
  // accumulation() then divides each rank's loss by the world size before its backward (the
  // per-row gradients of one process on the global batch: f16 overflows, and so skipped steps,
  // as in one process).
  // Stages 1-3 keep the model for MakeOptimizer; stage 3 gathers the parameters of each of
  // `zero_units` (inner ones first, ZeroOptions::units) around its forward, by default of each
  // module that owns parameters (wrong for a model that uses a child's parameter outside the
  // child's forward, e.g. a GPT's tied embedding: give its blocks and then the model). Call before
  // building the optimizer.
  void Wrap(std::shared_ptr<nn::Module> model,
            std::vector<std::shared_ptr<nn::Module>> zero_units = {});
  // The training optimizer over the wrapped model's parameters: a MixedPrecisionOptimizer
  // (stage 0, with `precision.reduce_found_inf`) or a ZeroOptimizer of the stage (its own
  // found_inf reduction; stage 3 shards the model). InvalidArgument names an unknown optimizer
  // or scaler.
  absl::StatusOr<std::unique_ptr<amp::TrainingOptimizer>> MakeOptimizer(
      const OptimizerConfig& config, const PrecisionConfig& precision);
  // For RunState::set_sharding: the model's whole state (gathered in stage 3), collectives.
  RunState::Sharding sharding() const;
  // The micro-batching of TrainStep: --grad_accum_steps, and DDP's no_sync.
  Accumulation accumulation();
  // The model's forward (through DDP when distributed).
  Tensor Forward(nn::Module& model, const Tensor& input);
  // This rank's rows of a global batch [B, ...]: rows [rank * B / world, (rank + 1) * B / world).
  RawTensor Local(const RawTensor& global) const;
  // Micro-batch k of this rank's rows [b, ...]: rows [k * b / N, (k + 1) * b / N) for
  // N = grad_accum_steps (the rows themselves for N = 1).
  RawTensor Micro(const RawTensor& rows, int64_t k) const;
  // After each step, on every rank: the mean of `loss` over the ranks (the loss of the global
  // batch, for reports) and whether a rank wants to stop (`signal` != 0: a signal reaches the
  // ranks at different steps; they must stop after the same one), with the signal and the lowest
  // rank that received one. One all_reduce of 1 + world_size numbers.
  struct Agreement {
    double mean_loss = 0;
    StopRequest stop;  // stop.signal == 0: go on
  };
  Agreement Agree(double loss, int signal) const;

  // At start, on every rank: the ranks compare a fingerprint of their run (`lines`: "name=value"
  // for the settings, every parameter's name, shape and dtype, the data size, ...). Ranks that
  // disagree would crash inside a collective or silently train different things; here every rank
  // gets the same FailedPrecondition naming the first difference from rank 0's fingerprint:
  // "the ranks disagree: rank 1 has batch_size=32, rank 0 has batch_size=64". Exchanged with
  // fixed-size collectives only (a hash, then the lengths, then the padded texts).
  absl::Status CheckSameRun(const std::vector<std::string>& lines) const;
  // For MixedPrecisionOptions::reduce_found_inf (null for one process).
  std::function<void(const RawTensor&)> ReduceFoundInf() const;
  // For amp::Fp8Training::set_amax_reducer: the all-reduce MAX of a pass's amaxes over the
  // ranks (null for one process).
  std::function<void(std::vector<float>&)> AmaxReducer() const;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  int local_world_size_ = -1;
  ThreadChoice threads_;
  Device device_;
  std::FILE* log_ = stderr;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::unique_ptr<dist::DistributedDataParallel> ddp_;
  bool sum_gradients_ = false;  // f16: backward on loss / world_size, gradients summed
  int zero_stage_ = 0;
  int64_t grad_accum_steps_ = 1;
  std::shared_ptr<nn::Module> model_;
  std::vector<std::shared_ptr<nn::Module>> zero_units_;
  dist::ZeroOptimizer* zero_ = nullptr;  // made by MakeOptimizer (owned by the caller)
};

// The start every training binary shares, in the order of its checks and first output lines:
// the world size (DataParallel::ResolveWorldSize), the batch sizes split across it
// (ResolveBatchSizes: --batch_size global, --micro_batch_size per pass), DataParallel::Start
// (its errors before the batch flags' own, as tests/tools pin them), then rank 0's first line
// (how the CPU pool was sized) and what --resume decided (DecideResume, elastic restarts
// included), printed as the second line when it says something.
struct RunStartOptions {
  DataParallel::Flags parallel;
  std::optional<int64_t> batch_size;        // --batch_size (global)
  std::optional<int64_t> micro_batch_size;  // --micro_batch_size
  int64_t default_batch_size = 1;           // the binary's default global batch
  ResumeFlag resume;                        // --resume
  std::string checkpoint_dir;               // --checkpoint_dir, resolved
};
struct RunStart {
  std::unique_ptr<DataParallel> dp;
  BatchSizes batch;
  bool resume = false;  // restore the checkpoint of checkpoint_dir
};
absl::StatusOr<RunStart> StartRun(const RunStartOptions& options, Device device);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_DATA_PARALLEL_H_
