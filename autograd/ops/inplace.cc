// Differentiable in-place ops, following PyTorch's rules:
//  - a leaf that requires grad cannot be modified in place while grad mode is on (its .grad
//    would describe a value that no longer exists), nor can a view of one;
//  - the new value is written into self's storage (RawTensor::copy_, so views of it see it) and the
//    version counter (on the storage, so shared by a base and all its views) is bumped: a node
//    that saved the old value refuses to run backward, and every view of the same base remakes
//    its grad_fn from the base on next use (Tensor::RefreshViewGradFn);
//  - when the op records on a non-view, self's history is rebased: it becomes a non-leaf whose
//    grad_fn is the new node, whose edges lead to self's old history;
//  - when it records on a view, the base's history is rewritten instead (PyTorch's CopySlices):
//    the base's new grad_fn sends the part of the gradient that falls in the viewed region
//    through the op's backward, and the rest straight to the base's old history; the view's
//    grad_fn becomes its view function applied to the base's new history.
// Values a backward formula needs from before the write (mul_'s self, or an `other` that shares
// self's storage) are snapshots: copies attached at the original's place in the graph, so the
// formula stays differentiable under create_graph.
#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/mutation_on_saved.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

// PyTorch's check_inplace: `other` (may be undefined) is the op's other differentiable input.
void CheckInPlaceAllowed(const char* op, const Tensor& self, const Tensor& other = Tensor()) {
  TG_CHECK(self.defined(), op, ": self is undefined");
  internal::BeforeInPlaceWrite(self);  // allow_mutation_on_saved_tensors copies first
  NotifyInPlaceWrite(self);            // a selective recomputation's kept output, say
  if (!GradMode::is_enabled()) return;
  const bool records = self.requires_grad() || (other.defined() && other.requires_grad());
  if (records && self.is_view()) {
    const ViewInfo& view = *self.impl()->view;
    TG_CHECK(view.multi_output_error.empty(), op, ": ", view.multi_output_error);
    TG_CHECK(!view.made_in_no_grad, op,
             ": a view was created in no_grad mode and is being modified inplace with grad mode "
             "enabled. Given that this use case is ambiguous and error-prone, it is forbidden. "
             "You can clarify your code by moving both the view and the inplace either both "
             "inside the no_grad block (if you don't want the inplace to be tracked) or both "
             "outside (if you want the inplace to be tracked).");
    TG_CHECK(!(self.requires_grad() && view.base.is_leaf()), op,
             ": a view of a leaf Variable that requires grad is being used in an in-place "
             "operation.",
             view.base.name().empty() ? "" : " (the leaf: " + view.base.name() + ")");
  }
  TG_CHECK(!(self.is_leaf() && self.requires_grad()), op, ": a leaf variable that requires grad",
           self.name().empty() ? "" : " (" + self.name() + ")",
           " cannot be modified in place while grad mode is on; modify it under NoGradGuard, or "
           "apply the op to a clone");
}

// `grad` (the base's shape) with the region that `view_fn` selects replaced by `src` (the
// view's shape), out of place; recorded when an input requires grad (create_graph), its
// backward being the same op with zeros (for grad) and the view of the gradient (for src).
Tensor WriteIntoView(const Tensor& grad, const Tensor& src, const ViewFn& view_fn) {
  RawTensor out = grad.data().clone();  // contiguous: every view function stays a view of it
  {
    NoGradGuard no_grad;
    const RawTensor region = view_fn(Tensor(out)).data();
    TG_CHECK(region.shares_storage(out),
             "CopySlices: the view function copied instead of viewing (internal error)");
    region.copy_(src.data());
  }
  const Shape src_shape = src.shape();
  return Record("CopySlicesWriteBackward", std::move(out), {grad, src}, {},
                [view_fn, src_shape](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  Tensor g_grad, g_src;
                  if (ctx.needs(0)) {
                    const Tensor zeros(RawTensor::Zeros(src_shape, g.dtype(), g.data().device()));
                    g_grad = WriteIntoView(g, zeros, view_fn);
                  }
                  if (ctx.needs(1)) g_src = view_fn(g);
                  return {g_grad, g_src};
                });
}

// The base's grad_fn after an in-place op `fn` on one of its views (PyTorch's CopySlices). Its
// edges are the base's old history, then fn's edges for fn's other inputs.
class CopySlices : public Node {
 public:
  CopySlices(const Tensor& base, ViewFn view_fn, std::shared_ptr<Node> fn)
      : view_fn_(std::move(view_fn)), fn_(std::move(fn)) {
    AddInputMetadata(base.data());
    auto& edges = mutable_next_edges();
    edges.push_back(Edge{base.gradient_edge_node(), base.output_nr()});
    for (size_t i = 1; i < fn_->next_edges().size(); ++i) edges.push_back(fn_->next_edges()[i]);
  }
  std::string name() const override { return "CopySlices"; }
  void ReleaseSaved() override { fn_->ReleaseSaved(); }

  VariableList Apply(VariableList grads) override {
    VariableList result(next_edges().size());
    const Tensor& grad = grads[0];  // [base shape]
    if (!grad.defined()) return result;
    // fn's backward sees the gradient of the view's new value; what it returns for the view's
    // old value goes back into the region, the rest of the base's gradient passes through.
    VariableList res = fn_->Apply({view_fn_(grad)});
    if (next_edges()[0].valid()) {
      Tensor in_region = res[0];
      if (!in_region.defined()) {  // no gradient: zeros (PyTorch drops the whole base gradient)
        const InputMetadata& m = fn_->input_metadata()[0];
        in_region = Tensor(RawTensor::Zeros(m.shape, grad.dtype(), m.device));
      }
      result[0] = WriteIntoView(grad, in_region, view_fn_);
    }
    for (size_t i = 1; i < res.size() && i < result.size(); ++i) result[i] = std::move(res[i]);
    return result;
  }

 private:
  ViewFn view_fn_;
  std::shared_ptr<Node> fn_;  // the in-place op's node (its edge 0 is the view's old history)
};

// After the in-place op on view `self` recorded `fn`: the base's history becomes CopySlices
// over fn, and self's grad_fn is remade from it now (PyTorch's rebase_history for views).
void RebaseViewHistory(const Tensor& self, std::shared_ptr<Node> fn) {
  ViewInfo& view = *self.impl()->view;
  RebaseHistory(view.base, std::make_shared<CopySlices>(view.base, view.fn, std::move(fn)), 0);
  view.attr_version = self.version() + 1;  // stale: the next line remakes self's grad_fn
  (void)self.grad_fn();
}

}  // namespace

namespace {

// The value written into self keeps self's shape (other broadcasts into self, never the
// reverse) and must not need a float -> integer conversion (PyTorch refuses both).
void CheckWritable(const char* op, const Tensor& self, const RawTensor& value) {
  TG_CHECK(value.shape() == self.shape(), op, ": the result of shape ",
           ShapeToString(value.shape()), " does not fit self of shape ",
           ShapeToString(self.shape()));
  TG_CHECK(!(IsIntegral(self.dtype()) && IsFloating(value.dtype())), op, ": the ",
           DTypeName(value.dtype()), " result cannot be written into self of dtype ",
           DTypeName(self.dtype()));
}

// A copy of v's current value at v's place in the graph (undefined for undefined v).
Tensor Snapshot(const Tensor& v) {
  if (!v.defined()) return Tensor();
  RawTensor copy = v.data().clone();
  std::shared_ptr<Node> node = v.gradient_edge_node();
  if (!node) return Tensor(std::move(copy));
  return MakeNonLeaf(std::move(copy), std::move(node), v.output_nr());
}

// Writes `value` into self, bumps its version and records the op with self's new value as the
// output (edges from `inputs`, taken before the rebase); the node becomes self's grad_fn.
const Tensor& Commit(const char* name, const Tensor& self, const RawTensor& value,
                     const VariableList& inputs, const VariableList& saved, BackwardFn backward,
                     bool save_output = false) {
  self.data().copy_(value);
  self.bump_version();
  const Tensor out = Record(name, self.data(), inputs, saved, std::move(backward), save_output);
  if (out.grad_fn() == nullptr) return self;
  if (self.is_view()) {
    RebaseViewHistory(self, out.grad_fn());
  } else {
    RebaseHistory(self, out.grad_fn(), out.output_nr());
  }
  return self;
}

}  // namespace

const Tensor& AddInPlace(const Tensor& self, const Tensor& other) {
  constexpr const char* kOp = OpTorchName(OpId::kAddInPlace);
  CheckInPlaceAllowed(kOp, self, other);
  TG_CHECK(other.defined(), kOp, ": other is undefined");
  const RawTensor value = tg::Add(self.data(), other.data());
  CheckWritable(kOp, self, value);
  const DType self_dtype = self.dtype(), other_dtype = other.dtype();
  const Shape other_shape = other.shape();
  return Commit(OpNodeName(OpId::kAddInPlace), self, value, {self, other}, {},
                [=](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  return {ctx.needs(0) ? Cast(g, self_dtype) : Tensor(),
                          ctx.needs(1) ? Cast(SumTo(g, other_shape), other_dtype) : Tensor()};
                });
}

const Tensor& MulInPlace(const Tensor& self, const Tensor& other) {
  constexpr const char* kOp = OpTorchName(OpId::kMulInPlace);
  CheckInPlaceAllowed(kOp, self, other);
  TG_CHECK(other.defined(), kOp, ": other is undefined");
  const RawTensor value = tg::Mul(self.data(), other.data());
  CheckWritable(kOp, self, value);
  Tensor self_before, other_saved;
  if (ShouldRecord({self, other})) {
    // d/d other needs self's old value; d/d self needs other, which the write changes too when
    // it shares self's storage (x.mul_(x)).
    if (other.requires_grad()) self_before = Snapshot(self);
    if (self.requires_grad()) {
      other_saved = other.data().shares_storage(self.data()) ? Snapshot(other) : other;
    }
  }
  const DType self_dtype = self.dtype(), other_dtype = other.dtype();
  const Shape other_shape = other.shape();
  return Commit(OpNodeName(OpId::kMulInPlace), self, value, {self, other},
                {self_before, other_saved}, [=](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  Tensor gs, go;
                  if (ctx.needs(0)) gs = Cast(Mul(g, ctx.saved[1]), self_dtype);
                  if (ctx.needs(1)) {
                    go = Cast(SumTo(Mul(g, ctx.saved[0]), other_shape), other_dtype);
                  }
                  return {gs, go};
                });
}

const Tensor& MulScalarInPlace(const Tensor& self, double s) {
  constexpr const char* kOp = OpTorchName(OpId::kMulScalarInPlace);
  CheckInPlaceAllowed(kOp, self);
  const RawTensor value = tg::MulScalar(self.data(), s);
  return Commit(
      OpNodeName(OpId::kMulScalarInPlace), self, value, {self}, {},
      [s](const BackwardContext& ctx) -> VariableList { return {MulScalar(ctx.grads[0], s)}; });
}

const Tensor& ReluInPlace(const Tensor& self) {
  constexpr const char* kOp = OpTorchName(OpId::kReluInPlace);
  CheckInPlaceAllowed(kOp, self);
  const RawTensor value = tg::Relu(self.data());
  // Saves self's new value (as PyTorch's relu_ does): modifying self again in place before
  // backward makes this node refuse to run.
  return Commit(
      OpNodeName(OpId::kReluInPlace), self, value, {self}, {},
      [](const BackwardContext& ctx) -> VariableList {
        return {ReluBackward(ctx.grads[0], ctx.saved[0])};
      },
      /*save_output=*/true);
}

const Tensor& CopyInPlace(const Tensor& self, const Tensor& src) {
  constexpr const char* kOp = OpTorchName(OpId::kCopyInPlace);
  CheckInPlaceAllowed(kOp, self, src);
  TG_CHECK(src.defined(), kOp, ": src is undefined");
  // A separate buffer first: src may overlap self (x.copy_(x.t())).
  RawTensor value = RawTensor::Empty(self.shape(), self.dtype(), self.data().device());
  value.copy_(src.data());  // broadcasts src and converts its dtype (throws if it cannot)
  const Shape self_shape = self.shape(), src_shape = src.shape();
  const DType self_dtype = self.dtype(), src_dtype = src.dtype();
  return Commit(OpNodeName(OpId::kCopyInPlace), self, value, {self, src}, {},
                [=](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  Tensor gs, gsrc;
                  if (ctx.needs(0)) {
                    gs = Tensor(RawTensor::Zeros(self_shape, self_dtype, g.data().device()));
                  }
                  if (ctx.needs(1)) gsrc = Cast(SumTo(g, src_shape), src_dtype);
                  return {gs, gsrc};
                });
}

const Tensor& FillInPlace(const Tensor& self, double value) {
  constexpr const char* kOp = OpTorchName(OpId::kFillInPlace);
  CheckInPlaceAllowed(kOp, self);
  const RawTensor full = RawTensor::Full(self.shape(), value, self.dtype(), self.data().device());
  const Shape shape = self.shape();
  const DType dtype = self.dtype();
  return Commit(OpNodeName(OpId::kFillInPlace), self, full, {self}, {},
                [shape, dtype](const BackwardContext& ctx) -> VariableList {
                  return {Tensor(RawTensor::Zeros(shape, dtype, ctx.grads[0].data().device()))};
                });
}

}  // namespace tg
