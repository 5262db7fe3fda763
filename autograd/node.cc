#include "autograd/node.h"

#include <algorithm>
#include <atomic>

#include "absl/debugging/stacktrace.h"
#include "absl/debugging/symbolize.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/trace.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg {
namespace {

// Sequence numbers only order nodes created on one thread (as in PyTorch), so a thread-local
// counter is enough and costs no atomic.
thread_local uint64_t sequence_counter = 0;

std::string CaptureCreationTrace() {
  void* frames[24];
  const int depth = absl::GetStackTrace(frames, 24, /*skip_count=*/2);
  std::string trace;
  for (int i = 0; i < depth; ++i) {
    char symbol[512];
    const char* name = absl::Symbolize(frames[i], symbol, sizeof(symbol)) ? symbol : "(unknown)";
    absl::StrAppend(&trace, "\n    #", i, " ", name);
  }
  return trace;
}

}  // namespace

Node::Node() : Node(sequence_counter++) {}

uint64_t Node::next_sequence_nr() { return sequence_counter; }

Node::Node(uint64_t sequence_nr) : sequence_nr_(sequence_nr) {
  if (AnomalyMode::is_enabled()) extras().creation_trace = CaptureCreationTrace();
}

Node::~Node() {
  // Destroying a long graph through nested destructors would overflow the stack (a chain of
  // 10^5 nodes), so nodes owned only by this one are taken apart iteratively: release what
  // they saved, move their edges onto a local stack, and let them die with nothing attached.
  std::vector<std::shared_ptr<Node>> stack;
  auto take_edges = [&stack](EdgeList& edges) {
    for (Edge& e : edges) {
      if (e.fn && e.fn.use_count() == 1) stack.push_back(std::move(e.fn));
    }
  };
  take_edges(next_edges_);
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    node->ReleaseSaved();
    take_edges(node->next_edges_);
  }
}

Node::Extras& Node::extras() {
  if (extras_ == nullptr) extras_ = std::make_unique<Extras>();
  return *extras_;
}

const std::string& Node::creation_trace() const {
  static const std::string kNone;
  return extras_ ? extras_->creation_trace : kNone;
}

uint32_t Node::AddInputMetadata(const RawTensor& t) {
  input_metadata_.push_back(InputMetadata{t.shape(), t.dtype(), t.device()});
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

namespace {

// Erases the entry with `id` from `list` (a vector of structs with an `id` member).
template <typename List>
void EraseId(List& list, uint64_t id) {
  list.erase(std::remove_if(list.begin(), list.end(), [id](const auto& e) { return e.id == id; }),
             list.end());
}

}  // namespace

HookHandle Node::RegisterPreHook(NodePreHook hook) {
  const uint64_t id = ++extras().next_hook_id;
  extras().pre_hooks.push_back({id, std::move(hook)});
  std::weak_ptr<Node> weak = weak_from_this();
  return HookHandle([weak, id] {
    if (auto n = weak.lock()) EraseId(n->extras_->pre_hooks, id);
  });
}

HookHandle Node::RegisterPostHook(NodePostHook hook) {
  const uint64_t id = ++extras().next_hook_id;
  extras().post_hooks.push_back({id, std::move(hook)});
  std::weak_ptr<Node> weak = weak_from_this();
  return HookHandle([weak, id] {
    if (auto n = weak.lock()) EraseId(n->extras_->post_hooks, id);
  });
}

HookHandle Node::RegisterTensorHook(uint32_t output_nr, TensorHook hook) {
  const uint64_t id = ++extras().next_hook_id;
  auto& groups = extras().tensor_hooks;
  auto group = std::find_if(groups.begin(), groups.end(),
                            [output_nr](const auto& g) { return g.output_nr == output_nr; });
  if (group == groups.end()) group = groups.insert(groups.end(), TensorHookGroup{output_nr, {}});
  group->hooks.push_back({id, std::move(hook)});
  std::weak_ptr<Node> weak = weak_from_this();
  return HookHandle([weak, id] {
    if (auto n = weak.lock()) {
      for (auto& g : n->extras_->tensor_hooks) EraseId(g.hooks, id);
    }
  });
}

void Node::SetRetainGrad(uint32_t output_nr, const std::weak_ptr<VariableImpl>& var) {
  extras().retain_grad.emplace_back(output_nr, var);
}

void Node::ClearRetainGrad(const VariableImpl* var) {
  if (extras_ == nullptr) return;
  auto& list = extras_->retain_grad;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [var](const auto& e) { return e.second.lock().get() == var; }),
             list.end());
}

namespace {

// Runs one tensor hook on `grad`: a defined result replaces it (and must keep its shape). As
// in PyTorch, the hook also runs when the gradient is undefined (no gradient reached it; a
// multi-grad hook counts on that), and then may not return one.
void ApplyTensorHook(const TensorHook& hook, Tensor& grad, const std::string& where) {
  Tensor result = hook(grad);
  if (!result.defined()) return;
  TG_CHECK(grad.defined(), "hook on ", where,
           " returned a gradient where it received none (an undefined gradient)");
  TG_CHECK(result.shape() == grad.shape(), "hook on ", where, " returned a gradient of shape ",
           ShapeToString(result.shape()), ", expected ", ShapeToString(grad.shape()));
  grad = std::move(result);
}

}  // namespace

void Node::RunTensorHooks(VariableList& grads) const {
  if (extras_ == nullptr) return;
  const size_t num_groups = extras_->tensor_hooks.size();
  for (size_t g = 0; g < num_groups; ++g) {
    const uint32_t output_nr = extras_->tensor_hooks[g].output_nr;
    // A copy: hooks may add or remove hooks of this list (see node.h).
    const auto hooks = extras_->tensor_hooks[g].hooks;
    for (const auto& hook : hooks) {
      if (TracingEnabled()) trace_internal::Hook("tensor_pre_hook", trace_name(), hook.id);
      ApplyTensorHook(hook.fn, grads[output_nr], name());
    }
  }
}

void Node::RunRetainGrad(const VariableList& grads) const {
  if (extras_ == nullptr) return;
  for (const auto& [output_nr, weak] : extras_->retain_grad) {
    auto impl = weak.lock();
    if (!impl || !grads[output_nr].defined()) continue;
    if (TracingEnabled()) trace_internal::Hook("retain_grad", trace_name(), 0);
    const Tensor& g = grads[output_nr];
    // Like PyTorch: the first gradient is copied, later backward calls accumulate.
    if (!impl->grad.defined()) {
      impl->grad = GradMode::is_enabled() ? g : Tensor(g.data().clone());
    } else {
      impl->grad = Tensor(tg::Add(impl->grad.data(), g.data()));
    }
  }
}

void Node::RunPreHooks(VariableList& grads) const {
  if (extras_ == nullptr) return;
  const auto hooks = extras_->pre_hooks;  // a copy (see RunTensorHooks)
  for (const auto& hook : hooks) {
    if (TracingEnabled()) trace_internal::Hook("node_pre_hook", trace_name(), hook.id);
    VariableList replaced = hook.fn(grads);
    if (replaced.empty()) continue;
    TG_CHECK(replaced.size() == grads.size(), "pre-hook of ", name(), " returned ", replaced.size(),
             " gradients, expected ", grads.size());
    grads = std::move(replaced);
  }
}

void Node::RunPostHooks(const VariableList& grad_inputs, const VariableList& grad_outputs) const {
  if (extras_ == nullptr) return;
  const auto hooks = extras_->post_hooks;  // a copy (see RunTensorHooks)
  for (const auto& hook : hooks) {
    if (TracingEnabled()) trace_internal::Hook("node_post_hook", trace_name(), hook.id);
    hook.fn(grad_inputs, grad_outputs);
  }
}

// ---- Saved variables --------------------------------------------------------------------------

namespace {
thread_local std::vector<std::pair<PackHook, UnpackHook>> saved_tensor_hooks;
}  // namespace

SavedTensorHooks::SavedTensorHooks(PackHook pack, UnpackHook unpack) {
  saved_tensor_hooks.emplace_back(std::move(pack), std::move(unpack));
}

SavedTensorHooks::~SavedTensorHooks() { saved_tensor_hooks.pop_back(); }

const std::pair<PackHook, UnpackHook>* SavedTensorHooks::Current() {
  return saved_tensor_hooks.empty() ? nullptr : &saved_tensor_hooks.back();
}

SavedVariable::SavedVariable(const Tensor& v, bool is_output) {
  if (!v.defined()) return;
  defined_ = true;
  is_output_ = is_output;
  version_ = v.version();
  requires_grad_ = v.requires_grad();
  if (const auto* hooks = SavedTensorHooks::Current()) {
    packed_ = true;
    packed_value_ = hooks->first(v);
    unpack_hook_ = hooks->second;
    output_nr_ = v.output_nr();
    if (is_output) {
      grad_fn_ = v.grad_fn();
    } else {
      original_ = v.impl();
      input_grad_fn_ = v.grad_fn();
      grad_accumulator_ = v.impl()->grad_accumulator;
    }
    return;
  }
  if (is_output) {
    data_ = v.data();
    grad_fn_ = v.grad_fn();
    output_nr_ = v.output_nr();
  } else {
    variable_ = v;
  }
}

Tensor SavedVariable::Unpack(const Node& owner, size_t index) const {
  if (!defined_) return Tensor();
  TG_CHECK(!released_, owner.name(),
           ": the tensors it saved for backward were released after "
           "an earlier backward through this graph; pass retain_graph=true to that backward to "
           "run backward through the graph again");
  Tensor v;
  if (packed_) {
    Tensor unpacked = unpack_hook_(packed_value_);
    TG_CHECK(unpacked.defined(), owner.name(),
             ": the unpack hook returned an undefined variable "
             "for saved tensor ",
             index);
    // The hooks own the storage now; version checks are theirs.
    if (is_output_) return MakeNonLeaf(unpacked.data(), grad_fn_.lock(), output_nr_);
    return RelinkInput(unpacked);
  }
  if (is_output_) {
    std::shared_ptr<Node> fn = grad_fn_.lock();
    v = fn ? MakeNonLeaf(data_, std::move(fn), output_nr_) : Tensor(data_);
  } else {
    v = variable_;
  }
  const uint64_t now = v.data().storage()->version();
  TG_CHECK(now == version_, owner.name(), ": saved tensor ", index, " (", DTypeName(v.dtype()), " ",
           ShapeToString(v.shape()), v.name().empty() ? "" : ", " + v.name(),
           ") was modified in place after it was saved "
           "(version ",
           version_, ", now ", now,
           "); its gradient would be wrong. Clone it before "
           "the in-place op, or use the out-of-place op");
  return v;
}

namespace {

bool SameData(const RawTensor& a, const RawTensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

}  // namespace

Tensor SavedVariable::RelinkInput(const Tensor& unpacked) const {
  if (auto original = original_.lock(); original && SameData(original->data, unpacked.data())) {
    return Tensor(std::move(original));
  }
  if (input_grad_fn_) return MakeNonLeaf(unpacked.data(), input_grad_fn_, output_nr_);
  if (!requires_grad_) return unpacked;
  // A leaf whose data the hooks replaced (e.g. offloaded): a new handle whose gradient flows
  // into the saved leaf's accumulator (so into its .grad and through its hooks).
  auto impl = std::make_shared<VariableImpl>();
  impl->data = unpacked.data();
  impl->requires_grad = true;
  impl->grad_accumulator = grad_accumulator_;
  return Tensor(std::move(impl));
}

void SavedVariable::Release() {
  if (!defined_) return;
  released_ = true;
  data_.reset();
  variable_ = Tensor();
  packed_value_.reset();
  unpack_hook_ = nullptr;
  input_grad_fn_ = nullptr;
}

// ---- FunctionNode ------------------------------------------------------------------------------

VariableList FunctionNode::Apply(VariableList grads) {
  TG_CHECK(!(released_ && !saved_.empty()), name_,
           ": the tensors it saved for backward were "
           "released after an earlier backward through this graph; pass retain_graph=true to that "
           "backward to run backward through the graph again");
  // Unpacked first, as PyTorch's generated nodes do: an in-place modification is reported (and
  // unpack hooks run) whether or not a gradient arrived.
  VariableList saved;
  saved.reserve(saved_.size());
  for (size_t i = 0; i < saved_.size(); ++i) saved.push_back(saved_[i].Unpack(*this, i));
  // No output received a gradient (a custom Function's Backward returned none for the value
  // this node made): "no gradient" passes on, as PyTorch's any_grad_defined does. Zeros here
  // would reach AccumulateGrad as a gradient of 0, and an optimizer would then step a parameter
  // that should be skipped (Adam moves it through momentum and weight decay).
  const bool any_defined =
      std::any_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); });
  if (!any_defined) return VariableList(next_edges().size());
  // Outputs that received no gradient while another did count as zeros (PyTorch's formulas
  // treat an undefined output gradient as zero too); the backward lambdas need no such case.
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) {
      const InputMetadata& m = input_metadata()[i];
      grads[i] = Tensor(RawTensor::Zeros(m.shape, m.dtype, m.device));
    }
  }
  return backward_(BackwardContext{grads, saved, next_edges()});
}

void FunctionNode::ReleaseSaved() {
  for (SavedVariable& s : saved_) s.Release();
  released_ = true;
}

// ---- AccumulateGrad ----------------------------------------------------------------------------

AccumulateGrad::AccumulateGrad(std::shared_ptr<VariableImpl> leaf)
    : Node(kRunFirst), leaf_(std::move(leaf)) {
  AddInputMetadata(leaf_->data);
}

std::string AccumulateGrad::trace_name() const {
  return leaf_->name.empty() ? "AccumulateGrad" : "AccumulateGrad(" + leaf_->name + ")";
}

Node::HookCounts Node::hook_counts() const {
  if (extras_ == nullptr) return {};
  size_t tensor_hooks = 0;
  for (const auto& group : extras_->tensor_hooks) tensor_hooks += group.hooks.size();
  return {tensor_hooks, extras_->pre_hooks.size(), extras_->post_hooks.size(),
          extras_->retain_grad.size()};
}

void AccumulateGrad::RunTensorHooks(VariableList& grads) const {
  const auto hooks = leaf_->tensor_hooks;  // a copy (see Node::RunTensorHooks)
  for (const auto& [id, hook] : hooks) {
    if (TracingEnabled()) trace_internal::Hook("tensor_pre_hook", trace_name(), id);
    ApplyTensorHook(hook, grads[0], leaf_->name.empty() ? "a leaf" : leaf_->name);
  }
}

VariableList AccumulateGrad::Apply(VariableList grads) {
  const Tensor& g = grads[0];
  if (!g.defined()) return {};
  Tensor& grad = leaf_->grad;
  if (!grad.defined()) {
    // Steal the incoming buffer when nothing else can see it; otherwise copy, so that later
    // in-place accumulation never writes into another tensor.
    const RawTensor& d = g.data();
    const bool exclusive =
        !GradMode::is_enabled() && d.storage().use_count() == 1 && d.is_contiguous() &&
        d.offset() == 0 &&
        d.storage()->nbytes() == static_cast<size_t>(d.numel()) * d.element_size();
    grad = GradMode::is_enabled() ? g : Tensor(exclusive ? d : d.clone());
  } else if (GradMode::is_enabled()) {
    grad = Tensor(tg::Add(grad.data(), g.data()));  // create_graph: out of place
  } else {
    grad.data().copy_(tg::Add(grad.data(), g.data()));  // in place: same storage
  }
  const Tensor leaf(leaf_);
  const auto hooks = leaf_->post_accumulate_hooks;  // a copy (see Node::RunTensorHooks)
  for (const auto& [id, hook] : hooks) {
    if (TracingEnabled()) trace_internal::Hook("post_accumulate_grad", trace_name(), id);
    hook(leaf);
  }
  return {};
}

// ---- Recording ---------------------------------------------------------------------------------

void RebaseHistory(const Tensor& self, std::shared_ptr<Node> grad_fn, uint32_t output_nr) {
  TG_CHECK(self.defined() && grad_fn != nullptr, "RebaseHistory: undefined variable or node");
  VariableImpl& impl = *self.impl();
  if (impl.retains_grad && impl.grad_fn) impl.grad_fn->ClearRetainGrad(&impl);
  impl.grad_fn = std::move(grad_fn);
  impl.output_nr = output_nr;
  if (impl.retains_grad) impl.grad_fn->SetRetainGrad(output_nr, self.impl());
}

bool ShouldRecord(const VariableList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& v : inputs) {
    if (v.requires_grad()) return true;
  }
  return false;
}

namespace {

// Records one node for an op whose forward produced `results` (ShouldRecord was true).
std::shared_ptr<FunctionNode> MakeNode(const char* name, const VariableList& inputs,
                                       const VariableList& saved, BackwardFn backward) {
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  auto& edges = node->mutable_next_edges();
  edges.reserve(inputs.size());
  for (const Tensor& in : inputs) edges.push_back(Edge{in.gradient_edge_node(), in.output_nr()});
  for (const Tensor& s : saved) node->Save(s, false);
  return node;
}

}  // namespace

VariableList RecordMulti(const char* name, absl::Span<const RawTensor> results,
                         const VariableList& inputs, const VariableList& saved,
                         BackwardFn backward) {
  VariableList outputs;
  outputs.reserve(results.size());
  if (!ShouldRecord(inputs)) {
    for (const RawTensor& r : results) outputs.emplace_back(r);
    return outputs;
  }
  std::shared_ptr<FunctionNode> node = MakeNode(name, inputs, saved, std::move(backward));
  for (size_t i = 0; i < results.size(); ++i) {
    node->AddInputMetadata(results[i]);
    outputs.push_back(MakeNonLeaf(results[i], node, static_cast<uint32_t>(i)));
  }
  return outputs;
}

Tensor Record(const char* name, RawTensor result, const VariableList& inputs,
              const VariableList& saved, BackwardFn backward, bool save_output) {
  if (!ShouldRecord(inputs)) return Tensor(std::move(result));
  std::shared_ptr<FunctionNode> node = MakeNode(name, inputs, saved, std::move(backward));
  node->AddInputMetadata(result);
  FunctionNode* raw = node.get();
  Tensor out = MakeNonLeaf(std::move(result), std::move(node), 0);
  if (save_output) raw->Save(out, true);
  return out;
}

}  // namespace tg
