#include "autograd/dispatch_mode.h"

namespace tg {
namespace {

thread_local const OpDispatchModeGuard::Entry* top = nullptr;

}  // namespace

OpDispatchModeGuard::OpDispatchModeGuard(OpDispatchMode* mode) : entry_{mode, top} {
  top = &entry_;
}

OpDispatchModeGuard::~OpDispatchModeGuard() { top = entry_.below; }

void NotifyInPlaceWrite(const Tensor& self) {
  for (const OpDispatchModeGuard::Entry* e = top; e != nullptr; e = e->below) {
    e->mode->BeforeInPlaceWrite(self);
  }
}

namespace dispatch_internal {

const OpDispatchModeGuard::Entry* Top() { return top; }

ScopedTop::ScopedTop(const OpDispatchModeGuard::Entry* new_top) : previous_(top) { top = new_top; }

ScopedTop::~ScopedTop() { top = previous_; }

DispatchResult CallFrom(const OpDispatchModeGuard::Entry* entry, OpId op,
                        const VariableList& inputs, const std::function<DispatchResult()>& kernel) {
  if (entry == nullptr) return kernel();
  const ScopedTop below(entry->below);
  return entry->mode->Call(op, inputs, [&] { return CallFrom(entry->below, op, inputs, kernel); });
}

}  // namespace dispatch_internal
}  // namespace tg
