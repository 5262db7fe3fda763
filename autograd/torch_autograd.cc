#include "autograd/torch_autograd.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tg::autograd {
namespace {

// Where the IValue map and the tensor positions live in the node's FunctionCtx::saved_data.
constexpr const char* kValues = "tg::autograd::saved_data";
constexpr const char* kPositions = "tg::autograd::tensor_positions";

using ValueMap = std::unordered_map<std::string, IValue>;

template <typename T>
T& Slot(FunctionCtx& ctx, const char* key) {
  std::any& slot = ctx.saved_data[key];
  if (!slot.has_value()) slot = T();
  return *std::any_cast<T>(&slot);
}

}  // namespace

variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs, std::optional<bool> retain_graph,
                   bool create_graph, bool allow_unused) {
  GradOptions options;
  options.create_graph = create_graph;
  options.retain_graph = retain_graph.value_or(create_graph);
  options.allow_unused = allow_unused;
  const VariableList result = Engine::Grad(
      VariableList(outputs.begin(), outputs.end()), VariableList(inputs.begin(), inputs.end()),
      VariableList(grad_outputs.begin(), grad_outputs.end()), options);
  return variable_list(result.begin(), result.end());
}

double IValue::toDouble() const {
  if (const int64_t* i = std::get_if<int64_t>(&value_)) return static_cast<double>(*i);
  return Get<double>("double");
}

const char* IValue::KindName() const {
  switch (value_.index()) {
    case 0:
      return "None";
    case 1:
      return "double";
    case 2:
      return "int";
    case 3:
      return "bool";
    case 4:
      return "Tensor";
    case 5:
      return "string";
    default:
      return "int list";
  }
}

AutogradContext::AutogradContext(FunctionCtx& ctx)
    : saved_data(Slot<ValueMap>(ctx, kValues)), ctx_(ctx) {}

void AutogradContext::save_for_backward(const variable_list& to_save) {
  ctx_.save_for_backward(VariableList(to_save.begin(), to_save.end()));
}
variable_list AutogradContext::get_saved_variables() const {
  const VariableList saved = ctx_.saved_variables();
  return variable_list(saved.begin(), saved.end());
}
void AutogradContext::mark_non_differentiable(const variable_list& outputs) {
  ctx_.mark_non_differentiable(VariableList(outputs.begin(), outputs.end()));
}
bool AutogradContext::needs_input_grad(size_t i) const {
  const std::vector<size_t>& positions = const_cast<AutogradContext*>(this)->tensor_positions();
  for (size_t k = 0; k < positions.size(); ++k) {
    if (positions[k] == i) return ctx_.needs_input_grad(k);
  }
  return false;  // not a Tensor argument
}
void AutogradContext::mark_dirty(const variable_list& inputs) {
  ctx_.mark_dirty(VariableList(inputs.begin(), inputs.end()));
}
void AutogradContext::set_materialize_grads(bool value) { ctx_.set_materialize_grads(value); }
std::vector<size_t>& AutogradContext::tensor_positions() {
  return Slot<std::vector<size_t>>(ctx_, kPositions);
}

namespace detail {


VariableList GradientsOfTensorArguments(const variable_list& grads, size_t num_args,
                                        const std::vector<size_t>& positions, const char* name) {
  TG_CHECK(grads.size() == num_args, name, "Backward: backward returned ", grads.size(),
           " gradients, expected ", num_args,
           " (one per argument of forward, undefined for "
           "the non-Tensor ones)");
  VariableList out;
  for (size_t p : positions) out.push_back(grads[p]);
  for (size_t p = 0; p < num_args; ++p) {
    const bool is_tensor = std::find(positions.begin(), positions.end(), p) != positions.end();
    TG_CHECK(is_tensor || !grads[p].defined(), name,
             "Backward: backward returned a gradient for "
             "argument ",
             p, ", which is not a Tensor");
  }
  return out;
}

}  // namespace detail
}  // namespace tg::autograd
