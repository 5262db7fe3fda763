// Activation checkpointing: trade compute for memory by not keeping the tensors a segment of
// the model saves for backward, and recomputing the segment when the backward needs them.
//
//   tg::Generator dropout_gen(0);
//   tg::Tensor h = tg::Checkpoint(
//       [&](const tg::VariableList& in) {
//         return tg::Dropout(tg::GeluTanh(tg::Matmul(in[0], w1) + b1), 0.1, dropout_gen);
//       },
//       {x}, tg::CheckpointOptions{/*reentrant=*/false, /*generators=*/{&dropout_gen}});
//   tg::Sum(h).backward();     // recomputes the segment once, with the same dropout mask
//
// Two modes (docs/architecture.md, autograd), with PyTorch's torch.utils.checkpoint semantics:
//
// - Reentrant (use_reentrant=True): a custom Function ("CheckpointBackward") whose forward runs
//   `fn` under no-grad, and whose backward recomputes `fn` under grad on detached inputs and
//   runs a nested Engine::Backward through the recomputed graph. Consequences, as in PyTorch:
//   parameters used inside `fn` accumulate their .grad (and fire their hooks) in that nested
//   graph task (depth + 1), not in the caller's; if no input requires grad the output does
//   not either and those parameters get no gradient (make an input require grad); it cannot
//   run under Engine::Grad or Backward(inputs=...) (the nested backward would accumulate into
//   every leaf), and create_graph does not reach through it.
// - Non-reentrant (use_reentrant=False): `fn` runs normally under grad, with SavedTensorHooks
//   that keep only an index for each saved tensor; the first unpack in a graph task recomputes
//   `fn` once and serves every saved tensor of the segment from that recomputation. All
//   gradients flow in the caller's graph task, and Engine::Grad, backward(inputs=) and
//   retain_graph (a later backward recomputes again) work. As in PyTorch (its defaults), the
//   recomputation stops once it has saved as many tensors as the forward (the rest of `fn` is
//   skipped; saving more is fine), saving fewer or other shapes/dtypes/devices is an error
//   naming the counts or positions, unpacking a saved tensor twice in one backward is an
//   error, and saved inputs unpack as the inputs themselves (so create_graph reaches them).
//
// Warnings (autograd/warning.h), as PyTorch's: `reentrant` left unset, and reentrant
// checkpointing of inputs none of which requires grad (its gradients will be undefined).
//
// Selective activation checkpointing (PyTorch's context_fn with
// create_selective_checkpoint_contexts; non-reentrant only): a policy decides, op call by op call
// in the forward, whether the op's output is kept (kMustSave, kPreferSave) or recomputed
// (kMustRecompute, kPreferRecompute). The recomputation then runs `fn` again but hands each kept
// output back instead of running that op's kernel again, so the expensive ops (GEMMs, attention)
// are not paid twice while the cheap ones free their memory:
//
//   tg::CheckpointOptions options{/*reentrant=*/false};
//   options.context_fn = [] {  // once per checkpointed call
//     return tg::CreateSelectiveCheckpointContexts({tg::OpId::kMatmul});  // keep every matmul
//   };
//   tg::Tensor h = tg::Checkpoint(fn, {x}, options);
//
// The ops a policy sees are the dispatched ops of the op list (its `checkpoint` column,
// tensor/op_list.inc; autograd/dispatch_mode.h), each call once, in the forward only (as in
// PyTorch 2.15, SelectiveCheckpointContext::is_recompute is always false), with its inputs and
// outputs. A kept output is checked, when it is handed back, to be unmodified since (its version
// counter), unless allow_cache_entry_mutation. Kept outputs are handed out once: a second
// recomputation of the segment (a second backward with retain_graph) that reaches a kept op is an
// error, which a GraphExecGroup (below) avoids by recomputing once for all the backward calls of a
// step. The recomputation must run the same ops in the same order (per op, the n-th call of the
// forward is the n-th of the recomputation); another op, or more calls of one, is an error naming
// the op. A random op (dropout) draws its random numbers outside its dispatched call, so a kept
// dropout leaves the generator where a recomputed one would.
//
// In both modes the states of `generators` are captured before the forward and restored for
// the recomputation (then put back, so the caller's random stream is unaffected): randomness
// drawn from those generators inside `fn` (dropout) is reproduced exactly. `fn` must otherwise
// be deterministic and must not modify its inputs in place.
#ifndef TAPEGRAD_AUTOGRAD_CHECKPOINT_H_
#define TAPEGRAD_AUTOGRAD_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"
#include "tensor/generator.h"
#include "tensor/op_list.h"

namespace tg {

// PyTorch's torch.utils.checkpoint.CheckpointPolicy (its CPU-offload policies are left out: eager
// PyTorch recomputes those too). kMust* and kPrefer* act alike here; the difference is for
// systems that may override a preference (PyTorch's compiler).
enum class CheckpointPolicy { kMustSave, kPreferSave, kMustRecompute, kPreferRecompute };

const char* CheckpointPolicyName(CheckpointPolicy policy);  // "MUST_SAVE", ...

// What a policy is told about an op call besides the op and its inputs.
struct SelectiveCheckpointContext {
  bool is_recompute = false;  // always false: policies are asked in the forward only
  VariableList op_output;     // the op's outputs (no history), as its kernel returned them
};

// Decides the policy of one op call: the op, its tensor arguments in parameter order (undefined
// for an absent optional one).
using CheckpointPolicyFn = std::function<CheckpointPolicy(const SelectiveCheckpointContext& ctx,
                                                          OpId op, const VariableList& inputs)>;

// The default policy of the op list: kPreferSave for an op whose `checkpoint` column says kSave
// (matmul, linear, conv2d, attention), kPreferRecompute otherwise.
CheckpointPolicy OpListCheckpointPolicy(const SelectiveCheckpointContext& ctx, OpId op,
                                        const VariableList& inputs);

// A context a checkpoint enters around its forward or around a recomputation: calling it enters,
// and dropping what it returns exits. PyTorch's context_fn returns two such contexts.
using CheckpointContext = std::function<std::shared_ptr<void>()>;
struct CheckpointContexts {
  CheckpointContext forward;    // entered around fn's forward (under grad mode only)
  CheckpointContext recompute;  // entered around each recomputation of fn
};
using CheckpointContextFn = std::function<CheckpointContexts()>;

// PyTorch's create_selective_checkpoint_contexts: the two contexts of one checkpointed call,
// sharing the outputs the forward keeps. With a list of ops, those ops are kMustSave and every
// other op kPreferRecompute. An op in the list that is not dispatched (a view, an in-place op,
// a composite op: its `checkpoint` column is kNone) is an error naming it, since no policy ever
// sees it.
CheckpointContexts CreateSelectiveCheckpointContexts(CheckpointPolicyFn policy,
                                                     bool allow_cache_entry_mutation = false);
CheckpointContexts CreateSelectiveCheckpointContexts(const std::vector<OpId>& ops_to_save,
                                                     bool allow_cache_entry_mutation = false);

// PyTorch's torch.utils.checkpoint.GraphExecGroup: while one is alive on this thread, every
// non-reentrant checkpointed segment that a backward reaches is recomputed at most once for all
// the backward calls made under it (a backward split into input-gradient and weight-gradient
// passes, Engine::Grad then Engine::Backward), instead of once per backward. The backward calls of
// one group must need disjoint saved tensors: a saved tensor unpacked twice under one group is an
// error. Groups do not nest (an error). It has no effect on reentrant checkpoints. A backward
// handed off to a fresh thread (deep nesting) sees the caller's group.
class GraphExecGroup {
 public:
  GraphExecGroup();
  ~GraphExecGroup();
  GraphExecGroup(const GraphExecGroup&) = delete;
  GraphExecGroup& operator=(const GraphExecGroup&) = delete;

  int64_t id() const { return id_; }
  // The group alive on this thread, or -1.
  static int64_t current();

 private:
  int64_t id_;
};

struct CheckpointOptions {
  // true: reentrant (PyTorch's use_reentrant=True), false: non-reentrant (recommended, as in
  // PyTorch). Left unset, it is reentrant (PyTorch's default) and Warn() (autograd/warning.h)
  // says to choose, as PyTorch warns when use_reentrant is not passed.
  std::optional<bool> reentrant;
  // Generators `fn` draws from; their states are restored for the recomputation.
  std::vector<Generator*> generators;
  // Called once per checkpointed call for the contexts its forward and its recomputations run
  // in (CreateSelectiveCheckpointContexts for selective checkpointing). Non-reentrant only.
  CheckpointContextFn context_fn;
};

using CheckpointFn = std::function<Tensor(const VariableList& inputs)>;

// The texts of the two warnings above.
extern const char* const kCheckpointReentrancyWarning;
extern const char* const kCheckpointNoGradInputsWarning;

// Returns fn(inputs), recomputing fn during backward instead of keeping what it saves.
Tensor Checkpoint(CheckpointFn fn, const VariableList& inputs,
                  const CheckpointOptions& options = {});

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_CHECKPOINT_H_
