#include "autograd/gradcheck.h"

#include <cmath>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/error.h"

namespace tg {

GradcheckResult Gradcheck(const std::function<Tensor(const VariableList&)>& fn,
                          const VariableList& inputs, const GradcheckOptions& options) {
  // Private contiguous f64 copies, so perturbing them touches nothing of the caller's.
  VariableList leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TG_CHECK(inputs[i].defined(), "gradcheck: input ", i, " is undefined");
    TG_CHECK(inputs[i].dtype() == kF64 || !inputs[i].requires_grad(), "gradcheck: input ", i,
             " is ", DTypeName(inputs[i].dtype()), "; gradcheck needs f64 inputs");
    Tensor leaf(inputs[i].data().clone());
    if (inputs[i].requires_grad()) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  auto evaluate = [&]() {
    NoGradGuard no_grad;
    Tensor out = fn(leaves);
    TG_CHECK(out.dtype() == kF64, "gradcheck: the function returned ", DTypeName(out.dtype()),
             ", expected f64");
    return out.data().to_vector<double>();
  };
  Tensor output = fn(leaves);
  const int64_t n_out = output.numel();
  GradcheckResult result;
  result.ok = true;
  result.max_error = -INFINITY;
  VariableList checked;
  std::vector<size_t> checked_index;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].requires_grad()) {
      checked.push_back(leaves[i]);
      checked_index.push_back(i);
    }
  }
  TG_CHECK(!checked.empty(), "gradcheck: no input requires grad");
  TG_CHECK(output.requires_grad() || n_out == 0, "gradcheck: the output does not require grad");
  // analytical[k][j][o]: d out[o] / d input_k[j], one vector-Jacobian product per output element.
  std::vector<std::vector<std::vector<double>>> analytical(checked.size());
  for (size_t k = 0; k < checked.size(); ++k) {
    analytical[k].assign(static_cast<size_t>(checked[k].numel()), std::vector<double>(n_out, 0.0));
  }
  for (int64_t o = 0; o < n_out; ++o) {
    RawTensor seed = RawTensor::Zeros(output.shape(), kF64);
    static_cast<double*>(seed.raw_data())[o] = 1.0;
    VariableList grads =
        Engine::Grad({output}, checked, {Tensor(seed)},
                     GradOptions{/*retain_graph=*/true, false, /*allow_unused=*/true});
    for (size_t k = 0; k < checked.size(); ++k) {
      if (!grads[k].defined()) continue;
      const std::vector<double> g = grads[k].data().to_vector<double>();
      for (size_t j = 0; j < g.size(); ++j) analytical[k][j][o] = g[j];
    }
  }
  for (size_t k = 0; k < checked.size(); ++k) {
    RawTensor data = checked[k].data();  // contiguous f64 (a clone)
    double* p = static_cast<double*>(data.raw_data());
    for (int64_t j = 0; j < data.numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + options.eps;
      const std::vector<double> plus = evaluate();
      p[j] = saved - options.eps;
      const std::vector<double> minus = evaluate();
      p[j] = saved;
      for (int64_t o = 0; o < n_out; ++o) {
        const double numerical = (plus[o] - minus[o]) / (2 * options.eps);
        const double a = analytical[k][j][o];
        const double excess = std::abs(a - numerical) - options.rtol * std::abs(numerical);
        const bool bad = !(excess <= options.atol) || std::isnan(a) != std::isnan(numerical);
        if (excess > result.max_error || (bad && result.ok)) {
          result.max_error = excess;
          result.message =
              absl::StrCat("gradcheck: input ", checked_index[k], " element ", j,
                           ", output element ", o, ": analytical ", a, ", numerical ", numerical,
                           " (|difference| ", std::abs(a - numerical), ", allowed ",
                           options.atol + options.rtol * std::abs(numerical), ")");
        }
        if (bad) result.ok = false;
      }
    }
  }
  if (result.ok) result.message = absl::StrCat("gradcheck passed; worst ", result.message);
  return result;
}

}  // namespace tg
