// Helpers shared by the fused (multi-tensor) update loops of SGD and Adam: contiguous views of a
// parameter and its gradient, dispatch over (param dtype, grad dtype) to typed loops, and
// compile-time flags so that each loop body has no per-element branches on options.
//
//   FlatParam f = FlatParam::Make(param.data(), grad);        // contiguous, typed pointers
//   VisitParamGrad(f.param.dtype(), f.grad.dtype(), [&](auto p_tag, auto g_tag) { ... });
//   f.WriteBack(param.data());                                 // no-op when already contiguous
//
// Internal to //optim (not part of the public API).
#ifndef TAPEGRAD_OPTIM_FOREACH_H_
#define TAPEGRAD_OPTIM_FOREACH_H_

#include <type_traits>
#include <utility>

#include "optim/optimizer.h"
#include "tensor/half.h"
#include "tensor/tensor.h"

namespace tg::optim::internal {

// A parameter and its gradient as contiguous tensors. The gradient has the parameter's dtype or
// the compute dtype (StateDType); any other gradient dtype is converted to the compute dtype
// first (exactly what the per-tensor path's grad.to(compute dtype) does).
struct FlatParam {
  Tensor param;    // contiguous; the parameter itself unless it was a strided view
  Tensor grad;     // contiguous, dtype param.dtype() or StateDType(param.dtype())
  bool copy_back;  // param is a copy that must be written back

  static FlatParam Make(const Tensor& param, const Tensor& grad) {
    FlatParam f;
    f.copy_back = !param.is_contiguous();
    f.param = f.copy_back ? param.contiguous() : param;
    const DType cd = StateDType(param.dtype());
    f.grad = (grad.dtype() == param.dtype() || grad.dtype() == cd) ? grad : grad.to(cd);
    f.grad = f.grad.contiguous();
    return f;
  }
  void WriteBack(const Tensor& param) const {
    if (copy_back) param.copy_(this->param);
  }
};

// Calls fn(T{}, G{}) with the storage types of the parameter (T) and the gradient (G), where G
// is T or the compute type (float for f16/bf16, T otherwise).
template <typename Fn>
void VisitParamGrad(DType param, DType grad, Fn&& fn) {
  switch (param) {
    case DType::kF32:
      return fn(float{}, float{});
    case DType::kF64:
      return fn(double{}, double{});
    case DType::kF16:
      if (grad == kF16) return fn(Half{}, Half{});
      return fn(Half{}, float{});
    case DType::kBF16:
      if (grad == kBF16) return fn(BFloat16{}, BFloat16{});
      return fn(BFloat16{}, float{});
    default:
      throw Error(absl::StrCat("optimizer: unsupported param dtype ", DTypeName(param)));
  }
}

// fn(std::integral_constant<bool, b>{}): turns a runtime flag into a template argument.
template <typename Fn>
void WithFlag(bool b, Fn&& fn) {
  if (b) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

}  // namespace tg::optim::internal

#endif  // TAPEGRAD_OPTIM_FOREACH_H_
