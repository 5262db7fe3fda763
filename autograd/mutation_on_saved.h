// PyTorch's torch.autograd.graph.allow_mutation_on_saved_tensors: while an
// AllowMutationOnSavedTensors guard lives, a tensor saved for backward may be modified in place
// by an in-place op of tg::Tensor; the saved value is copied just before the first such write,
// and the backward uses the copy (instead of refusing, as the version counter makes it do
// otherwise).
//
//   {
//     tg::AllowMutationOnSavedTensors allow;
//     tg::Tensor b = a.clone();
//     tg::Tensor out = (b * b).sum();   // saves b
//     b.mul_(2);                        // b's saved value is copied first
//     out.backward();                   // a.grad = 2 * (b before the write)
//   }
//
// As PyTorch's: the backward of a graph recorded inside the guard must run inside it too (after
// the guard is gone it throws "Trying to backward outside of the
// 'allow_mutation_on_saved_tensors' context in which the graph was originally recorded."); a
// write is seen when it goes through a tg::Tensor in-place op (add_, mul_, copy_, fill_,
// zero_, index_put_, ...), not a write into `.data()` (the raw data, which PyTorch's dispatch
// mode would also see). Guards do not nest (a second one on the thread throws).
#ifndef TAPEGRAD_AUTOGRAD_MUTATION_ON_SAVED_H_
#define TAPEGRAD_AUTOGRAD_MUTATION_ON_SAVED_H_

#include <memory>

#include "autograd/node.h"
#include "autograd/variable.h"

namespace tg {

class AllowMutationOnSavedTensors {
 public:
  AllowMutationOnSavedTensors();
  ~AllowMutationOnSavedTensors();
  AllowMutationOnSavedTensors(const AllowMutationOnSavedTensors&) = delete;
  AllowMutationOnSavedTensors& operator=(const AllowMutationOnSavedTensors&) = delete;

  struct State;

 private:
  std::shared_ptr<State> state_;
  SavedTensorHooks hooks_;
};

namespace internal {
// Called by every in-place op of tg::Tensor before it writes into `self` (autograd/ops/inplace.cc).
void BeforeInPlaceWrite(const Tensor& self);
}  // namespace internal

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_MUTATION_ON_SAVED_H_
