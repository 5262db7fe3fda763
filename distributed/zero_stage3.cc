// ZeroOptimizer stage 3: gathering a unit's parameters around its forward and in backward
// (saved tensors that live in a gathered buffer are stored as references), and freeing them.
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

// ---- Stage 3: gathering and freeing parameters ----------------------------------------------

void ZeroOptimizer::Gather(int u, bool in_backward) {
  Unit& unit = units_[u];
  NoGradGuard no_grad;
  std::vector<std::shared_ptr<Work>> works;
  for (int fi : unit.flats) {
    Flat& f = flats_[fi];
    f.full = RawTensor::Empty({f.numel}, f.dtype, device_);
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
  for (int fi : unit.flats) flats_[fi].full.reset();
  unit.gathered = false;
}

std::any ZeroOptimizer::Pack(int u, const Tensor& v) {
  const RawTensor& d = v.data();
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
  PackHook pack = [this, u, outer](const Tensor& v) -> std::any {
    std::any packed = Pack(u, v);
    if (outer && std::any_cast<ParamRef>(&packed) == nullptr) {
      return Delegated{outer->second, outer->first(v)};
    }
    return packed;
  };
  UnpackHook unpack = [this](const std::any& value) -> Tensor {
    if (const auto* ref = std::any_cast<ParamRef>(&value)) {
      Flat& f = flats_[ref->flat];
      // The first use in a backward gathers the unit again; it stays until its gradients are
      // reduce-scattered (or the epilogue).
      if (!f.full.defined()) Gather(f.unit, /*in_backward=*/true);
      return Tensor(RawTensor(f.full.storage(), ref->shape, ref->strides, ref->offset, f.dtype));
    }
    if (const auto* delegated = std::any_cast<Delegated>(&value)) {
      return delegated->unpack(delegated->value);
    }
    const auto& s = std::any_cast<const PlainSaved&>(value);
    Tensor v = s.leaf.defined() ? s.leaf : Tensor(s.data);
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
  CopyGradIntoBucket(p, /*add=*/p.arrived);  // with any forward-time part (.grad holds both)
  p.forward_grad = false;
  if (!p.arrived) {
    p.arrived = true;
    ++unit.arrived;
    ++b.arrived;
  }
  p.var.set_grad(Tensor());
  if (unit.arrived < unit.expected) return;
  // Every gradient of the unit is in: every node that used its parameters has run.
  for (int fi : unit.flats) {
    const int bi = flats_[fi].buckets[0];
    if (!buckets_[bi].launched && (buckets_[bi].grad.defined() || BucketHasForwardGrad(bi))) {
      LaunchBucket(bi, /*from_hook=*/true);
    }
  }
  if (unit.gathered && unit.active == 0) Free(p.unit);
}

}  // namespace tg::dist
