#include "autograd/function.h"

#include <algorithm>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace tg {

// ---- FunctionCtx -------------------------------------------------------------------------------

void FunctionCtx::save_for_backward(VariableList variables) { to_save_ = std::move(variables); }

VariableList FunctionCtx::saved_variables() const {
  TG_CHECK(node_ != nullptr,
           "saved_variables: the function was not recorded (no input requires "
           "grad or grad mode was off), so nothing was saved");
  VariableList out;
  out.reserve(saved_.size());
  for (size_t i = 0; i < saved_.size(); ++i) out.push_back(saved_[i].Unpack(*node_, i));
  return out;
}

bool FunctionCtx::needs_input_grad(size_t i) const {
  TG_CHECK(i < needs_input_grad_.size(), "needs_input_grad: index ", i, " out of range for ",
           needs_input_grad_.size(), " inputs");
  return needs_input_grad_[i];
}

void FunctionCtx::mark_non_differentiable(const VariableList& outputs) {
  non_differentiable_.insert(non_differentiable_.end(), outputs.begin(), outputs.end());
}

void FunctionCtx::mark_dirty(const VariableList& inputs) {
  dirty_.insert(dirty_.end(), inputs.begin(), inputs.end());
}

namespace {

constexpr char kTwiceMessage[] =
    "trying to differentiate twice a function that was marked with @once_differentiable";

// The grad_fn of a once-differentiable function's gradients under create_graph (PyTorch's
// DelayedError): reaching it in a backward is the error.
class DelayedErrorNode : public Node {
 public:
  explicit DelayedErrorNode(std::string function) : function_(std::move(function)) {}
  VariableList Apply(VariableList) override {
    throw Error(absl::StrCat(function_, ": ", kTwiceMessage));
  }
  std::string name() const override { return "Error"; }  // PyTorch's DelayedError node

 private:
  std::string function_;
};

}  // namespace

// ---- CustomFunctionNode ------------------------------------------------------------------------

CustomFunctionNode::CustomFunctionNode(std::string name, CustomBackwardFn backward,
                                       bool once_differentiable)
    : name_(std::move(name)),
      backward_(std::move(backward)),
      once_differentiable_(once_differentiable) {
  ctx_.node_ = this;
}

VariableList CustomFunctionNode::ApplyFunction(const char* name, const VariableList& inputs,
                                               const CustomForwardFn& forward,
                                               CustomBackwardFn backward,
                                               bool once_differentiable) {
  const bool record = ShouldRecord(inputs);
  // The node exists before Forward runs (as in PyTorch, where ctx is the node), so Forward
  // fills the ctx that Backward will see; without recording a throwaway ctx serves.
  std::shared_ptr<CustomFunctionNode> node;
  FunctionCtx unrecorded;
  FunctionCtx* ctx = &unrecorded;
  if (record) {
    node = std::make_shared<CustomFunctionNode>(absl::StrCat(name, "Backward"), std::move(backward),
                                                once_differentiable);
    ctx = &node->ctx_;
  }
  ctx->needs_input_grad_.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    ctx->needs_input_grad_[i] = record && inputs[i].requires_grad();
  }

  VariableList outputs;
  {
    // Forward computes on data: nothing it does is recorded, only the node below. It is
    // forward-pass code: a backward it runs itself (a tiled loss computing a weight's gradient
    // tile by tile) is flagged as issued in forward, as inside nn::Module::operator().
    NoGradGuard no_grad;
    ForwardScope forward_scope;
    outputs = forward(*ctx);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    TG_CHECK(outputs[i].defined(), "function ", name, ": Forward returned an undefined output ", i);
  }
  // Dirty inputs: each must be an input and an output; each is checked as an in-place op's self
  // is, and its version counts the write.
  std::vector<bool> output_is_dirty(outputs.size(), false);
  for (const Tensor& d : ctx->dirty_) {
    const bool is_input =
        std::any_of(inputs.begin(), inputs.end(), [&](const Tensor& in) { return in.is_same(d); });
    TG_CHECK(is_input, "function ", name, ": mark_dirty was given a tensor that is not an input");
    bool returned = false;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].is_same(d)) output_is_dirty[i] = returned = true;
    }
    TG_CHECK(returned, "function ", name,
             ": Some elements marked as dirty during the forward method were not returned as "
             "output. The inputs that are modified inplace must all be outputs of the Function.");
    if (record) {
      TG_CHECK(!(d.is_leaf() && d.requires_grad()), "function ", name,
               ": a leaf Variable that requires grad has been used in an in-place operation.");
      TG_CHECK(!d.is_view(), "function ", name,
               ": mark_dirty of a view while recording is not supported (no CopySlices for "
               "custom functions); make the function work on the base, or clone the view");
    }
    d.bump_version();  // as PyTorch's, on top of any bump of the write itself
  }
  if (!record) return outputs;

  auto& edges = node->mutable_next_edges();
  edges.reserve(inputs.size());
  node->input_shapes_.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    edges.push_back(in.defined() ? Edge{in.gradient_edge_node(), in.output_nr()} : Edge{});
    node->input_shapes_.push_back(in.defined() ? in.shape() : Shape{});
  }

  // Outputs get fresh variables sharing the forward's data (so an input returned as is becomes
  // a new non-leaf rather than having its own history rewritten).
  auto is_marked = [&](const Tensor& out) {
    return std::any_of(ctx->non_differentiable_.begin(), ctx->non_differentiable_.end(),
                       [&](const Tensor& v) { return v.is_same(out); });
  };
  VariableList results;
  results.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const RawTensor& data = outputs[i].data();
    node->AddInputMetadata(data);
    // Integer outputs cannot carry gradients (PyTorch treats them as non-differentiable too).
    if (output_is_dirty[i]) {
      // The input itself becomes this output: its history is rebased onto the node.
      if (!is_marked(outputs[i]) && IsFloating(data.dtype())) {
        RebaseHistory(outputs[i], node, static_cast<uint32_t>(i));
      }
      results.push_back(outputs[i]);
    } else if (is_marked(outputs[i]) || !IsFloating(data.dtype())) {
      results.emplace_back(data);
    } else {
      results.push_back(MakeNonLeaf(data, node, static_cast<uint32_t>(i)));
    }
  }

  // Saved outputs are saved as outputs (their grad_fn held weakly: no node -> itself cycle).
  // Saving happens after Forward, so the recorded versions are those Backward must see.
  for (const Tensor& v : ctx->to_save_) {
    if (!v.defined()) {
      ctx->saved_.emplace_back();
      continue;
    }
    auto it = std::find_if(outputs.begin(), outputs.end(),
                           [&](const Tensor& out) { return out.is_same(v); });
    if (it == outputs.end()) {
      ctx->saved_.emplace_back(v, /*is_output=*/false);
    } else {
      const Tensor& result = results[static_cast<size_t>(it - outputs.begin())];
      ctx->saved_.emplace_back(result, /*is_output=*/result.grad_fn() == node);
    }
  }
  ctx->to_save_.clear();
  ctx->non_differentiable_.clear();
  ctx->dirty_.clear();
  return results;
}

VariableList CustomFunctionNode::Apply(VariableList grads) {
  // Outputs that received no gradient (or cannot) count as zeros (materialize_grads).
  for (size_t i = 0; i < grads.size() && ctx_.materialize_grads_; ++i) {
    if (!grads[i].defined()) {
      const InputMetadata& m = input_metadata()[i];
      grads[i] = Tensor(RawTensor::Zeros(m.shape, m.dtype, m.device));
    }
  }
  VariableList result;
  if (once_differentiable_) {
    const bool create_graph = GradMode::is_enabled();
    {
      NoGradGuard no_grad;
      result = backward_(ctx_, grads);
    }
    // Under create_graph, gradients that would depend on grads requiring grad get a node that
    // refuses a second differentiation (edges to those grads, as PyTorch's DelayedError).
    const bool any = std::any_of(grads.begin(), grads.end(),
                                 [](const Tensor& g) { return g.defined() && g.requires_grad(); });
    if (create_graph && any) {
      auto delayed = std::make_shared<DelayedErrorNode>(name_);
      for (const Tensor& g : grads) {
        delayed->mutable_next_edges().push_back(g.defined() && g.requires_grad()
                                                    ? Edge{g.gradient_edge_node(), g.output_nr()}
                                                    : Edge{});
      }
      for (size_t i = 0; i < result.size(); ++i) {
        if (!result[i].defined()) continue;
        const uint32_t nr = delayed->AddInputMetadata(result[i].data());
        result[i] = MakeNonLeaf(result[i].data(), delayed, nr);
      }
    }
  } else {
    result = backward_(ctx_, grads);
  }
  const auto& edges = next_edges();
  TG_CHECK(result.size() == edges.size(), "function ", name_,
           " returned an incorrect number of gradients (expected ", edges.size(), ", got ",
           result.size(), ")");
  for (size_t i = 0; i < result.size(); ++i) {
    if (!edges[i].valid()) {
      result[i] = Tensor();  // the input does not require grad: ignored, as in PyTorch
      continue;
    }
    if (!result[i].defined()) continue;
    // Checked here (not only by the engine) so the message names the function and the input.
    TG_CHECK(result[i].shape() == input_shapes_[i], "function ", name_,
             " returned a gradient of shape ", ShapeToString(result[i].shape()), " for input ", i,
             ", which has shape ", ShapeToString(input_shapes_[i]));
  }
  return result;
}

void CustomFunctionNode::ReleaseSaved() {
  for (SavedVariable& s : ctx_.saved_) s.Release();
}

}  // namespace tg
