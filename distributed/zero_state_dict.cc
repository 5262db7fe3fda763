// ZeroOptimizer's state_dict: gathered from the shards into the single-process format
// (amp::MixedPrecisionOptimizer's), and loaded back by taking each rank's shard.
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

// ---- State dict ------------------------------------------------------------------------------

RawTensor ZeroOptimizer::GatherFlat(const Flat& f, const RawTensor& shard) {
  RawTensor full = RawTensor::Zeros({f.numel}, shard.dtype(), device_);
  std::vector<std::shared_ptr<Work>> works;
  for (int b : f.buckets) {
    const Bucket& bucket = buckets_[b];
    works.push_back(pg_->all_gather(full.narrow(0, bucket.start, bucket.numel),
                                    shard.narrow(0, bucket.master_offset, bucket.chunk)));
  }
  for (auto& w : works) TG_DIST_CHECK_OK(w->wait());
  return full;
}

RawTensor ZeroOptimizer::ShardOf(const Flat& f, const RawTensor& full) const {
  RawTensor shard = RawTensor::Empty({f.shard_numel}, full.dtype(), device_);
  for (int b : f.buckets) {
    const Bucket& bucket = buckets_[b];
    shard.narrow(0, bucket.master_offset, bucket.chunk)
        .copy_(full.narrow(0, bucket.start + rank_ * bucket.chunk, bucket.chunk));
  }
  return shard;
}

StateDict ZeroOptimizer::state_dict() {
  NoGradGuard no_grad;
  auto piece = [&](const RawTensor& full, int i) {
    return full.narrow(0, params_[i].offset, params_[i].numel).view(params_[i].shape).clone();
  };
  StateDict out, opt;
  const auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gp = absl::StrCat("param_groups.", g, ".");
    for (const optim::NamedOption& o : groups[g].options().named())
      opt.scalars[gp + o.name] = o.value;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].group == static_cast<int>(g)) ids.push_back(static_cast<int64_t>(i));
    }
    opt.tensors[gp + "params"] =
        RawTensor::FromVector<int64_t>(ids, {static_cast<int64_t>(ids.size())});
  }
  // The same flats and state keys on every rank, in the same order: the collectives match.
  for (const Flat& f : flats_) {
    if (IsLowPrecision(f.dtype)) {
      const RawTensor full = GatherFlat(f, f.master.data());
      for (int i : f.params) out.tensors[absl::StrCat("master.", i)] = piece(full, i);
    }
    const StateDict* st = optimizer_->param_state(f.master);
    if (st == nullptr) continue;  // not stepped yet
    for (const auto& [key, t] : st->tensors) {
      TG_CHECK(t.dim() == 1 && t.numel() == f.shard_numel, kName, ": state_dict: the wrapped ",
               optimizer_->name(), "'s state '", key, "' is ", ShapeToString(t.shape()),
               ", not one value per element of the shard [", f.shard_numel, "]");
      const RawTensor full = GatherFlat(f, t);
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
  std::vector<RawTensor> masters(params_.size());
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
    const RawTensor listed = in.tensor(params_key);
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
        RawTensor full = RawTensor::Zeros({f.numel}, t0.dtype(), device_);
        for (int i : f.params) {
          const std::string key = absl::StrCat("state.", i, ".", k);
          const RawTensor& t = in.tensor(key);
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
        RawTensor::FromVector<int64_t>(master_ids, {static_cast<int64_t>(master_ids.size())});
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
    RawTensor full = RawTensor::Zeros({f.numel}, MasterDType(f.dtype), device_);
    for (int i : f.params) {
      const Param& p = params_[i];
      // Stage 1/2 model parameters are views of f.full: their current values.
      const RawTensor value = IsLowPrecision(f.dtype) ? masters[i].to(device_) : p.var.data();
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

}  // namespace tg::dist
