#include "autograd/engine.h"

#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::ThrowsError;
using testing::ThrowsErrorExactly;

Variable Leaf(std::vector<double> values, Shape shape, DType dtype = kF64) {
  return Variable(Tensor::FromVector<double>(values, shape, dtype), /*requires_grad=*/true);
}

std::vector<double> Values(const Variable& v) { return v.data().to_vector<double>(); }

TEST(EngineTest, SimpleChainRule) {
  Variable x = Leaf({1, 2, 3}, {3});
  Variable y = Sum(Mul(x, x));
  y.backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{2, 4, 6}));
}

TEST(EngineTest, GradcheckSmoke) {
  Variable a = Leaf({0.5, -1.0, 2.0, 0.3}, {2, 2});
  Variable b = Leaf({1.5, 0.25}, {2});
  GradcheckResult r = Gradcheck(
      [](const VariableList& in) { return Tanh(Add(Matmul(in[0], in[0]), in[1])); }, {a, b});
  EXPECT_TRUE(r.ok) << r.message;
}

}  // namespace
}  // namespace tg
