// PyTorch's torch.autograd.graph.save_on_cpu: while a SaveOnCpu guard lives, every tensor saved
// for backward is kept on the host and moved back to its device when the backward needs it
// (activation offloading), through the saved-tensor hooks of autograd/node.h.
//
//   {
//     tg::SaveOnCpu offload;
//     loss = model(x);        // activations saved on the host
//   }
//   loss.backward();          // each one copied back to its device when used
//
// A CPU tensor is kept as it is (PyTorch's tensor.cpu() is the tensor itself), so on the CPU the
// guard changes nothing: the saved variables unpack as themselves. `pin_memory` is PyTorch's
// argument; tapegrad has no pinned host allocator yet, so the copies are synchronous copies into
// pageable memory either way (the overlapped, pinned copies on CUDA are not there).
#ifndef TAPEGRAD_AUTOGRAD_SAVE_ON_CPU_H_
#define TAPEGRAD_AUTOGRAD_SAVE_ON_CPU_H_

#include "autograd/node.h"

namespace tg {

class SaveOnCpu {
 public:
  explicit SaveOnCpu(bool pin_memory = false);
  SaveOnCpu(const SaveOnCpu&) = delete;
  SaveOnCpu& operator=(const SaveOnCpu&) = delete;

 private:
  SavedTensorHooks hooks_;
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_SAVE_ON_CPU_H_
