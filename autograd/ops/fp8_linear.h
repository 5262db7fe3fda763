// The FP8 form of Linear, for the Linear ops of autograd/ops.h (private to autograd/ops). It is
// not an op of its own: it is Linear's entry in the op list with Fp8Policy::kGemm (the fp8
// column), so the op list and the op tables know one Linear. A caller chooses the quantizers by
// installing an FP8 scope (autograd/fp8.h: Fp8Scope::LinearQuantizers), as amp::Fp8Training does.
#ifndef TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_
#define TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_

#include <optional>

#include "autograd/fp8.h"
#include "autograd/variable.h"
#include "tensor/op_kinds.h"

namespace tg {

// Linear with FP8 GEMMs (fp8_linear.cc has the formulas): the forward and both backward GEMMs
// read FP8 operands cast by `quantizers` (autograd/fp8.h; the recipes of amp/fp8.h make them) and
// accumulate in f32; the output has the dtype autocast gives Linear (x's dtype without autocast),
// the gradients their inputs' dtypes. f32, bf16 or f16 tensors. With act = kGeluTanh the GELU is
// applied to the GEMM's output and its derivative taken in one pass in the backward (as Linear's
// fused epilogue). No second derivative.
Tensor Fp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Fp8LinearQuantizers& quantizers, Activation act = Activation::kNone);

// act(Fp8Linear(x, weight, bias)) when an FP8 scope (autograd/fp8.h) is installed on this thread
// and covers `weight` (the parameter as the caller passed it, before autocast); nullopt
// otherwise: the caller runs Linear as usual. The first line of both Linear ops.
std::optional<Tensor> MaybeFp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     Activation act);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_
