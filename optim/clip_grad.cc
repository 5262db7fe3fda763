#include "optim/clip_grad.h"

#include <cmath>
#include <unordered_set>

#include "tensor/error.h"
#include "tensor/ops.h"
#include "tensor/optimizer_kernels.h"

namespace tg::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  TG_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  TG_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be > 0 (or inf), got ", norm_type);
  std::vector<Tensor> grads;
  std::unordered_set<const VariableImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    TG_CHECK(p.defined(), "clip_grad_norm: parameter ", i, " is undefined");
    if (!seen.insert(p.impl().get()).second) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK(IsFloating(g.dtype()), "clip_grad_norm: the gradient of parameter ", i, " has dtype ",
             DTypeName(g.dtype()), "; expected a floating dtype");
    TG_CHECK(grads.empty() || g.data().device() == grads[0].data().device(),
             "clip_grad_norm: the gradient of parameter ", i, " is on ",
             g.data().device().ToString(), " but earlier ones are on ",
             grads[0].data().device().ToString(), "; all must be on one device");
    grads.push_back(g);
  }

  if (grads.empty()) return 0;
  std::vector<RawTensor> data;
  data.reserve(grads.size());
  for (const Tensor& g : grads) data.push_back(g.data());
  const RawTensor norm = GlobalGradNorm(data, norm_type);  // 0-d f64 on the grads' device
  const double total = norm.item();  // the function's one host read (a device sync)
  double clip_coef = 1;
  // The one clip rule (tensor/optimizer_kernels.h); a non-finite total leaves the grads untouched.
  if (ClipCoefficient(total, max_norm, &clip_coef)) {
    ClipByNorm(data, norm, max_norm);  // takes the same decision where the norm lives
    for (const Tensor& g : grads) g.bump_version();
  }
  return total;
}

}  // namespace tg::optim
