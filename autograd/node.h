// Node: one step of the backward graph. A node receives the gradients of the outputs of the
// forward op that created it and returns the gradients of that op's inputs, which flow along
// its next edges. Nodes carry a sequence number (later-created nodes run first among ready
// nodes), the shape/dtype of each gradient they expect, hooks, and saved variables that detect
// in-place modification and are released after the node runs unless retain_graph.
//
// Differentiable ops are written with Record(): the backward is a lambda over the saved
// variables, composed of differentiable ops so that create_graph gives higher-order gradients.
//
//   Tensor Mul(const Tensor& a, const Tensor& b) {
//     return Record("MulBackward", tg::Mul(a.data(), b.data()), {a, b}, {a, b},
//                   [](const BackwardContext& ctx) -> VariableList {
//                     const Tensor& g = ctx.grads[0];
//                     return {Mul(g, ctx.saved[1]), Mul(g, ctx.saved[0])};   // (+ SumTo)
//                   });
//   }
#ifndef TAPEGRAD_AUTOGRAD_NODE_H_
#define TAPEGRAD_AUTOGRAD_NODE_H_

#include <any>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "autograd/variable.h"

namespace tg {

struct Edge {
  std::shared_ptr<Node> fn;  // null: the input does not need a gradient
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// What a node expects for each gradient it receives (the forward output's shape, dtype and
// device): a gradient that no output received is materialised as zeros of exactly this.
struct InputMetadata {
  Shape shape;
  DType dtype = kF32;
  Device device;
};

// Inline storage for the common case of one or two inputs/outputs per node: one allocation
// per recorded op (the node itself) instead of three.
using EdgeList = absl::InlinedVector<Edge, 2>;
using InputMetadataList = absl::InlinedVector<InputMetadata, 1>;

// Node pre-hook: sees the gradients of the node's outputs and may return replacements (an
// empty list keeps them). Post-hook: sees the gradients it produced and received.
using NodePreHook = std::function<VariableList(const VariableList& grad_outputs)>;
using NodePostHook =
    std::function<void(const VariableList& grad_inputs, const VariableList& grad_outputs)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  // Among ready nodes the engine runs the highest sequence number first: later-created nodes,
  // and before them every AccumulateGrad, which has this one (as in PyTorch, so a leaf's hooks
  // run as soon as its gradient is complete).
  static constexpr uint64_t kRunFirst = ~uint64_t{0};
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients w.r.t. the forward outputs -> gradients w.r.t. the forward inputs (one per next
  // edge). An undefined gradient means none flows there: summed with others it counts as zero,
  // but a node that receives only undefined ones passes none on, and a leaf that receives none
  // keeps its .grad (PyTorch's rule). Runs under grad mode == create_graph.
  virtual VariableList Apply(VariableList grads) = 0;
  virtual std::string name() const = 0;
  // The name in engine traces (autograd/trace.h): name(), and for a leaf's AccumulateGrad the
  // leaf's name too.
  virtual std::string trace_name() const { return name(); }
  // Drops saved tensors (after the node ran without retain_graph).
  virtual void ReleaseSaved() {}
  // Whether this is a leaf's AccumulateGrad node (Grad() does not run those).
  virtual bool IsAccumulateGrad() const { return false; }

  uint64_t sequence_nr() const { return sequence_nr_; }
  const EdgeList& next_edges() const { return next_edges_; }
  EdgeList& mutable_next_edges() { return next_edges_; }
  const InputMetadataList& input_metadata() const { return input_metadata_; }
  uint32_t AddInputMetadata(const RawTensor& t);
  size_t num_inputs() const { return input_metadata_.size(); }

  HookHandle RegisterPreHook(NodePreHook hook);
  HookHandle RegisterPostHook(NodePostHook hook);
  // RawTensor hooks of the forward output `output_nr` (run before node pre-hooks).
  HookHandle RegisterTensorHook(uint32_t output_nr, TensorHook hook);
  // retain_grad of output `output_nr`: the variable whose .grad receives the hooked gradient.
  void SetRetainGrad(uint32_t output_nr, const std::weak_ptr<VariableImpl>& var);
  // Forgets the retain_grad of `var` (it moved to another node: RebaseHistory).
  void ClearRetainGrad(const VariableImpl* var);

  // Hook runners used by the engine (in the documented order). Each list runs as it was when
  // its runner reached it (PyTorch iterates over a copy of the hook dict's values): a hook
  // added meanwhile first runs in the next call, a hook removed meanwhile still runs in this
  // one. A tensor-hook group added while the node's tensor hooks run does not run either.
  virtual void RunTensorHooks(VariableList& grads) const;
  void RunRetainGrad(const VariableList& grads) const;
  void RunPreHooks(VariableList& grads) const;
  void RunPostHooks(const VariableList& grad_inputs, const VariableList& grad_outputs) const;
  bool has_post_hooks() const { return extras_ && !extras_->post_hooks.empty(); }
  // How many hooks of each kind are registered (graph exports annotate nodes with these).
  struct HookCounts {
    size_t tensor_hooks = 0, pre_hooks = 0, post_hooks = 0, retain_grad = 0;
  };
  HookCounts hook_counts() const;

  // Where the node was created (a symbolised stack), recorded only in anomaly mode.
  const std::string& creation_trace() const;

  // Whether a non-reentrant checkpoint created this node and recomputes what it saved during
  // backward (BackwardGraphToDot marks it).
  bool recomputed_by_checkpoint() const { return extras_ && extras_->recomputed_by_checkpoint; }
  void MarkRecomputedByCheckpoint() { extras().recomputed_by_checkpoint = true; }
  // The sequence number the next node created on this thread gets.
  static uint64_t next_sequence_nr();

  // Scratch for the engine: the task that last reached this node and the node's slot in that
  // task's state, so lookups during backward are an array access instead of a hash lookup.
  // A nested task may overwrite it; the engine then falls back to its map.
  struct EngineMark {
    int64_t task = -1;
    uint32_t slot = 0;
  };
  EngineMark engine_mark;

 private:
  template <typename T>
  struct Registered {
    uint64_t id;
    T fn;
  };
  // The tensor hooks of one forward output. As in PyTorch (one hook dict per output tensor),
  // the groups run in the order of each output's first registration, each group's hooks in
  // registration order; a group stays when its hooks are removed.
  struct TensorHookGroup {
    uint32_t output_nr;
    std::vector<Registered<TensorHook>> hooks;
  };
  // What few nodes have (hooks, retain_grad, an anomaly-mode trace) lives behind one pointer
  // allocated on first use: a node stays small (fewer cache lines per node in a backward over a
  // large graph) and cheap to create and destroy.
  struct Extras {
    std::vector<Registered<NodePreHook>> pre_hooks;
    std::vector<Registered<NodePostHook>> post_hooks;
    std::vector<TensorHookGroup> tensor_hooks;
    std::vector<std::pair<uint32_t, std::weak_ptr<VariableImpl>>> retain_grad;
    std::string creation_trace;
    uint64_t next_hook_id = 0;
    bool recomputed_by_checkpoint = false;
  };
  Extras& extras();

 protected:
  // A node with a given sequence number (AccumulateGrad: kRunFirst).
  explicit Node(uint64_t sequence_nr);

 private:
  uint64_t sequence_nr_;
  EdgeList next_edges_;
  InputMetadataList input_metadata_;
  std::unique_ptr<Extras> extras_;
};

// A variable saved for backward. It remembers the storage version at save time, and unpacking
// after an in-place change or after release throws an error naming the node. Outputs of the
// saving node are kept without their grad_fn (no reference cycle) and re-linked on unpack.
// When a SavedTensorHooks guard is active, the pack hook decides what is stored, and the
// unpacked variable keeps the saved one's place in the graph (PyTorch's): an output is re-linked
// to its node; an input unpacks as the saved variable itself when that still lives and the hook
// returned its very data (checkpointing: the same handle, its hooks and .grad), and otherwise
// as a new variable with the saved one's grad_fn, or, for a leaf, its gradient accumulator.
class SavedVariable {
 public:
  SavedVariable() = default;
  SavedVariable(const Tensor& v, bool is_output);
  Tensor Unpack(const Node& owner, size_t index) const;
  void Release();
  bool defined() const { return defined_; }

 private:
  Tensor RelinkInput(const Tensor& unpacked) const;

  bool defined_ = false;
  bool released_ = false;
  bool is_output_ = false;
  RawTensor data_;
  Tensor variable_;              // inputs: the variable itself (keeps its history)
  std::weak_ptr<Node> grad_fn_;  // outputs: the producing node, held weakly
  uint32_t output_nr_ = 0;
  bool requires_grad_ = false;
  uint64_t version_ = 0;
  bool packed_ = false;
  std::any packed_value_;
  std::function<Tensor(const std::any&)> unpack_hook_;
  // Packed inputs: the saved variable (weakly: the hooks may exist to free it) and its place
  // in the graph (a non-leaf's node is held, as PyTorch does; it is in the graph anyway).
  std::weak_ptr<VariableImpl> original_;
  std::shared_ptr<Node> input_grad_fn_;
  std::weak_ptr<Node> grad_accumulator_;
};

// Saved-tensor hooks (thread-local, nestable): while a guard lives, every variable saved for
// backward goes through pack() and comes back through unpack() when the backward needs it.
// Non-reentrant checkpointing is built on these; users may install their own (e.g. offload).
using PackHook = std::function<std::any(const Tensor&)>;
using UnpackHook = std::function<Tensor(const std::any&)>;
class SavedTensorHooks {
 public:
  SavedTensorHooks(PackHook pack, UnpackHook unpack);
  ~SavedTensorHooks();
  SavedTensorHooks(const SavedTensorHooks&) = delete;
  SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;
  // The innermost active pair, or null.
  static const std::pair<PackHook, UnpackHook>* Current();
};

struct BackwardContext {
  // One per forward output; zeros where none flowed while another did (a node none of whose
  // outputs received a gradient does not call its backward: its inputs receive none either).
  const VariableList& grads;
  const VariableList& saved;  // the saved variables, in save order
  const EdgeList& edges;      // one per forward input
  // Whether forward input i needs a gradient (has a valid edge).
  bool needs(size_t i) const { return edges[i].valid(); }
};
using BackwardFn = std::function<VariableList(const BackwardContext& ctx)>;

// The node of every built-in differentiable op: a named backward lambda over saved variables.
class FunctionNode : public Node {
 public:
  // `name` must outlive the node (the ops pass string literals).
  FunctionNode(const char* name, BackwardFn backward)
      : name_(name), backward_(std::move(backward)) {}
  VariableList Apply(VariableList grads) override;
  std::string name() const override { return name_; }
  void ReleaseSaved() override;
  void Save(const Tensor& v, bool is_output) { saved_.emplace_back(v, is_output); }

 private:
  const char* name_;
  BackwardFn backward_;
  std::vector<SavedVariable> saved_;  // most ops save 0-2; the node stays small
  bool released_ = false;
};

// Accumulates the gradient of a leaf into its .grad, then runs its post-accumulate-grad hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<VariableImpl> leaf);
  VariableList Apply(VariableList grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  std::string trace_name() const override;
  bool IsAccumulateGrad() const override { return true; }
  // The leaf's own tensor hooks (registration order).
  void RunTensorHooks(VariableList& grads) const override;
  const std::shared_ptr<VariableImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<VariableImpl> leaf_;
};

// After an in-place op recorded `grad_fn` (output `output_nr`) for self's new value, makes that
// node self's history: self becomes a non-leaf. As in PyTorch, a retain_grad() of self moves to
// the new node (.grad is the gradient of the latest value), while tensor hooks registered before
// stay on the old node and see the gradient of the old value.
void RebaseHistory(const Tensor& self, std::shared_ptr<Node> grad_fn, uint32_t output_nr);

// Whether any of `inputs` requires grad while grad mode is on: the op must record a node.
bool ShouldRecord(const VariableList& inputs);

// Records a differentiable op with one output. `inputs` get the edges (in order); `saved` are
// kept for backward (and appear in ctx.saved); `save_output` also saves the result (appended
// last to ctx.saved). Without recording (no grad needed) it only wraps `result`.
Tensor Record(const char* name, RawTensor result, const VariableList& inputs,
              const VariableList& saved, BackwardFn backward, bool save_output = false);
// The same with several outputs.
VariableList RecordMulti(const char* name, absl::Span<const RawTensor> results,
                         const VariableList& inputs, const VariableList& saved,
                         BackwardFn backward);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_NODE_H_
