// tg::autograd (autograd/torch_autograd.h): libtorch's "Autograd in C++" tutorial, its custom
// functions and higher-order gradients, ported by the two replacements; gradients compared
// with the built-in ops' exactly.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tapegrad.h"

namespace {

using tg::autograd::AutogradContext;
using tg::autograd::Function;
using tg::autograd::tensor_list;
using tg::autograd::variable_list;

std::vector<float> Values(const tg::Tensor& t) { return t.data().to_vector<float>(); }

// The tutorial's LinearFunction, as written there.
class LinearFunction : public Function<LinearFunction> {
 public:
  static tg::Tensor forward(AutogradContext* ctx, tg::Tensor input, tg::Tensor weight,
                            tg::Tensor bias = tg::Tensor()) {
    ctx->save_for_backward({input, weight, bias});
    auto output = input.mm(weight.t());
    if (bias.defined()) {
      output += bias.unsqueeze(0).expand_as(output);
    }
    return output;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto input = saved[0];
    auto weight = saved[1];
    auto bias = saved[2];
    auto grad_output = grad_outputs[0];
    auto grad_input = grad_output.mm(weight);
    auto grad_weight = grad_output.t().mm(input);
    auto grad_bias = tg::Tensor();
    if (bias.defined()) {
      grad_bias = grad_output.sum(0);
    }
    return {grad_input, grad_weight, grad_bias};
  }
};

// The tutorial's MulConstant: a non-Tensor argument through saved_data.
class MulConstant : public Function<MulConstant> {
 public:
  static tg::Tensor forward(AutogradContext* ctx, tg::Tensor tensor, double constant) {
    ctx->saved_data["constant"] = constant;
    return tensor * constant;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    return {grad_outputs[0] * ctx->saved_data["constant"].toDouble(), tg::Tensor()};
  }
};

TEST(AutogradApi, TutorialLinearFunctionMatchesTheBuiltInOps) {
  tg::manual_seed(0);
  auto x = tg::randn({2, 3}).requires_grad_();
  auto weight = tg::randn({4, 3}).requires_grad_();
  auto bias = tg::randn({4}).requires_grad_();
  auto y = LinearFunction::apply(x, weight, bias);
  EXPECT_EQ(y.grad_fn()->name(), "LinearFunctionBackward");
  y.sum().backward();
  const std::vector<float> gx = Values(x.grad()), gw = Values(weight.grad()),
                           gb = Values(bias.grad());
  x.grad().zero_();
  weight.grad().zero_();
  bias.grad().zero_();
  (x.mm(weight.t()) + bias).sum().backward();
  EXPECT_EQ(gx, Values(x.grad()));
  EXPECT_EQ(gw, Values(weight.grad()));
  EXPECT_EQ(gb, Values(bias.grad()));
}

TEST(AutogradApi, TutorialMulConstantSavesANumber) {
  auto x = tg::randn({2}).requires_grad_();
  auto y = MulConstant::apply(x, 5.5);
  y.sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{5.5f, 5.5f}));
}

// A backward that returns a gradient for the number, or too few: libtorch's rule, named.
class WrongCount : public Function<WrongCount> {
 public:
  static tg::Tensor forward(AutogradContext*, tg::Tensor x, double) { return x * 2; }
  static tensor_list backward(AutogradContext*, tensor_list g) { return {g[0]}; }
};

TEST(AutogradApi, BackwardMustReturnOneGradientPerArgument) {
  auto x = tg::ones({2}, tg::requires_grad());
  try {
    WrongCount::apply(x, 1.0).sum().backward();
    FAIL() << "expected an error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("WrongCountBackward: backward returned 1 gradients, "
                                         "expected 2"),
              std::string::npos)
        << e.what();
  }
}

class GradientForANumber : public Function<GradientForANumber> {
 public:
  static tg::Tensor forward(AutogradContext*, tg::Tensor x, double) { return x * 2; }
  static tensor_list backward(AutogradContext*, tensor_list g) { return {g[0], tg::ones({1})}; }
};

TEST(AutogradApi, NoGradientForANonTensorArgument) {
  auto x = tg::ones({2}, tg::requires_grad());
  try {
    GradientForANumber::apply(x, 1.0).sum().backward();
    FAIL() << "expected an error";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GradientForANumberBackward: backward returned a "
                                         "gradient for argument 1, which is not a Tensor"),
              std::string::npos)
        << e.what();
  }
}

TEST(AutogradApi, GradWithCreateGraphGivesSecondDerivatives) {
  auto x = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
  auto y = (x * x * x).sum();
  variable_list g = tg::autograd::grad({y}, {x}, /*grad_outputs=*/{}, /*retain_graph=*/true,
                                       /*create_graph=*/true);
  EXPECT_EQ(Values(g[0]), (std::vector<float>{3, 12, 27}));  // 3 x^2
  g[0].sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{6, 12, 18}));  // 6 x
  auto unused = tg::ones({1}, tg::requires_grad());
  EXPECT_THROW(tg::autograd::grad({(x * 2).sum()}, {unused}), tg::Error);
  EXPECT_FALSE(tg::autograd::grad({(x * 2).sum()}, {unused}, {}, std::nullopt, false,
                                  /*allow_unused=*/true)[0]
                   .defined());
}

TEST(AutogradApi, SavedDataKinds) {
  tg::autograd::IValue i = int64_t{3}, d = 2.5, b = true, s = "name";
  EXPECT_EQ(i.toInt(), 3);
  EXPECT_EQ(i.toDouble(), 3.0);
  EXPECT_EQ(d.toDouble(), 2.5);
  EXPECT_TRUE(b.toBool());
  EXPECT_EQ(s.toStringRef(), "name");
  try {
    d.toTensor();
    FAIL() << "a double is not a tensor";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(), "IValue: expected Tensor, holds double");
  }
}

}  // namespace
