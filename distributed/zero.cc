#include "distributed/zero.h"

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
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::dist {
namespace {

constexpr const char* kName = "ZeroOptimizer";

bool IsLowPrecision(DType d) { return d == kF16 || d == kBF16; }
// The dtype of masters, master gradients and optimizer state (optim::StateDType's rule).
DType MasterDType(DType d) { return d == kF64 ? kF64 : kF32; }
int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
int64_t Bytes(const Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// What a stage 3 unit's pack hook stores for a tensor that is not in a gathered buffer: the
// leaf itself (it has no history to cycle through), or the data of a non-leaf (keeping the
// Variable would make a cycle node -> saved -> variable -> node for a saved output).
struct PlainSaved {
  Variable leaf;
  Tensor data;
  uint64_t version = 0;
};
// A tensor saved while hooks from outside the unit were active: theirs to store and restore.
struct Delegated {
  UnpackHook unpack;
  std::any value;
};

}  // namespace

struct ZeroOptimizer::Param {
  Variable var;
  int group = 0;
  int flat = -1;
  int bucket = -1;
  int unit = -1;
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  Shape shape;
  DType dtype = kF32;
  bool arrived = false;  // stage 2/3: this backward's gradient is in its bucket
  Tensor placeholder;    // stage 3: 1-element NaN storage expanded to `shape`
};

struct ZeroOptimizer::Bucket {
  int flat = 0;
  std::vector<int> params;    // buffer order
  int64_t start = 0;          // first element in the flat buffer
  int64_t numel = 0;          // padded to a multiple of the world size
  int64_t chunk = 0;          // numel / world: the part each rank owns
  int64_t master_offset = 0;  // where this rank's chunk lives in the flat buffer's master
  Tensor grad;                // [numel] reduce dtype, while filling or in flight
  Tensor shard_grad;          // [chunk] reduce dtype, the reduce_scatter's output
  std::shared_ptr<Work> work;
  int arrived = 0;
  bool launched = false;
};

struct ZeroOptimizer::Flat {
  int group = 0;
  int unit = -1;
  DType dtype = kF32;
  DType reduce_dtype = kF32;
  std::vector<int> params;   // buffer order
  std::vector<int> buckets;  // buffer order
  int64_t numel = 0;         // padded, all ranks
  int64_t shard_numel = 0;   // this rank's elements
  Tensor full;               // [numel] model dtype (stage 3: only while gathered)
  Tensor shard;              // stage 3: [shard_numel] model dtype
  Variable master;           // [shard_numel] f32 (f64 for f64)
  Tensor master_grad;        // [shard_numel] master dtype, or undefined
};

struct ZeroOptimizer::Unit {
  std::shared_ptr<nn::Module> module;
  std::string name;
  std::vector<int> flats;
  std::vector<int> params;
  int active = 0;  // forward calls running
  bool gathered = false;
  std::vector<std::unique_ptr<SavedTensorHooks>> guards;
  int64_t task = -1;  // the graph task whose gradients are arriving
  int expected = 0, arrived = 0;
};

// A saved tensor that lives in a gathered flat buffer of a stage 3 unit.
struct ZeroOptimizer::ParamRef {
  int flat = 0;
  Shape shape, strides;
  int64_t offset = 0;
};

// ---- Construction -------------------------------------------------------------------------

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<ProcessGroup> pg,
                             std::unique_ptr<optim::Optimizer> optimizer, ZeroOptions options)
    : pg_(std::move(pg)), optimizer_(std::move(optimizer)), options_(std::move(options)) {
  TG_CHECK(pg_ != nullptr, kName, ": the process group is null");
  TG_CHECK(optimizer_ != nullptr, kName, ": the optimizer is null");
  TG_CHECK(options_.stage >= 1 && options_.stage <= 3, kName, ": stage must be 1, 2 or 3, got ",
           options_.stage);
  TG_CHECK(options_.bucket_cap_bytes > 0, kName, ": bucket_cap_bytes must be > 0, got ",
           options_.bucket_cap_bytes);
  TG_CHECK(options_.reduce_op == ReduceOp::kAvg || options_.reduce_op == ReduceOp::kSum, kName,
           ": reduce_op must be avg or sum, got ", ReduceOpName(options_.reduce_op));
  TG_CHECK(options_.max_inflight_buckets >= 1, kName, ": max_inflight_buckets must be >= 1, got ",
           options_.max_inflight_buckets);
  TG_CHECK(!options_.mixed_precision.reduce_found_inf, kName,
           ": MixedPrecisionOptions::reduce_found_inf must be empty; ZeroOptimizer max-reduces "
           "found_inf over its process group itself");
  TG_CHECK(options_.stage != 3 || options_.module != nullptr, kName,
           ": stage 3 shards the parameters of a module; set ZeroOptions::module");
  TG_CHECK(!optimizer_->has_state(), kName,
           ": the wrapped optimizer already has state; wrap it before its first step (its "
           "parameters are replaced by the f32 master shards)");
  rank_ = pg_->rank();
  SetTraceRank(rank_);  // traces name this thread "rank R / ..." (a thread-local store)
  world_ = pg_->size();
  device_ = pg_->device();

  std::unordered_set<const VariableImpl*> seen;
  bool any_f16 = false;
  const auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const Variable& p : groups[g].params) {
      const size_t i = model_.size();
      TG_CHECK(p.defined(), kName, ": parameter ", i, " is undefined");
      const std::string what = absl::StrCat(
          "parameter ", i, " (", p.name().empty() ? "" : "'", p.name(),
          p.name().empty() ? "" : "', ", DTypeName(p.dtype()), " ", ShapeToString(p.shape()), ")");
      TG_CHECK(seen.insert(p.impl().get()).second, kName, ": ", what,
               " appears twice in the optimizer's groups");
      TG_CHECK(p.is_leaf() && p.requires_grad(), kName, ": ", what,
               " must be a leaf that requires grad");
      const DType d = p.dtype();
      TG_CHECK(d == kF32 || d == kF64 || d == kF16 || d == kBF16, kName, ": ", what,
               " must be f32, f64, f16 or bf16");
      TG_CHECK(p.data().device() == device_, kName, ": ", what, " is on ",
               p.data().device().ToString(), " but the process group '", pg_->name(), "' (",
               pg_->backend(), ") works on ", device_.ToString(),
               "; move the model (Module::to) before making the optimizer");
      any_f16 = any_f16 || d == kF16;
      model_.push_back(p);
      names_.push_back(p.name());
      Param param;
      param.var = p;
      param.group = static_cast<int>(g);
      param.numel = p.numel();
      param.shape = p.shape();
      param.dtype = d;
      params_.push_back(std::move(param));
    }
  }
  TG_CHECK(!model_.empty(), kName, ": the optimizer has no parameters");

  // The step's mechanics are amp::StepCore's, on this rank's shards; the two cross-rank
  // reductions are the hooks. found_inf's local value is counted on the device (stats() reads it
  // lazily), so a step keeps StepCore's one host read.
  local_overflows_ = Tensor::Zeros({}, kF32, device_);
  amp::StepCoreHooks hooks;
  hooks.reduce_found_inf = [this](const Tensor& found_inf) {
    local_overflows_.copy_(tg::Add(local_overflows_, found_inf));
    TG_DIST_CHECK_OK(pg_->all_reduce(found_inf, ReduceOp::kMax)->wait());
  };
  hooks.reduce_norm = [this](double local, double norm_type) {
    return ReduceNorm(local, norm_type);
  };
  core_ =
      std::make_unique<amp::StepCore>(options_.mixed_precision, any_f16, device_, std::move(hooks));

  if (options_.stage == 3) {
    InitStage3();
  } else {
    InitStage12();
  }
  // The wrapped optimizer steps on the master shards, group by group.
  auto& mutable_groups = optimizer_->param_groups();
  for (size_t g = 0; g < mutable_groups.size(); ++g) {
    mutable_groups[g].params.clear();
    for (const Flat& f : flats_) {
      if (f.group == static_cast<int>(g)) mutable_groups[g].params.push_back(f.master);
    }
  }
  InstallHooks();
}

ZeroOptimizer::~ZeroOptimizer() {
  for (HookHandle& h : hooks_) h.remove();
  for (int b : inflight_) {
    if (buckets_[b].work) (void)buckets_[b].work->wait();
  }
  // Guards left by a forward that threw (see the header): popped innermost first, as long as
  // this thread's stack has entries (a guard's destructor pops unconditionally).
  for (auto it = units_.rbegin(); it != units_.rend(); ++it) {
    while (!it->guards.empty()) {
      if (SavedTensorHooks::Current() == nullptr) (void)it->guards.back().release();
      it->guards.pop_back();
    }
  }
}

// Stage 1/2: buckets over the parameters in reverse optimizer order; a change of (group, dtype)
// or the cap starts a new bucket. Each (group, dtype) is one flat buffer holding its buckets.
void ZeroOptimizer::InitStage12() {
  std::map<std::pair<int, int>, int> flat_of;  // (group, dtype) -> flat
  int64_t bucket_bytes = 0;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    Param& p = params_[i];
    const auto key = std::make_pair(p.group, static_cast<int>(p.dtype));
    auto it = flat_of.find(key);
    if (it == flat_of.end()) {
      flats_.emplace_back();
      Flat& f = flats_.back();
      f.group = p.group;
      f.dtype = p.dtype;
      f.reduce_dtype = options_.reduce_in_f32 && IsLowPrecision(p.dtype) ? kF32 : p.dtype;
      it = flat_of.emplace(key, static_cast<int>(flats_.size()) - 1).first;
    }
    const int64_t bytes = p.numel * static_cast<int64_t>(ElementSize(p.dtype));
    const bool fits = !buckets_.empty() && buckets_.back().flat == it->second &&
                      bucket_bytes + bytes <= options_.bucket_cap_bytes;
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().flat = it->second;
      bucket_bytes = 0;
    }
    bucket_bytes += bytes;
    buckets_.back().params.push_back(i);
    p.bucket = static_cast<int>(buckets_.size()) - 1;
    p.flat = it->second;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    Flat& f = flats_[bucket.flat];
    bucket.start = f.numel;
    int64_t used = 0;
    for (int i : bucket.params) {
      params_[i].offset = bucket.start + used;
      used += params_[i].numel;
      f.params.push_back(i);
    }
    bucket.numel = RoundUp(std::max<int64_t>(used, 1), world_);
    bucket.chunk = bucket.numel / world_;
    bucket.master_offset = f.shard_numel;
    f.numel += bucket.numel;
    f.shard_numel += bucket.chunk;
    f.buckets.push_back(static_cast<int>(b));
  }

  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (Flat& f : flats_) {
    f.full = Tensor::Zeros({f.numel}, f.dtype, device_);
    for (int i : f.params) {
      const Param& p = params_[i];
      f.full.narrow(0, p.offset, p.numel).view(p.shape).copy_(p.var.data());
    }
    if (options_.broadcast_parameters && world_ > 1) works.push_back(pg_->broadcast(f.full, 0));
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  for (size_t fi = 0; fi < flats_.size(); ++fi) {
    Flat& f = flats_[fi];
    for (int i : f.params) {
      Param& p = params_[i];
      p.var.set_data(f.full.narrow(0, p.offset, p.numel).view(p.shape));
    }
    Tensor m = Tensor::Empty({f.shard_numel}, MasterDType(f.dtype), device_);
    for (int b : f.buckets) {
      const Bucket& bucket = buckets_[b];
      m.narrow(0, bucket.master_offset, bucket.chunk)
          .copy_(f.full.narrow(0, bucket.start + rank_ * bucket.chunk, bucket.chunk));
    }
    f.master = Variable(m, /*requires_grad=*/true);
    f.master.set_name(absl::StrCat("zero master ", fi, " (rank ", rank_, ")"));
  }
}

std::vector<std::vector<int>> ZeroOptimizer::AssignUnits() {
  std::unordered_map<const VariableImpl*, int> index;
  for (size_t i = 0; i < model_.size(); ++i) index[model_[i].impl().get()] = static_cast<int>(i);
  for (const auto& [name, p] : options_.module->named_parameters()) {
    auto it = index.find(p.impl().get());
    if (it != index.end() && names_[it->second] == p.name()) names_[it->second] = name;
  }
  std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> candidates;
  // Default units own their own parameters; explicit units their whole subtree's (not claimed
  // by an earlier unit).
  const bool recurse = !options_.units.empty();
  if (options_.units.empty()) {
    for (auto& [name, m] : options_.module->named_modules()) {
      if (!m->parameters(/*recurse=*/false).empty()) candidates.emplace_back(name, m);
    }
  } else {
    for (size_t u = 0; u < options_.units.size(); ++u) {
      TG_CHECK(options_.units[u] != nullptr, kName, ": stage 3: unit ", u, " is null");
      candidates.emplace_back(absl::StrCat("unit ", u), options_.units[u]);
    }
  }
  std::vector<std::vector<int>> out;
  std::vector<bool> claimed(model_.size(), false);
  for (auto& [name, m] : candidates) {
    std::vector<int> mine;
    for (const Variable& p : m->parameters(recurse)) {
      auto it = index.find(p.impl().get());
      if (it == index.end() || claimed[it->second]) continue;
      claimed[it->second] = true;
      mine.push_back(it->second);
    }
    if (mine.empty()) continue;
    std::sort(mine.begin(), mine.end());  // optimizer order within the unit
    Unit unit;
    unit.module = m;
    unit.name = name.empty() ? m->type_name() : name;
    units_.push_back(std::move(unit));
    out.push_back(std::move(mine));
  }
  for (size_t i = 0; i < model_.size(); ++i) {
    TG_CHECK(claimed[i], kName, ": stage 3: parameter ", i, " of the optimizer (",
             names_[i].empty() ? "" : "'", names_[i], names_[i].empty() ? "" : "', ",
             DTypeName(model_[i].dtype()), " ", ShapeToString(model_[i].shape()),
             ") is not a parameter of any unit of the module; every parameter the optimizer "
             "updates must belong to a module whose forward gathers it");
  }
  return out;
}

// Stage 3: one flat buffer (and one bucket) per (unit, group, dtype); each rank keeps its chunk.
void ZeroOptimizer::InitStage3() {
  const std::vector<std::vector<int>> unit_params = AssignUnits();
  for (size_t u = 0; u < unit_params.size(); ++u) {
    Unit& unit = units_[u];
    std::map<std::pair<int, int>, int> flat_of;
    for (int i : unit_params[u]) {
      Param& p = params_[i];
      p.unit = static_cast<int>(u);
      unit.params.push_back(i);
      const auto key = std::make_pair(p.group, static_cast<int>(p.dtype));
      auto it = flat_of.find(key);
      if (it == flat_of.end()) {
        flats_.emplace_back();
        Flat& f = flats_.back();
        f.group = p.group;
        f.unit = static_cast<int>(u);
        f.dtype = p.dtype;
        f.reduce_dtype = options_.reduce_in_f32 && IsLowPrecision(p.dtype) ? kF32 : p.dtype;
        const int flat_index = static_cast<int>(flats_.size()) - 1;
        buckets_.emplace_back();
        buckets_.back().flat = flat_index;
        flats_.back().buckets.push_back(static_cast<int>(buckets_.size()) - 1);
        unit.flats.push_back(flat_index);
        it = flat_of.emplace(key, static_cast<int>(flats_.size()) - 1).first;
      }
      Flat& f = flats_[it->second];
      p.flat = it->second;
      p.bucket = f.buckets[0];
      p.offset = f.numel;  // unpadded running size for now
      f.numel += p.numel;
      f.params.push_back(i);
      buckets_[p.bucket].params.push_back(i);
    }
  }
  NoGradGuard no_grad;
  std::vector<Tensor> fulls(flats_.size());
  std::vector<std::shared_ptr<Work>> works;
  for (size_t fi = 0; fi < flats_.size(); ++fi) {
    Flat& f = flats_[fi];
    Bucket& b = buckets_[f.buckets[0]];
    b.numel = RoundUp(std::max<int64_t>(f.numel, 1), world_);
    b.chunk = b.numel / world_;
    f.numel = b.numel;
    f.shard_numel = b.chunk;
    fulls[fi] = Tensor::Zeros({f.numel}, f.dtype, device_);
    for (int i : f.params) {
      const Param& p = params_[i];
      fulls[fi].narrow(0, p.offset, p.numel).view(p.shape).copy_(p.var.data());
    }
    if (options_.broadcast_parameters && world_ > 1) works.push_back(pg_->broadcast(fulls[fi], 0));
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  for (size_t fi = 0; fi < flats_.size(); ++fi) {
    Flat& f = flats_[fi];
    f.shard = fulls[fi].narrow(0, rank_ * f.shard_numel, f.shard_numel).clone();
    // An f32 (f64) shard is its own master; f16/bf16 shards get an f32 copy.
    f.master = Variable(MasterDType(f.dtype) == f.dtype ? f.shard : f.shard.to(kF32),
                        /*requires_grad=*/true);
    f.master.set_name(
        absl::StrCat("zero master ", fi, " (", units_[f.unit].name, ", rank ", rank_, ")"));
    for (int i : f.params) {
      Param& p = params_[i];
      p.placeholder = Tensor::Full({}, std::numeric_limits<double>::quiet_NaN(), p.dtype, device_)
                          .expand(p.shape);
      p.var.set_data(p.placeholder);
    }
  }
}

void ZeroOptimizer::InstallHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const int index = static_cast<int>(i);
    hooks_.push_back(params_[i].var.register_post_accumulate_grad_hook(
        [this, index](const Variable&) { OnGradAccumulated(index); }));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    hooks_.push_back(units_[u].module->register_forward_pre_hook(
        [this, unit](nn::Module&, const Variable&) -> Variable {
          OnUnitPreForward(unit);
          return Variable();
        }));
    hooks_.push_back(units_[u].module->register_forward_hook(
        [this, unit](nn::Module&, const Variable&, const Variable&) -> Variable {
          OnUnitForward(unit);
          return Variable();
        }));
  }
}

// ---- Backward: hooks, buckets and the epilogue ----------------------------------------------

Variable ZeroOptimizer::scale(const Variable& loss) const {
  TG_CHECK(loss.defined(), kName, ": scale() got an undefined loss");
  return core_->Scale(loss);
}

void ZeroOptimizer::backward(const Variable& loss, const amp::MasterBackwardOptions& options) {
  TG_CHECK(options.update_master_grads || options_.stage == 1, kName,
           ": backward with update_master_grads=false needs stage 1; stage ", options_.stage,
           " reduce-scatters the gradients during backward");
  const Variable scaled = scale(loss);
  BackwardOptions bo;
  bo.retain_graph = options.retain_graph;
  if (options.update_master_grads) {
    scaled.backward(Variable(), bo);
    return;
  }
  defer_ = true;  // the hooks stay quiet: .grad accumulates locally
  try {
    scaled.backward(Variable(), bo);
  } catch (...) {
    defer_ = false;
    throw;
  }
  defer_ = false;
}

void ZeroOptimizer::OnGradAccumulated(int index) {
  if (defer_ || backward_issued_in_forward()) return;
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
  CopyGradIntoBucket(p, /*add=*/p.arrived);
  if (!p.arrived) {
    p.arrived = true;
    ++b.arrived;
  }
  p.var.set_grad(Variable());  // stage 2 keeps no full gradient
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
    // parameters without a gradient contribute zeros, a bucket without any is skipped.
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!buckets_[b].launched && buckets_[b].arrived > 0) {
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
  bucket.grad = Tensor::Zeros({bucket.numel}, flats_[bucket.flat].reduce_dtype, device_);
  stats_.grad_buffer_bytes += Bytes(bucket.grad);
  stats_.peak_grad_buffer_bytes = std::max(stats_.peak_grad_buffer_bytes, stats_.grad_buffer_bytes);
}

void ZeroOptimizer::FreeGradBuffer(Bucket& bucket) {
  stats_.grad_buffer_bytes -= Bytes(bucket.grad) + Bytes(bucket.shard_grad);
  bucket.grad = Tensor();
  bucket.shard_grad = Tensor();
}

void ZeroOptimizer::CopyGradIntoBucket(Param& p, bool add) {
  Bucket& b = buckets_[p.bucket];
  const Variable g = p.var.grad();
  if (!g.defined()) return;
  NoGradGuard no_grad;
  const Tensor slot = b.grad.narrow(0, p.offset - b.start, p.numel).view(p.shape);
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
  bucket.shard_grad = Tensor::Empty({bucket.chunk}, flats_[bucket.flat].reduce_dtype, device_);
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
  Tensor g = bucket.shard_grad.to(md);
  core_->Unscale({g});
  if (!f.master_grad.defined()) f.master_grad = Tensor::Zeros({f.shard_numel}, md, device_);
  const Tensor dst = f.master_grad.narrow(0, bucket.master_offset, bucket.chunk);
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
      params_[i].var.set_grad(Variable());  // the next backward accumulates only its own
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
  }
}

// ---- Stage 3: gathering and freeing parameters ----------------------------------------------

void ZeroOptimizer::Gather(int u, bool in_backward) {
  Unit& unit = units_[u];
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (int fi : unit.flats) {
    Flat& f = flats_[fi];
    f.full = Tensor::Empty({f.numel}, f.dtype, device_);
    works.push_back(pg_->all_gather(f.full, f.shard));
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  for (int i : unit.params) {
    Param& p = params_[i];
    p.var.set_data(flats_[p.flat].full.narrow(0, p.offset, p.numel).view(p.shape));
  }
  unit.gathered = true;
  if (in_backward) {
    ++stats_.backward_gathers;
  } else {
    ++stats_.forward_gathers;
  }
}

void ZeroOptimizer::Free(int u) {
  Unit& unit = units_[u];
  for (int i : unit.params) params_[i].var.set_data(params_[i].placeholder);
  for (int fi : unit.flats) flats_[fi].full = Tensor();
  unit.gathered = false;
}

std::any ZeroOptimizer::Pack(int u, const Variable& v) {
  const Tensor& d = v.data();
  for (int fi : units_[u].flats) {
    const Flat& f = flats_[fi];
    if (f.full.defined() && d.storage() == f.full.storage()) {
      ParamRef ref;
      ref.flat = fi;
      ref.shape = d.shape();
      ref.strides = d.strides();
      ref.offset = d.offset();
      return ref;
    }
  }
  PlainSaved s;
  s.version = v.version();
  if (v.is_leaf()) {
    s.leaf = v;
  } else {
    s.data = d;
  }
  return s;
}

void ZeroOptimizer::OnUnitPreForward(int u) {
  Unit& unit = units_[u];
  if (unit.active++ == 0 && !unit.gathered) Gather(u, /*in_backward=*/false);
  // Hooks active outside this unit (e.g. non-reentrant checkpointing) keep the tensors that
  // are not ours.
  std::optional<std::pair<PackHook, UnpackHook>> outer;
  if (const auto* current = SavedTensorHooks::Current()) outer = *current;
  PackHook pack = [this, u, outer](const Variable& v) -> std::any {
    std::any packed = Pack(u, v);
    if (outer && std::any_cast<ParamRef>(&packed) == nullptr) {
      return Delegated{outer->second, outer->first(v)};
    }
    return packed;
  };
  UnpackHook unpack = [this](const std::any& value) -> Variable {
    if (const auto* ref = std::any_cast<ParamRef>(&value)) {
      Flat& f = flats_[ref->flat];
      // The first use in a backward gathers the unit again; it stays until its gradients are
      // reduce-scattered (or the epilogue).
      if (!f.full.defined()) Gather(f.unit, /*in_backward=*/true);
      return Variable(Tensor(f.full.storage(), ref->shape, ref->strides, ref->offset, f.dtype));
    }
    if (const auto* delegated = std::any_cast<Delegated>(&value)) {
      return delegated->unpack(delegated->value);
    }
    const auto& s = std::any_cast<const PlainSaved&>(value);
    Variable v = s.leaf.defined() ? s.leaf : Variable(s.data);
    const uint64_t now = v.version();
    TG_CHECK(now == s.version, kName, ": a tensor saved for backward in a stage 3 unit (",
             DTypeName(v.dtype()), " ", ShapeToString(v.shape()),
             ") was modified in place after it was saved (version ", s.version, ", now ", now,
             "); its gradient would be wrong");
    return v;
  };
  unit.guards.push_back(std::make_unique<SavedTensorHooks>(std::move(pack), std::move(unpack)));
}

void ZeroOptimizer::OnUnitForward(int u) {
  Unit& unit = units_[u];
  TG_CHECK(!unit.guards.empty() && unit.active > 0, kName, ": the forward hook of unit '",
           unit.name, "' ran without its pre-hook");
  unit.guards.pop_back();
  if (--unit.active == 0 && unit.gathered) Free(u);
}

void ZeroOptimizer::OnUnitGrad(int index) {
  Param& p = params_[index];
  Unit& unit = units_[p.unit];
  const int64_t task = current_graph_task_id();
  if (unit.task != task) {
    // The first gradient of this unit in this task: how many will come.
    unit.task = task;
    unit.arrived = 0;
    unit.expected = 0;
    for (int i : unit.params) {
      params_[i].arrived = false;
      const std::shared_ptr<Node> node = params_[i].var.gradient_edge_node();
      if (node != nullptr && will_execute(node)) ++unit.expected;
    }
  }
  Bucket& b = buckets_[p.bucket];
  TG_CHECK(!b.launched, kName, ": parameter ", index, " (", names_[index],
           ") received a gradient after its unit '", unit.name,
           "' was reduce-scattered in this backward");
  if (!b.grad.defined()) AllocateGradBuffer(b);
  CopyGradIntoBucket(p, /*add=*/p.arrived);
  if (!p.arrived) {
    p.arrived = true;
    ++unit.arrived;
    ++b.arrived;
  }
  p.var.set_grad(Variable());
  if (unit.arrived < unit.expected) return;
  // Every gradient of the unit is in: every node that used its parameters has run.
  for (int fi : unit.flats) {
    const int bi = flats_[fi].buckets[0];
    if (buckets_[bi].grad.defined() && !buckets_[bi].launched) LaunchBucket(bi, /*from_hook=*/true);
  }
  if (unit.gathered && unit.active == 0) Free(p.unit);
}

// ---- Step, clipping, zero_grad ----------------------------------------------------------------

amp::StepResult ZeroOptimizer::step() {
  update_master_grads();
  TG_CHECK(has_master_grads_, kName,
           ": step() found no gradients; run a backward (opt.backward(loss) or "
           "opt.scale(loss).backward()) between zero_grad() and step()");
  std::vector<amp::MasterPiece> pieces;
  for (const Flat& f : flats_) pieces.push_back({f.master, f.master_grad, Tensor()});
  return core_->Step(
      pieces, *optimizer_, [this] { zero_grad(); }, [this] { PublishMasters(); });
}

void ZeroOptimizer::PublishMasters() {
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (Flat& f : flats_) {
    if (!f.master_grad.defined()) continue;  // not stepped (the same on every rank)
    if (options_.stage == 3) {
      if (!f.shard.shares_storage(f.master.data())) f.shard.copy_(f.master.data());
      continue;
    }
    for (int b : f.buckets) {
      const Bucket& bucket = buckets_[b];
      const Tensor mine = f.master.data().narrow(0, bucket.master_offset, bucket.chunk);
      works.push_back(
          pg_->all_gather(f.full.narrow(0, bucket.start, bucket.numel), mine.to(f.dtype)));
    }
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  if (options_.stage != 3) {
    for (Flat& f : flats_) f.full.storage()->bump_version();  // the model params changed
  }
}

double ZeroOptimizer::clip_master_grads(double max_norm, double norm_type) {
  update_master_grads();
  std::vector<Tensor> grads;
  for (const Flat& f : flats_) {
    if (f.master_grad.defined()) grads.push_back(f.master_grad);
  }
  return core_->ClipGradNorm(grads, max_norm, norm_type);  // a collective: reduce_norm
}

double ZeroOptimizer::ReduceNorm(double local, double norm_type) {
  // This rank's part raised to p (max for the inf norm) and a NaN flag (a max over ranks would
  // drop a NaN), reduced over the group, then the p-th root: the norm of the whole gradient.
  const bool inf_norm = std::isinf(norm_type);
  const Tensor parts = Tensor::FromVector<double>(
      {inf_norm ? local : std::pow(local, norm_type), std::isnan(local) ? 1.0 : 0.0}, {2});
  Tensor reduced = parts.to(device_);
  TG_DIST_CHECK_OK(pg_->all_reduce(reduced, inf_norm ? ReduceOp::kMax : ReduceOp::kSum)->wait());
  const std::vector<double> v = reduced.to_vector<double>();
  if (v[1] > 0) return std::nan("");
  if (inf_norm || norm_type == 1) return v[0];
  if (norm_type == 2) return std::sqrt(v[0]);
  return std::pow(v[0], 1.0 / norm_type);
}

void ZeroOptimizer::zero_grad() {
  ResetBackwardState();
  for (Param& p : params_) p.var.set_grad(Variable());
  for (Flat& f : flats_) {
    f.master.set_grad(Variable());
    f.master_grad = Tensor();
  }
  core_->ClearFoundInf();
  has_master_grads_ = false;
}

// ---- State dict ------------------------------------------------------------------------------

Tensor ZeroOptimizer::GatherFlat(const Flat& f, const Tensor& shard) {
  Tensor full = Tensor::Zeros({f.numel}, shard.dtype(), device_);
  std::vector<std::shared_ptr<Work>> works;
  for (int b : f.buckets) {
    const Bucket& bucket = buckets_[b];
    works.push_back(pg_->all_gather(full.narrow(0, bucket.start, bucket.numel),
                                    shard.narrow(0, bucket.master_offset, bucket.chunk)));
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  return full;
}

Tensor ZeroOptimizer::ShardOf(const Flat& f, const Tensor& full) const {
  Tensor shard = Tensor::Empty({f.shard_numel}, full.dtype(), device_);
  for (int b : f.buckets) {
    const Bucket& bucket = buckets_[b];
    shard.narrow(0, bucket.master_offset, bucket.chunk)
        .copy_(full.narrow(0, bucket.start + rank_ * bucket.chunk, bucket.chunk));
  }
  return shard;
}

StateDict ZeroOptimizer::state_dict() {
  NoGradGuard no_grad;
  auto piece = [&](const Tensor& full, int i) {
    return full.narrow(0, params_[i].offset, params_[i].numel).view(params_[i].shape).clone();
  };
  StateDict out, opt;
  const auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gp = absl::StrCat("param_groups.", g, ".");
    for (const auto& [key, value] : groups[g].options) opt.scalars[gp + key] = value;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].group == static_cast<int>(g)) ids.push_back(static_cast<int64_t>(i));
    }
    opt.tensors[gp + "params"] =
        Tensor::FromVector<int64_t>(ids, {static_cast<int64_t>(ids.size())});
  }
  // The same flats and state keys on every rank, in the same order: the collectives match.
  for (const Flat& f : flats_) {
    if (IsLowPrecision(f.dtype)) {
      const Tensor full = GatherFlat(f, f.master.data());
      for (int i : f.params) out.tensors[absl::StrCat("master.", i)] = piece(full, i);
    }
    const StateDict* st = optimizer_->param_state(f.master);
    if (st == nullptr) continue;  // not stepped yet
    for (const auto& [key, t] : st->tensors) {
      TG_CHECK(t.dim() == 1 && t.numel() == f.shard_numel, kName, ": state_dict: the wrapped ",
               optimizer_->name(), "'s state '", key, "' is ", ShapeToString(t.shape()),
               ", not one value per element of the shard [", f.shard_numel, "]");
      const Tensor full = GatherFlat(f, t);
      for (int i : f.params) opt.tensors[absl::StrCat("state.", i, ".", key)] = piece(full, i);
    }
    for (const auto& [key, v] : st->scalars) {
      for (int i : f.params) opt.scalars[absl::StrCat("state.", i, ".", key)] = v;
    }
  }
  out.Merge("optimizer.", opt);
  out.Merge("scaler.", core_->scaler().state_dict());
  return out;
}

void ZeroOptimizer::load_state_dict(const StateDict& state) {
  const std::string op = absl::StrCat(kName, ": load_state_dict: ");
  auto describe = [&](int i) {
    return absl::StrCat("parameter ", i, names_[i].empty() ? "" : " '", names_[i],
                        names_[i].empty() ? "" : "'");
  };
  for (const auto& [key, value] : state.tensors) {
    (void)value;
    TG_CHECK(key.rfind("master.", 0) == 0 || key.rfind("optimizer.", 0) == 0, op,
             "unexpected tensor '", key, "'");
  }
  // Masters of the f16/bf16 parameters.
  std::vector<Tensor> masters(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    const std::string key = absl::StrCat("master.", i);
    if (!IsLowPrecision(p.dtype)) {
      TG_CHECK(!state.has_tensor(key), op, "unexpected '", key, "' (", describe(i), " is ",
               DTypeName(p.dtype), " and has no master copy)");
      continue;
    }
    TG_CHECK(state.has_tensor(key), op, "missing '", key, "'");
    masters[i] = state.tensor(key);
    TG_CHECK(masters[i].dtype() == kF32 && masters[i].shape() == p.shape, op, "'", key, "' is ",
             DTypeName(masters[i].dtype()), " ", ShapeToString(masters[i].shape()), " but ",
             describe(static_cast<int>(i)), " has an f32 master of shape ", ShapeToString(p.shape));
  }

  // The wrapped optimizer's view: one entry per master shard, built from the per-parameter state.
  const StateDict in = state.Sub("optimizer.");
  const auto& groups = optimizer_->param_groups();
  for (const auto& [key, t] : in.tensors) {
    (void)t;
    if (key.rfind("param_groups.", 0) == 0) continue;
    TG_CHECK(key.rfind("state.", 0) == 0, op, "unexpected tensor 'optimizer.", key, "'");
  }
  StateDict sharded;
  int64_t master_id = 0;
  std::unordered_set<std::string> used;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gp = absl::StrCat("param_groups.", g, ".");
    for (const auto& [key, v] : in.Sub(gp).scalars) sharded.scalars[gp + key] = v;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].group == static_cast<int>(g)) ids.push_back(static_cast<int64_t>(i));
    }
    const std::string params_key = gp + "params";
    TG_CHECK(in.has_tensor(params_key), op, "missing 'optimizer.", params_key, "'");
    const Tensor listed = in.tensor(params_key);
    TG_CHECK(listed.dtype() == kI64 && listed.dim() == 1 && listed.to_vector<int64_t>() == ids, op,
             "'optimizer.", params_key, "' does not list the parameters of group ", g,
             " of this optimizer (", ids.size(), " parameters from ", ids.empty() ? 0 : ids.front(),
             "); the checkpoint has other param groups");
    used.insert(params_key);
    std::vector<int64_t> master_ids;
    for (const Flat& f : flats_) {
      if (f.group != static_cast<int>(g)) continue;
      const int64_t id = master_id++;
      master_ids.push_back(id);
      // Every parameter of the flat must carry the same state keys and scalars (they step
      // together here); none carrying any means no state yet.
      const int first = *std::min_element(f.params.begin(), f.params.end());
      const std::string first_prefix = absl::StrCat("state.", first, ".");
      const StateDict first_state = in.Sub(first_prefix);
      for (int i : f.params) {
        const StateDict mine = in.Sub(absl::StrCat("state.", i, "."));
        std::vector<std::string> a, b;
        for (const auto& [k, t] : mine.tensors) a.push_back(k);
        for (const auto& [k, t] : first_state.tensors) b.push_back(k);
        TG_CHECK(a == b && mine.scalars == first_state.scalars, op, "the optimizer state of ",
                 describe(i), " differs in its keys or scalars (e.g. the step count) from that of ",
                 describe(first), "; ZeroOptimizer steps them together in one flat buffer");
      }
      const std::string sp = absl::StrCat("state.", id, ".");
      for (const auto& [k, v] : first_state.scalars) sharded.scalars[sp + k] = v;
      for (const auto& [k, t0] : first_state.tensors) {
        Tensor full = Tensor::Zeros({f.numel}, t0.dtype(), device_);
        for (int i : f.params) {
          const std::string key = absl::StrCat("state.", i, ".", k);
          const Tensor& t = in.tensor(key);
          TG_CHECK(t.dtype() == t0.dtype() && t.shape() == params_[i].shape, op, "'optimizer.", key,
                   "' is ", DTypeName(t.dtype()), " ", ShapeToString(t.shape()), " but ",
                   describe(i), " is ", ShapeToString(params_[i].shape), " (",
                   DTypeName(t0.dtype()), " state)");
          full.narrow(0, params_[i].offset, params_[i].numel)
              .view(params_[i].shape)
              .copy_(t.to(device_));
        }
        sharded.tensors[sp + k] = ShardOf(f, full);
      }
      for (int i : f.params) {
        const StateDict mine = in.Sub(absl::StrCat("state.", i, "."));
        for (const auto& [k, t] : mine.tensors) used.insert(absl::StrCat("state.", i, ".", k));
      }
    }
    sharded.tensors[params_key] =
        Tensor::FromVector<int64_t>(master_ids, {static_cast<int64_t>(master_ids.size())});
  }
  for (const auto& [key, t] : in.tensors) {
    (void)t;
    TG_CHECK(used.count(key) != 0, op, "unexpected tensor 'optimizer.", key,
             "' (this optimizer has ", params_.size(), " parameters in ", groups.size(),
             " groups)");
  }
  // Scalars: state.<i>.* of a parameter (checked above) and param_groups.<g>.* of a group (the
  // wrapped optimizer checks the names).
  for (const auto& [key, v] : in.scalars) {
    (void)v;
    const bool group = key.rfind("param_groups.", 0) == 0;
    const size_t start = group ? 13 : 6;
    const size_t dot = key.find('.', start);
    int64_t index = -1;
    const int64_t count = static_cast<int64_t>(group ? groups.size() : params_.size());
    TG_CHECK((group || key.rfind("state.", 0) == 0) && dot != std::string::npos &&
                 absl::SimpleAtoi(key.substr(start, dot - start), &index) && index >= 0 &&
                 index < count,
             op, "unexpected scalar 'optimizer.", key, "' (this optimizer has ", params_.size(),
             " parameters in ", groups.size(), " groups)");
  }

  amp::LossScaler scaler = core_->scaler();
  scaler.load_state_dict(state.Sub("scaler."));
  optimizer_->load_state_dict(sharded);  // validates the rest, then changes
  core_->scaler() = scaler;

  NoGradGuard no_grad;
  for (Flat& f : flats_) {
    if (options_.stage == 3 && !IsLowPrecision(f.dtype)) continue;  // the shard is the master
    Tensor full = Tensor::Zeros({f.numel}, MasterDType(f.dtype), device_);
    for (int i : f.params) {
      const Param& p = params_[i];
      // Stage 1/2 model parameters are views of f.full: their current values.
      const Tensor value = IsLowPrecision(f.dtype) ? masters[i].to(device_) : p.var.data();
      full.narrow(0, p.offset, p.numel).view(p.shape).copy_(value);
    }
    f.master.data().copy_(ShardOf(f, full));
    f.master.bump_version();
    if (!IsLowPrecision(f.dtype)) continue;
    // The model holds the masters rounded to its dtype, as after a step.
    if (options_.stage == 3) {
      f.shard.copy_(f.master.data());
    } else {
      f.full.copy_(full);
      f.full.storage()->bump_version();
    }
  }
  zero_grad();
}

// ---- Inspection -------------------------------------------------------------------------------

std::vector<Tensor> ZeroOptimizer::full_parameters() {
  std::vector<Tensor> out(params_.size());
  NoGradGuard no_grad;
  if (options_.stage != 3) {
    for (size_t i = 0; i < params_.size(); ++i) out[i] = params_[i].var.data().clone();
    return out;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const bool was = units_[u].gathered;
    if (!was) {
      Gather(static_cast<int>(u), false);
      --stats_.forward_gathers;  // not a forward
    }
    for (int i : units_[u].params) out[i] = params_[i].var.data().clone();
    if (!was) Free(static_cast<int>(u));
  }
  return out;
}

std::vector<Variable> ZeroOptimizer::master_params() const {
  std::vector<Variable> out;
  for (const Flat& f : flats_) out.push_back(f.master);
  return out;
}

std::vector<Tensor> ZeroOptimizer::master_grads() const {
  std::vector<Tensor> out;
  for (const Flat& f : flats_) out.push_back(f.master_grad);
  return out;
}

int64_t ZeroOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const Flat& f : flats_) n += f.shard_numel;
  return n;
}

std::vector<ZeroFlatLayout> ZeroOptimizer::layout() const {
  std::vector<ZeroFlatLayout> out;
  for (const Flat& f : flats_) {
    ZeroFlatLayout l;
    l.group = f.group;
    l.unit = f.unit;
    l.dtype = f.dtype;
    l.numel = f.numel;
    l.shard_numel = f.shard_numel;
    for (int b : f.buckets) l.bucket_numels.push_back(buckets_[b].numel);
    for (int i : f.params) l.param_names.push_back(names_[i]);
    out.push_back(std::move(l));
  }
  return out;
}

ZeroStats ZeroOptimizer::stats() const {
  ZeroStats s = stats_;
  s.local_overflow_steps = static_cast<int64_t>(local_overflows_.item());  // a host read
  return s;
}

ZeroMemory ZeroOptimizer::memory() const {
  ZeroMemory m;
  for (const Flat& f : flats_) {
    m.master_bytes += Bytes(f.master.data());
    m.master_grad_bytes += Bytes(f.master_grad);
    if (const StateDict* st = optimizer_->param_state(f.master)) {
      for (const auto& [key, t] : st->tensors) m.optimizer_state_bytes += Bytes(t);
    }
    if (options_.stage == 3) {
      if (!f.shard.shares_storage(f.master.data())) m.param_bytes += Bytes(f.shard);
    }
    m.param_bytes += Bytes(f.full);
  }
  return m;
}

}  // namespace tg::dist
