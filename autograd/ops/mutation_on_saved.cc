#include "autograd/mutation_on_saved.h"

#include <any>
#include <vector>

#include "tensor/error.h"

namespace tg {

// The tensors saved while the guard lives, each with the copy made before its storage's first
// in-place write (undefined until then).
struct AllowMutationOnSavedTensors::State {
  struct Saved {
    RawTensor original;
    RawTensor copy;
  };
  std::vector<std::shared_ptr<Saved>> saved;
  bool closed = false;
};

namespace {

thread_local AllowMutationOnSavedTensors::State* active = nullptr;

}  // namespace

namespace internal {

void BeforeInPlaceWrite(const Tensor& self) {
  if (active == nullptr || !self.defined()) return;
  for (const auto& s : active->saved) {
    if (!s->copy.defined() && s->original.shares_storage(self.data()))
      s->copy = s->original.clone();
  }
}

}  // namespace internal

AllowMutationOnSavedTensors::AllowMutationOnSavedTensors()
    : state_(std::make_shared<State>()),
      hooks_(
          [state = state_](const Tensor& t) -> std::any {
            auto saved = std::make_shared<State::Saved>();
            saved->original = t.data();
            state->saved.push_back(saved);
            return std::make_pair(state, saved);
          },
          [](const std::any& packed) -> Tensor {
            const auto& [state, saved] = std::any_cast<
                const std::pair<std::shared_ptr<State>, std::shared_ptr<State::Saved>>&>(packed);
            TG_CHECK(!state->closed,
                     "Trying to backward outside of the 'allow_mutation_on_saved_tensors' "
                     "context in which the graph was originally recorded.");
            return Tensor(saved->copy.defined() ? saved->copy : saved->original);
          }) {
  TG_CHECK(active == nullptr,
           "AllowMutationOnSavedTensors: a guard is already active on this thread (they do not "
           "nest)");
  active = state_.get();
}

AllowMutationOnSavedTensors::~AllowMutationOnSavedTensors() {
  active = nullptr;
  state_->closed = true;
  state_->saved.clear();
}

}  // namespace tg
