#include "autograd/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <queue>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "autograd/autocast.h"
#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/trace.h"
#include "tensor/error.h"
#include "tensor/op_list.h"
#include "tensor/ops.h"

namespace tg {
namespace {

std::atomic<int64_t> next_graph_task_id{0};
std::atomic<bool> anomaly_enabled{false};

// Per-node bookkeeping of one task: unmet dependencies, the gradient buffer (one slot per
// node input), and what the task does with the node (PyTorch's exec_info). A task with inputs
// (Grad(), Backward(inputs=)) runs a node only when it is `needed` (some requested gradient
// lies below it); Grad() `captured` nodes deliver a requested gradient. A node that is neither
// never receives a gradient: none of its hooks run.
struct NodeState {
  uint64_t sequence_nr = 0;  // the node's, copied so queueing it does not touch the node
  int dependencies = 0;
  bool needed = true;
  bool captured = false;
  bool reached() const { return needed || captured; }
  VariableList buffer;
};

struct Capture {
  Node* node;
  uint32_t input_nr;
  size_t index;  // position in Grad()'s result
};

struct GraphTask {
  int64_t id = 0;
  int depth = 0;
  GraphTask* outermost = this;     // the depth-0 task this one is nested in (itself at depth 0)
  bool issued_in_forward = false;  // the outermost task started inside a ForwardScope
  bool keep_graph = false;
  bool create_graph = false;
  bool partial = false;           // only nodes leading to `inputs` run
  const char* kind = "backward";  // or "grad" (the trace's name for the task)
  // One slot per node reached from the roots, filled once by ComputeDependencies (so pointers
  // into it stay valid), found through Node::engine_mark. Only when a nested task overwrote a
  // mark (or for nodes outside this task) is the node -> slot map needed; it is built then.
  std::vector<NodeState> states;
  std::vector<Node*> nodes;  // nodes[slot]
  absl::flat_hash_map<Node*, uint32_t> slots;
  NodeState* Find(Node* node) {
    if (node->engine_mark.task == id) return &states[node->engine_mark.slot];
    if (slots.empty() && !nodes.empty()) {
      slots.reserve(nodes.size());
      for (uint32_t i = 0; i < nodes.size(); ++i) slots.emplace(nodes[i], i);
    }
    auto it = slots.find(node);
    return it == slots.end() ? nullptr : &states[it->second];
  }
  struct Callback {
    std::function<void()> fn;
    const char* trace_name;
  };
  std::vector<Callback> callbacks;
  std::vector<Capture> captures;
  VariableList captured;
  // The roots' nodes (keeping their graph alive while the task runs), and other nodes the task
  // refers to (AccumulateGrad nodes of inputs, created on demand).
  std::vector<std::shared_ptr<Node>> roots;
  std::vector<std::shared_ptr<Node>> keep_alive;
};

thread_local GraphTask* current_task = nullptr;
thread_local int thread_nesting = 0;  // nested tasks running on this thread
thread_local int64_t graph_exec_group = -1;

struct ReadyEntry {
  uint64_t sequence_nr;
  Node* node;
  NodeState* state;
  bool operator<(const ReadyEntry& o) const { return sequence_nr < o.sequence_nr; }
};

// a + b where either may be undefined; recorded (so differentiable) only under create_graph.
Tensor SumGrads(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  RawTensor sum = tg::Add(a.data(), b.data());
  if (!ShouldRecord({a, b})) return Tensor(std::move(sum));
  return Record(OpNodeName(OpId::kAdd), sum, {a, b}, {},
                [](const BackwardContext& ctx) -> VariableList {
                  return {ctx.grads[0], ctx.grads[0]};
                });
}

// g cast to `dtype`; recorded (so differentiable) when g requires grad and grad mode is on.
Tensor CastGrad(const Tensor& g, DType dtype) {
  RawTensor cast = g.data().to(dtype);
  if (!ShouldRecord({g})) return Tensor(std::move(cast));
  const DType from = g.dtype();
  return Record(OpNodeName(OpId::kCast), std::move(cast), {g}, {},
                [from](const BackwardContext& ctx) -> VariableList {
                  return {CastGrad(ctx.grads[0], from)};
                });
}

// Gives every node reachable from the roots a slot and counts the edges into it (iteratively:
// graphs may be long). No user code runs here, so the marks cannot be overwritten meanwhile.
void ComputeDependencies(GraphTask& task) {
  std::vector<Node*> stack;
  auto visit = [&task, &stack](Node* node) -> uint32_t {
    if (node->engine_mark.task == task.id) return node->engine_mark.slot;
    const uint32_t slot = static_cast<uint32_t>(task.states.size());
    task.states.emplace_back().sequence_nr = node->sequence_nr();
    task.nodes.push_back(node);
    node->engine_mark = Node::EngineMark{task.id, slot};
    stack.push_back(node);
    return slot;
  };
  for (const auto& root : task.roots) visit(root.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges()) {
      if (e.valid()) ++task.states[visit(e.fn.get())].dependencies;
    }
  }
}

// Marks the `needed` targets (Backward's inputs) and the `captured` ones (Grad's inputs), then
// as needed every node from which one of them is reachable (post-order, iterative), as
// PyTorch's init_to_execute does. A captured node itself runs only when it is also needed.
void ComputeNeeded(GraphTask& task, const std::vector<Node*>& needed,
                   const std::vector<Node*>& captured) {
  for (NodeState& state : task.states) state.needed = false;
  absl::flat_hash_map<Node*, bool> done;
  for (Node* t : needed) {
    if (NodeState* state = task.Find(t)) state->needed = true;
  }
  for (Node* t : captured) {
    if (NodeState* state = task.Find(t)) state->captured = true;
  }
  struct Frame {
    Node* node;
    size_t next;
  };
  for (const auto& root : task.roots) {
    if (done.count(root.get())) continue;
    std::vector<Frame> stack{{root.get(), 0}};
    done[root.get()] = false;
    while (!stack.empty()) {
      Frame& f = stack.back();
      const auto& edges = f.node->next_edges();
      if (f.next < edges.size()) {
        Node* child = edges[f.next++].fn.get();
        if (child && !done.count(child)) {
          done[child] = false;
          stack.push_back({child, 0});
        }
        continue;
      }
      NodeState& state = *task.Find(f.node);
      for (const Edge& e : edges) {
        if (e.valid() && task.Find(e.fn.get())->reached()) state.needed = true;
      }
      done[f.node] = true;
      stack.pop_back();
    }
  }
}

void CheckFiniteForAnomaly(const Node& node, const VariableList& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined() && IsFloating(grads[i].dtype()) && AnyNonFinite({grads[i].data()})) {
      throw Error(absl::StrCat(
          "anomaly detected: ", node.name(), " returned NaN or inf in its gradient for input ", i,
          node.creation_trace().empty() ? "" : "; it was created at:", node.creation_trace()));
    }
  }
}

// Checks the gradients a node returned against what the next nodes expect; casts dtypes.
void ValidateOutputs(const Node& node, VariableList& grads) {
  const auto& edges = node.next_edges();
  TG_CHECK(grads.size() == edges.size(), node.name(), " returned ", grads.size(),
           " gradients, expected ", edges.size(), " (one per input)");
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!edges[i].valid() || !grads[i].defined()) continue;
    const InputMetadata& m = edges[i].fn->input_metadata()[edges[i].input_nr];
    TG_CHECK(grads[i].shape() == m.shape, node.name(), " returned a gradient of shape ",
             ShapeToString(grads[i].shape()), " for input ", i, ", which has shape ",
             ShapeToString(m.shape));
    // PyTorch's validate_outputs: a 0-d gradient on another device is moved (a CPU scalar
    // meeting a CUDA input); any other device mismatch is a bug in the node and is reported.
    if (grads[i].data().device() != m.device) {
      TG_CHECK(grads[i].dim() == 0, node.name(), " returned a gradient on ",
               grads[i].data().device().ToString(), " for input ", i, ", which is on ",
               m.device.ToString());
      grads[i] = Tensor(grads[i].data().to(m.device));
    }
    // The gradient of an input has the input's dtype (an f16 weight gets an f16 gradient).
    if (grads[i].dtype() != m.dtype) grads[i] = Tensor(grads[i].data().to(m.dtype));
  }
}

// Grad(): stores the gradients `node` received for the requested inputs.
void CaptureGrads(GraphTask& task, Node* node, const VariableList& grads) {
  for (const Capture& c : task.captures) {
    if (c.node == node)
      task.captured[c.index] = SumGrads(task.captured[c.index], grads[c.input_nr]);
  }
}

void RunNodeBody(GraphTask& task, Node* node, NodeState& state,
                 std::priority_queue<ReadyEntry>& ready) {
  VariableList grads = std::move(state.buffer);
  // PyTorch's order (evaluate_function): a captured node that also runs (another requested
  // gradient lies below it) captures what it received, before its tensor hooks; one that only
  // delivers the captured gradient runs its tensor hooks and retain_grad, captures their
  // result and stops there.
  if (state.captured && state.needed) CaptureGrads(task, node, grads);
  node->RunTensorHooks(grads);
  node->RunRetainGrad(grads);
  if (!state.needed) {
    if (state.captured) CaptureGrads(task, node, grads);
    return;
  }
  const bool is_accumulate = node->IsAccumulateGrad();
  node->RunPreHooks(grads);
  VariableList outputs;
  try {
    outputs = node->Apply(grads);
  } catch (const Error& e) {
    // Name the failing node; nested tasks add their own, giving the chain of nodes.
    throw Error(absl::StrCat(e.what(), " [in ", node->name(), "]"));
  }
  if (!is_accumulate) ValidateOutputs(*node, outputs);
  if (AnomalyMode::is_enabled()) CheckFiniteForAnomaly(*node, outputs);
  const auto& edges = node->next_edges();
  if (node->has_post_hooks()) {
    // PyTorch's post-hooks see None for the inputs the task does not compute: those that need
    // no gradient (no edge) and, in a partial task, those whose node the task does not reach.
    VariableList shown = outputs;
    for (size_t i = 0; i < shown.size() && i < edges.size(); ++i) {
      if (!edges[i].valid() || !task.Find(edges[i].fn.get())->reached()) shown[i] = Tensor();
    }
    node->RunPostHooks(shown, grads);
  }
  if (!task.keep_graph) node->ReleaseSaved();
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!edges[i].valid()) continue;
    Node* next = edges[i].fn.get();
    NodeState& next_state = *task.Find(next);
    if (!next_state.reached()) continue;  // not part of this task: it never runs
    if (next_state.buffer.empty()) next_state.buffer.resize(next->num_inputs());
    Tensor& slot = next_state.buffer[edges[i].input_nr];
    slot = slot.defined() ? SumGrads(slot, outputs[i]) : std::move(outputs[i]);
    if (--next_state.dependencies == 0) {
      // It runs soon (next, in a chain): start fetching the node while this one finishes.
      __builtin_prefetch(next);
      __builtin_prefetch(reinterpret_cast<const char*>(next) + 64);
      __builtin_prefetch(reinterpret_cast<const char*>(next) + 128);
      ready.push({next_state.sequence_nr, next, &next_state});
    }
  }
}

// Runs the node; traced, between its node_begin and node_end, and the end is recorded (with the
// error) also when the node, a hook or a nested task throws, so the trace's spans stay nested.
void RunNode(GraphTask& task, Node* node, NodeState& state,
             std::priority_queue<ReadyEntry>& ready) {
  if (!TracingEnabled()) return RunNodeBody(task, node, state, ready);
  const uint64_t sequence_nr = state.sequence_nr;
  trace_internal::Node(TraceKind::kNodeBegin, node->trace_name(), sequence_nr);
  try {
    RunNodeBody(task, node, state, ready);
  } catch (...) {
    trace_internal::Node(TraceKind::kNodeEnd, node->trace_name(), sequence_nr,
                         trace_internal::CurrentErrorMessage());
    throw;
  }
  trace_internal::Node(TraceKind::kNodeEnd, node->trace_name(), sequence_nr);
}

// Whether `node` receives its gradient in the current task (its tensor hooks will run).
bool GradientWillBeComputed(Node* node) {
  const NodeState* state = current_task->Find(node);
  return state != nullptr && state->reached();
}

void RunCallbacks(GraphTask& task) {
  // Index loop: a callback may queue more callbacks, which run in the same pass.
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    std::function<void()> cb = std::move(task.callbacks[i].fn);
    const char* name = task.callbacks[i].trace_name;
    if (!TracingEnabled()) {
      cb();
      continue;
    }
    // A span: what a callback waits for (DDP's all-reduces) shows as its length.
    trace_internal::Callback(TraceKind::kCallbackRun, name, task.id);
    try {
      cb();
    } catch (...) {
      trace_internal::Callback(TraceKind::kCallbackEnd, name, task.id,
                               trace_internal::CurrentErrorMessage());
      throw;
    }
    trace_internal::Callback(TraceKind::kCallbackEnd, name, task.id);
  }
  task.callbacks.clear();
}

void RunTask(GraphTask& task, const std::vector<std::pair<Node*, VariableList>>& root_grads);

// Runs the task on this thread: nodes, then callbacks.
void Execute(GraphTask& task, const std::vector<std::pair<Node*, VariableList>>& root_grads) {
  GraphTask* parent = current_task;
  current_task = &task;
  ++thread_nesting;
  struct Restore {
    GraphTask* parent;
    ~Restore() {
      current_task = parent;
      --thread_nesting;
    }
  } restore{parent};
  AutoGradMode grad_mode(task.create_graph);
  const int64_t parent_id = parent ? parent->id : -1;
  if (TracingEnabled())
    trace_internal::Task(TraceKind::kTaskBegin, task.kind, task.id, parent_id, task.depth);
  try {
    RunTask(task, root_grads);
  } catch (...) {
    if (TracingEnabled()) {
      trace_internal::Task(TraceKind::kTaskEnd, task.kind, task.id, parent_id, task.depth,
                           trace_internal::CurrentErrorMessage());
    }
    throw;
  }
  if (TracingEnabled())
    trace_internal::Task(TraceKind::kTaskEnd, task.kind, task.id, parent_id, task.depth);
}

// Execute's body: the nodes in order, then the callbacks.
void RunTask(GraphTask& task, const std::vector<std::pair<Node*, VariableList>>& root_grads) {
  std::priority_queue<ReadyEntry> ready;
  for (const auto& [node, grads] : root_grads) {
    NodeState& state = *task.Find(node);
    if (state.buffer.empty()) state.buffer.resize(node->num_inputs());
    for (size_t i = 0; i < grads.size(); ++i) state.buffer[i] = SumGrads(state.buffer[i], grads[i]);
  }
  for (const auto& [node, grads] : root_grads) {
    (void)grads;
    NodeState& state = *task.Find(node);
    if (state.dependencies == 0 && state.reached()) {
      state.dependencies = -1;  // queued once even if it is several roots
      ready.push({node->sequence_nr(), node, &state});
    }
  }
  while (!ready.empty()) {
    const ReadyEntry entry = ready.top();
    ready.pop();
    RunNode(task, entry.node, *entry.state, ready);
  }
  RunCallbacks(task);
}

// Runs the task here, or on a fresh thread when this thread already nests too deeply.
void ExecuteWithHandOff(GraphTask& task,
                        const std::vector<std::pair<Node*, VariableList>>& root_grads) {
  if (thread_nesting < Engine::kMaxDepthPerThread) {
    Execute(task, root_grads);
    return;
  }
  GraphTask* parent = current_task;
  const bool grad_mode = GradMode::is_enabled();
  const amp::AutocastState autocast = amp::GetAutocastState();
  const int64_t group = graph_exec_group;
  const OpDispatchModeGuard::Entry* const dispatch_modes = dispatch_internal::Top();
  std::exception_ptr error;
  TraceScope* trace = trace_internal::current;  // the worker records into the caller's trace
  if (trace != nullptr) trace_internal::HandOff(task.id);
  const int rank = TraceRank();
  std::thread worker([&] {
    TraceScope::ThreadGuard trace_guard(trace);
    SetTraceRank(rank);
    TraceThreadRole role(absl::StrCat("backward hand-off (task ", task.id, ")"));
    current_task = parent;
    GradMode::set_enabled(grad_mode);
    amp::AutocastStateGuard autocast_state(autocast);  // the caller's thread-local state
    graph_exec_group = group;
    const dispatch_internal::ScopedTop dispatch(dispatch_modes);
    try {
      Execute(task, root_grads);
    } catch (...) {
      error = std::current_exception();
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
}

// Builds the task for roots/grad_outputs: validation, root gradients, dependencies.
// Where a backward starts or a gradient is captured: a tensor's gradient edge, or a
// GradientEdge given as such (its metadata from the node's input).
struct EdgePoint {
  std::shared_ptr<Node> node;
  uint32_t output_nr = 0;
  InputMetadata meta;
  std::string name;  // " (the tensor's name)" or ""
};

EdgePoint PointOf(const char* op, const char* what, size_t i, const Tensor& t,
                  const char* missing) {
  TG_CHECK(t.defined(), op, ": ", what, " ", i, " is undefined");
  EdgePoint p;
  p.name = t.name().empty() ? "" : " (" + t.name() + ")";
  p.node = t.gradient_edge_node();
  TG_CHECK(p.node != nullptr, op, ": ", what, " ", i, p.name, missing);
  p.output_nr = t.output_nr();
  p.meta = InputMetadata{t.shape(), t.dtype(), t.data().device()};
  return p;
}

EdgePoint PointOf(const char* op, const char* what, size_t i, const GradientEdge& e) {
  TG_CHECK(e.node != nullptr, op, ": ", what, " ", i, " is a GradientEdge without a node");
  TG_CHECK(e.output_nr < e.node->num_inputs(), op, ": ", what, " ", i, " is a GradientEdge to ",
           "input ", e.output_nr, " of ", e.node->name(), ", which has ", e.node->num_inputs());
  return EdgePoint{e.node, e.output_nr, e.node->input_metadata()[e.output_nr], ""};
}

std::vector<std::pair<Node*, VariableList>> PrepareTask(GraphTask& task, const char* op,
                                                        const std::vector<EdgePoint>& roots,
                                                        const VariableList& grad_outputs) {
  TG_CHECK(!roots.empty(), op, ": no roots given");
  TG_CHECK(grad_outputs.empty() || grad_outputs.size() == roots.size(), op, ": ", roots.size(),
           " roots but ", grad_outputs.size(), " grad_outputs");
  std::vector<std::pair<Node*, VariableList>> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const EdgePoint& root = roots[i];
    const std::shared_ptr<Node>& node = root.node;
    Tensor g = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (g.defined()) {
      TG_CHECK(g.shape() == root.meta.shape, op, ": grad_output ", i, " has shape ",
               ShapeToString(g.shape()), " but root ", i, " has shape ",
               ShapeToString(root.meta.shape));
      // PyTorch's validate_outputs on the roots: a gradient on another device is moved when
      // it is 0-d and refused otherwise; one of another dtype is cast to the root's dtype
      // (differentiable when it requires grad, as PyTorch's grad.to(dtype)).
      if (g.data().device() != root.meta.device) {
        TG_CHECK(g.dim() == 0, op, ": grad_output ", i, " is on ", g.data().device().ToString(),
                 " but root ", i, " is on ", root.meta.device.ToString());
        g = Tensor(g.data().to(root.meta.device));
      }
      if (g.dtype() != root.meta.dtype) g = CastGrad(g, root.meta.dtype);
    } else {
      TG_CHECK(NumElements(root.meta.shape) == 1, op,
               ": a gradient can be implied only for one-element roots; "
               "root ",
               i, " has shape ", ShapeToString(root.meta.shape), ", pass its grad_output");
      // On the root's device: the whole backward then runs there (a CPU seed would make the
      // first node mix devices).
      g = Tensor(RawTensor::Ones(root.meta.shape, root.meta.dtype, root.meta.device));
    }
    VariableList grads(node->num_inputs());
    grads[root.output_nr] = g;
    root_grads.emplace_back(node.get(), std::move(grads));
    task.roots.push_back(node);
  }
  ComputeDependencies(task);
  return root_grads;
}

std::vector<EdgePoint> RootPoints(const char* op, const VariableList& roots) {
  std::vector<EdgePoint> points;
  for (size_t i = 0; i < roots.size(); ++i) {
    points.push_back(PointOf(op, "root", i, roots[i], " does not require grad and has no grad_fn"));
  }
  return points;
}

void InitTask(GraphTask& task, bool keep_graph, bool create_graph) {
  task.id = next_graph_task_id.fetch_add(1);
  task.depth = current_task ? current_task->depth + 1 : 0;
  task.outermost = current_task ? current_task->outermost : &task;
  task.issued_in_forward = current_task ? current_task->issued_in_forward : ForwardScope::active();
  task.keep_graph = keep_graph;
  task.create_graph = create_graph;
}

}  // namespace

void Engine::Backward(const VariableList& roots, const VariableList& grad_outputs,
                      const BackwardOptions& options) {
  TG_CHECK(!RecomputeScope::active(),
           "backward: called while a checkpoint recomputes its function (from the function's "
           "forward or a hook inside it); its gradients were accumulated when the forward first "
           "ran and would be accumulated a second time. Keep code that runs a backward in its "
           "forward (a tiled loss) outside the checkpointed function, or use Engine::Grad() there");
  GraphTask task;
  InitTask(task, options.retain_graph || options.create_graph, options.create_graph);
  auto root_grads = PrepareTask(task, "backward", RootPoints("backward", roots), grad_outputs);
  if (options.inputs != nullptr) {
    TG_CHECK(!options.inputs->empty(), "backward: inputs was given but is empty");
    task.partial = true;
    std::vector<Node*> targets;
    for (size_t i = 0; i < options.inputs->size(); ++i) {
      const Tensor& in = (*options.inputs)[i];
      TG_CHECK(in.defined(), "backward: input ", i, " is undefined");
      std::shared_ptr<Node> node = in.gradient_edge_node();
      TG_CHECK(node != nullptr, "backward: input ", i,
               in.name().empty() ? "" : " (" + in.name() + ")", " does not require grad");
      // As in PyTorch, a non-leaf input gets .grad through retain_grad (which stays on), and
      // its grad_fn runs (its node hooks fire) while nothing below it does unless needed.
      if (!in.is_leaf()) in.retain_grad();
      targets.push_back(node.get());
      task.keep_alive.push_back(std::move(node));  // accumulators created here
    }
    ComputeNeeded(task, /*needed=*/targets, /*captured=*/{});
  }
  ExecuteWithHandOff(task, root_grads);
}

namespace {

VariableList RunGrad(const std::vector<EdgePoint>& outputs, const std::vector<EdgePoint>& inputs,
                     const VariableList& grad_outputs, const GradOptions& options) {
  TG_CHECK(!inputs.empty(), "grad: no inputs given");
  GraphTask task;
  InitTask(task, options.retain_graph || options.create_graph, options.create_graph);
  task.kind = "grad";
  auto root_grads = PrepareTask(task, "grad", outputs, grad_outputs);
  task.partial = true;
  std::vector<Node*> targets;
  task.captured.resize(inputs.size());
  std::vector<bool> reachable(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::shared_ptr<Node>& node = inputs[i].node;
    reachable[i] = task.Find(node.get()) != nullptr;
    targets.push_back(node.get());
    task.captures.push_back({node.get(), inputs[i].output_nr, i});
    task.keep_alive.push_back(node);
  }
  ComputeNeeded(task, /*needed=*/{}, /*captured=*/targets);
  ExecuteWithHandOff(task, root_grads);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (task.captured[i].defined() || options.allow_unused) continue;
    const std::string& name = inputs[i].name;
    TG_CHECK(reachable[i], "grad: input ", i, name,
             " is not used by the outputs; pass allow_unused=true to get an undefined gradient");
    // As PyTorch: what allow_unused allows is an undefined result, however it came about.
    throw Error(absl::StrCat(
        "grad: input ", i, name,
        " received no gradient: every path from the outputs to it carries none (a node on the "
        "way, such as a custom function's Backward, returned an undefined gradient); pass "
        "allow_unused=true to get an undefined gradient"));
  }
  return task.captured;
}

}  // namespace

VariableList Engine::Grad(const VariableList& outputs, const VariableList& inputs,
                          const VariableList& grad_outputs, const GradOptions& options) {
  std::vector<EdgePoint> points;
  for (size_t i = 0; i < inputs.size(); ++i) {
    points.push_back(PointOf("grad", "input", i, inputs[i], " does not require grad"));
  }
  return RunGrad(RootPoints("grad", outputs), points, grad_outputs, options);
}

VariableList Engine::GradEdges(const std::vector<GradTarget>& outputs,
                               const std::vector<GradTarget>& inputs,
                               const VariableList& grad_outputs, const GradOptions& options) {
  auto points = [](const std::vector<GradTarget>& targets, const char* what, const char* missing) {
    std::vector<EdgePoint> out;
    for (size_t i = 0; i < targets.size(); ++i) {
      out.push_back(targets[i].is_edge() ? PointOf("grad", what, i, targets[i].edge())
                                         : PointOf("grad", what, i, targets[i].tensor(), missing));
    }
    return out;
  };
  return RunGrad(points(outputs, "root", " does not require grad and has no grad_fn"),
                 points(inputs, "input", " does not require grad"), grad_outputs, options);
}

GradientEdge get_gradient_edge(const Tensor& t) {
  TG_CHECK(t.defined() && t.requires_grad(),
           "get_gradient_edge: It is not possible to get the gradient edge for a Tensor that "
           "does not require gradients");
  return GradientEdge{t.gradient_edge_node(), t.output_nr()};
}

int64_t current_graph_task_id() { return current_task ? current_task->id : -1; }

int64_t current_graph_exec_group() { return graph_exec_group; }

void set_current_graph_exec_group(int64_t id) { graph_exec_group = id; }

int current_reentrant_depth() { return current_task ? current_task->depth : -1; }

void queue_callback(std::function<void()> callback, const char* trace_name) {
  TG_CHECK(current_task != nullptr, "callbacks can only be queued during backward");
  if (TracingEnabled())
    trace_internal::Callback(TraceKind::kCallbackQueued, trace_name, current_task->id);
  current_task->callbacks.push_back({std::move(callback), trace_name});
}

int64_t outermost_graph_task_id() { return current_task ? current_task->outermost->id : -1; }

void queue_callback_on_outermost_task(std::function<void()> callback, const char* trace_name) {
  TG_CHECK(current_task != nullptr, "callbacks can only be queued during backward");
  if (TracingEnabled()) {
    trace_internal::Callback(TraceKind::kCallbackQueued, trace_name, current_task->outermost->id);
  }
  current_task->outermost->callbacks.push_back({std::move(callback), trace_name});
}

bool backward_issued_in_forward() {
  TG_CHECK(current_task != nullptr,
           "backward_issued_in_forward can only be called during backward");
  return current_task->issued_in_forward;
}

namespace {
thread_local int forward_scope_depth = 0;
thread_local int recompute_scope_depth = 0;
}  // namespace

ForwardScope::ForwardScope() { ++forward_scope_depth; }
ForwardScope::~ForwardScope() { --forward_scope_depth; }
bool ForwardScope::active() { return forward_scope_depth > 0; }

RecomputeScope::RecomputeScope() { ++recompute_scope_depth; }
RecomputeScope::~RecomputeScope() { --recompute_scope_depth; }
bool RecomputeScope::active() { return recompute_scope_depth > 0; }

bool will_execute(const std::shared_ptr<Node>& node) {
  TG_CHECK(current_task != nullptr, "will_execute can only be called during backward");
  const NodeState* state = current_task->Find(node.get());
  if (state == nullptr) return false;
  // PyTorch's _will_engine_execute_node: needed or captured. A leaf captured by Grad() has no
  // true answer: its tensor hooks run (its gradient is computed) but its AccumulateGrad does
  // not (no .grad is written), and a caller counting the gradients to expect would be wrong
  // either way, so the question is refused, as PyTorch refuses it.
  if (state->captured && node->IsAccumulateGrad()) {
    const std::string& leaf = static_cast<const AccumulateGrad&>(*node).leaf()->name;
    throw Error(absl::StrCat(
        "will_execute: the node is the AccumulateGrad of a leaf", leaf.empty() ? "" : " (", leaf,
        leaf.empty() ? "" : ")",
        " that is an input of the running Engine::Grad(); Grad() computes that leaf's gradient "
        "without running its AccumulateGrad (no .grad is written), so whether the node executes "
        "has no answer there (PyTorch refuses it too)"));
  }
  return state->needed || state->captured;
}

bool current_task_is_partial() {
  TG_CHECK(current_task != nullptr, "current_task_is_partial can only be called during backward");
  return current_task->partial;
}

namespace {

// The node a gradient for `impl` flows into, without creating an accumulator (a leaf that has
// none is in no graph).
Node* ExistingGradientEdgeNode(const VariableImpl& impl) {
  if (impl.grad_fn) return impl.grad_fn.get();
  return impl.grad_accumulator.lock().get();
}

// The trace name of a multi-grad hook's bookkeeping callback: the engine's, not the user's.
constexpr char kMultiGradCleanupTraceName[] = "multi_grad cleanup (internal)";

// What a multi-grad hook keeps per graph task: an entry is made at the task's first gradient
// for one of the variables and dropped when the task's callbacks run.
struct MultiGradState {
  struct PerTask {
    int64_t task_id;
    bool fired = false;
    size_t seen = 0;
    size_t expected = 0;  // kAll: how many of the variables the task reaches
    VariableList grads;
  };
  MultiGradMode mode;
  std::function<void(const VariableList&)> fn;
  std::vector<std::weak_ptr<VariableImpl>> vars;  // weak: the hooks live on the variables
  std::mutex mu;                                  // backward may run on several threads
  std::vector<PerTask> tasks;                     // the running tasks that reached a variable

  PerTask& ForCurrentTask(const std::shared_ptr<MultiGradState>& self) {
    const int64_t id = current_graph_task_id();
    for (PerTask& t : tasks) {
      if (t.task_id == id) return t;
    }
    PerTask& t = tasks.emplace_back();
    t.task_id = id;
    t.grads.resize(vars.size());
    if (mode == MultiGradMode::kAll) {
      for (const auto& weak : vars) {
        auto impl = weak.lock();
        Node* node = impl ? ExistingGradientEdgeNode(*impl) : nullptr;
        if (node != nullptr && GradientWillBeComputed(node)) ++t.expected;
      }
    }
    // Forget this task once it is done (also when the hook did not fire: a failed backward
    // leaves its entry behind, a few bytes, until the hook is removed).
    std::weak_ptr<MultiGradState> weak = self;
    queue_callback(
        [weak, id] {
          if (auto state = weak.lock()) {
            std::lock_guard<std::mutex> lock(state->mu);
            auto& v = state->tasks;
            auto done = [id](const PerTask& t) { return t.task_id == id; };
            v.erase(std::remove_if(v.begin(), v.end(), done), v.end());
          }
        },
        kMultiGradCleanupTraceName);
    return t;
  }
};

}  // namespace

HookHandle register_multi_grad_hook(const VariableList& vars,
                                    std::function<void(const VariableList& grads)> fn,
                                    MultiGradMode mode) {
  TG_CHECK(fn != nullptr, "register_multi_grad_hook: the hook is empty");
  auto state = std::make_shared<MultiGradState>();
  state->mode = mode;
  state->fn = std::move(fn);
  for (const Tensor& v : vars) {
    TG_CHECK(v.defined(), "register_multi_grad_hook: variable ", state->vars.size(),
             " is undefined");
    state->vars.push_back(v.impl());
  }
  std::vector<HookHandle> handles;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (mode == MultiGradMode::kAny && !vars[i].requires_grad()) continue;  // as PyTorch
    handles.push_back(vars[i].register_hook([state, i](const Tensor& g) -> Tensor {
      VariableList grads;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        MultiGradState::PerTask& t = state->ForCurrentTask(state);
        if (t.fired) return Tensor();
        t.grads[i] = g;
        if (state->mode == MultiGradMode::kAll && ++t.seen < t.expected) return Tensor();
        t.fired = true;
        grads = std::move(t.grads);  // kAny: only grads[i] is defined
      }
      if (TracingEnabled()) trace_internal::Hook("multi_grad", absl::StrCat("vars[", i, "]"), 0);
      state->fn(grads);  // outside the lock: it may start a backward that reaches these again
      return Tensor();
    }));
  }
  return HookHandle([handles]() mutable {
    for (HookHandle& h : handles) h.remove();
  });
}

HookHandle register_multi_grad_hook(const VariableList& vars,
                                    std::function<void(const Tensor& grad)> fn,
                                    MultiGradMode mode) {
  TG_CHECK(mode == MultiGradMode::kAny,
           "register_multi_grad_hook: a hook taking one gradient needs MultiGradMode::kAny; "
           "kAll passes the list of gradients");
  TG_CHECK(fn != nullptr, "register_multi_grad_hook: the hook is empty");
  return register_multi_grad_hook(
      vars,
      [fn = std::move(fn)](const VariableList& grads) {
        for (const Tensor& g : grads) {
          if (g.defined()) return fn(g);
        }
        fn(Tensor());  // the first gradient to arrive was itself undefined
      },
      MultiGradMode::kAny);
}

bool AnomalyMode::is_enabled() { return anomaly_enabled.load(std::memory_order_relaxed); }
void AnomalyMode::set_enabled(bool enabled) { anomaly_enabled.store(enabled); }

}  // namespace tg
