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
#include "distributed/zero_internal.h"
#include "optim/muon.h"
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
    for (const Tensor& p : groups[g].params) {
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
  local_overflows_ = RawTensor::Zeros({}, kF32, device_);
  amp::StepCoreHooks hooks;
  hooks.reduce_found_inf = [this](const RawTensor& found_inf) {
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
  InitMuonSharding();
}

// ---- Muon's sharding (optim/muon.h) ------------------------------------------------------------

class ZeroOptimizer::MuonShards : public optim::MuonSharding {
 public:
  explicit MuonShards(ZeroOptimizer& zero) : zero_(zero) {
    for (size_t fi = 0; fi < zero.flats_.size(); ++fi) {
      const Flat& f = zero.flats_[fi];
      Layout layout;
      layout.full_numel = f.numel;
      for (int i : f.params) {
        layout.matrices.push_back({zero.params_[i].offset, zero.params_[i].shape});
      }
      for (int b : f.buckets) {
        const Bucket& bucket = zero.buckets_[b];
        layout.chunks.push_back(
            {bucket.start + zero.rank_ * bucket.chunk, bucket.chunk, bucket.master_offset});
      }
      flat_of_[f.master.impl().get()] = fi;
      layouts_.push_back(std::move(layout));
    }
  }
  int rank() const override { return zero_.rank_; }
  int world() const override { return zero_.world_; }
  const Layout& layout(const Tensor& shard) const override { return layouts_[Find(shard)]; }
  RawTensor Gather(const Tensor& shard, const RawTensor& values) const override {
    return zero_.GatherFlat(zero_.flats_[Find(shard)], values);
  }
  void Broadcast(const RawTensor& buffer, int root) const override {
    TG_DIST_CHECK_OK(zero_.pg_->broadcast(buffer, root)->wait());
  }

 private:
  size_t Find(const Tensor& shard) const {
    const auto it = flat_of_.find(shard.impl().get());
    TG_CHECK(it != flat_of_.end(), kName, ": Muon stepped a tensor that is not a master shard");
    return it->second;
  }
  ZeroOptimizer& zero_;
  std::unordered_map<const VariableImpl*, size_t> flat_of_;
  std::vector<Layout> layouts_;
};

void ZeroOptimizer::InitMuonSharding() {
  if (auto* muon = dynamic_cast<optim::MuonShardable*>(optimizer_.get())) {
    muon->set_muon_sharding(std::make_shared<MuonShards>(*this));
  }
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
    f.full = RawTensor::Zeros({f.numel}, f.dtype, device_);
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
    RawTensor m = RawTensor::Empty({f.shard_numel}, MasterDType(f.dtype), device_);
    for (int b : f.buckets) {
      const Bucket& bucket = buckets_[b];
      m.narrow(0, bucket.master_offset, bucket.chunk)
          .copy_(f.full.narrow(0, bucket.start + rank_ * bucket.chunk, bucket.chunk));
    }
    f.master = Tensor(m, /*requires_grad=*/true);
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
    for (const Tensor& p : m->parameters(recurse)) {
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
  std::vector<RawTensor> fulls(flats_.size());
  std::vector<std::shared_ptr<Work>> works;
  for (size_t fi = 0; fi < flats_.size(); ++fi) {
    Flat& f = flats_[fi];
    Bucket& b = buckets_[f.buckets[0]];
    b.numel = RoundUp(std::max<int64_t>(f.numel, 1), world_);
    b.chunk = b.numel / world_;
    f.numel = b.numel;
    f.shard_numel = b.chunk;
    fulls[fi] = RawTensor::Zeros({f.numel}, f.dtype, device_);
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
    f.master = Tensor(MasterDType(f.dtype) == f.dtype ? f.shard : f.shard.to(kF32),
                      /*requires_grad=*/true);
    f.master.set_name(
        absl::StrCat("zero master ", fi, " (", units_[f.unit].name, ", rank ", rank_, ")"));
    for (int i : f.params) {
      Param& p = params_[i];
      p.placeholder =
          RawTensor::Full({}, std::numeric_limits<double>::quiet_NaN(), p.dtype, device_)
              .expand(p.shape);
      p.var.set_data(p.placeholder);
    }
  }
}

void ZeroOptimizer::InstallHooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const int index = static_cast<int>(i);
    hooks_.push_back(params_[i].var.register_post_accumulate_grad_hook(
        [this, index](const Tensor&) { OnGradAccumulated(index); }));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    hooks_.push_back(units_[u].module->register_forward_pre_hook(
        [this, unit](nn::Module&, const Tensor&) -> Tensor {
          OnUnitPreForward(unit);
          return Tensor();
        }));
    hooks_.push_back(units_[u].module->register_forward_hook(
        [this, unit](nn::Module&, const Tensor&, const Tensor&) -> Tensor {
          OnUnitForward(unit);
          return Tensor();
        }));
  }
}

// ---- Step, clipping, zero_grad ----------------------------------------------------------------

amp::StepResult ZeroOptimizer::step() {
  update_master_grads();
  TG_CHECK(has_master_grads_, kName,
           ": step() found no gradients; run a backward (opt.backward(loss) or "
           "opt.scale(loss).backward()) between zero_grad() and step()");
  std::vector<amp::MasterPiece> pieces;
  for (const Flat& f : flats_) pieces.push_back({f.master, f.master_grad, RawTensor()});
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
      const RawTensor mine = f.master.data().narrow(0, bucket.master_offset, bucket.chunk);
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
  std::vector<RawTensor> grads;
  for (const Flat& f : flats_) {
    if (f.master_grad.defined()) grads.push_back(f.master_grad);
  }
  return core_->ClipGradNorm(grads, max_norm, norm_type);  // a collective: reduce_norm
}

double ZeroOptimizer::ReduceNorm(double local, double norm_type) {
  // This rank's part raised to p (max for the inf norm) and a NaN flag (a max over ranks would
  // drop a NaN), reduced over the group, then the p-th root: the norm of the whole gradient.
  const bool inf_norm = std::isinf(norm_type);
  const RawTensor parts = RawTensor::FromVector<double>(
      {inf_norm ? local : std::pow(local, norm_type), std::isnan(local) ? 1.0 : 0.0}, {2});
  RawTensor reduced = parts.to(device_);
  TG_DIST_CHECK_OK(pg_->all_reduce(reduced, inf_norm ? ReduceOp::kMax : ReduceOp::kSum)->wait());
  const std::vector<double> v = reduced.to_vector<double>();
  if (v[1] > 0) return std::nan("");
  if (inf_norm || norm_type == 1) return v[0];
  if (norm_type == 2) return std::sqrt(v[0]);
  return std::pow(v[0], 1.0 / norm_type);
}

void ZeroOptimizer::zero_grad() {
  ResetBackwardState();
  for (Param& p : params_) {
    p.var.set_grad(Tensor());
    p.forward_grad = false;
  }
  for (Flat& f : flats_) {
    f.master.set_grad(Tensor());
    f.master_grad.reset();
  }
  core_->ClearFoundInf();
  has_master_grads_ = false;
}

// ---- Inspection -------------------------------------------------------------------------------

std::vector<RawTensor> ZeroOptimizer::full_parameters() {
  std::vector<RawTensor> out(params_.size());
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

std::vector<Tensor> ZeroOptimizer::master_params() const {
  std::vector<Tensor> out;
  for (const Flat& f : flats_) out.push_back(f.master);
  return out;
}

std::vector<RawTensor> ZeroOptimizer::master_grads() const {
  std::vector<RawTensor> out;
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
