// ZeroOptimizer: ZeRO sharding of amp::MixedPrecisionOptimizer's training step across the ranks
// of a ProcessGroup. Stage 1 shards the f32 masters and the wrapped optimizer's state; stage 2
// also reduce-scatters the gradients during backward (the full gradients are not kept); stage 3
// (fully sharded) also shards the model parameters, which are all-gathered around each
// module's forward and again during backward, and freed in between.
//
//   auto pg = tg::dist::InitProcessGroup().value();
//   auto model = std::make_shared<tg::nn::Mlp>(sizes, gen, tg::nn::Mlp::Options{});
//   tg::dist::ZeroOptions zo;
//   zo.stage = 3;
//   zo.module = model;                                    // stage 3 only
//   tg::dist::ZeroOptimizer opt(pg, std::make_unique<tg::optim::AdamW>(model->parameters(), o),
//                               zo);
//   for (...) {
//     opt.zero_grad();
//     opt.backward(tg::nn::MseLoss((*model)(x_local), y_local));   // or opt.scale(loss).backward()
//     double norm = opt.clip_master_grads(1.0);           // the norm over all shards
//     tg::amp::StepResult r = opt.step();                 // every rank skips the same steps
//   }
//   std::vector<tg::RawTensor> full = opt.full_parameters();  // a collective (every rank calls it)
//
// Semantics (amp::MixedPrecisionOptimizer's, see amp/mixed_precision_optimizer.h, on shards; the
// unscale, overflow check, clip, skip and scaler update are one amp::StepCore, amp/step_core.h,
// handed this rank's master shards and two hooks: the found_inf max and the norm reduction):
// scale(loss) = f32 loss * scale; backward(loss) = scale + backward, the gradient reduction
// running from hooks; step() -> StepResult{skipped, scale}: found_inf is this rank's non-finite
// check of its shard gradients (after the reduction, during the unscale), then all_reduce(kMax)
// so every rank skips the same steps, and the scaler update is identical on every rank. The
// loss scaler is amp::LossScaler (same defaults: PyTorch's dynamic scaler when some parameter
// is f16, a constant 1 otherwise). The gradient is the average over ranks (ReduceOp::kAvg), so
// each rank's loss is the mean over its own part of the batch, as with DDP.
//
// Layout (decisions):
// - Parameters are flattened per (param group, dtype) -- and, in stage 3, per unit (module) --
//   into flat buffers. A flat buffer is cut into buckets (stage 1/2: at most bucket_cap_bytes of
//   the model dtype, a parameter never split, parameters taken in REVERSE optimizer order,
//   roughly the order backward produces their gradients; stage 3: one bucket per flat buffer);
//   each bucket is padded with zeros to a multiple of the world size W and rank r owns its
//   contiguous chunk r. A rank's shard of a flat buffer is the concatenation of its chunks:
//   per-bucket chunks let a bucket's reduce_scatter deliver exactly the part the rank owns.
//   With one bucket (the default cap is large) the shard is the classic contiguous 1/W slice.
// - Masters: one f32 Tensor per flat buffer (f64 for f64 parameters) holding the rank's shard,
//   so the wrapped optimizer steps on 1/W of the elements (its groups' params are replaced by
//   these masters; the optimizer must not have stepped). Padding elements have zero gradients
//   and stay zero under SGD/Adam/AdamW. Stage 1/2 f32 parameters also get a separate master
//   (their shard is not contiguous in the model buffer when there are several buckets); in
//   stage 3 an f32 parameter shard IS its master (no copy).
// - Stage 1/2: the model parameters become views (set_data) of one flat model-dtype buffer per
//   flat buffer, so the all-gather of the updated shards after step() writes them in place.
// - Gradients are reduced in the parameter dtype by default (f16 scaled gradients stay f16;
//   Gloo sums the chunks in f32 and rounds once, NCCL averages f16 through an f32 buffer, so an
//   average of finite gradients is finite); reduce_in_f32 converts f16/bf16 gradients to
//   f32 before the reduce_scatter (exact averaging, twice the traffic).
//
// Per stage:
// - Stage 1: a post-accumulate-grad hook on every parameter queues an epilogue on the outermost
//   graph task of the user's backward (as MixedPrecisionOptimizer::attach does, always
//   installed here; backward passes issued inside a ForwardScope do not arm it, see below). The
//   epilogue
//   copies each parameter's .grad into its bucket, releases the .grad, reduce_scatters each
//   bucket (kAvg), unscales (and checks) the shard gradient in f32 and accumulates it into the
//   master gradient. backward(loss, {.update_master_grads = false}) defers this: .grad
//   accumulates locally (no communication) until a later backward or step().
// - Stage 2: the hook copies the .grad into its bucket (allocated at the first gradient of the
//   bucket) and releases it at once; a bucket whose parameters have all arrived is
//   reduce-scattered right away, strictly in bucket order (a complete bucket waits for the
//   earlier ones), so every rank issues the same sequence. At most max_inflight_buckets
//   reductions are in flight: launching one more first finishes the oldest (wait, unscale into
//   the master gradient, free the bucket), which bounds the gradient memory to
//   (max_inflight_buckets + 1) buckets. The epilogue launches the rest (parameters without a
//   gradient contribute zeros, those with a forward-time gradient their .grad; a bucket with
//   neither is skipped) and finishes all of them.
//   Gradient accumulation over several backward calls works: the master gradients accumulate
//   until zero_grad(), like .grad.
// - Stage 3: units are modules: by default every module of ZeroOptions::module that has
//   parameters of its own, owning exactly those; or ZeroOptions::units, each owning the
//   optimizer parameters of its subtree not claimed by an earlier unit. Between uses each
//   parameter's data is a 1-element NaN storage expanded to its shape (RawTensor::expand: stride
//   0), so the full values are not resident; the rank keeps only its shard (model dtype) and
//   master.
//   * A forward pre-hook all-gathers the unit's flat buffers (each parameter becomes a view of
//     the gathered buffer) and pushes SavedTensorHooks for the unit's forward: a tensor saved for
//     backward that lives in a gathered buffer (the parameter itself, or a view of it such as the
//     transposed weight that Matmul saves) is stored as a reference (buffer, shape, strides,
//     offset), every other saved tensor as itself (leaves) or its data (non-leaves), with the
//     saved version checked on unpack like SavedVariable does; hooks active outside the unit
//     (e.g. non-reentrant checkpointing) still receive the non-parameter tensors. The forward
//     hook pops them and frees the gathered buffers (when the unit is not still running: a unit
//     called within itself or twice frees after the last exit).
//   * In backward, the first unpack of a reference all-gathers the unit again (a blocking
//     collective; ranks run the same graph in the same order, so the sequence matches).
//   * The post-accumulate-grad hooks copy each gradient into the unit's flat gradient buffer and
//     release the .grad; when every parameter of the unit that the task will accumulate into
//     (tg::will_execute of its AccumulateGrad) has arrived, the buffer is reduce-scattered
//     (asynchronously) and the unit's gathered parameters are freed -- every node that uses them
//     has run by then. The epilogue waits for the reductions, unscales them into the master
//     gradients and frees whatever is still gathered.
//   * step() updates the masters and rounds them into the model-dtype shards; the next forward
//     gathers the new values. A model state_dict() taken outside forward sees the NaN
//     placeholders: use full_parameters() (a collective).
// - Backward calls issued during forward (inside a ForwardScope: every nn::Module call, a custom
//   function's Forward, e.g. a tiled logits loss computing the head's gradient tile by tile, or
//   a forward hook back-propagating an auxiliary loss; DeepSpeed's BackwardHookStateManager
//   "case 2") feed the gradients but run no epilogue: the hook only records that the
//   parameter's .grad holds a forward-time gradient. The one epilogue of the next user backward
//   includes it, the same in every stage: a parameter whose hook fires there has the
//   forward-time part in its .grad already (AccumulateGrad adds to it); one whose hook does not
//   fire (its only gradient came from the forward) has its .grad copied into its bucket (stage
//   3: unit buffer) and released when that bucket launches -- in the fixed bucket order, from a
//   hook (stage 3: the unit's other gradients arrived) or from the epilogue, which launches a
//   bucket holding only such gradients too; stage 1 reads every .grad in the epilogue anyway.
//   Nothing is dropped or counted twice, and every rank issues the same collectives (every rank
//   runs the same forward). A bucket with a forward-time-only gradient waits for the epilogue
//   (no overlap for it). stats().forward_grads_reduced counts such copies (stage 2/3).
// - step() (and clip_master_grads, update_master_grads) after a forward-time backward with no
//   user backward since includes those gradients, as amp::MixedPrecisionOptimizer does (it
//   reads .grad in step()): stage 1 reduces the model .grad, stage 2/3 launch the buckets that
//   hold them in bucket order; either counts as one epilogue (stats().epilogues).
// - clip_master_grads(max_norm, p): this rank's part (optim::clip_grad_norm over its master
//   shards with an infinite max_norm, i.e. the norm without clipping) raised to p, summed over
//   ranks (max for the inf norm; a NaN on any rank gives NaN everywhere), then the p-th root:
//   the norm of the whole gradient; then clip_grad_norm's rule (tg::ClipCoefficient:
//   max_norm / (total + 1e-6) < 1
//   scales every master gradient; a non-finite total scales nothing) on every rank.
//
// Memory per rank: the master shards and the optimizer state cover sum over buckets of
// ceil(n_b / W) elements (12 bytes each with AdamW: f32 master, exp_avg, exp_avg_sq); the
// gradient buffers of stage 2/3 at most max_inflight_buckets + 1 buckets (stats()); stage 3
// parameters only their model-dtype shard (none extra for f32) plus the units gathered now.
//
// Contracts and limits:
// - Every rank must construct the optimizer with the same model, groups and options, and run the
//   same forward/backward graph in the same order (the collectives are issued from hooks; a
//   parameter used on one rank and not on another desynchronises the group, as in DDP without
//   find_unused_parameters). Parameters must be leaves that require grad, of f32/f64/f16/bf16,
//   all on the group's device, each in one group.
// - The object must outlive every backward through graphs recorded while it existed (the stage
//   3 hooks refer to it); it cannot be copied or moved. One backward at a time.
// - Not supported: create_graph through a stage 3 unit (non-leaf saved tensors come back
//   without history); a stage 3 unit whose parameters accumulate in two graph tasks of one
//   backward (used both inside and outside a reentrant checkpoint); a parameter that gets two
//   gradients in one stage 2 backward after its bucket was launched (throws tg::Error). If a
//   unit's forward throws, its SavedTensorHooks stay pushed on the thread (the forward hook
//   that pops them does not run); that training step cannot continue.
// - ZeroOptimizer reduces the gradients itself: do not also wrap the model in
//   DistributedDataParallel. Stage 2/3 release every .grad in their hook, so hooks registered
//   after the optimizer's, and the caller after backward, see no .grad (stage 1: until the
//   epilogue of the backward).
// - A wrapped optim::Muon or MuonWithAdamW steps whole matrices through the optim::MuonSharding
//   this object gives it (optim/muon.h): the momentum on the shards, each matrix orthogonalised
//   by one owner rank and broadcast; one process's bits, each matrix once per step.
// - state_dict() is world-size independent (amp::MixedPrecisionOptimizer's format, gathered from
//   the shards), so a checkpoint moves between world sizes, stages and a single process.
#ifndef TAPEGRAD_DISTRIBUTED_ZERO_H_
#define TAPEGRAD_DISTRIBUTED_ZERO_H_

#include <any>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "amp/step_core.h"
#include "amp/training_optimizer.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg::dist {

struct ZeroOptions {
  // 1: optimizer state + masters; 2: + gradients; 3: + parameters.
  int stage = 1;
  // The scaler, check_non_finite and update_scaler of amp::MixedPrecisionOptimizer (same
  // defaults). reduce_found_inf must be empty: found_inf is max-reduced over the group here.
  amp::MixedPrecisionOptions mixed_precision;
  // Stage 1/2: the most bytes (of the model dtype, before padding) a bucket holds; a larger
  // parameter gets a bucket of its own. > 0.
  int64_t bucket_cap_bytes = int64_t{16} << 20;
  // Gradient reductions (buckets; stage 3: units) in flight before the oldest is finished
  // (waited for, unscaled into the master gradient and freed). >= 1.
  int max_inflight_buckets = 2;
  // Reduce f16/bf16 gradients in f32.
  bool reduce_in_f32 = false;
  // kAvg (the gradient of the mean of the ranks' losses) or kSum (for losses that are already
  // divided by the world size: the training binaries' f16 runs, whose backward then sees the
  // per-row values of one process on the global batch).
  ReduceOp reduce_op = ReduceOp::kAvg;
  // Broadcast rank 0's parameter values at construction (all ranks start equal).
  bool broadcast_parameters = true;
  // Stage 3: the model (required) and optionally its units, inner ones first.
  std::shared_ptr<nn::Module> module;
  std::vector<std::shared_ptr<nn::Module>> units;
};

// Bytes held by this rank, for tests and logs.
struct ZeroMemory {
  int64_t master_bytes = 0;           // the f32 master shards
  int64_t optimizer_state_bytes = 0;  // tensors of the wrapped optimizer's state (after a step)
  int64_t master_grad_bytes = 0;      // the f32 master-gradient shards currently allocated
  // Model parameter storage this optimizer holds: stage 1/2 the full flat buffers, stage 3 the
  // model-dtype shards (not counted again when they are the masters) plus buffers gathered now.
  int64_t param_bytes = 0;
  int64_t sharded_bytes() const { return master_bytes + optimizer_state_bytes; }
};

// Counters since construction, for tests and logs.
struct ZeroStats {
  int64_t epilogues = 0;               // completed post-backward epilogues (and explicit updates)
  int64_t reduce_scatters = 0;         // gradient reductions launched
  int64_t launched_from_hooks = 0;     // of those, launched during backward before the epilogue
  int64_t forward_gathers = 0;         // stage 3: unit gathers by forward pre-hooks
  int64_t backward_gathers = 0;        // stage 3: unit gathers by unpacks during backward
  int64_t local_overflow_steps = 0;    // steps whose own shard gradients had inf/NaN (counted
                                       // on the device; stats() reads it)
  int64_t grad_buffer_bytes = 0;       // gradient bucket buffers allocated now
  int64_t peak_grad_buffer_bytes = 0;  // the most at once
  // Stage 2/3: parameters whose gradient came into a bucket from .grad at its launch (a
  // gradient a backward issued in forward left there; their hook did not fire since).
  int64_t forward_grads_reduced = 0;
};

// A flat buffer of the layout, for tests and logs.
struct ZeroFlatLayout {
  int group = 0;
  int unit = -1;  // stage 3: the unit's index; -1 otherwise
  DType dtype = kF32;
  int64_t numel = 0;                     // padded elements of the whole buffer (all ranks)
  int64_t shard_numel = 0;               // elements this rank owns (its master's numel)
  std::vector<int64_t> bucket_numels;    // padded, in buffer order
  std::vector<std::string> param_names;  // in buffer order
};

class ZeroOptimizer : public amp::TrainingOptimizer {
 public:
  // Builds the layout, broadcasts (see ZeroOptions) and shards. Throws tg::Error for an invalid
  // option, a parameter off the group's device, an optimizer that already stepped, ...
  ZeroOptimizer(std::shared_ptr<ProcessGroup> pg, std::unique_ptr<optim::Optimizer> optimizer,
                ZeroOptions options = {});
  // Removes the hooks and waits for reductions still in flight (ignoring their status). Stage 3
  // parameters keep their placeholders.
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // loss (any floating dtype) cast to f32 and multiplied by the current scale.
  Tensor scale(const Tensor& loss) const override;
  // scale(loss).backward(); the reduction runs from the hooks (see the header comment).
  // update_master_grads = false (stage 1 only) keeps the gradients in .grad.
  void backward(const Tensor& loss, const amp::MasterBackwardOptions& options) override;
  using TrainingOptimizer::backward;  // backward(loss): not deferred
  // Stage 1: reduces the gradients accumulated in the model's .grad now (a collective).
  // Stage 2/3: finishes reductions still in flight.
  void update_master_grads() override;
  bool can_defer_master_grads() const override { return options_.stage == 1; }
  // See the header comment; a collective (with the found_inf all_reduce).
  amp::StepResult step() override;
  // The norm over every rank's shard (a collective), clipping as clip_grad_norm does.
  double clip_master_grads(double max_norm, double norm_type) override;
  using TrainingOptimizer::clip_master_grads;  // clip_master_grads(max_norm): the 2-norm
  // Clears model .grad, master gradients, found_inf and the per-backward state.
  void zero_grad() override;

  // The model parameters' full values, in optimizer order (copies). A collective in stage 3.
  std::vector<RawTensor> full_parameters();

  // The whole optimizer state in amp::MixedPrecisionOptimizer's format, the same for every world
  // size and stage: "master.<i>" (the f32 master of each f16/bf16 parameter i, optimizer order),
  // "optimizer.*" (the wrapped optimizer's state_dict as if it stepped the full parameters:
  // state.<i>.* in each parameter's shape, the original param groups) and "scaler.*". Every rank
  // returns the same dictionary, on the group's device. A collective (it all-gathers the shards):
  // every rank calls it.
  StateDict state_dict() override;
  // Loads a state_dict() of this or any other world size and stage, or a MixedPrecisionOptimizer's
  // over the same parameters and groups; each rank takes its own shard (no communication).
  // Everything is validated before anything changes (tg::Error naming the key). f32/f64
  // parameters have no master entry: their masters are the model's current values, so load the
  // model's state first (stage 3: before constructing the ZeroOptimizer, which shards the model).
  // The parameters of one flat buffer step together, so their optimizer state must agree (the
  // same step count). Clears the gradients, as zero_grad().
  void load_state_dict(const StateDict& state) override;

  int stage() const { return options_.stage; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return pg_; }
  double loss_scale() const override { return core_->scaler().scale(); }
  amp::LossScaler& scaler() override { return core_->scaler(); }
  optim::Optimizer& optimizer() override { return *optimizer_; }
  // The model parameters in optimizer order, and this rank's master shard per flat buffer.
  const std::vector<Tensor>& model_params() const override { return model_; }
  std::vector<Tensor> master_params() const;
  // This rank's master gradients (f32, [shard_numel] per flat buffer; undefined: none yet).
  std::vector<RawTensor> master_grads() const;
  int64_t shard_numel() const;  // elements of all masters of this rank
  std::vector<ZeroFlatLayout> layout() const;
  ZeroMemory memory() const;
  // local_overflow_steps is counted on the device: reading it is a host read.
  ZeroStats stats() const;
  int64_t skipped_steps() const override { return core_->skipped_steps(); }
  // The mechanics of the step (amp::MixedPrecisionOptimizer's, on this rank's shards).
  const amp::StepCore& step_core() const { return *core_; }

 private:
  struct Param;
  struct Bucket;
  struct Flat;
  struct Unit;
  struct ParamRef;
  class MuonShards;

  // A Muon (or MuonWithAdamW) wrapped here gets the layout of the flat buffers and the
  // collectives it needs (optim/muon.h: MuonSharding).
  void InitMuonSharding();
  void InitStage12();
  void InitStage3();
  void InstallHooks();
  std::vector<std::vector<int>> AssignUnits();

  void OnGradAccumulated(int index);
  void ArmEpilogue();
  void Epilogue();
  void CopyGradIntoBucket(Param& p, bool add);
  void LaunchBucket(int b, bool from_hook);
  void LaunchReadyBuckets();
  bool BucketHasForwardGrad(int b) const;
  bool ReduceForwardGrads();  // stage 2/3, outside backward
  void FinishBucket(int b);
  void FinishAll();
  void ReduceModelGrads();                                  // stage 1
  RawTensor GatherFlat(const Flat& f,
                       const RawTensor& shard);  // [shard_numel] -> [numel], collective
  RawTensor ShardOf(const Flat& f,
                    const RawTensor& full) const;  // [numel] -> this rank's [shard_numel]
  void AllocateGradBuffer(Bucket& bucket);
  void FreeGradBuffer(Bucket& bucket);
  bool HasModelGrads() const;
  void ResetBackwardState();
  // After an update: the new master shards into the model (stage 1/2: all-gathered into the flat
  // buffers; stage 3: rounded into the model-dtype shards).
  void PublishMasters();
  // StepCore's reduce_norm hook: the norm over the group from this rank's.
  double ReduceNorm(double local, double norm_type);

  // Stage 3.
  void Gather(int unit, bool in_backward);
  void Free(int unit);
  void OnUnitPreForward(int unit);
  void OnUnitForward(int unit);
  void OnUnitGrad(int index);
  std::any Pack(int unit, const Tensor& v);

  std::shared_ptr<ProcessGroup> pg_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  ZeroOptions options_;
  // Unscale, overflow check, clip, skip and scaler update: the one amp::StepCore.
  std::unique_ptr<amp::StepCore> core_;
  RawTensor local_overflows_;  // 0-d f32: steps whose own shard gradients had inf/NaN
  int rank_ = 0, world_ = 1;
  Device device_;

  std::vector<Tensor> model_;       // optimizer order
  std::vector<std::string> names_;  // for errors and layout()
  std::vector<Param> params_;       // parallel to model_
  std::vector<Flat> flats_;
  std::vector<Bucket> buckets_;  // stage 1/2: launch order; stage 3: one per flat
  std::vector<Unit> units_;
  std::vector<int> inflight_;  // buckets launched and not finished, oldest first
  int next_launch_ = 0;        // stage 2: first bucket not launched in this backward
  std::vector<HookHandle> hooks_;
  bool has_master_grads_ = false;
  bool defer_ = false;  // backward(update_master_grads = false) is running
  int64_t armed_task_ = -1;
  ZeroStats stats_;
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_ZERO_H_
