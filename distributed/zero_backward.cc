// ZeroOptimizer during backward: the post-accumulate-grad hooks, the gradient buckets and their
// reduce_scatter, and the epilogue that unscales the shard gradients into the master gradients.
#include <algorithm>
#include <any>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "autograd/trace.h"
#include "distributed/zero.h"
#include "distributed/zero_internal.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::dist {

using zero_internal::Bytes;
using zero_internal::Delegated;
using zero_internal::IsLowPrecision;
using zero_internal::kName;
using zero_internal::MasterDType;
using zero_internal::PlainSaved;
using zero_internal::RoundUp;

// ---- Backward: hooks, buckets and the epilogue ----------------------------------------------

Tensor ZeroOptimizer::scale(const Tensor& loss) const {
  TG_CHECK(loss.defined(), kName, ": scale() got an undefined loss");
  return core_->Scale(loss);
}

void ZeroOptimizer::backward(const Tensor& loss, const amp::MasterBackwardOptions& options) {
  TG_CHECK(options.update_master_grads || options_.stage == 1, kName,
           ": backward with update_master_grads=false needs stage 1; stage ", options_.stage,
           " reduce-scatters the gradients during backward");
  const Tensor scaled = scale(loss);
  BackwardOptions bo;
  bo.retain_graph = options.retain_graph;
  if (options.update_master_grads) {
    scaled.backward(Tensor(), bo);
    return;
  }
  defer_ = true;  // the hooks stay quiet: .grad accumulates locally
  try {
    scaled.backward(Tensor(), bo);
  } catch (...) {
    defer_ = false;
    throw;
  }
  defer_ = false;
}

void ZeroOptimizer::OnGradAccumulated(int index) {
  if (backward_issued_in_forward()) {
    // A backward issued by a forward (a tiled loss's per-tile backward, a forward hook's): it
    // feeds .grad, the epilogue runs once after the user's backward and takes it from there
    // (stage 1 reads every .grad; stage 2/3 fold it in when the bucket launches).
    params_[index].forward_grad = true;
    return;
  }
  if (defer_) return;
  ArmEpilogue();
  Param& p = params_[index];
  if (options_.stage == 1) return;  // the epilogue reads .grad
  if (options_.stage == 3) {
    OnUnitGrad(index);
    return;
  }
  Bucket& b = buckets_[p.bucket];
  TG_CHECK(!b.launched, kName, ": parameter ", index, " (", names_[index],
           ") received a gradient after its bucket ", p.bucket,
           " was reduce-scattered in this backward (it accumulates in two graph tasks, e.g. "
           "inside and outside a reentrant checkpoint); a larger bucket_cap_bytes avoids it");
  if (!b.grad.defined()) AllocateGradBuffer(b);
  CopyGradIntoBucket(p, /*add=*/p.arrived);  // with any forward-time part (.grad holds both)
  p.forward_grad = false;
  if (!p.arrived) {
    p.arrived = true;
    ++b.arrived;
  }
  p.var.set_grad(Tensor());  // stage 2 keeps no full gradient
  if (b.arrived == static_cast<int>(b.params.size())) LaunchReadyBuckets();
}

void ZeroOptimizer::ArmEpilogue() {
  const int64_t task = outermost_graph_task_id();
  if (task == armed_task_) return;
  // A new user backward. State left by one that threw is dropped first.
  ResetBackwardState();
  armed_task_ = task;
  queue_callback_on_outermost_task([this] { Epilogue(); }, "zero epilogue");
}

void ZeroOptimizer::Epilogue() {
  if (options_.stage == 1) {
    ReduceModelGrads();
  } else {
    // Buckets (stage 3: units) whose gradients did not all arrive, in the fixed order;
    // parameters without a gradient contribute zeros, those whose only gradient came from a
    // backward issued in forward their .grad; a bucket without any gradient is skipped.
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!buckets_[b].launched &&
          (buckets_[b].arrived > 0 || BucketHasForwardGrad(static_cast<int>(b)))) {
        LaunchBucket(static_cast<int>(b), /*from_hook=*/false);
      }
    }
    FinishAll();
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u].gathered && units_[u].active == 0) Free(static_cast<int>(u));
  }
  ResetBackwardState();
  ++stats_.epilogues;
}

void ZeroOptimizer::AllocateGradBuffer(Bucket& bucket) {
  bucket.grad = RawTensor::Zeros({bucket.numel}, flats_[bucket.flat].reduce_dtype, device_);
  stats_.grad_buffer_bytes += Bytes(bucket.grad);
  stats_.peak_grad_buffer_bytes = std::max(stats_.peak_grad_buffer_bytes, stats_.grad_buffer_bytes);
}

void ZeroOptimizer::FreeGradBuffer(Bucket& bucket) {
  stats_.grad_buffer_bytes -= Bytes(bucket.grad) + Bytes(bucket.shard_grad);
  bucket.grad.reset();
  bucket.shard_grad.reset();
}

void ZeroOptimizer::CopyGradIntoBucket(Param& p, bool add) {
  Bucket& b = buckets_[p.bucket];
  const Tensor g = p.var.grad();
  if (!g.defined()) return;
  NoGradGuard no_grad;
  const RawTensor slot = b.grad.narrow(0, p.offset - b.start, p.numel).view(p.shape);
  if (add) {
    slot.copy_(tg::Add(slot, g.data()));
  } else {
    slot.copy_(g.data());  // converts to the reduce dtype
  }
}

void ZeroOptimizer::LaunchBucket(int b, bool from_hook) {
  while (static_cast<int>(inflight_.size()) >= options_.max_inflight_buckets) {
    FinishBucket(inflight_.front());
  }
  Bucket& bucket = buckets_[b];
  // Gradients left in .grad by a backward issued in forward, of parameters that did not arrive
  // in this backward (stage 1 copied every .grad already).
  for (int i : bucket.params) {
    Param& p = params_[i];
    if (!p.forward_grad) continue;
    p.forward_grad = false;
    if (p.arrived || !p.var.grad().defined()) continue;
    if (!bucket.grad.defined()) AllocateGradBuffer(bucket);
    CopyGradIntoBucket(p, /*add=*/false);
    p.var.set_grad(Tensor());
    ++stats_.forward_grads_reduced;
  }
  bucket.shard_grad = RawTensor::Empty({bucket.chunk}, flats_[bucket.flat].reduce_dtype, device_);
  stats_.grad_buffer_bytes += Bytes(bucket.shard_grad);
  stats_.peak_grad_buffer_bytes = std::max(stats_.peak_grad_buffer_bytes, stats_.grad_buffer_bytes);
  bucket.work = pg_->reduce_scatter(bucket.shard_grad, bucket.grad, options_.reduce_op);
  bucket.launched = true;
  inflight_.push_back(b);
  ++stats_.reduce_scatters;
  TraceEvent("zero", "bucket ", b, " reduce_scatter issued");
  if (from_hook) ++stats_.launched_from_hooks;
}

void ZeroOptimizer::LaunchReadyBuckets() {
  const int n = static_cast<int>(buckets_.size());
  while (next_launch_ < n) {
    const Bucket& b = buckets_[next_launch_];
    if (b.arrived != static_cast<int>(b.params.size())) break;
    LaunchBucket(next_launch_++, /*from_hook=*/true);
  }
}

bool ZeroOptimizer::BucketHasForwardGrad(int b) const {
  for (int i : buckets_[b].params) {
    const Param& p = params_[i];
    if (p.forward_grad && !p.arrived && p.var.grad().defined()) return true;
  }
  return false;
}

bool ZeroOptimizer::ReduceForwardGrads() {
  bool any = false;
  for (size_t b = 0; b < buckets_.size() && !any; ++b) {
    any = BucketHasForwardGrad(static_cast<int>(b));
  }
  if (!any) return false;
  // No user backward took them: one epilogue of their own, in the fixed bucket order (every
  // rank ran the same forward, so every rank has the same buckets to launch).
  ResetBackwardState();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (BucketHasForwardGrad(static_cast<int>(b))) {
      LaunchBucket(static_cast<int>(b), /*from_hook=*/false);
    }
  }
  FinishAll();
  ResetBackwardState();
  return true;
}

void ZeroOptimizer::FinishBucket(int b) {
  Bucket& bucket = buckets_[b];
  inflight_.erase(std::find(inflight_.begin(), inflight_.end(), b));
  const absl::Status status = bucket.work->wait();
  bucket.work.reset();
  if (!status.ok()) {
    FreeGradBuffer(bucket);
    ThrowIfError(status);
  }
  Flat& f = flats_[bucket.flat];
  const DType md = MasterDType(f.dtype);
  // The reduce dtype -> master dtype (a copy unless equal; the shard gradient is ours anyway),
  // then one pass that divides by the scale and records inf/NaN of this rank's shard.
  RawTensor g = bucket.shard_grad.to(md);
  core_->Unscale({g});
  if (!f.master_grad.defined()) f.master_grad = RawTensor::Zeros({f.shard_numel}, md, device_);
  const RawTensor dst = f.master_grad.narrow(0, bucket.master_offset, bucket.chunk);
  dst.copy_(tg::Add(dst, g));
  has_master_grads_ = true;
  FreeGradBuffer(bucket);
}

void ZeroOptimizer::FinishAll() {
  while (!inflight_.empty()) {
    try {
      FinishBucket(inflight_.front());
    } catch (...) {
      // Wait for the rest (their status is moot: the group is broken) before reporting.
      for (int b : inflight_) {
        (void)buckets_[b].work->wait();
        buckets_[b].work.reset();
        FreeGradBuffer(buckets_[b]);
      }
      inflight_.clear();
      throw;
    }
  }
}

bool ZeroOptimizer::HasModelGrads() const {
  for (const Param& p : params_) {
    if (p.var.grad().defined()) return true;
  }
  return false;
}

void ZeroOptimizer::ReduceModelGrads() {
  if (!HasModelGrads()) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    AllocateGradBuffer(bucket);
    for (int i : bucket.params) {
      CopyGradIntoBucket(params_[i], /*add=*/false);
      params_[i].var.set_grad(Tensor());  // the next backward accumulates only its own
    }
    LaunchBucket(static_cast<int>(b), /*from_hook=*/false);
  }
  FinishAll();
}

void ZeroOptimizer::ResetBackwardState() {
  for (int b : inflight_) {
    if (buckets_[b].work) (void)buckets_[b].work->wait();
    buckets_[b].work.reset();
  }
  inflight_.clear();
  for (Bucket& b : buckets_) {
    if (b.grad.defined() || b.shard_grad.defined()) FreeGradBuffer(b);
    b.arrived = 0;
    b.launched = false;
  }
  for (Param& p : params_) p.arrived = false;
  for (Unit& u : units_) {
    u.task = -1;
    u.expected = u.arrived = 0;
  }
  next_launch_ = 0;
  armed_task_ = -1;
}

void ZeroOptimizer::update_master_grads() {
  if (options_.stage == 1) {
    if (HasModelGrads()) {
      ReduceModelGrads();
      ++stats_.epilogues;
    }
  } else {
    FinishAll();
    // Gradients a backward issued in forward left in .grad with no user backward since (the
    // same rule as stage 1 and amp::MixedPrecisionOptimizer, which read every .grad here).
    if (ReduceForwardGrads()) ++stats_.epilogues;
  }
}

}  // namespace tg::dist
