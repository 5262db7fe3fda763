// Helpers of the tests that compare with literals printed by a PyTorch reference script
// (hook_semantics_reference.py, checkpoint_reference.py): f64 leaves and gradients formatted as
// the scripts print them.
//
//   Tensor x = Leaf({1, 2});
//   EXPECT_EQ(Fmt(x.grad()), "[0.5, 1]");
#ifndef TAPEGRAD_TESTS_AUTOGRAD_REFERENCE_VALUES_H_
#define TAPEGRAD_TESTS_AUTOGRAD_REFERENCE_VALUES_H_

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "tensor/tensor.h"

namespace tg::testing {

// Events recorded by hooks, in order.
using Events = std::vector<std::string>;

// A 1-d leaf that requires grad.
inline Tensor Leaf(std::vector<double> values, DType dtype = kF64) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor(RawTensor::FromVector<double>(values, {n}, dtype), /*requires_grad=*/true);
}

// A gradient as the reference scripts print it: [v, ...] with %g, or "undef".
inline std::string Fmt(const Tensor& g) {
  if (!g.defined()) return "undef";
  std::ostringstream os;
  os << "[";
  const std::vector<double> values = g.data().to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << "]";
  return os.str();
}

}  // namespace tg::testing

#endif  // TAPEGRAD_TESTS_AUTOGRAD_REFERENCE_VALUES_H_
