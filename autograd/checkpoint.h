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
// In both modes the states of `generators` are captured before the forward and restored for
// the recomputation (then put back, so the caller's random stream is unaffected): randomness
// drawn from those generators inside `fn` (dropout) is reproduced exactly. `fn` must otherwise
// be deterministic and must not modify its inputs in place.
#ifndef TAPEGRAD_AUTOGRAD_CHECKPOINT_H_
#define TAPEGRAD_AUTOGRAD_CHECKPOINT_H_

#include <functional>
#include <optional>
#include <vector>

#include "autograd/node.h"
#include "autograd/variable.h"
#include "tensor/generator.h"

namespace tg {

struct CheckpointOptions {
  // true: reentrant (PyTorch's use_reentrant=True), false: non-reentrant (recommended, as in
  // PyTorch). Left unset, it is reentrant (PyTorch's default) and Warn() (autograd/warning.h)
  // says to choose, as PyTorch warns when use_reentrant is not passed.
  std::optional<bool> reentrant;
  // Generators `fn` draws from; their states are restored for the recomputation.
  std::vector<Generator*> generators;
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
