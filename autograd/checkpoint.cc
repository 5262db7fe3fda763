#include "autograd/checkpoint.h"

#include <algorithm>
#include <any>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/fp8.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/selective_checkpoint.h"
#include "autograd/trace.h"
#include "autograd/warning.h"
#include "tensor/error.h"

namespace tg {
namespace {

// Runs a recomputation between recompute_begin and recompute_end; the end is recorded (with the
// error) also when `body` throws, so the trace's spans stay nested.
// A backward started inside the recomputation throws (RecomputeScope, autograd/engine.h).
template <typename Body>
void TracedRecompute(const char* mode, Body&& body) {
  const RecomputeScope recomputing;
  if (!TracingEnabled()) return body();
  trace_internal::Recompute(TraceKind::kRecomputeBegin, mode);
  try {
    body();
  } catch (...) {
    trace_internal::Recompute(TraceKind::kRecomputeEnd, mode,
                              trace_internal::CurrentErrorMessage());
    throw;
  }
  trace_internal::Recompute(TraceKind::kRecomputeEnd, mode);
}

// Marks the nodes `fn` created (sequence numbers from `first` on, reached from its output) as
// recomputed by a non-reentrant checkpoint, for BackwardGraphToDot. Sequence numbers count per
// thread and fn ran on this one, so the range is exactly fn's nodes; the walk stops at older
// nodes (the inputs' history) and leaves (AccumulateGrad's kRunFirst is outside the range).
// A node inside a nested checkpoint is marked already but still walked through: the outer
// segment's nodes created before the inner checkpoint lie below it. The mark lives in the
// node's Extras (one small allocation per segment node, at forward time).
void MarkRecomputed(const Tensor& out, uint64_t first) {
  const uint64_t end = Node::next_sequence_nr();
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  auto visit = [&](Node* n) {
    if (n == nullptr || n->sequence_nr() < first || n->sequence_nr() >= end ||
        !seen.insert(n).second) {
      return;
    }
    n->MarkRecomputedByCheckpoint();
    stack.push_back(n);
  };
  if (out.defined()) visit(out.grad_fn().get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) visit(e.fn.get());
  }
}

// The states of the generators `fn` draws from, captured before its forward.
struct GeneratorStates {
  std::vector<Generator*> generators;
  std::vector<Generator::State> states;

  static GeneratorStates Capture(const std::vector<Generator*>& generators) {
    GeneratorStates s{generators, {}};
    for (const Generator* g : generators) s.states.push_back(g->state());
    return s;
  }
};

// Rewinds the generators to `saved` for the recomputation and puts their current states back
// afterwards (also when the recomputation throws), so the caller's stream is unaffected.
class ScopedGeneratorStates {
 public:
  explicit ScopedGeneratorStates(const GeneratorStates& saved)
      : current_(GeneratorStates::Capture(saved.generators)) {
    for (size_t i = 0; i < saved.generators.size(); ++i) {
      saved.generators[i]->set_state(saved.states[i]);
    }
  }
  ~ScopedGeneratorStates() {
    for (size_t i = 0; i < current_.generators.size(); ++i) {
      current_.generators[i]->set_state(current_.states[i]);
    }
  }
  ScopedGeneratorStates(const ScopedGeneratorStates&) = delete;
  ScopedGeneratorStates& operator=(const ScopedGeneratorStates&) = delete;

 private:
  GeneratorStates current_;
};

// Leaves sharing the inputs' data (and version counters) with the inputs' requires_grad, so
// that the recomputation records (and saves) exactly what the forward did.
VariableList DetachInputs(const VariableList& inputs) {
  VariableList detached;
  detached.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    if (!in.defined()) {
      detached.emplace_back();
      continue;
    }
    Tensor d = in.detach();
    if (in.requires_grad()) d.set_requires_grad(true);
    detached.push_back(std::move(d));
  }
  return detached;
}

Tensor CheckedCall(const CheckpointFn& fn, const VariableList& inputs) {
  Tensor out = fn(inputs);
  TG_CHECK(out.defined(), "checkpoint: the checkpointed function returned an undefined variable");
  return out;
}

// ---- Reentrant -------------------------------------------------------------------------------

struct CheckpointFunction : Function<CheckpointFunction> {
  static constexpr const char* kName = "Checkpoint";

  static VariableList Forward(FunctionCtx& ctx, const VariableList& inputs, CheckpointFn fn,
                              const std::vector<Generator*>& generators) {
    // Captured before fn draws anything, so the recomputation sees the same random numbers.
    ctx.saved_data["generators"] = GeneratorStates::Capture(generators);
    ctx.saved_data["autocast"] = amp::GetAutocastState();
    Tensor out = CheckedCall(fn, inputs);  // under no-grad (Function::Apply): nothing saved
    ctx.save_for_backward(inputs);         // version-checked when the backward recomputes
    ctx.saved_data["fn"] = std::move(fn);
    return {out};
  }

  static VariableList Backward(FunctionCtx& ctx, const VariableList& grads) {
    // The nested Backward below accumulates into every leaf fn uses; a task that computes only
    // some gradients (Grad(), or inputs=) must not see .grad change, so refuse, as PyTorch does.
    TG_CHECK(!current_task_is_partial(),
             "checkpoint: reentrant checkpointing does not work with Engine::Grad() or with "
             "Backward() given inputs; use CheckpointOptions::reentrant = false");
    const auto& fn = std::any_cast<const CheckpointFn&>(ctx.saved_data.at("fn"));
    const auto& generators = std::any_cast<const GeneratorStates&>(ctx.saved_data.at("generators"));
    const auto& autocast = std::any_cast<const amp::AutocastState&>(ctx.saved_data.at("autocast"));
    const VariableList detached = DetachInputs(ctx.saved_variables());
    Tensor out;
    TracedRecompute("reentrant", [&] {
      ScopedGeneratorStates rng(generators);
      // The recomputation runs under the forward's autocast state (so it makes the same casts);
      // the nested backward below runs under the caller's, as in PyTorch.
      amp::AutocastStateGuard autocast_state(autocast);
      EnableGradGuard grad;
      out = CheckedCall(fn, detached);
    });
    TG_CHECK(out.requires_grad(),
             "checkpoint: the recomputed output does not require grad (none "
             "of the inputs or parameters fn uses requires grad)");
    // A nested graph task: parameters inside fn accumulate (and run their hooks) in it.
    Engine::Backward({out}, {grads[0]});
    VariableList input_grads;
    input_grads.reserve(detached.size());
    for (size_t i = 0; i < detached.size(); ++i) {
      input_grads.push_back(ctx.needs_input_grad(i) ? detached[i].grad() : Tensor());
    }
    return input_grads;
  }
};

// ---- Non-reentrant ---------------------------------------------------------------------------

// What one recomputation serves: a GraphExecGroup, or else one graph task (PyTorch keys its
// recomputations the same way).
struct RecomputeKey {
  bool group;
  int64_t id;
  bool operator==(const RecomputeKey& o) const { return group == o.group && id == o.id; }
};

struct SavedMetadata {
  Shape shape;
  DType dtype;
  Device device;
  std::string ToString() const {
    return absl::StrCat(DTypeName(dtype), " ", ShapeToString(shape), " on ", device.ToString());
  }
};

SavedMetadata MetadataOf(const Tensor& v) { return {v.shape(), v.dtype(), v.data().device()}; }

// Shared by the pack/unpack hooks of one checkpointed call; owned by the saved variables of
// the segment's nodes (through their unpack hooks), so it lives as long as the graph does.
struct NonReentrantState {
  CheckpointFn fn;
  VariableList inputs;  // detached (see DetachInputs)
  std::vector<uint64_t> input_versions;
  GeneratorStates generators;
  amp::AutocastState autocast;               // at the forward, re-established for the recomputation
  CheckpointContext recompute_context;       // entered around each recomputation (or empty)
  std::vector<SavedMetadata> forward_saved;  // what the forward packed, by pack index
  std::optional<RecomputeKey> recomputed_for;  // what `recomputed` was recomputed for
  VariableList recomputed;                     // by pack index; emptied as entries are unpacked
  std::vector<bool> unpacked;                  // by pack index: handed out for recomputed_for
};

// Thrown by the recomputation's pack hook once it has every tensor the forward saved (PyTorch's
// _StopRecomputationError): the rest of fn is not run. Not a tg::Error, so that nothing that
// handles errors mistakes it for one; only Recompute catches it.
struct StopRecomputation {};

void Recompute(NonReentrantState& s) {
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    if (!s.inputs[i].defined()) continue;
    TG_CHECK(s.inputs[i].version() == s.input_versions[i], "checkpoint: input ", i,
             " was modified in place after the checkpointed forward (version ", s.input_versions[i],
             ", now ", s.inputs[i].version(),
             "); the recomputation would not reproduce the forward");
  }
  const size_t expected = s.forward_saved.size();
  VariableList saved;
  TracedRecompute("non_reentrant", [&] {
    ScopedGeneratorStates rng(s.generators);
    amp::AutocastStateGuard autocast_state(s.autocast);
    EnableGradGuard grad;  // the forward recorded (it saved something), so record again
    // Innermost hooks: every tensor the recomputation saves lands here (detached: the
    // recomputed graph itself is dropped when fn's output goes out of scope). As in PyTorch
    // (early stop, its default), the recomputation stops as soon as it has saved as many
    // tensors as the forward did, so a recomputation that would save more is fine.
    SavedTensorHooks recorder(
        [&saved, expected](const Tensor& v) -> std::any {
          saved.push_back(v.detach());
          if (saved.size() == expected) {
            selective_internal::StoppedAt(v);
            throw StopRecomputation{};
          }
          return std::any();
        },
        [](const std::any&) -> Tensor {
          throw Error(
              "checkpoint: a tensor saved during the recomputation was unpacked; "
              "backward through the recomputed graph is not supported");
        });
    const std::shared_ptr<void> context = s.recompute_context ? s.recompute_context() : nullptr;
    try {
      CheckedCall(s.fn, s.inputs);
      selective_internal::Finished();
    } catch (const StopRecomputation&) {
    }
  });
  TG_CHECK(saved.size() == expected,
           "checkpoint: a different number of tensors was saved during the original forward "
           "and the recomputation: ",
           expected, " in the forward, ", saved.size(), " in the recomputation (none at position ",
           saved.size(),
           "); the checkpointed function must run the same ops on the same shapes both times "
           "(pass the generators it draws from in CheckpointOptions::generators)");
  std::string mismatches;
  for (size_t i = 0; i < saved.size(); ++i) {
    const SavedMetadata& f = s.forward_saved[i];
    const SavedMetadata r = MetadataOf(saved[i]);
    if (r.shape == f.shape && r.dtype == f.dtype && r.device == f.device) continue;
    absl::StrAppend(&mismatches, mismatches.empty() ? "" : "; ", "tensor at position ", i,
                    ": saved ", f.ToString(), ", recomputed ", r.ToString());
  }
  TG_CHECK(mismatches.empty(),
           "checkpoint: recomputed values for the following tensors have different metadata "
           "than during the forward: ",
           mismatches);
  s.recomputed = std::move(saved);
  s.unpacked.assign(s.recomputed.size(), false);
}

Tensor Unpack(NonReentrantState& s, size_t index) {
  // One recomputation per graph task serves all of the segment's saved tensors, or, under a
  // GraphExecGroup, one per group; a new task (a second backward with retain_graph, or Grad())
  // recomputes again, and so does every unpack outside backward and outside a group (PyTorch
  // gives each of those a fresh id). An entry is handed out once and then dropped, so memory goes
  // back as the backward moves through the segment.
  const int64_t group = current_graph_exec_group();
  const int64_t task = current_graph_task_id();
  const std::optional<RecomputeKey> key =
      group >= 0  ? std::optional<RecomputeKey>(RecomputeKey{true, group})
      : task >= 0 ? std::optional<RecomputeKey>(RecomputeKey{false, task})
                  : std::nullopt;
  if (!key.has_value() || !s.recomputed_for.has_value() || !(*s.recomputed_for == *key)) {
    s.recomputed_for.reset();  // until the recomputation succeeds
    Recompute(s);
    s.recomputed_for = key;
  }
  // PyTorch's CheckpointError: the entry is gone; recomputing the segment again would hide it.
  TG_CHECK(!s.unpacked[index], "checkpoint: unpack is being triggered for saved tensor ", index,
           ", which was already unpacked once in this backward",
           group >= 0 ? " (under one GraphExecGroup, the backward calls must need disjoint saved "
                        "tensors)"
                      : "",
           "; if you call FunctionCtx::saved_variables() in backward, call it only once");
  s.unpacked[index] = true;
  Tensor v = std::move(s.recomputed[index]);
  s.recomputed[index] = Tensor();
  return v;
}

Tensor NonReentrantCheckpoint(CheckpointFn fn, const VariableList& inputs,
                              const std::vector<Generator*>& generators,
                              const CheckpointContextFn& context_fn) {
  auto state = std::make_shared<NonReentrantState>();
  CheckpointContexts contexts;
  if (context_fn) contexts = context_fn();
  state->recompute_context = std::move(contexts.recompute);
  state->fn = std::move(fn);
  state->inputs = DetachInputs(inputs);
  for (const Tensor& in : inputs) {
    state->input_versions.push_back(in.defined() ? in.version() : 0);
  }
  state->generators = GeneratorStates::Capture(generators);
  state->autocast = amp::GetAutocastState();
  SavedTensorHooks hooks(
      [state](const Tensor& v) -> std::any {
        state->forward_saved.push_back(MetadataOf(v));
        return state->forward_saved.size() - 1;  // only the index is kept, not the tensor
      },
      [state](const std::any& packed) -> Tensor {
        return Unpack(*state, std::any_cast<size_t>(packed));
      });
  const uint64_t first = Node::next_sequence_nr();
  Tensor out;
  {
    // As in PyTorch, the forward context is entered only when the forward records.
    const std::shared_ptr<void> context =
        contexts.forward && GradMode::is_enabled() ? contexts.forward() : nullptr;
    out = CheckedCall(state->fn, inputs);
  }
  MarkRecomputed(out, first);
  return out;
}

}  // namespace

const char* const kCheckpointReentrancyWarning =
    "checkpoint: CheckpointOptions::reentrant should be set explicitly; it defaults to true "
    "(reentrant). reentrant = false is recommended (it works with Engine::Grad, "
    "Backward(inputs=) and parameters whose inputs do not require grad); set reentrant = true "
    "to keep the current behaviour and silence this warning";
const char* const kCheckpointNoGradInputsWarning =
    "checkpoint: none of the inputs requires grad, so with reentrant checkpointing the output "
    "does not either and the gradients of the parameters used inside will be undefined";

Tensor Checkpoint(CheckpointFn fn, const VariableList& inputs, const CheckpointOptions& options) {
  TG_CHECK(fn != nullptr, "checkpoint: the function is empty");
  // The recomputation would cast with the recipe's scales of the backward's time (moved on since
  // the forward) and record its amaxes a second time: refused rather than silently different.
  TG_CHECK(CurrentFp8Scope() == nullptr,
           "checkpoint: FP8 training (an FP8 scope is installed) inside a checkpointed segment "
           "is not supported; turn activation checkpointing off or run the segment outside the "
           "scope");
  for (size_t i = 0; i < options.generators.size(); ++i) {
    TG_CHECK(options.generators[i] != nullptr, "checkpoint: generator ", i, " is null");
  }
  if (!options.reentrant.has_value()) Warn(kCheckpointReentrancyWarning);
  if (!options.reentrant.value_or(true)) {
    return NonReentrantCheckpoint(std::move(fn), inputs, options.generators, options.context_fn);
  }
  TG_CHECK(options.context_fn == nullptr,
           "checkpoint: CheckpointOptions::context_fn (selective checkpointing) works only with "
           "reentrant = false");
  // PyTorch's check_backward_validity (use_reentrant=True only).
  if (std::none_of(inputs.begin(), inputs.end(),
                   [](const Tensor& in) { return in.requires_grad(); })) {
    Warn(kCheckpointNoGradInputsWarning);
  }
  return CheckpointFunction::Apply(inputs, std::move(fn), options.generators)[0];
}

}  // namespace tg
