// Gradcheck: compares the analytical Jacobian (from the engine) of a function of Tensors
// with central finite differences, in float64.
//
//   GradcheckResult r = Gradcheck([](const VariableList& in) { return Tanh(Mul(in[0], in[1])); },
//                                 {x, y});           // f64 leaves; those requiring grad are
//                                 checked
//   EXPECT_TRUE(r.ok) << r.message;                  // the message names the worst element
#ifndef TAPEGRAD_AUTOGRAD_GRADCHECK_H_
#define TAPEGRAD_AUTOGRAD_GRADCHECK_H_

#include <functional>
#include <string>

#include "autograd/node.h"

namespace tg {

struct GradcheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // |analytical - numerical| <= atol + rtol * |numerical|
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = false;
  double max_error = 0;  // largest |analytical - numerical| - rtol * |numerical|
  std::string message;   // the worst element: input, input element, output element, values
};

GradcheckResult Gradcheck(const std::function<Tensor(const VariableList&)>& fn,
                          const VariableList& inputs, const GradcheckOptions& options = {});

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_GRADCHECK_H_
