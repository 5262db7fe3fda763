// Between the non-reentrant recomputation (checkpoint.cc) and the selective recompute mode
// (selective_checkpoint.cc) of this thread. Private to //autograd:checkpoint.
//
// A tapegrad op records its node, and so packs what it saves, after its kernel ran; PyTorch
// packs an op's inputs before running it. So when a recomputation stops early (it has every
// tensor the forward saved) while packing the inputs of the op it dispatched last, PyTorch never
// ran that op. To behave as PyTorch does, that last dispatched call of a selective recomputation
// is provisional: taking its kept output (and any error taking it raises: modified in place, or
// already taken by an earlier recomputation) is undone when the recomputation stops on one of
// its inputs, and made final when it stops on one of its outputs, when the next op is
// dispatched, or when the function returns.
#ifndef TAPEGRAD_AUTOGRAD_SELECTIVE_CHECKPOINT_H_
#define TAPEGRAD_AUTOGRAD_SELECTIVE_CHECKPOINT_H_

#include "autograd/variable.h"

namespace tg::selective_internal {

// The recomputation stops early, `last` being the tensor whose pack completed it.
void StoppedAt(const Tensor& last);
// The function returned: the last call is final (throws its error, if it has one).
void Finished();

}  // namespace tg::selective_internal

#endif  // TAPEGRAD_AUTOGRAD_SELECTIVE_CHECKPOINT_H_
