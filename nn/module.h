// Module: the unit models are written in. A module registers its parameters, buffers and child
// modules by name in its constructor and computes in forward(); names nest with dots
// ("blocks.0.attn.qkv.weight"), so parameters(), state_dict() and to() reach the whole tree.
// As libtorch's C++ frontend, a model is a class `XImpl` with a holder `X` (TG_MODULE below):
//
//   struct TwoLayerImpl : tg::nn::Module {
//     TwoLayerImpl() {
//       fc1 = register_module("fc1", tg::nn::Linear(784, 128));
//       fc2 = register_module("fc2", tg::nn::Linear(128, 10));
//     }
//     tg::Tensor forward(const tg::Tensor& x) override { return fc2(tg::relu(fc1(x))); }
//     tg::nn::Linear fc1{nullptr}, fc2{nullptr};
//   };
//   TG_MODULE(TwoLayer);   // TwoLayer net; net(x); net->parameters()
//
// Call a module with operator() (or its holder's), not forward(): operator() runs the forward
// pre-hooks, forward(), then the forward hooks, and (for layers that opt in, see
// Options::autocast_scope) enters the autocast module scope that implements amp's
// lower-precision-safe module list. All of it runs inside a tg::ForwardScope (autograd/engine.h): a
// backward started by the forward or a hook is flagged as issued in forward, so the post-backward
// epilogues of amp, DDP and ZeRO wait for the user's backward (the gradients it accumulates are
// kept and included there).
#ifndef TAPEGRAD_NN_MODULE_H_
#define TAPEGRAD_NN_MODULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "nn/ordered_dict.h"
#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg {
namespace nn {

class Module;

// libtorch's module holders (torch::nn::ModuleHolder, TORCH_MODULE): `tg::nn::Linear` is a
// shared_ptr to a `tg::nn::LinearImpl` with the module's constructors, empty when made from
// nullptr, dereferenced with -> and called with (). One Tensor goes through Module::operator()
// (hooks, autocast scope) when the module overrides forward(const Tensor&); any other arguments
// (or a forward of its own signature) go to Impl::forward directly, as in libtorch.
//
//   struct NetImpl : tg::nn::Module {
//     NetImpl() { fc = register_module("fc", tg::nn::Linear(784, 10)); }
//     tg::Tensor forward(tg::Tensor x) { return fc(x); }
//     tg::nn::Linear fc{nullptr};
//   };
//   TG_MODULE(Net);   // Net net; net(x); net->parameters()
struct ModuleHolderTag {};

template <typename Impl, typename = void>
struct OverridesSingleForward : std::false_type {};
template <typename Impl>
struct OverridesSingleForward<
    Impl, std::void_t<decltype(static_cast<Tensor (Impl::*)(const Tensor&)>(&Impl::forward))>>
    : std::true_type {};

[[noreturn]] void ThrowEmptyHolder(const char* type);

// Whether Args is one holder of type Holder (or derived from it): a copy of the holder, not the
// argument of a new module (Sequential(seq) copies the handle, as in libtorch).
template <typename Holder, typename... Args>
struct IsSelfCopy : std::false_type {};
template <typename Holder, typename Arg>
struct IsSelfCopy<Holder, Arg> : std::is_base_of<Holder, std::decay_t<Arg>> {};

template <typename Impl>
class ModuleHolder : public ModuleHolderTag {
 public:
  using ContainedType = Impl;
  ModuleHolder(std::nullptr_t) {}  // NOLINT: `tg::nn::Linear fc{nullptr};`
  ModuleHolder(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}  // NOLINT
  // A new module: ModuleHolder(784, 10) holds std::make_shared<Impl>(784, 10).
  template <typename... Args,
            typename = std::enable_if_t<std::is_constructible_v<Impl, Args&&...> &&
                                        !IsSelfCopy<ModuleHolder, Args...>::value>>
  explicit ModuleHolder(Args&&... args)
      : impl_(std::make_shared<Impl>(std::forward<Args>(args)...)) {}

  Impl* get() const {
    if (impl_ == nullptr) ThrowEmptyHolder(typeid(Impl).name());
    return impl_.get();
  }
  Impl* operator->() const { return get(); }
  Impl& operator*() const { return *get(); }
  const std::shared_ptr<Impl>& ptr() const { return impl_; }
  bool is_empty() const { return impl_ == nullptr; }
  explicit operator bool() const { return impl_ != nullptr; }
  operator std::shared_ptr<Module>() const { return impl_; }  // NOLINT: for containers

  template <typename... Args>
  decltype(auto) operator()(Args&&... args) const {
    if constexpr (sizeof...(Args) == 1 && OverridesSingleForward<Impl>::value &&
                  (std::is_convertible_v<Args, const Tensor&> && ...)) {
      return (*get())(std::forward<Args>(args)...);
    } else {
      return get()->forward(std::forward<Args>(args)...);
    }
  }

 private:
  std::shared_ptr<Impl> impl_;
};

// Declares the holder `Name` of `Name##Impl` (libtorch's TORCH_MODULE).
#define TG_MODULE(Name)                                     \
  class Name : public ::tg::nn::ModuleHolder<Name##Impl> {  \
   public:                                                  \
    using ::tg::nn::ModuleHolder<Name##Impl>::ModuleHolder; \
    using Impl = Name##Impl;                                \
  }

// A pre-hook sees the input and may return a replacement (an undefined return keeps it); a
// forward hook sees input and output and may return a replacement output. PyTorch's order:
// pre-hooks in registration order, forward, hooks in registration order.
using ForwardPreHook = std::function<Tensor(Module& module, const Tensor& input)>;
using ForwardHook =
    std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
// PyTorch's register_forward_hook(prepend=, always_call=): prepend puts the hook before those
// already registered; always_call runs it even when forward (or an earlier forward hook) throws,
// with an undefined output, before the exception goes on (an exception of the hook itself is
// then dropped with a warning, as PyTorch silences it).
struct ForwardHookOptions {
  bool prepend = false;
  bool always_call = false;
};
// Module backward hooks (PyTorch's register_full_backward_pre_hook / register_full_backward_hook):
// the module's input and output pass through identity nodes ("BackwardHookFunctionBackward"),
// so the hooks see the gradients with respect to the module's output (grad_output) and input
// (grad_input), one entry each (tapegrad modules take one tensor), undefined where none flows.
// A pre-hook may return a replacement grad_output and a hook a replacement grad_input (an empty
// list keeps them; a list of another length throws PyTorch's "Backward pre hook returned an
// invalid number of grad_output, got 2, but expected 1" / "Backward hook returned an invalid
// number of grad_input, ..."). When the input does not require grad, the hooks run as soon as
// grad_output is known, with an undefined grad_input, must not return a gradient, and PyTorch's
// warning "Full backward hook is firing when gradients are computed with respect to module
// outputs since no inputs require gradients. ..." is given. The hooks registered when the
// module is called are the ones that run for that call; the module must outlive its backward.
using BackwardPreHook =
    std::function<VariableList(Module& module, const VariableList& grad_output)>;
using BackwardHook = std::function<VariableList(Module& module, const VariableList& grad_input,
                                                const VariableList& grad_output)>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  // `type_name` names the class in to_string(), errors and amp's lower-precision-safe module list.
  // `autocast_scope`: a layer that computes itself (Linear, Conv2d, CausalSelfAttention) enters
  // amp::AutocastModuleScope(type_name) in operator(), so under autocast its matmuls run in low
  // precision only if its type is in the guard's safe list. Containers and models leave it off
  // and are transparent, as in PyTorch (which has no module list), so a user's model class needs
  // no entry in the list.
  explicit Module(std::string type_name, bool autocast_scope = false);
  // libtorch's default: the type name is the class's own (demangled, without namespaces and
  // without a trailing "Impl").
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The default throws: a module without a single-input forward (ModuleList) is
  // used through its parts.
  virtual Tensor forward(const Tensor& input);
  // Hooks + forward (see the file comment).
  Tensor operator()(const Tensor& input);

  const std::string& type_name() const;
  const std::string& name() const { return type_name(); }  // libtorch's name()

  // ---- The tree ----------------------------------------------------------------------------
  // Own parameters, buffers and children in registration order; recurse = false for own only.
  std::vector<Tensor> parameters(bool recurse = true) const;
  // As libtorch's, named_* return an OrderedDict (nn/ordered_dict.h: items with key()/value()
  // that are also std::pairs, looked up by position or by name).
  OrderedDict<std::string, Tensor> named_parameters(bool recurse = true) const;
  OrderedDict<std::string, RawTensor> named_buffers(bool recurse = true) const;
  OrderedDict<std::string, std::shared_ptr<Module>> named_children() const;
  // This module (name "") and every descendant, depth first in registration order.
  OrderedDict<std::string, std::shared_ptr<Module>> named_modules();
  // Every parameter's gradient set to undefined (set_to_none) or zeroed, as libtorch's
  // Module::zero_grad (optim/optimizer.h: ZeroGrads).
  void zero_grad(bool set_to_none = true);
  // Number of parameter elements (shared parameters counted once).
  int64_t num_parameters() const;

  // Own parameter / buffer / child by name; throws tg::Error naming the module and the key.
  const Tensor& parameter(const std::string& name) const;
  const RawTensor& buffer(const std::string& name) const;

  // ---- Modes and conversion ----------------------------------------------------------------
  // Sets training mode on the whole tree (dropout is active only in training).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Converts every floating parameter and buffer (and existing gradients) to `dtype`, in place
  // on the same Tensors, so handles held elsewhere stay valid. Integer buffers are kept.
  void to(DType dtype);
  // Moves every parameter, buffer and existing gradient to `device` (copies; dtypes kept), in
  // place on the same Tensors like to(dtype): an optimizer built afterwards sees the device
  // tensors. Models are built on the CPU (initialisation draws from the host generator, so a
  // model has the same weights on every device) and then moved. Throws tg::Error
  // "<Type>.to(cuda:1): ..." before changing anything when the device cannot be used (no CUDA
  // backend linked, no GPU, no such device). An optimizer made before the move still holds
  // state on the old device: make it afterwards.
  void to(Device device);

  // ---- State -------------------------------------------------------------------------------
  // Parameters and buffers under their dotted names (tensors share storage with the module).
  StateDict state_dict() const;
  // Copies values into the existing parameters/buffers (converting dtype as copy_ does).
  // strict: throws one tg::Error listing every missing key, unexpected key and shape mismatch
  // before changing anything; non-strict: loads the keys that match, still rejecting shape
  // mismatches.
  void load_state_dict(const StateDict& state, bool strict = true);

  // ---- Hooks -------------------------------------------------------------------------------
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook, const ForwardHookOptions& options = {});
  HookHandle register_full_backward_pre_hook(BackwardPreHook hook);
  HookHandle register_full_backward_hook(BackwardHook hook);
  // Whether any hook that operator() runs is registered (forward pre-hooks and hooks, module
  // backward hooks): a container may then not fuse this module's output with the next op.
  bool has_forward_hooks() const;

  // A readable summary of the tree with each module's parameter count, e.g.
  //   Sequential(  # 101,770 params
  //     (0): Flatten()
  //     (1): Linear(in=784, out=128, bias=true)  # 100,480 params
  //     ...
  //   )
  std::string to_string() const;
  // One line describing this module's own configuration ("in=784, out=128, bias=true").
  virtual std::string extra_repr() const { return ""; }

 protected:
  // Registers a leaf parameter `name` holding `value` (requires grad); returns the Tensor.
  Tensor register_parameter(const std::string& name, RawTensor value, bool requires_grad = true);
  void register_buffer(const std::string& name, RawTensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    AddChild(name, module);
    return module;
  }
  // The same for a module holder (libtorch's register_module("fc", tg::nn::Linear(3, 4))).
  template <class H, typename = std::enable_if_t<std::is_base_of_v<ModuleHolderTag, H>>>
  H register_module(const std::string& name, H holder) {
    AddChild(name, holder.ptr());
    return holder;
  }

 private:
  struct Hooks;
  void CheckNewName(const std::string& name, const char* what) const;
  void AddChild(const std::string& name, std::shared_ptr<Module> module);
  void CollectParameters(const std::string& prefix,
                         std::vector<std::pair<std::string, Tensor>>* out) const;
  void CollectBuffers(const std::string& prefix,
                      std::vector<std::pair<std::string, RawTensor>>* out) const;
  void CollectModules(const std::string& prefix,
                      std::vector<std::pair<std::string, std::shared_ptr<Module>>>* out);
  void AppendString(const std::string& name, int indent, std::string* out) const;
  void ConvertTensors(const std::function<RawTensor(const RawTensor&)>& convert);

  mutable std::string type_name_;  // computed from the class by type_name() when empty
  bool autocast_scope_ = false;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, RawTensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<Hooks> hooks_;
};

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_MODULE_H_
