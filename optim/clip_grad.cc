#include "optim/clip_grad.h"

#include <cmath>
#include <unordered_set>

#include "tensor/convert.h"
#include "tensor/cuda/amp_kernels.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::optim {
namespace {

// clip_grad_norm for gradients on one CUDA device. The 2-norm and the inf norm are one
// multi-tensor launch each for the norm and the scaling, and the clip decision is taken on the
// device; the only wait is the read of the norm that the function returns. Other norm types are
// composed from tensor ops in f64. The 2-norm agrees with the CPU's to a few f32 ulps (see
// cuda::GlobalGradNorm); the scaling rule is the same.
double ClipCudaGradNorm(const std::vector<Variable>& grads, double max_norm, double norm_type) {
  const Device device = grads[0].data().device();
  std::vector<Tensor> data;
  data.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i].data();
    TG_CHECK(g.is_contiguous(), "clip_grad_norm: gradient ", i,
             " is not contiguous; CUDA gradients are clipped in place by a multi-tensor kernel");
    data.push_back(g);
  }
  double total;
  if (norm_type == 2 || std::isinf(norm_type)) {
    const Tensor norm = cuda::ClipGradNorm(data, max_norm, norm_type);
    total = norm.item();  // the function's one host read
    if (std::isfinite(total) && max_norm / (total + 1e-6) < 1) {
      for (const Variable& g : grads) g.bump_version();
    }
    return total;
  }
  Tensor acc = Tensor::Zeros({}, kF64, device);
  for (const Tensor& g : data) acc = Add(acc, Sum(Pow(Abs(g.to(kF64)), norm_type)));
  total = norm_type == 1 ? acc.item() : std::pow(acc.item(), 1.0 / norm_type);
  if (!std::isfinite(total)) return total;
  const double clip_coef = max_norm / (total + 1e-6);
  if (clip_coef < 1) {
    MulScalarInPlace(data, clip_coef);
    for (const Variable& g : grads) g.bump_version();
  }
  return total;
}

}  // namespace

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
    TG_CHECK(grads.empty() || g.data().device() == grads[0].data().device(),
             "clip_grad_norm: the gradient of parameter ", i, " is on ",
             g.data().device().ToString(), " but earlier ones are on ",
             grads[0].data().device().ToString(), "; all must be on one device");
    grads.push_back(g);
  }

  if (!grads.empty() && grads[0].data().device().is_cuda()) {
    return ClipCudaGradNorm(grads, max_norm, norm_type);
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
