// Engine: runs the backward graph. Every Backward() / Grad() call is one GraphTask with an id
// from a process-wide counter; nodes run in dependency order, among the ready ones a leaf's
// AccumulateGrad first and then later-created nodes first (PyTorch's order); callbacks queued
// during the task run FIFO once every node ran and every .grad was accumulated, before the
// call returns. A backward issued from inside a node, hook or callback runs as a nested task
// (its own id and callbacks) that completes before the outer task continues; deep nesting
// hands off to a fresh thread every kMaxDepthPerThread levels, so recursion never overflows a
// stack.
//
//   loss.backward();                                     // Engine::Backward({loss}, {}, {})
//   auto [gx] = Engine::Grad({y}, {x}, {}, {.create_graph = true});
//   tg::queue_callback([] { /* after all .grad are final */ });   // only inside backward
#ifndef TAPEGRAD_AUTOGRAD_ENGINE_H_
#define TAPEGRAD_AUTOGRAD_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"

namespace tg {

struct GradOptions {
  bool retain_graph = false;
  bool create_graph = false;  // also implies retain_graph, as in PyTorch
  // An input that receives no gradient gets an undefined one instead of an error: the outputs
  // do not depend on it, or every path to it carries none (a custom function's Backward
  // returned an undefined gradient on the way), as PyTorch.
  bool allow_unused = false;
};

// PyTorch's torch.autograd.graph.GradientEdge: the place where a tensor's gradient enters the
// graph (its grad_fn and output number, or a leaf's AccumulateGrad), which stays valid after
// the tensor is gone. As Engine::Grad's input it captures the gradient there, as the tensor
// would; as an output it starts the backward there (Engine::GradEdges). Pipeline schedules
// (zero-bubble) split a backward with it: first the gradient of an activation, then from that
// activation's edge the weights' gradients.
struct GradientEdge {
  std::shared_ptr<Node> node;
  uint32_t output_nr = 0;
};
// Throws "get_gradient_edge: It is not possible to get the gradient edge for a Tensor that does
// not require gradients" (PyTorch's message) for one that does not.
GradientEdge get_gradient_edge(const Tensor& t);

// A tensor or a GradientEdge, for Engine::Grad's outputs and inputs.
class GradTarget {
 public:
  GradTarget(Tensor t) : tensor_(std::move(t)) {}                      // NOLINT: implicit
  GradTarget(GradientEdge e) : edge_(std::move(e)), is_edge_(true) {}  // NOLINT
  bool is_edge() const { return is_edge_; }
  const Tensor& tensor() const { return tensor_; }
  const GradientEdge& edge() const { return edge_; }

 private:
  Tensor tensor_;
  GradientEdge edge_;
  bool is_edge_ = false;
};

class Engine {
 public:
  // Accumulates d(roots)/d(leaves) into the leaves' .grad. grad_outputs may be empty or hold
  // undefined entries for one-element roots (implicit 1); otherwise each must match its root's
  // shape, and one of another dtype is cast to the root's (a 0-d one on another device is
  // moved), as PyTorch does. With options.inputs, only those variables accumulate and only the
  // nodes that lead to them run (no hook of any other node fires); a non-leaf input gets
  // retain_grad() (it stays on) and its grad_fn runs, but nothing below it unless needed.
  static void Backward(const VariableList& roots, const VariableList& grad_outputs = {},
                       const BackwardOptions& options = {});
  // Returns d(outputs)/d(inputs) without touching any leaf's .grad; only the nodes that lead
  // to the inputs run. An input's gradient is captured where it enters the input's node: if
  // no other input lies below that node, after its tensor hooks (and retain_grad), and the
  // node does not run; otherwise before them, and the node runs (PyTorch's order).
  static VariableList Grad(const VariableList& outputs, const VariableList& inputs,
                           const VariableList& grad_outputs = {}, const GradOptions& options = {});
  // Grad with GradientEdges among the outputs (a grad_output is implied only for one element,
  // as for tensors) or the inputs
  // (PyTorch's torch.autograd.grad takes either; a name of its own keeps braced lists of
  // tensors unambiguous).
  static VariableList GradEdges(const std::vector<GradTarget>& outputs,
                                const std::vector<GradTarget>& inputs,
                                const VariableList& grad_outputs = {},
                                const GradOptions& options = {});

  // Nested tasks beyond this many on one thread continue on a fresh thread.
  static constexpr int kMaxDepthPerThread = 48;
};

// The innermost running graph task's id on this thread, -1 outside backward.
int64_t current_graph_task_id();
// The id of the GraphExecGroup (autograd/checkpoint.h) alive on this thread, -1 for none; a
// backward handed off to a fresh thread carries it there. Set only by GraphExecGroup.
int64_t current_graph_exec_group();
void set_current_graph_exec_group(int64_t id);
// 0 for a task started outside backward, parent depth + 1 for a nested one; -1 outside.
int current_reentrant_depth();
// Appends to the current task's final callbacks; throws
// "callbacks can only be queued during backward" outside backward.
// `trace_name` names the callback in engine traces (autograd/trace.h): what queued it, a string
// literal (it is kept, not copied).
void queue_callback(std::function<void()> callback, const char* trace_name = "callback");
// The outermost task of the current nesting (the user's backward when the current task is a
// reentrant one, e.g. inside a checkpoint); -1 outside backward.
int64_t outermost_graph_task_id();
// Appends to the outermost task's final callbacks: they run once the whole backward, nested
// tasks included, is done (post-backward epilogues queued from hooks that may fire in nested
// tasks). Throws "callbacks can only be queued during backward" outside backward.
void queue_callback_on_outermost_task(std::function<void()> callback,
                                      const char* trace_name = "callback");

// Marks code that computes a forward pass: nn::Module::operator() enters one around its
// pre-hooks, forward and hooks, a custom Function around its Forward, and DDP around the wrapped
// module. A backward started inside it outside any backward (an auxiliary backward issued by a
// model's forward or a forward hook, a tiled loss's per-tile backward) is flagged, and so are
// the tasks nested in it, so that the post-backward epilogues keyed to the user's backward
// (mixed-precision master grads, DDP, ZeRO) do not run for it: the gradients it accumulates
// stay in .grad and are included by the next user backward's epilogue (DeepSpeed's rule). A
// backward started inside an already running backward (e.g. a checkpoint's recomputation)
// takes its parent task's flag, whatever scope is active.
class ForwardScope {
 public:
  ForwardScope();
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;
  static bool active();
};
// Inside backward: whether the outermost task was started inside a ForwardScope.
bool backward_issued_in_forward();

// Marks a checkpoint's recomputation of a forward (autograd/checkpoint.cc enters one around the
// checkpointed function, in both modes). Engine::Backward started inside it throws: the gradients
// such a backward accumulates (a tiled loss's per-tile backward, a forward hook's auxiliary
// backward) were accumulated when the forward first ran, and the recomputation would add them a
// second time. PyTorch adds them twice; tapegrad refuses (docs/semantics.md). Engine::Grad()
// accumulates nothing and stays allowed.
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
  static bool active();
};

// Inside backward: whether the current task will run `node` (PyTorch's
// _will_engine_execute_node): every node of the graph for a plain Backward; with inputs, the
// nodes some requested gradient lies below, and Grad()'s captured non-leaf inputs (only their
// tensor hooks run). A leaf's AccumulateGrad never runs under Grad(): asked about a leaf that
// is an input of the running Grad() (its hooks run, its AccumulateGrad does not), it throws
// "will_execute: the node is the AccumulateGrad of a leaf ... that is an input of the running
// Engine::Grad() ...", as PyTorch raises there; other leaves of a Grad() give false.
bool will_execute(const std::shared_ptr<Node>& node);
// Inside backward: whether the current task computes only some gradients (Grad(), or
// Backward with inputs); reentrant checkpointing refuses to run under such a task.
bool current_task_is_partial();

// Multi-grad hooks (PyTorch's torch.autograd.graph.register_multi_grad_hook): one tensor hook
// per variable of `vars`, so they run where tensor hooks run (in registration order among the
// variable's other tensor hooks) and only in graph tasks that reach the variable. `fn` runs at
// most once per graph task (a nested backward is a task of its own):
// - kAll: once every variable the task reaches has received its gradient (those the task does
//   not reach count as undefined: not in the graph, or not needed for Grad()'s inputs or
//   Backward's inputs); `grads` holds one gradient per variable, undefined where none came.
// - kAny: at the first gradient of any of them; `grads` holds that one gradient at its
//   variable's position and undefined elsewhere (PyTorch passes the one tensor: use the
//   overload below for that signature). Tensors that do not require grad are skipped.
// The handle removes every hook. Unlike PyTorch (which raises there), a leaf passed to
// Engine::Grad as an input counts as reached in kAll mode: its tensor hooks do run.
enum class MultiGradMode { kAll, kAny };
HookHandle register_multi_grad_hook(const VariableList& vars,
                                    std::function<void(const VariableList& grads)> fn,
                                    MultiGradMode mode = MultiGradMode::kAll);
// kAny with PyTorch's signature: `fn` receives only the first gradient. `mode` must be kAny.
HookHandle register_multi_grad_hook(const VariableList& vars,
                                    std::function<void(const Tensor& grad)> fn, MultiGradMode mode);

// Anomaly mode (process-wide): nodes record where they were created, and a backward whose
// node produces NaN/inf throws naming that node's forward op and its creation site.
class AnomalyMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : previous_(AnomalyMode::is_enabled()) { AnomalyMode::set_enabled(true); }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(previous_); }

 private:
  bool previous_;
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_ENGINE_H_
