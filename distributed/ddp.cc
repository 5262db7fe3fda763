#include "distributed/ddp.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/trace.h"
#include "tensor/error.h"

namespace tg::dist {
namespace {

constexpr const char* kName = "DistributedDataParallel";

// Gloo and NCCL carry floating and 32/64-bit integer dtypes; u8/bool buffers travel as i32.
DType TransportDType(DType dtype) { return dtype == kU8 || dtype == kBool ? kI32 : dtype; }

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> pg,
                                                 DdpOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options) {
  TG_CHECK(module_ != nullptr, kName, ": the module is null");
  TG_CHECK(pg_ != nullptr, kName, ": the process group is null");
  TG_CHECK(options_.bucket_cap_bytes > 0, kName, ": bucket_cap_bytes must be positive, got ",
           options_.bucket_cap_bytes);
  TG_CHECK(options_.reduce_op == ReduceOp::kAvg || options_.reduce_op == ReduceOp::kSum, kName,
           ": reduce_op must be avg or sum, got ", ReduceOpName(options_.reduce_op));
  const Device device = pg_->device();

  // named_parameters() lists a shared parameter once, under its first name.
  const std::vector<std::pair<std::string, Tensor>> named = module_->named_parameters();
  for (const auto& [name, p] : named) {
    TG_CHECK(p.data().device() == device, kName, ": parameter ", name, " is on ",
             p.data().device().ToString(), " but the process group '", pg_->name(), "' (",
             pg_->backend(), ") works on ", device.ToString(),
             "; move the module (Module::to) before wrapping it");
  }

  // ---- All replicas start from rank 0's state.
  if (pg_->size() > 1 && options_.broadcast_parameters) {
    std::vector<RawTensor> data;
    data.reserve(named.size());
    for (const auto& [name, p] : named) data.push_back(p.data());
    BroadcastFromRank0(data, "parameters");
    for (const auto& [name, p] : named) p.bump_version();
  }
  if (pg_->size() > 1 && options_.broadcast_buffers) BroadcastBuffers();

  // ---- Buckets: parameters that require grad, in reverse registration order.
  std::vector<int32_t> order;
  for (int32_t i = static_cast<int32_t>(named.size()) - 1; i >= 0; --i) {
    if (named[i].second.requires_grad()) order.push_back(i);
  }
  TG_CHECK(!order.empty(), kName, ": the module (", module_->type_name(),
           ") has no parameter that requires grad");
  params_.reserve(order.size());
  int64_t bucket_bytes = 0;
  int64_t bucket_numel = 0;
  for (const int32_t i : order) {
    const Tensor& var = named[i].second;
    const int64_t bytes = var.numel() * static_cast<int64_t>(ElementSize(var.dtype()));
    const bool start_new = buckets_.empty() || var.dtype() != params_.back().var.dtype() ||
                           (bucket_bytes > 0 && bucket_bytes + bytes > options_.bucket_cap_bytes);
    if (start_new) {
      if (!buckets_.empty()) {
        buckets_.back().buffer =
            RawTensor::Zeros({bucket_numel}, params_.back().var.dtype(), device);
      }
      buckets_.emplace_back();
      buckets_.back().first_param = static_cast<int32_t>(params_.size());
      bucket_bytes = 0;
      bucket_numel = 0;
    }
    Param p;
    p.var = var;
    p.name = named[i].first;
    p.bucket = static_cast<int32_t>(buckets_.size()) - 1;
    p.registration_index = i;
    p.offset = bucket_numel;
    params_.push_back(std::move(p));
    buckets_.back().end_param = static_cast<int32_t>(params_.size());
    bucket_bytes += bytes;
    bucket_numel += var.numel();
  }
  buckets_.back().buffer = RawTensor::Zeros({bucket_numel}, params_.back().var.dtype(), device);
  for (Param& p : params_) {
    p.slot = buckets_[p.bucket].buffer.narrow(0, p.offset, p.var.numel()).view(p.var.shape());
    p.grad_view = Tensor(p.slot);
  }
  for (Bucket& b : buckets_) b.pending = b.end_param - b.first_param;

  // ---- Hooks: each captures its parameter's slot index (this + an int: no allocation when
  // std::function copies it).
  hooks_.reserve(params_.size());
  for (int32_t i = 0; i < static_cast<int32_t>(params_.size()); ++i) {
    hooks_.push_back(params_[i].var.register_post_accumulate_grad_hook(
        [this, i](const Tensor&) { OnGradAccumulated(i); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (HookHandle& h : hooks_) h.remove();
  (void)WaitAll();  // buffers must outlive the collectives that use them
}

void DistributedDataParallel::BroadcastFromRank0(const std::vector<RawTensor>& tensors,
                                                 const char* what) {
  // One flat buffer per transport dtype, in first-appearance order (the same on every rank).
  std::vector<DType> dtypes;
  std::map<DType, int64_t> numel;
  for (const RawTensor& t : tensors) {
    const DType d = TransportDType(t.dtype());
    if (numel.find(d) == numel.end()) dtypes.push_back(d);
    numel[d] += t.numel();
  }
  const Device device = pg_->device();
  for (const DType d : dtypes) {
    RawTensor flat = RawTensor::Empty({numel[d]}, d, device);  // [numel of this dtype]
    int64_t offset = 0;
    for (const RawTensor& t : tensors) {
      if (TransportDType(t.dtype()) != d) continue;
      flat.narrow(0, offset, t.numel()).view(t.shape()).copy_(t);
      offset += t.numel();
    }
    const absl::Status status = pg_->broadcast(flat, /*root=*/0)->wait();
    if (!status.ok()) {
      TG_DIST_CHECK_OK(
          absl::Status(status.code(), absl::StrCat(kName, ": broadcast of the ", what,
                                                   " from rank 0 failed: ", status.message())));
    }
    if (pg_->rank() == 0) continue;
    offset = 0;
    for (const RawTensor& t : tensors) {
      if (TransportDType(t.dtype()) != d) continue;
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.shape()));
      t.storage()->bump_version();
      offset += t.numel();
    }
  }
}

void DistributedDataParallel::BroadcastBuffers() {
  const std::vector<std::pair<std::string, RawTensor>> named = module_->named_buffers();
  if (named.empty()) return;
  std::vector<RawTensor> buffers;
  std::set<std::pair<const Storage*, int64_t>> seen;  // a shared buffer once
  for (const auto& [name, b] : named) {
    TG_CHECK(b.device() == pg_->device(), kName, ": buffer ", name, " is on ",
             b.device().ToString(), " but the process group works on ", pg_->device().ToString());
    if (seen.insert({b.storage().get(), b.offset()}).second) buffers.push_back(b);
  }
  BroadcastFromRank0(buffers, "buffers");
}

Tensor DistributedDataParallel::operator()(const Tensor& input) {
  SetTraceRank(pg_->rank());  // traces name this thread "rank R / ..." (a thread-local store)
  if (options_.broadcast_buffers && pg_->size() > 1) BroadcastBuffers();
  ForwardScope forward;  // backward passes issued by the model's forward are not reduced
  return (*module_)(input);
}

std::vector<DdpBucketLayout> DistributedDataParallel::bucket_layout() const {
  std::vector<DdpBucketLayout> layout;
  for (const Bucket& b : buckets_) {
    DdpBucketLayout l;
    l.dtype = b.buffer.dtype();
    l.numel = b.buffer.numel();
    for (int32_t i = b.first_param; i < b.end_param; ++i) {
      l.param_names.push_back(params_[i].name);
      l.offsets.push_back(params_[i].offset);
    }
    layout.push_back(std::move(l));
  }
  return layout;
}

// ---- The backward path ------------------------------------------------------------------------

void DistributedDataParallel::OnGradAccumulated(int32_t index) {
  if (backward_issued_in_forward()) {
    // Issued by a forward: kept in .grad for the next synchronised backward (see ddp.h).
    params_[index].forward_grad = true;
    return;
  }
  if (no_sync_depth_ > 0) return;
  const int64_t task = outermost_graph_task_id();
  if (task != armed_task_) StartBackward(task);
  Param& p = params_[index];
  Bucket& b = buckets_[p.bucket];
  if (p.ready) {
    // A second gradient for this parameter in the same backward (used inside and outside a
    // reentrant checkpoint): .grad now holds both contributions.
    TG_CHECK(!b.launched, kName, ": the gradient of parameter ", p.name,
             " was produced a second time in this backward after the all_reduce of its bucket ",
             p.bucket,
             " was launched (is it used both inside and outside a reentrant checkpoint?); use a "
             "larger bucket_cap_bytes so that its bucket completes later, or non-reentrant "
             "checkpointing");
    CopyGradIntoSlot(p);
    ++stats_.recopies;
    return;
  }
  CopyGradIntoSlot(p);
  p.ready = true;
  if (--b.pending == 0 && p.bucket == next_launch_) LaunchCompleteBuckets(/*from_hook=*/true);
}

void DistributedDataParallel::StartBackward(int64_t task) {
  // State left by a backward that threw before its finaliser: let its collectives finish.
  if (in_backward_) (void)WaitAll();
  for (Param& p : params_) p.ready = false;
  for (Bucket& b : buckets_) {
    b.pending = b.end_param - b.first_param;
    b.launched = false;
  }
  next_launch_ = 0;
  armed_task_ = task;
  in_backward_ = true;
  // Named in traces: its span is the wait for the buckets' all-reduces.
  queue_callback_on_outermost_task([this] { Finalize(); }, "ddp finalize");
}

void DistributedDataParallel::CopyGradIntoSlot(Param& p) {
  ++stats_.grads_copied;
  const RawTensor& g = p.var.impl()->grad.data();
  // .grad is already this slot (a view set by an earlier reduction, accumulated in place).
  if (g.shares_storage(p.slot) && g.offset() == p.slot.offset() &&
      g.strides() == p.slot.strides()) {
    return;
  }
  p.slot.copy_(g);
}

void DistributedDataParallel::LaunchCompleteBuckets(bool from_hook) {
  const int32_t n = static_cast<int32_t>(buckets_.size());
  while (next_launch_ < n && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_];
    b.work = pg_->all_reduce(b.buffer, options_.reduce_op);
    b.launched = true;
    ++stats_.bucket_launches;
    if (from_hook) ++stats_.launched_from_hooks;
    const int launched = next_launch_++;
    TraceEvent("ddp", "bucket ", launched, " launched");
    if (launch_observer_) launch_observer_(launched);
  }
}

absl::Status DistributedDataParallel::WaitAll() {
  absl::Status first;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.work == nullptr) continue;
    absl::Status s = b.work->wait();
    TraceEvent("ddp", "bucket ", i, " finished", s.ok() ? "" : " (failed)");
    if (!s.ok() && first.ok()) first = std::move(s);
    b.work.reset();
  }
  return first;
}

void DistributedDataParallel::Finalize() {
  std::vector<int32_t> missing;
  for (int32_t i = 0; i < static_cast<int32_t>(params_.size()); ++i) {
    Param& p = params_[i];
    if (p.ready) continue;
    const Tensor& g = p.var.impl()->grad;
    if (p.forward_grad && g.defined()) {
      // Its only gradient since the last reduction came from a backward issued in forward.
      CopyGradIntoSlot(p);
      ++stats_.forward_grads_reduced;
      p.ready = true;
      --buckets_[p.bucket].pending;
      continue;
    }
    if (!options_.find_unused_parameters) {
      missing.push_back(i);
      continue;
    }
    // Unused in this backward: its current .grad (e.g. accumulated under no_sync) or zeros.
    if (g.defined()) {
      CopyGradIntoSlot(p);
    } else {
      p.slot.zero_();
    }
    p.ready = true;
    --buckets_[p.bucket].pending;
  }
  if (!missing.empty()) {
    (void)WaitAll();
    in_backward_ = false;
    std::sort(missing.begin(), missing.end(), [&](int32_t a, int32_t b) {
      return params_[a].registration_index < params_[b].registration_index;
    });
    std::vector<std::string> names;
    for (const int32_t i : missing) names.push_back(params_[i].name);
    throw Error(absl::StrCat(
        kName, ": parameters got no gradient in this backward: ", absl::StrJoin(names, ", "),
        " (pass find_unused_parameters=true in DdpOptions when some parameters legitimately take "
        "no part in the loss, or make every parameter contribute to it)"));
  }
  // Every parameter's .grad, forward-time parts included, is in its slot now.
  for (Param& p : params_) p.forward_grad = false;
  const auto wait_start = std::chrono::steady_clock::now();
  LaunchCompleteBuckets(/*from_hook=*/false);
  const absl::Status status = WaitAll();
  stats_.exposed_comm_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  in_backward_ = false;
  if (!status.ok()) {
    TG_DIST_CHECK_OK(
        absl::Status(status.code(),
                     absl::StrCat(kName, ": the gradient all_reduce failed: ", status.message())));
  }
  for (Param& p : params_) {
    if (!p.grad_view.data().shares_storage(p.slot) ||
        p.grad_view.data().offset() != p.slot.offset()) {
      p.grad_view = Tensor(p.slot);  // someone replaced the view's data (set_data)
    }
    if (!p.var.impl()->grad.is_same(p.grad_view)) p.var.set_grad(p.grad_view);
  }
  ++stats_.synchronized_backwards;
}

std::function<void(const RawTensor& found_inf)> MaxFoundInfAcrossRanks(
    std::shared_ptr<ProcessGroup> pg) {
  TG_CHECK(pg != nullptr, "MaxFoundInfAcrossRanks: the process group is null");
  return [pg = std::move(pg)](const RawTensor& found_inf) {
    TG_DIST_CHECK_OK(pg->all_reduce(found_inf, ReduceOp::kMax)->wait());
  };
}

std::function<void(std::vector<float>& amaxes)> MaxAmaxesAcrossRanks(
    std::shared_ptr<ProcessGroup> pg, Device device) {
  TG_CHECK(pg != nullptr, "MaxAmaxesAcrossRanks: the process group is null");
  return [pg = std::move(pg), device](std::vector<float>& amaxes) {
    if (amaxes.empty()) return;  // no FP8 layer: every rank skips alike
    const RawTensor t =
        RawTensor::FromVector<float>(amaxes, {static_cast<int64_t>(amaxes.size())}).to(device);
    TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kMax)->wait());
    amaxes = t.to_vector<float>();
  };
}

}  // namespace tg::dist
