// How the differentiable ops apply their autocast policy (autograd/autocast.h). The policy is the
// op's attribute in the op list (tensor/op_list.inc), never a literal here: an op whose policy
// casts starts with
//
//   if (const auto in = AutocastInputs(OpId::kMatmul, a, b)) return Matmul(in[0], in[1]);
//
// so the cast inputs re-enter the op, which then finds nothing left to cast. Ops whose policy is
// kPromote or kNone need no such line (AutocastInputs would never cast for them).
#ifndef TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_
#define TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_

#include <array>
#include <cstddef>

#include "autograd/autocast.h"
#include "autograd/variable.h"
#include "tensor/op_list.h"

namespace tg {

// `x` cast (a recorded Cast) to the dtype `policy` asks for; the low-precision cast of an f32
// leaf that requires grad is taken from / put into the autocast cache.
Tensor AutocastInput(const Tensor& x, CastPolicy policy);

// An op's inputs after autocast: true, with every input cast to its policy's dtype, when autocast
// casts at least one of them; false (and empty) otherwise.
template <size_t N>
class AutocastedInputs {
 public:
  explicit operator bool() const { return cast_; }
  const Tensor& operator[](size_t i) const { return inputs_[i]; }

 private:
  template <typename... Vs>
  friend AutocastedInputs<sizeof...(Vs)> AutocastInputs(OpId op, const Vs&... xs);

  std::array<Tensor, N> inputs_;
  bool cast_ = false;
};

// Applies the autocast policy of `op` (AutocastPolicyOf, tensor/op_list.h) to its Tensor
// inputs (undefined ones, absent optional inputs, stay undefined). Autocast off costs one
// thread-local read. The inputs are cast last to first, as the hand-written prologues this
// replaced did (GCC evaluates call arguments right to left): the casts' nodes keep their
// sequence numbers, so the engine runs their backwards in the same order as before.
template <typename... Vs>
AutocastedInputs<sizeof...(Vs)> AutocastInputs(OpId op, const Vs&... xs) {
  constexpr size_t n = sizeof...(Vs);
  AutocastedInputs<n> result;
  if (!amp::AutocastEnabled()) return result;  // the fast path
  const CastPolicy policy = AutocastPolicyOf(op);
  const std::array<const Tensor*, n> in = {&xs...};
  bool needed = false;
  for (const Tensor* x : in) {
    needed = needed || (x->defined() && amp::AutocastTargetDType(policy, x->dtype()) != x->dtype());
  }
  if (!needed) return result;
  for (size_t i = n; i-- > 0;) result.inputs_[i] = AutocastInput(*in[i], policy);
  result.cast_ = true;
  return result;
}

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_AUTOCAST_INPUTS_H_
