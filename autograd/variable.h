// Tensor: a tensor that takes part in automatic differentiation.
//
// A Tensor is a cheap handle (shared ownership) to its data RawTensor and its autograd state:
// requires_grad, the accumulated `grad`, `grad_fn` (the Node that produced it, null for a
// leaf), its output index in that node, hooks, and a name used in error messages. Leaves that
// require grad accumulate through an AccumulateGrad node, created on first use and held weakly
// (the graph owns it, as in PyTorch).
//
//   tg::Tensor w(tg::RandNormal({3, 3}, gen), /*requires_grad=*/true);
//   tg::Tensor loss = tg::Sum(tg::Mul(w, w));
//   loss.backward();                       // w.grad() == 2 * w
//   auto h = w.register_hook([](const tg::Tensor& g) { return tg::MulScalar(g, 0.5); });
//   h.remove();
#ifndef TAPEGRAD_AUTOGRAD_VARIABLE_H_
#define TAPEGRAD_AUTOGRAD_VARIABLE_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "tensor/tensor.h"

namespace tg {

class Node;
class Tensor;
struct VariableImpl;
namespace indexing {
class TensorIndex;  // autograd/indexing.h
}  // namespace indexing

// Gradients and inputs of one node: inline storage for the common one- and two-element lists.
using VariableList = absl::InlinedVector<Tensor, 2>;

// Removes a registered hook when remove() is called (idempotent). Dropping the handle without
// calling remove() keeps the hook.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (remover_) {
      auto r = std::move(remover_);
      remover_ = nullptr;
      r();
    }
  }

 private:
  std::function<void()> remover_;
};

// A tensor hook sees the gradient and may return a replacement (an undefined return keeps it).
// As in PyTorch it also runs, with an undefined gradient, when the node was reached but no
// gradient flowed into this output; it must then return an undefined variable.
using TensorHook = std::function<Tensor(const Tensor& grad)>;
// A post-accumulate-grad hook sees the leaf after its .grad was updated.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
// A view function: recreates a view from its base with the differentiable view ops (recorded
// when grad mode is on), e.g. [](const Tensor& b) { return Slice(b, 0, 1, 3); }.
using ViewFn = std::function<Tensor(const Tensor&)>;

struct BackwardOptions {
  bool retain_graph = false;             // keep saved tensors for another backward
  bool create_graph = false;             // record the backward itself (higher-order gradients)
  const VariableList* inputs = nullptr;  // accumulate only into these (all leaves if null)
};

class Tensor {
 public:
  // An undefined variable (defined() == false), used as "no gradient" / zeros.
  Tensor() = default;
  // A leaf wrapping `data`.
  explicit Tensor(RawTensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const RawTensor& data() const;
  // The same Tensor identity with new data (shape and dtype must stay the same); used by
  // optimizers and in-place updates outside autograd.
  void set_data(const RawTensor& data) const;

  // Shorthands for data().
  const Shape& shape() const { return data().shape(); }
  DType dtype() const { return data().dtype(); }
  int64_t dim() const { return data().dim(); }
  int64_t size(int64_t d) const { return data().size(d); }
  int64_t numel() const { return data().numel(); }
  double item() const { return data().item(); }

  bool requires_grad() const;
  // Only on leaves; requires a floating dtype.
  const Tensor& set_requires_grad(bool requires_grad) const;
  bool is_leaf() const;
  const std::shared_ptr<Node>& grad_fn() const;
  uint32_t output_nr() const;

  // The accumulated gradient (undefined until a backward reaches this leaf).
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  // Keep .grad on a non-leaf (sees the result of all tensor hooks). No-op on leaves.
  void retain_grad() const;
  bool retains_grad() const;

  // A leaf sharing this data (and its version counter) without history. Not a view for
  // autograd (PyTorch's detach()).
  Tensor detach() const;

  // Views (PyTorch's): the result of a view op (Slice, Select, Narrow, Transpose, Permute,
  // Reshape/Unsqueeze/Squeeze when they do not copy, Expand) knows its root base and how to
  // recreate itself from it. The view's grad_fn follows the base: after an in-place op on the
  // base or on any view of it (the shared version counter moved), it is remade as the view
  // function applied to the base's current history. An in-place op on a view rewrites the
  // base's history (CopySlices, autograd/ops/inplace.cc).
  bool is_view() const;
  // The root base of a view (never itself a view); undefined for a non-view.
  Tensor base() const;

  // Version of the underlying storage, bumped by in-place ops.
  uint64_t version() const { return data().storage()->version(); }
  void bump_version() const { data().storage()->bump_version(); }

  const std::string& name() const;
  const Tensor& set_name(std::string name) const;

  HookHandle register_hook(TensorHook hook) const;
  // Leaf only; throws on a non-leaf.
  HookHandle register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;

  // The node a gradient for this variable flows into: grad_fn for a non-leaf, the
  // AccumulateGrad node for a leaf that requires grad (created on demand), null otherwise.
  std::shared_ptr<Node> gradient_edge_node() const;

  // Engine::Backward({*this}, {grad}, options).
  void backward(const Tensor& grad = Tensor(), const BackwardOptions& options = {}) const;

  // ---- libtorch's Tensor API (torch::Tensor). Every method below that computes is the recorded
  // op of autograd/ops.h (defined in autograd/ops/methods.cc): it records history exactly when
  // that op does. Scalars are doubles, kept in the op's compute precision (f32 for f16/bf16).
  IntArrayRef sizes() const { return data().shape(); }
  IntArrayRef strides() const { return data().strides(); }
  Device device() const { return data().device(); }
  bool is_cuda() const { return data().device().is_cuda(); }
  bool is_floating_point() const { return IsFloating(dtype()); }
  // The value of a one-element tensor as T (a device tensor is copied to the host). An integer
  // T reads i32/i64 tensors exactly (no trip through double) and refuses a floating value that
  // is not finite or does not fit T (tg::Error), rather than returning a wrong number.
  template <typename T>
  T item() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return static_cast<T>(ItemAsInteger(std::numeric_limits<T>::min(),
                                          std::numeric_limits<T>::max()));
    } else {
      return static_cast<T>(data().item());
    }
  }
  // item<T>()'s integer read: the value, checked to lie in [lo, hi].
  int64_t ItemAsInteger(int64_t lo, uint64_t hi) const;
  // Leaves only, floating dtypes only (libtorch's requires_grad_).
  const Tensor& requires_grad_(bool requires_grad = true) const {
    return set_requires_grad(requires_grad);
  }
  // libtorch's signature: retain_graph defaults to create_graph.
  void backward(const Tensor& grad, std::optional<bool> retain_graph,
                bool create_graph = false) const {
    BackwardOptions options;
    options.create_graph = create_graph;
    options.retain_graph = retain_graph.value_or(create_graph);
    backward(grad, options);
  }

  // Shapes and views (views share storage; see is_view()). Shapes are IntArrayRef: {2, 3}, a
  // std::vector<int64_t>, or another tensor's sizes().
  Tensor view(IntArrayRef shape) const;  // throws where the strides need a copy
  Tensor reshape(IntArrayRef shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;  // every size-1 dim
  Tensor squeeze(int64_t dim) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // a matrix's transpose; 0-d and 1-d unchanged
  Tensor permute(IntArrayRef dims) const;
  Tensor expand(IntArrayRef shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor view_as(const Tensor& other) const { return view(other.sizes()); }
  Tensor reshape_as(const Tensor& other) const { return reshape(other.sizes()); }
  Tensor contiguous() const;  // *this when contiguous, else a recorded copy (CloneBackward0)
  Tensor select(int64_t dim, int64_t index) const;
  Tensor slice(int64_t dim = 0, int64_t start = 0,
               int64_t end = std::numeric_limits<int64_t>::max(), int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor operator[](int64_t index) const;  // select(0, index)

  // Reductions. max/min over a dim give {values, indices}; argmax/argmin give i64 indices of the
  // first extreme (NaN counts as one); all/any give bool.
  Tensor sum() const;
  Tensor sum(int64_t dim, bool keepdim = false) const;
  Tensor sum(IntArrayRef dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(int64_t dim, bool keepdim = false) const;
  Tensor mean(IntArrayRef dims, bool keepdim = false) const;
  Tensor max() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  Tensor min() const;
  std::tuple<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  Tensor argmax() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin() const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  Tensor all() const;
  Tensor any() const;
  Tensor norm() const;  // the 2-norm of all elements, sqrt(sum(x * x))

  // Elementwise.
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor sqrt() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor clamp(std::optional<double> min, std::optional<double> max = std::nullopt) const;
  Tensor clamp_min(double min) const;
  Tensor clamp_max(double max) const;
  Tensor masked_fill(const Tensor& mask, double value) const;  // mask bool, broadcast
  Tensor mm(const Tensor& other) const;
  Tensor matmul(const Tensor& other) const;
  Tensor add(const Tensor& other, double alpha = 1) const;
  Tensor sub(const Tensor& other, double alpha = 1) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  // Comparisons give bool tensors (no history); against a number, in the tensor's dtype.
  Tensor eq(const Tensor& other) const;
  Tensor ne(const Tensor& other) const;
  Tensor lt(const Tensor& other) const;
  Tensor le(const Tensor& other) const;
  Tensor gt(const Tensor& other) const;
  Tensor ge(const Tensor& other) const;
  Tensor eq(double other) const;
  Tensor ne(double other) const;
  Tensor lt(double other) const;
  Tensor le(double other) const;
  Tensor gt(double other) const;
  Tensor ge(double other) const;

  // Copies: to() records (a dtype cast or a device copy); clone() is a recorded copy.
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  Tensor clone() const;

  // In place, recorded (the version counter moves; refused on a leaf that requires grad while
  // grad mode is on, as in PyTorch).
  const Tensor& add_(const Tensor& other, double alpha = 1) const;
  const Tensor& add_(double other) const;
  const Tensor& sub_(const Tensor& other, double alpha = 1) const;
  const Tensor& sub_(double other) const;
  const Tensor& mul_(const Tensor& other) const;
  const Tensor& mul_(double other) const;
  const Tensor& div_(const Tensor& other) const;
  const Tensor& div_(double other) const;
  const Tensor& zero_() const;
  const Tensor& fill_(double value) const;
  const Tensor& copy_(const Tensor& src) const;  // src broadcast and converted to this dtype
  // Refills with draws from the default generator (tg::manual_seed): U[from, to) and
  // N(mean, std), as an in-place op whose source needs no gradient (defined with the default
  // generator in autograd/factories.cc).
  const Tensor& uniform_(double from = 0, double to = 1) const;
  const Tensor& normal_(double mean = 0, double std = 1) const;
  // libtorch's indexing (autograd/indexing.h): x.index({Slice(), 0}), x.index({"...", None}),
  // x.index_put_({Slice(0, 2)}, value).
  Tensor index(std::initializer_list<indexing::TensorIndex> indices) const;
  Tensor index(const std::vector<indexing::TensorIndex>& indices) const;
  const Tensor& index_put_(std::initializer_list<indexing::TensorIndex> indices,
                           const Tensor& value) const;
  const Tensor& index_put_(std::initializer_list<indexing::TensorIndex> indices,
                           double value) const;
  const Tensor& operator+=(const Tensor& other) const;
  const Tensor& operator+=(double other) const;
  const Tensor& operator-=(const Tensor& other) const;
  const Tensor& operator-=(double other) const;
  const Tensor& operator*=(const Tensor& other) const;
  const Tensor& operator*=(double other) const;
  const Tensor& operator/=(const Tensor& other) const;
  const Tensor& operator/=(double other) const;

  // Identity of the handle (two Tensors are the same tensor of the graph).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  const std::shared_ptr<VariableImpl>& impl() const { return impl_; }
  explicit Tensor(std::shared_ptr<VariableImpl> impl) : impl_(std::move(impl)) {}

 private:
  void CheckDefined(const char* what) const {
    if (impl_ == nullptr) ThrowUndefined(what);
  }
  [[noreturn]] static void ThrowUndefined(const char* what);
  // A view whose version moved since its grad_fn was made gets a new one from its base.
  void RefreshViewGradFn() const;
  std::shared_ptr<VariableImpl> impl_;
};

// What a view knows about its base (PyTorch's DifferentiableViewMeta, backward part).
struct ViewInfo {
  Tensor base;    // the root base: a view of a view has its base's base
  ViewFn fn;      // base -> this view: the composition of the view ops from the root base
  // The storage version when grad_fn was last made from the base; grad_fn is remade when the
  // version differs (an in-place op on the base or on a view of it happened since).
  uint64_t attr_version = 0;
  // Made while grad mode was off: its grad_fn is never remade, and an in-place op on it that
  // records is refused (PyTorch's CreationMeta::NO_GRAD_MODE).
  bool made_in_no_grad = false;
  // Set for an output of an op with several view outputs (Split) and views of one: an in-place
  // op on it that records is refused with this text (PyTorch's CreationMeta::MULTI_OUTPUT_NODE),
  // and so is remaking its grad_fn after its base was modified in place.
  std::string multi_output_error;
};

struct VariableImpl {
  RawTensor data;
  bool requires_grad = false;  // leaves only; non-leaves require grad through grad_fn
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  Tensor grad;
  std::weak_ptr<Node> grad_accumulator;
  std::vector<std::pair<uint64_t, TensorHook>> tensor_hooks;  // leaves (non-leaves: on grad_fn)
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_accumulate_hooks;
  bool retains_grad = false;
  std::unique_ptr<ViewInfo> view;  // set on views only (Tensor::is_view)
  std::string name;
};

// Makes `out` (the result of a view op on `input` whose data shares input's storage) a view: its
// base is input's root base and its view function `fn` applied after input's. A result that
// does not share storage (a reshape that copied) is returned as it is. Returns `out`.
Tensor MakeView(Tensor out, const Tensor& input, ViewFn fn);
// The same for output `index` of `node_name` (Split), an op that returns several views.
Tensor MakeMultiOutputView(Tensor out, const Tensor& input, const char* node_name, size_t index);

// Prints as libtorch does (tensor/print.h): the values, then "[ CPUFloatType{2,3} ]".
std::ostream& operator<<(std::ostream& out, const Tensor& t);

// The variable produced by `grad_fn` (output `output_nr`) holding `data`.
Tensor MakeNonLeaf(RawTensor data, std::shared_ptr<Node> grad_fn, uint32_t output_nr);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_VARIABLE_H_
