// libtorch's torch::autograd namespace, spelled tg::autograd: grad() with libtorch's signature,
// and custom functions as `struct F : tg::autograd::Function<F>` with static forward(ctx, ...)
// and backward(ctx, grad_outputs), applied with F::apply(...). Both run on the engine's own
// machinery (Engine::Grad, tg::Function's CustomFunctionNode), so hooks, saved-variable checks
// and error texts are the engine's.
//
//   struct MulConstant : tg::autograd::Function<MulConstant> {
//     static tg::Tensor forward(tg::autograd::AutogradContext* ctx, tg::Tensor x, double c) {
//       ctx->saved_data["c"] = c;
//       return x * c;
//     }
//     static tg::autograd::variable_list backward(tg::autograd::AutogradContext* ctx,
//                                                 tg::autograd::variable_list g) {
//       return {g[0] * ctx->saved_data["c"].toDouble(), tg::Tensor()};  // one per argument
//     }
//   };
//   tg::Tensor y = MulConstant::apply(x, 5.5);   // y.grad_fn()->name() == "MulConstantBackward"
#ifndef TAPEGRAD_AUTOGRAD_TORCH_AUTOGRAD_H_
#define TAPEGRAD_AUTOGRAD_TORCH_AUTOGRAD_H_

#include <any>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/variable.h"
#include "tensor/class_name.h"
#include "tensor/error.h"

namespace tg::autograd {

using variable_list = std::vector<Tensor>;
using tensor_list = std::vector<Tensor>;

// d(outputs)/d(inputs) (libtorch's torch::autograd::grad): retain_graph defaults to
// create_graph; an input the outputs do not reach is an error unless allow_unused.
variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs = {},
                   std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                   bool allow_unused = false);

// One value of a custom function's saved_data (libtorch's IValue, for the kinds functions
// save): a number, a flag, a tensor, a string or a list of integers.
class IValue {
 public:
  IValue() = default;
  IValue(double v) : value_(v) {}                           // NOLINT: implicit, as libtorch's
  IValue(int64_t v) : value_(v) {}                          // NOLINT
  IValue(int v) : value_(int64_t{v}) {}                     // NOLINT
  IValue(bool v) : value_(v) {}                             // NOLINT
  IValue(Tensor v) : value_(std::move(v)) {}                // NOLINT
  IValue(std::string v) : value_(std::move(v)) {}           // NOLINT
  IValue(const char* v) : value_(std::string(v)) {}         // NOLINT
  IValue(std::vector<int64_t> v) : value_(std::move(v)) {}  // NOLINT

  bool isNone() const { return value_.index() == 0; }
  // A number saved as an integer reads as a double too, as in libtorch.
  double toDouble() const;
  int64_t toInt() const { return Get<int64_t>("int"); }
  bool toBool() const { return Get<bool>("bool"); }
  Tensor toTensor() const { return Get<Tensor>("Tensor"); }
  const std::string& toStringRef() const { return Get<std::string>("string"); }
  std::vector<int64_t> toIntVector() const { return Get<std::vector<int64_t>>("int list"); }

 private:
  template <typename T>
  const T& Get(const char* want) const {
    const T* v = std::get_if<T>(&value_);
    TG_CHECK(v != nullptr, "IValue: expected ", want, ", holds ", KindName());
    return *v;
  }
  const char* KindName() const;
  std::variant<std::monostate, double, int64_t, bool, Tensor, std::string, std::vector<int64_t>>
      value_;
};

// What forward and backward of a custom function share (libtorch's AutogradContext): a view of
// the node's FunctionCtx.
class AutogradContext {
 public:
  explicit AutogradContext(FunctionCtx& ctx);
  void save_for_backward(const variable_list& to_save);
  variable_list get_saved_variables() const;
  void mark_non_differentiable(const variable_list& outputs);
  // Whether the Tensor argument at position `i` of forward (counting every argument, as
  // libtorch does) requires a gradient.
  bool needs_input_grad(size_t i) const;
  // In-place custom functions and undefined gradients (autograd/function.h says the rules).
  void mark_dirty(const variable_list& inputs);
  void set_materialize_grads(bool value);

  std::unordered_map<std::string, IValue>& saved_data;

  // The Tensor arguments' positions among forward's arguments (set by Function::apply).
  std::vector<size_t>& tensor_positions();

 private:
  FunctionCtx& ctx_;
};

namespace detail {
template <typename A>
void CollectTensor(const A& arg, size_t position, VariableList* inputs,
                   std::vector<size_t>* positions) {
  if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) {
    inputs->push_back(arg);
    positions->push_back(position);
  }
}
inline VariableList AsList(const Tensor& t) { return {t}; }
inline VariableList AsList(const variable_list& ts) { return VariableList(ts.begin(), ts.end()); }
VariableList GradientsOfTensorArguments(const variable_list& grads, size_t num_args,
                                        const std::vector<size_t>& positions, const char* name);
}  // namespace detail

// CRTP base: T has static forward(AutogradContext*, args...) returning a Tensor or a
// variable_list, and static backward(AutogradContext*, variable_list) returning one gradient
// per argument of forward (undefined for the non-Tensor ones, as libtorch requires).
template <class T>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    static const std::string name = UnqualifiedClassName(typeid(T).name());
    VariableList inputs;
    std::vector<size_t> positions;
    size_t position = 0;
    (detail::CollectTensor(args, position++, &inputs, &positions), ...);
    constexpr size_t kNumArgs = sizeof...(Args);
    using Result = decltype(T::forward(std::declval<AutogradContext*>(), args...));
    VariableList outputs = CustomFunctionNode::ApplyFunction(
        name.c_str(), inputs,
        [&](FunctionCtx& function_ctx) {
          AutogradContext ctx(function_ctx);
          ctx.tensor_positions() = positions;
          return detail::AsList(T::forward(&ctx, args...));
        },
        [](FunctionCtx& function_ctx, const VariableList& grads) {
          AutogradContext ctx(function_ctx);
          const variable_list out = T::backward(&ctx, variable_list(grads.begin(), grads.end()));
          return detail::GradientsOfTensorArguments(out, kNumArgs, ctx.tensor_positions(),
                                                    name.c_str());
        });
    if constexpr (std::is_same_v<Result, Tensor>) {
      return Tensor(outputs[0]);
    } else {
      return variable_list(outputs.begin(), outputs.end());
    }
  }
};

}  // namespace tg::autograd

#endif  // TAPEGRAD_AUTOGRAD_TORCH_AUTOGRAD_H_
