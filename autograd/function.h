// Custom autograd functions: a forward computed on plain data and a hand-written backward,
// recorded as one node of the graph (PyTorch's torch.autograd.Function / the C++
// torch::autograd::Function<T>).
//
// A function is a struct deriving from tg::Function<Self> with a name and two static members.
// Forward receives the inputs (and any extra non-tensor arguments given to Apply) and runs
// under no-grad; Backward receives one gradient per forward output and returns one gradient
// (or an undefined Tensor) per input.
//
//   struct Cube : tg::Function<Cube> {
//     static constexpr const char* kName = "Cube";
//     static tg::VariableList Forward(tg::FunctionCtx& ctx, const tg::VariableList& in) {
//       ctx.save_for_backward({in[0]});
//       return {tg::Tensor(tg::Pow(in[0].data(), 3.0))};
//     }
//     static tg::VariableList Backward(tg::FunctionCtx& ctx, const tg::VariableList& grads) {
//       tg::Tensor x = ctx.saved_variables()[0];
//       return {tg::Mul(grads[0], tg::MulScalar(tg::Mul(x, x), 3))};   // 3x^2 * g
//     }
//   };
//   tg::Tensor y = Cube::Apply({x})[0];   // y.grad_fn()->name() == "CubeBackward"
//
// Semantics follow PyTorch where docs/architecture.md is silent:
// - Forward runs inside a ForwardScope (autograd/engine.h), as nn modules' forwards do: a
//   backward it starts itself (EnableGradGuard + Engine::Backward on an inner graph, e.g. a tiled
//   loss accumulating a weight's gradient tile by tile) is flagged as issued in forward.
// - Backward runs with grad mode == create_graph, so a Backward composed of differentiable
//   ops gives higher-order gradients; it may call Engine::Backward itself (a nested task).
// - Gradients of outputs that received none (or are non-differentiable) arrive as zeros
//   (PyTorch's default materialize_grads=True), even when none of them received one; after
//   ctx.set_materialize_grads(false) in Forward they arrive undefined, as PyTorch's None.
// - ctx.mark_dirty({x}) in Forward declares that Forward modified input x in place (on its
//   data) and returns x as an output: x's version is bumped and x itself becomes that output,
//   its history rebased onto the function's node (PyTorch's in-place custom functions). As
//   PyTorch's: a leaf that requires grad may not be dirty while grad mode is on ("a leaf
//   Variable that requires grad has been used in an in-place operation.", after Forward ran),
//   every dirty input must be returned, and the bump comes on top of any bump of the write
//   itself (an in-place tg::Tensor op in Forward: two). A view may be dirty only when nothing is
//   recorded (tapegrad has no CopySlices for custom nodes; the error says so).
// - A function with `static constexpr bool kOnceDifferentiable = true;` (Python's
//   @once_differentiable) runs Backward under no-grad; with create_graph its gradients carry a
//   node ("Error", as PyTorch names it) that throws "trying to differentiate twice a function that
//   was marked with
//   @once_differentiable" if a further backward reaches it.
// - An undefined gradient returned for an input is "no gradient", not zeros: built-in nodes
//   that receive nothing else pass none on, a leaf's .grad stays as it was (undefined if it
//   was), Engine::Grad gives an undefined result (allow_unused) and optimizers skip the
//   parameter, as in PyTorch.
// - A gradient returned for an input that does not require grad is ignored; one whose shape
//   differs from its input's is an error, as is returning the wrong number of gradients.
// - Saved variables are version-checked like those of built-in ops, go through active
//   SavedTensorHooks, and are released after the backward unless retain_graph.
// - Outputs are fresh variables sharing the data Forward returned (an input returned as is
//   becomes a new non-leaf, like PyTorch's view of it); integer outputs never require grad.
// - Not supported (unlike PyTorch): undefined outputs. Non-tensor results go in
//   FunctionCtx::saved_data.
#ifndef TAPEGRAD_AUTOGRAD_FUNCTION_H_
#define TAPEGRAD_AUTOGRAD_FUNCTION_H_

#include <any>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"

namespace tg {

class FunctionCtx;
using CustomForwardFn = std::function<VariableList(FunctionCtx& ctx)>;
using CustomBackwardFn = std::function<VariableList(FunctionCtx& ctx, const VariableList& grads)>;

// What Forward and Backward share: saved variables, flags and arbitrary non-tensor data.
class FunctionCtx {
 public:
  // In Forward: the variables Backward will need (inputs, outputs or intermediates; undefined
  // entries are allowed). Replaces an earlier call, as in PyTorch.
  void save_for_backward(VariableList variables);
  // In Backward: the saved variables in save order. Throws if one was modified in place after
  // it was saved, or if the graph was already released (a second backward without
  // retain_graph).
  VariableList saved_variables() const;
  // Whether input `i` requires a gradient: it requires grad and grad mode was on when the
  // function was applied (PyTorch's ctx.needs_input_grad). False for every input of a
  // function that was not recorded.
  bool needs_input_grad(size_t i) const;
  // In Forward: these outputs (as returned by Forward) are not differentiable; they do not
  // require grad and their gradient in Backward is always zeros.
  void mark_non_differentiable(const VariableList& outputs);
  // In Forward: these inputs were modified in place and are returned (see the file comment).
  void mark_dirty(const VariableList& inputs);
  // In Forward: false makes the gradients of outputs that received none arrive undefined.
  void set_materialize_grads(bool value) { materialize_grads_ = value; }

  // Non-tensor data for Backward (sizes, flags, closures, generator states, ...).
  std::unordered_map<std::string, std::any> saved_data;

 private:
  friend class CustomFunctionNode;

  std::vector<bool> needs_input_grad_;
  VariableList to_save_;             // set by Forward, turned into saved_ once outputs exist
  VariableList non_differentiable_;  // set by Forward
  VariableList dirty_;               // set by Forward
  bool materialize_grads_ = true;
  std::vector<SavedVariable> saved_;
  const Node* node_ = nullptr;  // the owning node (named in errors); null if unrecorded
};

// The node a custom function records; its name is "<kName>Backward".
class CustomFunctionNode : public Node {
 public:
  // The non-template core of Function<T>::Apply: runs `forward` under no-grad and, when grad
  // mode is on and an input requires grad, records a node that calls `backward`.
  static VariableList ApplyFunction(const char* name, const VariableList& inputs,
                                    const CustomForwardFn& forward, CustomBackwardFn backward,
                                    bool once_differentiable = false);

  CustomFunctionNode(std::string name, CustomBackwardFn backward, bool once_differentiable);
  VariableList Apply(VariableList grads) override;
  std::string name() const override { return name_; }
  void ReleaseSaved() override;
  FunctionCtx& ctx() { return ctx_; }

 private:
  std::string name_;
  CustomBackwardFn backward_;
  bool once_differentiable_;
  FunctionCtx ctx_;                  // PyTorch's ctx is the node itself; here the node owns it
  std::vector<Shape> input_shapes_;  // checked against the returned gradients
};

// Whether T declares kOnceDifferentiable = true.
template <typename T, typename = void>
struct IsOnceDifferentiable : std::false_type {};
template <typename T>
struct IsOnceDifferentiable<T, std::void_t<decltype(T::kOnceDifferentiable)>>
    : std::bool_constant<T::kOnceDifferentiable> {};

// CRTP base: Derived provides kName, Forward(ctx, inputs, extra...) and Backward(ctx, grads).
template <typename Derived>
struct Function {
  // Applies the function to `inputs`; `extra` (non-tensor arguments) are passed on to Forward.
  template <typename... Extra>
  static VariableList Apply(const VariableList& inputs, Extra&&... extra) {
    return CustomFunctionNode::ApplyFunction(
        Derived::kName, inputs,
        [&](FunctionCtx& ctx) {
          return Derived::Forward(ctx, inputs, std::forward<Extra>(extra)...);
        },
        [](FunctionCtx& ctx, const VariableList& grads) { return Derived::Backward(ctx, grads); },
        IsOnceDifferentiable<Derived>::value);
  }
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_FUNCTION_H_
