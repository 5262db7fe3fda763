// Differentiable in-place ops, following PyTorch's rules:
//  - a leaf that requires grad cannot be modified in place while grad mode is on (its .grad
//    would describe a value that no longer exists);
//  - the new value is written into self's storage (Tensor::copy_, so views of it see it) and the
//    version counter is bumped, so a node that saved the old value refuses to run backward;
//  - when the op records, self's history is rebased: it becomes a non-leaf whose grad_fn is the
//    new node, whose edges lead to self's old history.
// Values a backward formula needs from before the write (mul_'s self, or an `other` that shares
// self's storage) are snapshots: copies attached at the original's place in the graph, so the
// formula stays differentiable under create_graph.
//
// Limitation (README, "Decisions worth knowing"): there is no view tracking, so an in-place op
// on a view (e.g. the result of Slice) does not rebase the history of the view's base.
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"

namespace tg {
namespace {

void CheckInPlaceAllowed(const char* op, const Variable& self) {
  TG_CHECK(self.defined(), op, ": self is undefined");
  TG_CHECK(!(GradMode::is_enabled() && self.is_leaf() && self.requires_grad()), op,
           ": a leaf variable that requires grad",
           self.name().empty() ? "" : " (" + self.name() + ")",
           " cannot be modified in place while grad mode is on; modify it under NoGradGuard, or "
           "apply the op to a clone");
  TG_CHECK(!(GradMode::is_enabled() && self.requires_grad() && self.impl()->in_view_relation), op,
           ": ", self.name().empty() ? "self" : self.name(),
           " shares storage with a view (or is "
           "one) made by a recorded view op; tapegrad does not track views, so the gradient of an "
           "in-place op here would be wrong. Apply the op to a clone, or out of place");
}

}  // namespace

Variable MarkView(Variable out, const Variable& base) {
  if (out.grad_fn() != nullptr && out.data().shares_storage(base.data())) {
    out.impl()->in_view_relation = true;
    base.impl()->in_view_relation = true;
  }
  return out;
}

namespace {

// The value written into self keeps self's shape (other broadcasts into self, never the
// reverse) and must not need a float -> integer conversion (PyTorch refuses both).
void CheckWritable(const char* op, const Variable& self, const Tensor& value) {
  TG_CHECK(value.shape() == self.shape(), op, ": the result of shape ",
           ShapeToString(value.shape()), " does not fit self of shape ",
           ShapeToString(self.shape()));
  TG_CHECK(!(IsIntegral(self.dtype()) && IsFloating(value.dtype())), op, ": the ",
           DTypeName(value.dtype()), " result cannot be written into self of dtype ",
           DTypeName(self.dtype()));
}

// A copy of v's current value at v's place in the graph (undefined for undefined v).
Variable Snapshot(const Variable& v) {
  if (!v.defined()) return Variable();
  Tensor copy = v.data().clone();
  std::shared_ptr<Node> node = v.gradient_edge_node();
  if (!node) return Variable(std::move(copy));
  return MakeNonLeaf(std::move(copy), std::move(node), v.output_nr());
}

// Writes `value` into self, bumps its version and records the op with self's new value as the
// output (edges from `inputs`, taken before the rebase); the node becomes self's grad_fn.
const Variable& Commit(const char* name, const Variable& self, const Tensor& value,
                       const VariableList& inputs, const VariableList& saved, BackwardFn backward,
                       bool save_output = false) {
  self.data().copy_(value);
  self.bump_version();
  const Variable out = Record(name, self.data(), inputs, saved, std::move(backward), save_output);
  if (out.grad_fn()) RebaseHistory(self, out.grad_fn(), out.output_nr());
  return self;
}

}  // namespace

const Variable& AddInPlace(const Variable& self, const Variable& other) {
  CheckInPlaceAllowed("add_", self);
  TG_CHECK(other.defined(), "add_: other is undefined");
  const Tensor value = tg::Add(self.data(), other.data());
  CheckWritable("add_", self, value);
  const DType self_dtype = self.dtype(), other_dtype = other.dtype();
  const Shape other_shape = other.shape();
  return Commit("AddInPlaceBackward", self, value, {self, other}, {},
                [=](const BackwardContext& ctx) -> VariableList {
                  const Variable& g = ctx.grads[0];
                  return {ctx.needs(0) ? Cast(g, self_dtype) : Variable(),
                          ctx.needs(1) ? Cast(SumTo(g, other_shape), other_dtype) : Variable()};
                });
}

const Variable& MulInPlace(const Variable& self, const Variable& other) {
  CheckInPlaceAllowed("mul_", self);
  TG_CHECK(other.defined(), "mul_: other is undefined");
  const Tensor value = tg::Mul(self.data(), other.data());
  CheckWritable("mul_", self, value);
  Variable self_before, other_saved;
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
  return Commit("MulInPlaceBackward", self, value, {self, other}, {self_before, other_saved},
                [=](const BackwardContext& ctx) -> VariableList {
                  const Variable& g = ctx.grads[0];
                  Variable gs, go;
                  if (ctx.needs(0)) gs = Cast(Mul(g, ctx.saved[1]), self_dtype);
                  if (ctx.needs(1)) {
                    go = Cast(SumTo(Mul(g, ctx.saved[0]), other_shape), other_dtype);
                  }
                  return {gs, go};
                });
}

const Variable& MulScalarInPlace(const Variable& self, double s) {
  CheckInPlaceAllowed("mul_", self);
  const Tensor value = tg::MulScalar(self.data(), s);
  return Commit(
      "MulScalarInPlaceBackward", self, value, {self}, {},
      [s](const BackwardContext& ctx) -> VariableList { return {MulScalar(ctx.grads[0], s)}; });
}

const Variable& ReluInPlace(const Variable& self) {
  CheckInPlaceAllowed("relu_", self);
  const Tensor value = tg::Relu(self.data());
  // Saves self's new value (as PyTorch's relu_ does): modifying self again in place before
  // backward makes this node refuse to run.
  return Commit(
      "ReluInPlaceBackward", self, value, {self}, {},
      [](const BackwardContext& ctx) -> VariableList {
        return {ReluBackward(ctx.grads[0], ctx.saved[0])};
      },
      /*save_output=*/true);
}

}  // namespace tg
