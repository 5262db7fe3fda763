#include "autograd/fp8.h"

namespace tg {
namespace {

thread_local Fp8Scope* current_scope = nullptr;

}  // namespace

Fp8Scope* CurrentFp8Scope() { return current_scope; }

Fp8ScopeGuard::Fp8ScopeGuard(Fp8Scope* scope) : previous_(current_scope) { current_scope = scope; }

Fp8ScopeGuard::~Fp8ScopeGuard() { current_scope = previous_; }

}  // namespace tg
