#include "optim/clip_grad.h"

#include <cmath>
#include <unordered_set>

#include "tensor/convert.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {

double clip_grad_norm(const std::vector<Variable>& params, double max_norm, double norm_type) {
  TG_CHECK(max_norm >= 0, "clip_grad_norm: max_norm must be >= 0, got ", max_norm);
  TG_CHECK(norm_type > 0, "clip_grad_norm: norm_type must be > 0 (or inf), got ", norm_type);
  const bool inf_norm = std::isinf(norm_type);
  std::vector<Variable> grads;
  std::unordered_set<const VariableImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Variable& p = params[i];
    TG_CHECK(p.defined(), "clip_grad_norm: parameter ", i, " is undefined");
    if (!seen.insert(p.impl().get()).second) continue;
    Variable g = p.grad();
    if (!g.defined()) continue;
    TG_CHECK(IsFloating(g.dtype()), "clip_grad_norm: the gradient of parameter ", i, " has dtype ",
             DTypeName(g.dtype()), "; expected a floating dtype");
    grads.push_back(g);
  }

  double acc = 0;  // sum of |g|^p, or max |g| for the inf norm
  bool nan = false;
  for (const Variable& grad : grads) {
    const Tensor c = grad.data().contiguous();
    VisitFloating("clip_grad_norm", c.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* x = c.data<T>();
      const int64_t n = c.numel();
      if (inf_norm) {
        for (int64_t k = 0; k < n; ++k) {
          const double a = std::fabs(Convert<double>(x[k]));
          if (std::isnan(a)) nan = true;
          if (a > acc) acc = a;
        }
      } else if (norm_type == 2) {
        for (int64_t k = 0; k < n; ++k) {
          const double v = Convert<double>(x[k]);
          acc += v * v;
        }
      } else if (norm_type == 1) {
        for (int64_t k = 0; k < n; ++k) acc += std::fabs(Convert<double>(x[k]));
      } else {
        for (int64_t k = 0; k < n; ++k)
          acc += std::pow(std::fabs(Convert<double>(x[k])), norm_type);
      }
    });
  }
  double total;
  if (inf_norm) {
    total = nan ? std::nan("") : acc;
  } else if (norm_type == 1) {
    total = acc;
  } else if (norm_type == 2) {
    total = std::sqrt(acc);
  } else {
    total = std::pow(acc, 1.0 / norm_type);
  }
  if (!std::isfinite(total)) return total;  // grads untouched (see the header)

  const double clip_coef = max_norm / (total + 1e-6);
  if (clip_coef < 1) {
    std::vector<Tensor> data;
    for (const Variable& g : grads) data.push_back(g.data());
    MulScalarInPlace(data, clip_coef);
    for (const Variable& g : grads) g.bump_version();
  }
  return total;
}

}  // namespace tg::optim
