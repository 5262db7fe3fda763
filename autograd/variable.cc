#include "autograd/variable.h"

#include <atomic>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "tensor/error.h"

namespace tg {
namespace {

uint64_t NextHookId() {
  static std::atomic<uint64_t> next{0};
  return ++next;
}

// A handle that erases entry `id` from the hook list `member` of the variable, if it still lives.
template <typename List>
HookHandle RemoverFor(const std::shared_ptr<VariableImpl>& impl, List VariableImpl::*member,
                      uint64_t id) {
  std::weak_ptr<VariableImpl> weak = impl;
  return HookHandle([weak, member, id] {
    if (auto locked = weak.lock()) {
      auto& hooks = (*locked).*member;
      for (auto it = hooks.begin(); it != hooks.end(); ++it) {
        if (it->first == id) {
          hooks.erase(it);
          break;
        }
      }
    }
  });
}

}  // namespace

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  TG_CHECK(data.defined(), "Variable: the data tensor is undefined");
  impl_->data = std::move(data);
  if (requires_grad) set_requires_grad(true);
}

void Variable::ThrowUndefined(const char* what) {
  throw Error(absl::StrCat(what, ": the variable is undefined"));
}

const Tensor& Variable::data() const {
  CheckDefined("data");
  return impl_->data;
}

void Variable::set_data(const Tensor& data) const {
  CheckDefined("set_data");
  TG_CHECK(data.shape() == impl_->data.shape() && data.dtype() == impl_->data.dtype(),
           "set_data: new data ", DTypeName(data.dtype()), " ", ShapeToString(data.shape()),
           " differs from ", DTypeName(impl_->data.dtype()), " ",
           ShapeToString(impl_->data.shape()));
  impl_->data = data;
}

bool Variable::requires_grad() const {
  return impl_ != nullptr && (impl_->requires_grad || impl_->grad_fn != nullptr);
}

const Variable& Variable::set_requires_grad(bool requires_grad) const {
  CheckDefined("set_requires_grad");
  TG_CHECK(is_leaf(), "set_requires_grad: ", name().empty() ? "the variable" : name(),
           " is not a leaf; detach() it first");
  TG_CHECK(!requires_grad || IsFloating(impl_->data.dtype()),
           "set_requires_grad: only floating tensors can require grad, got ",
           DTypeName(impl_->data.dtype()));
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Variable::is_leaf() const { return impl_ == nullptr || impl_->grad_fn == nullptr; }

const std::shared_ptr<Node>& Variable::grad_fn() const {
  static const std::shared_ptr<Node> kNone;
  return impl_ ? impl_->grad_fn : kNone;
}

uint32_t Variable::output_nr() const { return impl_ ? impl_->output_nr : 0; }

Variable Variable::grad() const {
  CheckDefined("grad");
  return impl_->grad;
}

void Variable::set_grad(const Variable& grad) const {
  CheckDefined("set_grad");
  if (grad.defined()) {
    TG_CHECK(grad.shape() == shape(), "set_grad: gradient of shape ", ShapeToString(grad.shape()),
             " for a variable of shape ", ShapeToString(shape()));
  }
  impl_->grad = grad;
}

void Variable::retain_grad() const {
  CheckDefined("retain_grad");
  TG_CHECK(requires_grad(), "retain_grad: the variable does not require grad");
  if (is_leaf() || impl_->retains_grad) return;
  impl_->retains_grad = true;
  impl_->grad_fn->SetRetainGrad(impl_->output_nr, impl_);
}

bool Variable::retains_grad() const { return impl_ != nullptr && impl_->retains_grad; }

Variable Variable::detach() const {
  CheckDefined("detach");
  return Variable(impl_->data);
}

const std::string& Variable::name() const {
  static const std::string kEmpty;
  return impl_ ? impl_->name : kEmpty;
}

const Variable& Variable::set_name(std::string name) const {
  CheckDefined("set_name");
  impl_->name = std::move(name);
  return *this;
}

std::shared_ptr<Node> Variable::gradient_edge_node() const {
  if (impl_ == nullptr) return nullptr;
  if (impl_->grad_fn) return impl_->grad_fn;
  if (!impl_->requires_grad) return nullptr;
  std::shared_ptr<Node> acc = impl_->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(impl_);
    impl_->grad_accumulator = acc;
  }
  return acc;
}

HookHandle Variable::register_hook(TensorHook hook) const {
  CheckDefined("register_hook");
  TG_CHECK(requires_grad(),
           "register_hook: cannot register a hook on a variable that does not "
           "require grad");
  if (!is_leaf()) return impl_->grad_fn->RegisterTensorHook(impl_->output_nr, std::move(hook));
  // A leaf keeps its tensor hooks itself (its AccumulateGrad node runs them), so hooks
  // registered before any graph exists survive without keeping that node alive.
  const uint64_t id = NextHookId();
  impl_->tensor_hooks.emplace_back(id, std::move(hook));
  return RemoverFor(impl_, &VariableImpl::tensor_hooks, id);
}

HookHandle Variable::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  CheckDefined("register_post_accumulate_grad_hook");
  TG_CHECK(is_leaf(),
           "register_post_accumulate_grad_hook: post-accumulate-grad hooks can only "
           "be registered on leaf variables; ",
           name().empty() ? "this one" : name(), " has grad_fn ", impl_->grad_fn->name());
  TG_CHECK(requires_grad(), "register_post_accumulate_grad_hook: the leaf does not require grad");
  const uint64_t id = NextHookId();
  impl_->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return RemoverFor(impl_, &VariableImpl::post_accumulate_hooks, id);
}

void Variable::backward(const Variable& grad, const BackwardOptions& options) const {
  Engine::Backward({*this}, {grad}, options);
}

Variable MakeNonLeaf(Tensor data, std::shared_ptr<Node> grad_fn, uint32_t output_nr) {
  auto impl = std::make_shared<VariableImpl>();
  impl->data = std::move(data);
  impl->grad_fn = std::move(grad_fn);
  impl->output_nr = output_nr;
  return Variable(std::move(impl));
}

}  // namespace tg
