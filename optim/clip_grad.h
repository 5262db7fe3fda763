// Gradient-norm clipping (torch.nn.utils.clip_grad_norm_): scales the gradients of a list of
// parameters in place so that their joint norm is at most max_norm.
//
//   loss.backward();
//   double norm = tg::optim::clip_grad_norm(params, /*max_norm=*/1.0);   // 2-norm
//   double inf_norm = tg::optim::clip_grad_norm(params, 1.0, tg::optim::kInfNorm);
//   if (!std::isfinite(norm)) { /* grads untouched: skip the step */ }
//   opt.step();
//
// Semantics (PyTorch's, with the differences marked):
// - Parameters without a grad are skipped; a parameter listed twice counts once.
// - total = (sum over all grad elements of |g|^p)^(1/p) for norm_type p, max |g| for kInfNorm
//   (NaN anywhere gives NaN). Every element is widened to double and accumulated in double in
//   list order (PyTorch computes per-tensor norms in the grad dtype, then the norm of those),
//   so f16/bf16/f32 gradients get an f64-accurate norm.
// - clip_coef = max_norm / (total + 1e-6) in double; when clip_coef < 1 every grad is
//   multiplied in place by clip_coef (rounded to the grad's compute type: f32 for f16/bf16/f32,
//   f64 for f64, like MulScalarInPlace) and its version bumped.
// - A non-finite total (inf or NaN) is returned as is and the grads are NOT scaled. PyTorch
//   (error_if_nonfinite=false) multiplies them by a NaN or zero coefficient; we refuse to corrupt
//   the grads and let the caller see the norm and skip the step.
// - The norm and the scaling are tensor/ops.h's GlobalGradNorm and ClipByNorm, run by the
//   gradients' device (all on one device): on CUDA one multi-tensor launch each for the 2-norm
//   and the inf norm, summed in f64 in another order than the CPU's list order (so the 2-norm
//   agrees to f64 rounding, not bit for bit); returning the norm reads it on the host (one
//   synchronisation).
// Throws tg::Error for max_norm < 0 or NaN, norm_type <= 0 or NaN, or an undefined parameter.
#ifndef TAPEGRAD_OPTIM_CLIP_GRAD_H_
#define TAPEGRAD_OPTIM_CLIP_GRAD_H_

#include <limits>
#include <vector>

#include "autograd/variable.h"

namespace tg::optim {

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// Returns the total norm of the gradients before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace tg::optim

#endif  // TAPEGRAD_OPTIM_CLIP_GRAD_H_
