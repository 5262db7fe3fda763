// The FP8 form of Linear, for the Linear ops of autograd/ops.h (private to autograd/ops).
#ifndef TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_
#define TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_

#include <optional>

#include "autograd/variable.h"
#include "tensor/op_kinds.h"

namespace tg {

// act(Fp8Linear(x, weight, bias)) when an FP8 scope (autograd/fp8.h) is installed on this thread
// and covers `weight` (the parameter as the caller passed it, before autocast); nullopt
// otherwise: the caller runs Linear as usual. The first line of both Linear ops.
std::optional<Tensor> MaybeFp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     Activation act);

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_FP8_LINEAR_H_
