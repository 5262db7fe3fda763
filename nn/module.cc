#include "nn/module.h"

#include <algorithm>
#include <any>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/warning.h"
#include "optim/optimizer.h"
#include "tensor/class_name.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

struct Module::Hooks {
  uint64_t next_id = 0;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<std::pair<uint64_t, ForwardHook>> post;
  std::set<uint64_t> always_call;  // ids of forward hooks with always_call
  std::vector<std::pair<uint64_t, BackwardPreHook>> backward_pre;
  std::vector<std::pair<uint64_t, BackwardHook>> backward;
};

namespace {

// H is Module::Hooks (deduced, as the type is private to Module).
template <class H, class List>
HookHandle AddHook(const std::shared_ptr<H>& hooks, List* list,
                   typename List::value_type::second_type hook, bool prepend = false,
                   uint64_t* id_out = nullptr) {
  uint64_t id = hooks->next_id++;
  if (id_out != nullptr) *id_out = id;
  if (prepend) {
    list->emplace(list->begin(), id, std::move(hook));
  } else {
    list->emplace_back(id, std::move(hook));
  }
  std::weak_ptr<H> weak = hooks;
  return HookHandle([weak, list, id] {
    if (auto alive = weak.lock()) {
      list->erase(std::remove_if(list->begin(), list->end(),
                                 [id](const auto& entry) { return entry.first == id; }),
                  list->end());
    }
  });
}

std::string WithThousands(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// "tg::nn::LinearImpl" -> "Linear", "MyNet" -> "MyNet": the class's own name without a
// trailing "Impl" (libtorch's holder convention).
std::string ClassNameOf(const char* mangled) {
  std::string name = UnqualifiedClassName(mangled);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

// One call's module backward hooks (PyTorch's torch.utils.hooks.BackwardHook): the hooks
// registered at the call, and the grad_output captured at the output's identity node until the
// input's identity node hands it to the hooks.
struct BackwardHookState {
  Module* module;
  std::vector<BackwardPreHook> pre;
  std::vector<BackwardHook> hooks;
  bool input_requires_grad = false;
  std::optional<VariableList> grad_outputs;
};

// The output side: when the output's identity node runs (after the output's tensor hooks and
// the node's pre-hooks, where PyTorch runs it too), capture grad_output and run the pre-hooks;
// when the input needs no gradient, run the hooks there too. Returns the grad_output to pass on.
VariableList OutputSide(BackwardHookState& state, const VariableList& grad_output) {
  state.grad_outputs = grad_output;
  for (const BackwardPreHook& pre : state.pre) {
    VariableList replaced = pre(*state.module, *state.grad_outputs);
    if (replaced.empty()) continue;
    TG_CHECK(replaced.size() == state.grad_outputs->size(),
             "Backward pre hook returned an invalid number of grad_output, got ", replaced.size(),
             ", but expected ", state.grad_outputs->size());
    state.grad_outputs = std::move(replaced);
  }
  VariableList local = *state.grad_outputs;
  if (!state.input_requires_grad) {
    if (!state.hooks.empty()) {
      Warn(
          "Full backward hook is firing when gradients are computed with respect to module "
          "outputs since no inputs require gradients. See "
          "https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html"
          "#torch.nn.Module.register_full_backward_hook for more details.");
    }
    const VariableList grad_inputs(1);
    for (const BackwardHook& hook : state.hooks) {
      const VariableList res = hook(*state.module, grad_inputs, *state.grad_outputs);
      const bool none =
          std::all_of(res.begin(), res.end(), [](const Tensor& t) { return !t.defined(); });
      TG_CHECK(none,
               "Backward hook for Modules where no input requires gradient should always return "
               "None or None for all gradients.");
    }
    state.grad_outputs.reset();
  }
  return local;
}

// The input side: run the hooks with grad_input (PyTorch: a post-hook of the input's identity
// node) and pass on what they return.
VariableList InputSide(BackwardHookState& state, const VariableList& grad_input) {
  if (!state.grad_outputs.has_value()) return grad_input;  // no grad_output came: PyTorch skips
  VariableList res = grad_input;
  for (const BackwardHook& hook : state.hooks) {
    VariableList out = hook(*state.module, res, *state.grad_outputs);
    if (out.empty()) continue;
    TG_CHECK(out.size() == res.size(),
             "Backward hook returned an invalid number of grad_input, got ", out.size(),
             ", but expected ", res.size());
    res = std::move(out);
  }
  state.grad_outputs.reset();
  return res;
}

// The identity custom function both sides pass through ("BackwardHookFunctionBackward", as
// PyTorch's); gradients are not materialised, so the hooks see undefined ones where none flows.
struct BackwardHookFunction : Function<BackwardHookFunction> {
  static constexpr const char* kName = "BackwardHookFunction";
  static VariableList Forward(FunctionCtx& ctx, const VariableList& in,
                              std::shared_ptr<BackwardHookState> state, bool output_side) {
    ctx.set_materialize_grads(false);
    ctx.saved_data["state"] = std::move(state);
    ctx.saved_data["output_side"] = output_side;
    return {Tensor(in[0].data())};
  }
  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    auto state = std::any_cast<std::shared_ptr<BackwardHookState>>(ctx.saved_data.at("state"));
    return std::any_cast<bool>(ctx.saved_data.at("output_side")) ? OutputSide(*state, grads)
                                                                 : InputSide(*state, grads);
  }
};

}  // namespace

void ThrowEmptyHolder(const char* type) {
  throw Error(absl::StrCat("module holder of ", ClassNameOf(type),
                           " is empty (made from nullptr): assign it a module first, e.g. with "
                           "register_module"));
}

void Module::zero_grad(bool set_to_none) { optim::ZeroGrads(parameters(), set_to_none); }

Module::Module(std::string type_name, bool autocast_scope)
    : type_name_(std::move(type_name)), autocast_scope_(autocast_scope) {}

const std::string& Module::type_name() const {
  if (type_name_.empty()) type_name_ = ClassNameOf(typeid(*this).name());
  return type_name_;
}

Tensor Module::forward(const Tensor&) {
  throw Error(absl::StrCat(type_name(), ": this module has no single-input forward(); call its ",
                           "parts or its own methods"));
}

Tensor Module::operator()(const Tensor& input) {
  // Pre-hooks, forward and hooks are forward-pass code: a backward started in them (a tiled
  // loss's per-tile backward, an auxiliary loss back-propagated from a hook) is flagged, so the
  // post-backward epilogues keyed to the user's backward (amp, DDP, ZeRO) run once, after it.
  // A nested scope is a counter; inside a backward (checkpoint recomputation) the task's flag
  // is inherited from its parent task, not read from the scope.
  ForwardScope forward_scope;
  Tensor x = input;
  Tensor out;
  std::shared_ptr<BackwardHookState> backward;
  std::vector<uint64_t> called;  // forward hooks that ran (for always_call after a throw)
  try {
    if (hooks_ != nullptr) {
      auto pre = hooks_->pre;  // a hook may remove itself
      for (auto& [id, hook] : pre) {
        Tensor replaced = hook(*this, x);
        if (replaced.defined()) x = std::move(replaced);
      }
    }
    // Module backward hooks: the input through its identity node (PyTorch's setup_input_hook).
    if (hooks_ != nullptr && (!hooks_->backward_pre.empty() || !hooks_->backward.empty()) &&
        GradMode::is_enabled()) {
      backward = std::make_shared<BackwardHookState>();
      backward->module = this;
      for (const auto& [id, hook] : hooks_->backward_pre) backward->pre.push_back(hook);
      for (const auto& [id, hook] : hooks_->backward) backward->hooks.push_back(hook);
      backward->input_requires_grad = x.defined() && x.requires_grad();
      if (backward->input_requires_grad) {
        x = BackwardHookFunction::Apply({x}, backward, /*output_side=*/false)[0];
      }
    }
    if (autocast_scope_) {
      amp::AutocastModuleScope scope(type_name());
      out = forward(x);
    } else {
      out = forward(x);
    }
    if (hooks_ != nullptr) {
      auto post = hooks_->post;
      for (auto& [id, hook] : post) {
        called.push_back(id);
        Tensor replaced = hook(*this, x, out);
        if (replaced.defined()) out = std::move(replaced);
      }
    }
  } catch (...) {
    // PyTorch: the always_call hooks that did not run yet run now, with no output; an exception
    // they throw is dropped with a warning, the original one goes on.
    if (hooks_ != nullptr && !hooks_->always_call.empty()) {
      auto post = hooks_->post;
      for (auto& [id, hook] : post) {
        if (hooks_->always_call.count(id) == 0 ||
            std::find(called.begin(), called.end(), id) != called.end()) {
          continue;
        }
        try {
          hook(*this, x, Tensor());
        } catch (const std::exception& e) {
          Warn(
              absl::StrCat("module forward hook with ``always_call=True`` raised an exception "
                           "that was silenced as another error was raised in forward: ",
                           e.what()));
        }
      }
    }
    throw;
  }
  // The output through its identity node (PyTorch's setup_output_hook, after forward hooks).
  if (backward != nullptr && out.defined() && out.requires_grad()) {
    out = BackwardHookFunction::Apply({out}, backward, /*output_side=*/true)[0];
  }
  return out;
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  if (hooks_ == nullptr) hooks_ = std::make_shared<Hooks>();
  return AddHook(hooks_, &hooks_->pre, std::move(hook));
}

HookHandle Module::register_forward_hook(ForwardHook hook, const ForwardHookOptions& options) {
  if (hooks_ == nullptr) hooks_ = std::make_shared<Hooks>();
  uint64_t id = 0;
  HookHandle handle = AddHook(hooks_, &hooks_->post, std::move(hook), options.prepend, &id);
  if (options.always_call) hooks_->always_call.insert(id);
  return handle;
}

HookHandle Module::register_full_backward_pre_hook(BackwardPreHook hook) {
  if (hooks_ == nullptr) hooks_ = std::make_shared<Hooks>();
  return AddHook(hooks_, &hooks_->backward_pre, std::move(hook));
}

HookHandle Module::register_full_backward_hook(BackwardHook hook) {
  if (hooks_ == nullptr) hooks_ = std::make_shared<Hooks>();
  return AddHook(hooks_, &hooks_->backward, std::move(hook));
}

bool Module::has_forward_hooks() const {
  return hooks_ != nullptr && (!hooks_->pre.empty() || !hooks_->post.empty() ||
                               !hooks_->backward_pre.empty() || !hooks_->backward.empty());
}

// ---- Registration ----------------------------------------------------------------------------

void Module::CheckNewName(const std::string& name, const char* what) const {
  TG_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name(), ": ", what, " name '",
           name, "' must be non-empty and contain no '.'");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  TG_CHECK(!taken(parameters_) && !taken(buffers_) && !taken(children_), type_name(), ": ", what,
           " name '", name, "' is already registered");
}

Tensor Module::register_parameter(const std::string& name, RawTensor value, bool requires_grad) {
  CheckNewName(name, "parameter");
  TG_CHECK(value.defined(), type_name(), ": parameter '", name, "' is undefined");
  Tensor p(std::move(value), requires_grad);
  p.set_name(name);
  parameters_.emplace_back(name, p);
  return p;
}

void Module::register_buffer(const std::string& name, RawTensor value) {
  CheckNewName(name, "buffer");
  TG_CHECK(value.defined(), type_name(), ": buffer '", name, "' is undefined");
  buffers_.emplace_back(name, std::move(value));
}

void Module::AddChild(const std::string& name, std::shared_ptr<Module> module) {
  CheckNewName(name, "module");
  TG_CHECK(module != nullptr, type_name(), ": module '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

// ---- The tree --------------------------------------------------------------------------------

void Module::CollectParameters(const std::string& prefix,
                               std::vector<std::pair<std::string, Tensor>>* out) const {
  for (const auto& [name, p] : parameters_) out->emplace_back(prefix + name, p);
  for (const auto& [name, child] : children_) child->CollectParameters(prefix + name + ".", out);
}

void Module::CollectBuffers(const std::string& prefix,
                            std::vector<std::pair<std::string, RawTensor>>* out) const {
  for (const auto& [name, b] : buffers_) out->emplace_back(prefix + name, b);
  for (const auto& [name, child] : children_) child->CollectBuffers(prefix + name + ".", out);
}

void Module::CollectModules(const std::string& prefix,
                            std::vector<std::pair<std::string, std::shared_ptr<Module>>>* out) {
  for (const auto& [name, child] : children_) {
    std::string full = prefix.empty() ? name : prefix + "." + name;
    out->emplace_back(full, child);
    child->CollectModules(full, out);
  }
}

OrderedDict<std::string, Tensor> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> all;
  if (!recurse) return OrderedDict<std::string, Tensor>(parameters_);
  CollectParameters("", &all);
  // A module reachable twice (shared) lists its parameters once, under the first name.
  std::vector<std::pair<std::string, Tensor>> unique;
  std::set<const VariableImpl*> seen;
  for (auto& entry : all) {
    if (seen.insert(entry.second.impl().get()).second) unique.push_back(std::move(entry));
  }
  return OrderedDict<std::string, Tensor>(std::move(unique));
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(std::move(entry.second));
  return out;
}

OrderedDict<std::string, RawTensor> Module::named_buffers(bool recurse) const {
  if (!recurse) return OrderedDict<std::string, RawTensor>(buffers_);
  std::vector<std::pair<std::string, RawTensor>> out;
  CollectBuffers("", &out);
  return OrderedDict<std::string, RawTensor>(std::move(out));
}

OrderedDict<std::string, std::shared_ptr<Module>> Module::named_children() const {
  return OrderedDict<std::string, std::shared_ptr<Module>>(children_);
}

OrderedDict<std::string, std::shared_ptr<Module>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  out.emplace_back("", shared_from_this());
  CollectModules("", &out);
  return OrderedDict<std::string, std::shared_ptr<Module>>(std::move(out));
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

const Tensor& Module::parameter(const std::string& name) const {
  for (const auto& entry : parameters_) {
    if (entry.first == name) return entry.second;
  }
  throw Error(absl::StrCat(type_name(), ": no parameter '", name, "'"));
}

const RawTensor& Module::buffer(const std::string& name) const {
  for (const auto& entry : buffers_) {
    if (entry.first == name) return entry.second;
  }
  throw Error(absl::StrCat(type_name(), ": no buffer '", name, "'"));
}

// ---- Modes and conversion --------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::ConvertTensors(const std::function<RawTensor(const RawTensor&)>& convert) {
  // Every tensor is converted first and the results are committed only when all conversions
  // succeeded: an error halfway (out of device memory, a non-leaf parameter) leaves the whole
  // module as it was, never half moved. The new tensors exist next to the old ones until the
  // commit (on the target device that is the model's final size; to(dtype) on one device holds
  // both copies for a moment).
  struct NewParam {
    VariableImpl* impl;
    RawTensor data;
    RawTensor grad;  // undefined: the parameter has no gradient
  };
  std::vector<NewParam> params;
  std::vector<std::pair<RawTensor*, RawTensor>> buffers;
  std::set<const VariableImpl*> seen_params;  // a parameter shared by two modules: once
  std::set<const RawTensor*> seen_buffers;    // a module reachable twice: its buffers once
  std::function<void(Module&)> collect = [&](Module& m) {
    for (auto& [name, p] : m.parameters_) {
      VariableImpl& impl = *p.impl();
      if (!seen_params.insert(&impl).second) continue;
      TG_CHECK(impl.grad_fn == nullptr, m.type_name(), ": parameter '", name, "' is not a leaf");
      RawTensor converted = convert(impl.data);
      if (converted.shares_storage(impl.data) && converted.dtype() == impl.data.dtype()) continue;
      RawTensor grad = impl.grad.defined() ? convert(impl.grad.data()) : RawTensor();
      params.push_back({&impl, std::move(converted), std::move(grad)});
    }
    for (auto& [name, b] : m.buffers_) {
      if (seen_buffers.insert(&b).second) buffers.emplace_back(&b, convert(b));
    }
    for (auto& [name, child] : m.children_) collect(*child);
  };
  collect(*this);
  for (NewParam& np : params) {
    np.impl->data = std::move(np.data);
    if (np.grad.defined()) np.impl->grad = Tensor(std::move(np.grad));
    // As PyTorch's set_data when the type changes: a graph recorded before keeps its old
    // accumulator (whose metadata says the old dtype and device); new graphs get a fresh one.
    // The leaf's hooks live on the leaf, not on the accumulator, so none is lost.
    np.impl->grad_accumulator.reset();
  }
  for (auto& [slot, t] : buffers) *slot = std::move(t);
}

void Module::to(DType dtype) {
  TG_CHECK(IsFloating(dtype), type_name(), ".to(", DTypeName(dtype),
           "): the target must be a floating dtype");
  ConvertTensors([dtype](const RawTensor& t) {
    return IsFloating(t.dtype()) && t.dtype() != dtype ? t.to(dtype) : t;
  });
}

void Module::to(Device device) {
  // Fail before anything moves: a half-moved model would only fail later, inside an op.
  if (!device.is_cpu()) {
    try {
      GetDeviceBackend(device.type)->allocator(device.index);
    } catch (const Error& e) {
      throw Error(absl::StrCat(type_name(), ".to(", device.ToString(), "): ", e.what()));
    }
  }
  ConvertTensors([device](const RawTensor& t) { return t.to(device); });
}

// ---- State -----------------------------------------------------------------------------------

StateDict Module::state_dict() const {
  StateDict sd;
  for (const auto& [name, p] : named_parameters()) sd.tensors[name] = p.data();
  for (const auto& [name, b] : named_buffers()) sd.tensors[name] = b;
  return sd;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  std::map<std::string, RawTensor> targets;  // destination tensors (share storage with the module)
  for (const auto& [name, p] : named_parameters()) targets[name] = p.data();
  for (const auto& [name, b] : named_buffers()) targets[name] = b;

  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, t] : targets) {
    auto it = state.tensors.find(name);
    if (it == state.tensors.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != t.shape()) {
      mismatched.push_back(absl::StrCat(name, ": checkpoint ", ShapeToString(it->second.shape()),
                                        " vs model ", ShapeToString(t.shape())));
    }
  }
  for (const auto& [name, t] : state.tensors) {
    if (targets.count(name) == 0) unexpected.push_back(name);
  }
  std::vector<std::string> problems;
  if (strict && !missing.empty()) {
    problems.push_back(absl::StrCat("missing keys: ", absl::StrJoin(missing, ", ")));
  }
  if (strict && !unexpected.empty()) {
    problems.push_back(absl::StrCat("unexpected keys: ", absl::StrJoin(unexpected, ", ")));
  }
  if (!mismatched.empty()) {
    problems.push_back(absl::StrCat("shape mismatch: ", absl::StrJoin(mismatched, "; ")));
  }
  TG_CHECK(problems.empty(), "load_state_dict(", type_name(), "): ", absl::StrJoin(problems, "; "));

  NoGradGuard no_grad;
  for (auto& [name, t] : targets) {
    auto it = state.tensors.find(name);
    if (it != state.tensors.end() && !it->second.shares_storage(t)) t.copy_(it->second);
  }
}

// ---- Summary ---------------------------------------------------------------------------------

void Module::AppendString(const std::string& name, int indent, std::string* out) const {
  std::string pad(indent, ' ');
  absl::StrAppend(out, pad, name.empty() ? "" : absl::StrCat("(", name, "): "), type_name(), "(",
                  extra_repr());
  int64_t params = num_parameters();
  std::string count = params > 0 ? absl::StrCat("  # ", WithThousands(params), " params") : "";
  if (children_.empty()) {
    absl::StrAppend(out, ")", count, "\n");
    return;
  }
  absl::StrAppend(out, count, "\n");
  for (const auto& [child_name, child] : children_) {
    child->AppendString(child_name, indent + 2, out);
  }
  absl::StrAppend(out, pad, ")\n");
}

std::string Module::to_string() const {
  std::string out;
  AppendString("", 0, &out);
  return out;
}

}  // namespace nn
}  // namespace tg
