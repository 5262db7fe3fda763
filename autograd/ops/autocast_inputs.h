// How the differentiable ops apply the autocast policy (autograd/autocast.h) to their inputs. An op
// under a policy starts with
//
//   if (NeedsAutocast(P, a, b)) return Op(AutocastInput(a, P), AutocastInput(b, P));
//
// so the cast inputs re-enter the op, which then finds nothing left to cast.
#ifndef TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_
#define TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_

#include "autograd/autocast.h"
#include "autograd/variable.h"

namespace tg {

inline bool NeedsAutocast(amp::CastPolicy policy, const Variable& x) {
  return x.defined() && amp::AutocastTargetDType(policy, x.dtype()) != x.dtype();
}

template <typename... Rest>
bool NeedsAutocast(amp::CastPolicy policy, const Variable& x, const Rest&... rest) {
  if (!amp::AutocastEnabled()) return false;  // the fast path: one thread-local read
  return NeedsAutocast(policy, x) || (NeedsAutocast(policy, rest) || ...);
}

// `x` cast (a recorded Cast) to the dtype the policy asks for; the low-precision cast of an f32
// leaf that requires grad is taken from / put into the autocast cache.
Variable AutocastInput(const Variable& x, amp::CastPolicy policy);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_
