#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

std::string GroupName(size_t g) { return absl::StrCat("param group ", g); }

std::string ParamName(size_t g, size_t i) {
  return absl::StrCat("param ", i, " of param group ", g);
}

// Parses a decimal index ("0", "17"); false for anything else (signs, spaces, leading zeros,
// more than 9 digits).
bool ParseIndex(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

// Splits "<index>.<name>" (the part of a key after "param_groups." or "state.").
bool SplitIndexed(const std::string& rest, int64_t* index, std::string* name) {
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot + 1 == rest.size()) return false;
  *name = rest.substr(dot + 1);
  return ParseIndex(rest.substr(0, dot), index);
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

bool OptimizerOptions::set_named(const std::string& name, double value,
                                 const std::string& context) {
  return SetNamed(name, value, context);
}

bool OptimizerOptions::NamedBool(const std::string& name, double value,
                                 const std::string& context) {
  TG_CHECK(value == 0 || value == 1, context, name, " must be 0 or 1, got ", value);
  return value == 1;
}

ParamGroup::ParamGroup(const ParamGroup& other)
    : params(other.params), options_(other.options_ ? other.options_->clone() : nullptr) {}

ParamGroup& ParamGroup::operator=(const ParamGroup& other) {
  if (this != &other) {
    params = other.params;
    options_ = other.options_ ? other.options_->clone() : nullptr;
  }
  return *this;
}

const OptimizerOptions& ParamGroup::options() const {
  TG_CHECK(options_ != nullptr,
           "param group has no options (it takes the optimizer's defaults when added)");
  return *options_;
}

OptimizerOptions& ParamGroup::options() {
  return const_cast<OptimizerOptions&>(static_cast<const ParamGroup&>(*this).options());
}

void ParamGroup::ThrowWrongType(const char* wanted) const {
  throw Error(absl::StrCat("param group options are ", options().type_name(), ", not ", wanted));
}

DType StateDType(DType param_dtype) {
  TG_CHECK(IsFloating(param_dtype), "StateDType: expected a floating dtype, got ",
           DTypeName(param_dtype));
  return param_dtype == kF64 ? kF64 : kF32;
}

Optimizer::Optimizer(std::string name, std::unique_ptr<OptimizerOptions> defaults, bool fused)
    : name_(std::move(name)), defaults_(std::move(defaults)), fused_(fused) {}

void Optimizer::Init(std::vector<ParamGroup> groups) {
  TG_CHECK(!groups.empty(), name_, ": got an empty list of param groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

void Optimizer::CheckValues(const OptimizerOptions& options, const std::string& context) const {
  TG_CHECK(AcceptsOptions(options), context, "options are ", options.type_name(), "; ", name_,
           " takes ", AcceptedOptions());
  for (const NamedOption& o : options.named()) {
    TG_CHECK(std::isfinite(o.value), context, "option '", o.name, "' is ", o.value);
  }
  CheckOptions(options, context);
}

void Optimizer::CheckParam(const Tensor& p, const OptimizerOptions& options, size_t g,
                           size_t i) const {
  TG_CHECK(p.defined(), name_, ": ", ParamName(g, i), " is undefined");
  TG_CHECK(p.is_leaf(), name_, ": ", ParamName(g, i),
           " is not a leaf; optimizers update leaves (detach() it)");
  TG_CHECK(IsFloating(p.dtype()), name_, ": ", ParamName(g, i), " has dtype ", DTypeName(p.dtype()),
           "; only floating parameters can be optimized");
  const std::string refused = RefuseShape(options, p.shape());
  TG_CHECK(refused.empty(), name_, ": ", ParamName(g, i), " has shape ", ShapeToString(p.shape()),
           ": ", refused);
}

std::string Optimizer::RefuseShape(const OptimizerOptions&, const Shape&) const { return ""; }

std::string Optimizer::AcceptedOptions() const { return defaults_->type_name(); }

std::vector<ParamGroup> Optimizer::OneGroup(const char* name, std::vector<Tensor> params) {
  TG_CHECK(!params.empty(), name, ": got an empty parameter list");
  return {ParamGroup(std::move(params))};
}

void Optimizer::add_param_group(ParamGroup group) {
  const size_t g = groups_.size();
  if (!group.has_options()) group.options_ = defaults_->clone();
  CheckValues(group.options(), absl::StrCat(name_, ": ", GroupName(g), ": "));
  std::unordered_map<const VariableImpl*, std::pair<size_t, size_t>> seen;
  for (size_t h = 0; h < groups_.size(); ++h) {
    for (size_t i = 0; i < groups_[h].params.size(); ++i) {
      if (groups_[h].params[i].defined())
        seen.emplace(groups_[h].params[i].impl().get(), std::make_pair(h, i));
    }
  }
  for (size_t i = 0; i < group.params.size(); ++i) {
    CheckParam(group.params[i], group.options(), g, i);
    auto [it, inserted] = seen.emplace(group.params[i].impl().get(), std::make_pair(g, i));
    TG_CHECK(inserted, name_, ": ", ParamName(g, i), " is the same variable as ",
             ParamName(it->second.first, it->second.second), "; a parameter may appear only once");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::set_model_copy(const Tensor& param, const RawTensor& copy) {
  TG_CHECK(param.defined(), name_, ".set_model_copy: the parameter is undefined");
  if (!copy.defined()) {
    model_copies_.erase(param.impl().get());
    return;
  }
  TG_CHECK(copy.shape() == param.shape() && copy.device() == param.data().device() &&
               IsFloating(copy.dtype()),
           name_, ".set_model_copy: the copy (", DTypeName(copy.dtype()), " ",
           ShapeToString(copy.shape()), " on ", copy.device().ToString(),
           ") must be a floating tensor of the parameter's shape ", ShapeToString(param.shape()),
           " on its device ", param.data().device().ToString());
  model_copies_[param.impl().get()] = copy;
}

bool Optimizer::has_state() const { return !state_.empty(); }

const StateDict* Optimizer::param_state(const Tensor& param) const {
  if (!param.defined()) return nullptr;
  auto it = state_.find(param.impl().get());
  return it == state_.end() ? nullptr : &it->second.state;
}

void Optimizer::step() {
  // Validate everything before changing anything.
  std::unordered_map<const VariableImpl*, std::pair<size_t, size_t>> seen;
  std::vector<std::vector<std::pair<Tensor, RawTensor>>> work(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string context = absl::StrCat(name_, ".step: ", GroupName(g), ": ");
    TG_CHECK(group.has_options(), context, "the group has no options");
    CheckValues(group.options(), context);  // the type and value ranges
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      CheckParam(p, group.options(), g, i);
      auto [it, inserted] = seen.emplace(p.impl().get(), std::make_pair(g, i));
      TG_CHECK(inserted, name_, ".step: ", ParamName(g, i), " is the same variable as ",
               ParamName(it->second.first, it->second.second),
               "; a parameter may appear only once");
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      const RawTensor& gd = grad.data();
      TG_CHECK(IsFloating(gd.dtype()), name_, ".step: the gradient of ", ParamName(g, i),
               " has dtype ", DTypeName(gd.dtype()), "; expected a floating dtype");
      TG_CHECK(gd.shape() == p.shape(), name_, ".step: the gradient of ", ParamName(g, i),
               " has shape ", ShapeToString(gd.shape()), " but the param has shape ",
               ShapeToString(p.shape()));
      TG_CHECK(gd.device() == p.data().device(), name_, ".step: the gradient of ", ParamName(g, i),
               " is on ", gd.device().ToString(), " but the param is on ",
               p.data().device().ToString());
      // State made before the parameter moved (an optimizer built before Module::to) would
      // meet the parameter in a kernel that takes one device: say so now, before any update.
      auto st = state_.find(p.impl().get());
      if (st != state_.end()) {
        for (const auto& [key, t] : st->second.state.tensors) {
          TG_CHECK(t.device() == p.data().device(), name_, ".step: the state '", key, "' of ",
                   ParamName(g, i), " is on ", t.device().ToString(), " but the param is on ",
                   p.data().device().ToString(),
                   "; make the optimizer after moving the model (Module::to), or load a "
                   "state_dict into one made there");
        }
      }
      work[g].emplace_back(p, gd);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (work[g].empty()) continue;
    std::vector<ParamUpdate> updates;
    updates.reserve(work[g].size());
    for (auto& [p, grad] : work[g]) {
      Entry& entry = state_.try_emplace(p.impl().get(), Entry{p, StateDict()}).first->second;
      ParamUpdate u;
      u.param = p;
      u.grad = grad;
      u.state = &entry.state;
      if (!model_copies_.empty()) {
        auto it = model_copies_.find(p.impl().get());
        if (it != model_copies_.end()) u.model_copy = it->second;
      }
      updates.push_back(std::move(u));
    }
    StepGroup(groups_[g], updates);
    for (const ParamUpdate& u : updates) {
      u.param.bump_version();
      if (u.model_copy.defined() && !u.model_copy_written) u.model_copy.copy_(u.param.data());
    }
  }
}

void ZeroGrads(const std::vector<Tensor>& params, bool set_to_none) {
  for (const Tensor& p : params) {
    if (!p.defined()) continue;
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
      continue;
    }
    // Like PyTorch's zero_grad(set_to_none=False): a grad with history (create_graph) is
    // detached first, then zeroed in place.
    if (!grad.is_leaf()) {
      grad = grad.detach();
      p.set_grad(grad);
    }
    grad.data().zero_();
    grad.bump_version();
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (const ParamGroup& group : groups_) ZeroGrads(group.params, set_to_none);
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const std::string gp = absl::StrCat("param_groups.", g, ".");
    for (const NamedOption& o : group.options().named()) sd.scalars[gp + o.name] = o.value;
    std::vector<int64_t> ids;
    for (const Tensor& p : group.params) {
      const int64_t id = index++;
      ids.push_back(id);
      const StateDict* st = param_state(p);
      if (st == nullptr) continue;
      const std::string sp = absl::StrCat("state.", id, ".");
      for (const auto& [key, t] : st->tensors) sd.tensors[sp + key] = t.clone();
      for (const auto& [key, v] : st->scalars) sd.scalars[sp + key] = v;
    }
    sd.tensors[gp + "params"] =
        RawTensor::FromVector<int64_t>(ids, {static_cast<int64_t>(ids.size())});
  }
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  const std::string op = name_ + ".load_state_dict: ";
  // Sort every key into its group or parameter.
  std::map<int64_t, std::set<std::string>> group_scalars;  // g -> option names
  std::set<int64_t> group_ids;
  std::map<int64_t, std::set<std::string>> state_tensors, state_scalars;  // id -> names
  auto classify = [&](const std::string& key, bool is_tensor) {
    int64_t index;
    std::string rest;
    const char* kind = is_tensor ? "tensor" : "scalar";
    if (StartsWith(key, "param_groups.")) {
      TG_CHECK(SplitIndexed(key.substr(13), &index, &rest), op, "unexpected ", kind, " '", key,
               "'");
      group_ids.insert(index);
      if (is_tensor) {
        TG_CHECK(rest == "params", op, "unexpected tensor '", key, "'");
      } else {
        group_scalars[index].insert(rest);
      }
    } else if (StartsWith(key, "state.")) {
      TG_CHECK(SplitIndexed(key.substr(6), &index, &rest), op, "unexpected ", kind, " '", key, "'");
      (is_tensor ? state_tensors : state_scalars)[index].insert(rest);
    } else {
      throw Error(absl::StrCat(op, "unexpected ", kind, " '", key, "'"));
    }
  };
  for (const auto& kv : sd.tensors) classify(kv.first, true);
  for (const auto& kv : sd.scalars) classify(kv.first, false);

  TG_CHECK(group_ids.size() == groups_.size(), op, "the state dict has ", group_ids.size(),
           " param groups, the optimizer has ", groups_.size());
  // Group options and the parameter numbering.
  std::vector<std::unique_ptr<OptimizerOptions>> new_options(groups_.size());
  std::map<int64_t, std::pair<size_t, size_t>> id_to_param;  // id -> (group, index)
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string gp = absl::StrCat("param_groups.", g, ".");
    TG_CHECK(group_ids.count(static_cast<int64_t>(g)) != 0, op, "param group ", g,
             " is missing from the state dict");
    TG_CHECK(sd.has_tensor(gp + "params"), op, "missing tensor '", gp, "params'");
    const RawTensor& ids = sd.tensor(gp + "params");
    TG_CHECK(ids.dtype() == kI64 && ids.dim() == 1, op, "'", gp,
             "params' must be a 1-D i64 tensor, got ", DTypeName(ids.dtype()), " ",
             ShapeToString(ids.shape()));
    TG_CHECK(static_cast<size_t>(ids.numel()) == groups_[g].params.size(), op, GroupName(g),
             " has ", ids.numel(), " params in the state dict, ", groups_[g].params.size(),
             " in the optimizer");
    const std::vector<int64_t> id_list = ids.to_vector<int64_t>();
    for (size_t i = 0; i < id_list.size(); ++i) {
      auto [it, inserted] = id_to_param.emplace(id_list[i], std::make_pair(g, i));
      TG_CHECK(inserted, op, "param id ", id_list[i], " appears twice in the param groups");
    }
    // Every name the group's options have, by the names state_dict wrote (the same names and
    // values as when groups held maps of names to doubles).
    const std::string context = absl::StrCat(op, GroupName(g), ": ");
    std::unique_ptr<OptimizerOptions> options = groups_[g].options().clone();
    const std::vector<NamedOption> names = options->named();
    std::set<std::string> known;
    for (const NamedOption& o : names) {
      TG_CHECK(sd.has_scalar(gp + o.name), op, "missing scalar '", gp, o.name, "'");
      known.insert(o.name);
    }
    for (const std::string& key : group_scalars[static_cast<int64_t>(g)]) {
      TG_CHECK(known.count(key) != 0, op, "unexpected scalar '", gp, key, "'");
    }
    for (const NamedOption& o : names) {
      const double v = sd.scalar(gp + o.name);
      TG_CHECK(std::isfinite(v), context, "option '", o.name, "' is ", v);
    }
    for (const NamedOption& o : names) options->set_named(o.name, sd.scalar(gp + o.name), context);
    CheckValues(*options, context);
    new_options[g] = std::move(options);
  }

  // Per-parameter state.
  std::set<int64_t> state_ids;
  for (const auto& kv : state_tensors) state_ids.insert(kv.first);
  for (const auto& kv : state_scalars) state_ids.insert(kv.first);
  std::unordered_map<const VariableImpl*, Entry> new_state;
  for (int64_t id : state_ids) {
    const std::string sp = absl::StrCat("state.", id, ".");
    auto where = id_to_param.find(id);
    TG_CHECK(where != id_to_param.end(), op, "state for param id ", id,
             " but no param has that id ('", sp, "...')");
    const auto [g, i] = where->second;
    const Tensor& p = groups_[g].params[i];
    CheckParam(p, *new_options[g], g, i);
    const StateSpec spec = ParamStateSpec(*new_options[g]);
    const DType want = StateDType(p.dtype());
    std::set<std::string> allowed_tensors(spec.tensors.begin(), spec.tensors.end());
    allowed_tensors.insert(spec.optional_tensors.begin(), spec.optional_tensors.end());
    for (const std::string& key : spec.tensors) {
      TG_CHECK(state_tensors[id].count(key) != 0, op, "missing tensor '", sp, key, "'");
    }
    for (const std::string& key : spec.scalars) {
      TG_CHECK(state_scalars[id].count(key) != 0, op, "missing scalar '", sp, key, "'");
    }
    Entry entry{p, StateDict()};
    for (const std::string& key : state_tensors[id]) {
      TG_CHECK(allowed_tensors.count(key) != 0, op, "unexpected tensor '", sp, key, "'");
      const RawTensor& t = sd.tensor(sp + key);
      TG_CHECK(t.shape() == p.shape(), op, "'", sp, key, "' has shape ", ShapeToString(t.shape()),
               " but ", ParamName(g, i), " has shape ", ShapeToString(p.shape()));
      TG_CHECK(t.dtype() == want, op, "'", sp, key, "' has dtype ", DTypeName(t.dtype()),
               ", expected ", DTypeName(want), " (the state dtype of a ", DTypeName(p.dtype()),
               " param)");
      // A NaN/inf moment never recovers (an inf second moment freezes its element for good).
      TG_CHECK(!AnyNonFinite({t}), op, "'", sp, key,
               "' holds a NaN or infinite value; the "
               "state of an optimizer must be finite");
      RawTensor copy = RawTensor::Empty(t.shape(), t.dtype(), p.data().device());
      copy.copy_(t);
      entry.state.tensors[key] = copy;
    }
    for (const std::string& key : state_scalars[id]) {
      const bool allowed =
          std::find(spec.scalars.begin(), spec.scalars.end(), key) != spec.scalars.end();
      TG_CHECK(allowed, op, "unexpected scalar '", sp, key, "'");
      const double v = sd.scalar(sp + key);
      TG_CHECK(v >= 0 && v <= 9007199254740992.0 && std::floor(v) == v, op, "'", sp, key, "' is ",
               v, "; expected a non-negative integer");
      entry.state.scalars[key] = v;
    }
    new_state.emplace(p.impl().get(), std::move(entry));
  }

  // Commit.
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options_ = std::move(new_options[g]);
  state_ = std::move(new_state);
}

}  // namespace tg::optim
