// DistributedDataParallel: data-parallel training of one nn::Module replicated on every rank of
// a ProcessGroup. Each rank runs forward and backward on its own slice of the global batch; the
// gradients are averaged across ranks bucket by bucket while the backward is still running, so
// that after backward() every rank holds the gradient of the mean loss over the global batch and
// the optimizers of all ranks take the same step (docs/architecture.md, distributed).
//
//   auto pg = tg::dist::InitProcessGroup().value();
//   auto model = std::make_shared<tg::nn::Mlp>(sizes, gen, tg::nn::Mlp::Options{});
//   tg::dist::DistributedDataParallel ddp(model, pg);       // broadcasts rank 0's weights
//   tg::optim::SGD sgd(model->parameters(), sgd_options);
//   for (...) {
//     sgd.zero_grad();
//     tg::Tensor loss = tg::nn::MseLoss(ddp(x_local), y_local);   // mean over the local batch
//     loss.backward();          // .grad = mean over ranks of the local gradients, on every rank
//     sgd.step();
//   }
//   {                           // gradient accumulation: no communication for this micro-batch
//     auto no_sync = ddp.no_sync();
//     loss1.backward();
//   }
//   loss2.backward();           // reduces the gradient accumulated over both micro-batches
//
// With mixed precision, build DDP before attaching the optimizer so that DDP's epilogue runs
// first (see "Mixed precision" below):
//   tg::dist::DistributedDataParallel ddp(model, pg);
//   tg::amp::MixedPrecisionOptimizer::Options mp;
//   mp.reduce_found_inf = tg::dist::MaxFoundInfAcrossRanks(pg);  // optional, see below
//   tg::amp::MixedPrecisionOptimizer opt(std::make_unique<tg::optim::SGD>(params, o), mp);
//   opt.attach();
//   opt.scale(loss).backward();  opt.step();
//
// How it works and the decisions (PyTorch's torch.nn.parallel.DistributedDataParallel where
// this comment is silent):
// - Construction broadcasts every parameter (also those that do not require grad) and, with
//   broadcast_buffers, every buffer from rank 0, as one flat buffer per dtype (u8/bool travel as
//   i32), and waits: all replicas start equal. With broadcast_buffers, buffers are broadcast
//   again before every forward (PyTorch's default), when the module has any.
// - Buckets: the parameters that require grad (deduplicated: a shared parameter once, under its
//   first name) in REVERSE registration order -- roughly the order in which backward produces
//   their gradients -- are cut into buckets of at most bucket_cap_bytes; a parameter larger than
//   the cap gets a bucket of its own, and a change of dtype starts a new bucket (one dtype per
//   bucket). Each bucket is one flat contiguous buffer on the group's device(); every parameter
//   has a fixed slot (a view of its shape) in it. bucket_layout() shows the result.
// - A post-accumulate-grad hook on every parameter copies the accumulated .grad into its slot
//   and marks it ready. When a bucket is complete its all_reduce (kAvg by default) is launched
//   asynchronously, but buckets are launched strictly in bucket order (a complete bucket waits
//   until every earlier bucket has been launched), so every rank issues the same sequence of
//   collectives whatever order its backward ran in. Communication thus overlaps the rest of the
//   backward.
// - The first hook of the outermost user backward queues a finaliser on that outermost graph
//   task (queue_callback_on_outermost_task), so it runs once per backward after every gradient,
//   including those accumulated in nested tasks of reentrant checkpointing. It handles the
//   parameters whose hook never fired (find_unused_parameters: their slot gets their current
//   .grad, e.g. one accumulated under no_sync, or zeros, and they count as ready; otherwise it
//   throws tg::Error naming them), launches the remaining buckets, waits for every Work (a failed
//   collective throws tg::Error out of backward, after every Work was waited on), and makes each
//   parameter's .grad a view of its bucket slot (PyTorch's gradient_as_bucket_view=True: no copy
//   back and no second gradient buffer). An unused parameter thus ends with a defined .grad
//   (zeros when no rank used it). Consequences of the views: a later backward without
//   zero_grad accumulates straight into the bucket (then the hook's copy is skipped), and a
//   .grad tensor held by the caller is overwritten by the next synchronised backward; zero_grad
//   (set to none or in place) and optimizers work as usual.
// - Backward passes started inside a ForwardScope (backward_issued_in_forward(): issued by a
//   model's forward, a forward hook or a custom function's Forward; operator() enters a
//   ForwardScope around the module, and so does every nn::Module call) communicate nothing:
//   their gradients stay in .grad and the hook only records that the parameter has one. The
//   next synchronised backward reduces them (DeepSpeed's rule: the inner backward calls feed
//   the gradients, the reduction runs once, after the user's backward): a parameter whose hook
//   fires there already holds the forward-time part in its .grad (AccumulateGrad adds to it);
//   one whose hook does not fire (its only gradient came from the forward, e.g. the head of a
//   tiled loss) is reduced with its .grad by the finaliser, as if its hook had fired, also
//   without find_unused_parameters (stats().forward_grads_reduced counts them). Under
//   no_sync the record survives until the next synchronised backward. The finaliser is queued
//   by the user backward's first hook, so that backward must reach at least one parameter of
//   the module; DDP does not own step(): a step taken after a forward-time backward and no user
//   backward uses the local, unreduced .grad (as PyTorch's DDP would).
// - A hook that fires a second time for the same parameter in one backward (a parameter used
//   both inside and outside a reentrant checkpoint: its .grad accumulates in two graph tasks)
//   copies the slot again when the bucket has not been launched yet (the slot then holds the
//   full gradient); once the bucket's all_reduce is in flight the late contribution cannot be
//   included, so it throws tg::Error naming the parameter (a larger bucket_cap_bytes or
//   non-reentrant checkpointing avoids it).
// - no_sync(): while a guard is alive the hooks do nothing, .grad accumulates locally and no
//   collective is issued; the next synchronised backward reduces the accumulated gradient. The
//   guard must cover the backward (the flag is read when the hooks fire).
// - The hot path costs O(1) per parameter and allocates nothing: hooks capture the parameter's
//   index, slots are precomputed views, the per-backward state is a few flags and counters
//   (reset in one pass when the next backward starts). tools/bench:ddp_overlap measures the
//   per-parameter bookkeeping (hook + finaliser): about 0.1-0.2 us when the hook copies a fresh
//   .grad, 0.03-0.08 us when .grad is already the bucket view, flat from 10 to 10^4 parameters.
// - A backward that throws (a hook, another callback, the finaliser) leaves this rank's
//   collective sequence wherever it stopped: the next backward first waits for the Works still
//   in flight (ignoring their status) and starts afresh; after a failure on only some ranks the
//   job cannot continue (as with every collective library).
// - Mixed precision: amp::MixedPrecisionOptimizer::attach() uses the same first-hook technique,
//   and callbacks run FIFO, hooks in registration order. Constructing DDP before attach() makes
//   DDP's hook the first to fire, so DDP's finaliser is queued (and runs) before the optimizer's
//   master-grad epilogue: the master gradients are made from the averaged gradients. The
//   facade's opt.backward(loss) updates the masters after backward() returns, also after DDP.
//   Gradients are averaged in the parameters' dtype (f16 scaled gradients stay f16), so an
//   overflow on one rank makes the average inf/NaN on every rank and every rank skips the
//   step; MaxFoundInfAcrossRanks additionally makes found_inf itself agree. The f16 average
//   itself never overflows (both backends sum f16 in f32 and round once, process_group.h), so
//   a step is skipped only where some rank's local gradient overflowed. With each rank's loss
//   its local mean, the local backward's per-row values are world times those of one process
//   on the global batch and may overflow where that one's do not; train::DataParallel therefore
//   divides each rank's f16 loss by the world size and uses reduce_op kSum (same per-row values,
//   same skipped steps as one process: tests/tools:data_parallel_test).
// - Thread safety: one backward at a time (the engine runs a backward's hooks sequentially).
//   The object must outlive every backward through its module; it cannot be copied or moved.
#ifndef TAPEGRAD_DISTRIBUTED_DDP_H_
#define TAPEGRAD_DISTRIBUTED_DDP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tg::dist {

struct DdpOptions {
  // Upper bound of a bucket's buffer (a larger parameter gets a bucket of its own). > 0.
  int64_t bucket_cap_bytes = int64_t{25} << 20;
  // Parameters whose hook did not fire in a backward count as ready with their current .grad
  // (zeros when they have none) instead of making the backward throw.
  bool find_unused_parameters = false;
  // Broadcast rank 0's parameters at construction (all replicas start equal).
  bool broadcast_parameters = true;
  // Broadcast rank 0's buffers at construction and before every forward.
  bool broadcast_buffers = true;
  // kAvg (the gradient of the mean loss over the global batch) or kSum.
  ReduceOp reduce_op = ReduceOp::kAvg;
};

// One bucket of the layout, for tests and logs.
struct DdpBucketLayout {
  DType dtype = kF32;
  int64_t numel = 0;                     // elements of the flat buffer
  std::vector<std::string> param_names;  // in slot order (reverse registration order)
  std::vector<int64_t> offsets;          // each parameter's first element in the buffer
};

// Counters since construction, for tests and logs.
struct DdpStats {
  int64_t synchronized_backwards = 0;  // finalisers that completed
  int64_t bucket_launches = 0;         // all_reduce calls for buckets
  int64_t launched_from_hooks = 0;     // of those, launched during backward (overlapped)
  int64_t grads_copied = 0;            // hook calls that copied a gradient into its slot
  int64_t recopies = 0;                // of those, a second hook for the same parameter
  // Parameters whose hook did not fire in a synchronised backward, reduced with the gradient a
  // backward issued in forward left in their .grad.
  int64_t forward_grads_reduced = 0;
  // Time the finalisers spent launching the remaining buckets and waiting for every Work: the
  // communication that backward did not hide.
  double exposed_comm_seconds = 0;
};

class DistributedDataParallel {
 public:
  // Broadcasts (see DdpOptions) and waits, builds the buckets and registers the hooks. Throws
  // tg::Error when the module has no parameter that requires grad, a parameter is not on the
  // group's device, or an option is out of range.
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                          DdpOptions options = {});
  // Removes the hooks and waits for collectives still in flight (ignoring their status).
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's forward (operator(), with its hooks) inside a ForwardScope, after the buffer
  // broadcast when enabled.
  Tensor operator()(const Tensor& input);
  Tensor forward(const Tensor& input) { return (*this)(input); }

  // RAII: while alive, backward passes do not communicate and .grad accumulates locally.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel* ddp) : ddp_(ddp) { ++ddp_->no_sync_depth_; }
    ~NoSyncGuard() { --ddp_->no_sync_depth_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(this); }
  bool sync_enabled() const { return no_sync_depth_ == 0; }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  const DdpOptions& options() const { return options_; }
  // The buckets in launch order.
  std::vector<DdpBucketLayout> bucket_layout() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  const DdpStats& stats() const { return stats_; }
  // Test probe: called with the bucket index right after its all_reduce was launched (from a
  // hook during backward, or from the finaliser).
  void set_bucket_launch_observer(std::function<void(int bucket)> observer) {
    launch_observer_ = std::move(observer);
  }

 private:
  struct Param {
    Tensor var;
    std::string name;
    int32_t bucket = 0;
    int32_t registration_index = 0;  // position in the module's deduplicated parameters
    int64_t offset = 0;              // first element of the slot in the bucket buffer
    RawTensor slot;                  // view of the bucket buffer with the parameter's shape
    Tensor grad_view;                // Tensor(slot): becomes .grad after the reduction
    bool ready = false;              // the slot holds this backward's gradient
    // .grad holds a gradient accumulated by a backward issued in forward (ForwardScope) since
    // the last synchronised backward: reduced by the next one even if its hook does not fire.
    bool forward_grad = false;
  };
  struct Bucket {
    RawTensor buffer;                        // [numel] of the bucket's dtype, on pg_->device()
    int32_t first_param = 0, end_param = 0;  // range in params_
    int32_t pending = 0;                     // parameters not ready yet in this backward
    bool launched = false;
    std::shared_ptr<Work> work;
  };

  void BroadcastFromRank0(const std::vector<RawTensor>& tensors, const char* what);
  void BroadcastBuffers();
  void OnGradAccumulated(int32_t index);
  void StartBackward(int64_t task);
  void CopyGradIntoSlot(Param& p);
  void LaunchCompleteBuckets(bool from_hook);
  void Finalize();
  // Waits for every Work in flight; returns the first failure.
  absl::Status WaitAll();

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> pg_;
  DdpOptions options_;
  std::vector<Param> params_;  // in bucket (slot) order
  std::vector<Bucket> buckets_;
  std::vector<HookHandle> hooks_;
  int no_sync_depth_ = 0;
  int64_t armed_task_ = -1;   // outermost task whose finaliser is queued
  bool in_backward_ = false;  // state of an unfinished synchronised backward
  int32_t next_launch_ = 0;   // first bucket not launched yet
  DdpStats stats_;
  std::function<void(int)> launch_observer_;
};

// For MixedPrecisionOptions::reduce_found_inf: all_reduce(kMax) of found_inf in place and wait
// (a synchronisation with every rank); a failed collective throws tg::Error.
std::function<void(const RawTensor& found_inf)> MaxFoundInfAcrossRanks(
    std::shared_ptr<ProcessGroup> pg);

// For amp::Fp8Training::set_amax_reducer (delayed FP8 scaling): the amaxes of a pass, as one f32
// tensor on `device` (the group's: CUDA for NCCL), all_reduce(kMax)ed in place and waited for
// (one collective per update, the same on every rank); a failed collective throws tg::Error.
std::function<void(std::vector<float>& amaxes)> MaxAmaxesAcrossRanks(
    std::shared_ptr<ProcessGroup> pg, Device device);

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_DDP_H_
