#include "autograd/variable.h"

#include <atomic>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
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

Tensor::Tensor(RawTensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  TG_CHECK(data.defined(), "Tensor: the data tensor is undefined");
  impl_->data = std::move(data);
  if (requires_grad) set_requires_grad(true);
}

void Tensor::ThrowUndefined(const char* what) {
  throw Error(absl::StrCat(what, ": the variable is undefined"));
}

const RawTensor& Tensor::data() const {
  CheckDefined("data");
  return impl_->data;
}

int64_t Tensor::ItemAsInteger(int64_t lo, uint64_t hi) const {
  const RawTensor& d = data();
  const double x = d.item();  // checks that there is one element
  int64_t v;
  if (IsFloating(d.dtype())) {
    // [-2^63, 2^63): the doubles that convert to int64 (truncating toward zero, as C++ does).
    TG_CHECK(std::isfinite(x) && x >= -0x1p63 && x < 0x1p63, "item: ", x,
             " is not a value of an integer type");
    v = static_cast<int64_t>(x);
  } else {
    v = d.to_vector<int64_t>()[0];  // exact, also beyond 2^53
  }
  TG_CHECK(v >= lo && (v < 0 || static_cast<uint64_t>(v) <= hi), "item: ", v,
           " does not fit the requested integer type [", lo, ", ", hi, "]");
  return v;
}

void Tensor::set_data(const RawTensor& data) const {
  CheckDefined("set_data");
  TG_CHECK(data.shape() == impl_->data.shape() && data.dtype() == impl_->data.dtype(),
           "set_data: new data ", DTypeName(data.dtype()), " ", ShapeToString(data.shape()),
           " differs from ", DTypeName(impl_->data.dtype()), " ",
           ShapeToString(impl_->data.shape()));
  impl_->data = data;
}

bool Tensor::requires_grad() const {
  RefreshViewGradFn();
  return impl_ != nullptr && (impl_->requires_grad || impl_->grad_fn != nullptr);
}

const Tensor& Tensor::set_requires_grad(bool requires_grad) const {
  CheckDefined("set_requires_grad");
  TG_CHECK(is_leaf(), "set_requires_grad: ", name().empty() ? "the variable" : name(),
           " is not a leaf; detach() it first");
  TG_CHECK(!requires_grad || IsFloating(impl_->data.dtype()),
           "set_requires_grad: only floating tensors can require grad, got ",
           DTypeName(impl_->data.dtype()));
  impl_->requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  RefreshViewGradFn();
  return impl_ == nullptr || impl_->grad_fn == nullptr;
}

const std::shared_ptr<Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<Node> kNone;
  RefreshViewGradFn();
  return impl_ ? impl_->grad_fn : kNone;
}

uint32_t Tensor::output_nr() const {
  RefreshViewGradFn();
  return impl_ ? impl_->output_nr : 0;
}

bool Tensor::is_view() const { return impl_ != nullptr && impl_->view != nullptr; }

Tensor Tensor::base() const { return is_view() ? impl_->view->base : Tensor(); }

// PyTorch's VariableHooks::grad_fn for views: the view function replayed on the base under grad
// mode (a chain of view nodes where PyTorch makes one AsStridedBackward; the gradients are the
// same). As in PyTorch's update_tensor_hooks_on_new_gradfn, a retain_grad() moves to the new
// node while tensor hooks stay on the old one (which is no longer in the view's history).
void Tensor::RefreshViewGradFn() const {
  if (impl_ == nullptr || impl_->view == nullptr) return;
  ViewInfo& view = *impl_->view;
  if (view.made_in_no_grad) return;
  if (impl_->grad_fn == nullptr && !view.base.requires_grad()) return;
  const uint64_t now = version();
  if (view.attr_version == now) return;
  view.attr_version = now;
  Tensor remade;
  {
    EnableGradGuard grad_on;  // also when reached from a backward or under NoGradGuard
    remade = view.fn(view.base);
  }
  if (remade.grad_fn() != nullptr) {
    RebaseHistory(*this, remade.grad_fn(), remade.output_nr());
  } else {
    if (impl_->retains_grad && impl_->grad_fn) impl_->grad_fn->ClearRetainGrad(impl_.get());
    impl_->grad_fn = nullptr;
    impl_->output_nr = 0;
  }
}

Tensor MakeView(Tensor out, const Tensor& input, ViewFn fn) {
  if (!out.data().shares_storage(input.data())) return out;  // e.g. a reshape that copied
  auto view = std::make_unique<ViewInfo>();
  const bool no_grad = !GradMode::is_enabled();
  if (const ViewInfo* outer = input.impl()->view.get()) {
    view->base = outer->base;
    view->fn = [first = outer->fn, then = std::move(fn)](const Tensor& base) {
      return then(first(base));
    };
    view->made_in_no_grad = outer->made_in_no_grad || no_grad;
    view->multi_output_error = outer->multi_output_error;
  } else {
    view->base = input;
    view->fn = std::move(fn);
    view->made_in_no_grad = no_grad;
  }
  view->attr_version = out.version();
  out.impl()->view = std::move(view);
  return out;
}

Tensor MakeMultiOutputView(Tensor out, const Tensor& input, const char* node_name, size_t index) {
  const std::string output = absl::StrCat("Output ", index, " of ", node_name, " is a view and ");
  const std::string rest =
      ". This view is the output of a function that returns multiple views. Such functions do "
      "not allow the output views to be modified inplace. You should replace the inplace "
      "operation by an out-of-place one.";
  const std::string indirect =
      absl::StrCat(output, "its base or another view of its base has been modified inplace", rest);
  // Remaking its grad_fn (after an in-place op on its base) throws, as PyTorch's view_func does.
  out = MakeView(std::move(out), input,
                 [indirect](const Tensor&) -> Tensor { throw Error(indirect); });
  if (out.is_view()) {
    out.impl()->view->multi_output_error = absl::StrCat(output, "is being modified inplace", rest);
  }
  return out;
}

Tensor Tensor::grad() const {
  CheckDefined("grad");
  return impl_->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  CheckDefined("set_grad");
  if (grad.defined()) {
    TG_CHECK(grad.shape() == shape(), "set_grad: gradient of shape ", ShapeToString(grad.shape()),
             " for a variable of shape ", ShapeToString(shape()));
  }
  impl_->grad = grad;
}

void Tensor::retain_grad() const {
  CheckDefined("retain_grad");
  RefreshViewGradFn();
  TG_CHECK(requires_grad(), "retain_grad: the variable does not require grad");
  if (is_leaf() || impl_->retains_grad) return;
  impl_->retains_grad = true;
  impl_->grad_fn->SetRetainGrad(impl_->output_nr, impl_);
}

bool Tensor::retains_grad() const { return impl_ != nullptr && impl_->retains_grad; }

Tensor Tensor::detach() const {
  CheckDefined("detach");
  return Tensor(impl_->data);
}

const std::string& Tensor::name() const {
  static const std::string kEmpty;
  return impl_ ? impl_->name : kEmpty;
}

const Tensor& Tensor::set_name(std::string name) const {
  CheckDefined("set_name");
  impl_->name = std::move(name);
  return *this;
}

std::shared_ptr<Node> Tensor::gradient_edge_node() const {
  if (impl_ == nullptr) return nullptr;
  RefreshViewGradFn();
  if (impl_->grad_fn) return impl_->grad_fn;
  if (!impl_->requires_grad) return nullptr;
  std::shared_ptr<Node> acc = impl_->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(impl_);
    impl_->grad_accumulator = acc;
  }
  return acc;
}

HookHandle Tensor::register_hook(TensorHook hook) const {
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

HookHandle Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
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

void Tensor::backward(const Tensor& grad, const BackwardOptions& options) const {
  Engine::Backward({*this}, {grad}, options);
}

Tensor MakeNonLeaf(RawTensor data, std::shared_ptr<Node> grad_fn, uint32_t output_nr) {
  auto impl = std::make_shared<VariableImpl>();
  impl->data = std::move(data);
  impl->grad_fn = std::move(grad_fn);
  impl->output_nr = output_nr;
  return Tensor(std::move(impl));
}

}  // namespace tg
