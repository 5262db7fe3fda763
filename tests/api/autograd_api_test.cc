// tg::autograd (autograd/torch_autograd.h): libtorch's "Autograd in C++" tutorial, its custom
// functions and higher-order gradients, ported by the two replacements; gradients compared
// with the built-in ops' exactly.
#include <optional>
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

// set_materialize_grads(false): the gradient of an output nothing used arrives undefined (the
// default would give zeros). PyTorch 2.15 prints x.grad = [2., 2.] and "None" for the second.
struct TwoOutputs : public Function<TwoOutputs> {
  static variable_list forward(AutogradContext* ctx, tg::Tensor x) {
    ctx->set_materialize_grads(false);
    return {x * 2, x * 3};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ctx->saved_data["second_defined"] = grads[1].defined();
    tg::Tensor g = grads[0] * 2;
    if (grads[1].defined()) g = g + grads[1] * 3;
    return {g};
  }
};

TEST(AutogradApi, SetMaterializeGradsFalseLeavesUnusedGradientsUndefined) {
  tg::Tensor x = tg::ones({2}, tg::requires_grad());
  variable_list out = TwoOutputs::apply(x);
  out[0].sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{2, 2}));
  EXPECT_FALSE(out[0].grad_fn() == nullptr);
}

// mark_dirty: forward doubles its input in place and returns it; the input becomes the output
// (the same tensor), its version counts the write, its history is the function's node, and the
// gradient flows through it (PyTorch 2.15: a.grad = [2., 2., 2.], y is b; its version +1 for
// mark_dirty, +2 when forward also used an in-place op, as here it writes the data directly).
struct DoubleInPlace : public Function<DoubleInPlace> {
  static tg::Tensor forward(AutogradContext* ctx, tg::Tensor x) {
    x.data().copy_(tg::MulScalar(x.data(), 2.0));  // in place on the data
    ctx->mark_dirty({x});
    return x;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0] * 2}; }
};

struct DirtyButNotReturned : public Function<DirtyButNotReturned> {
  static tg::Tensor forward(AutogradContext* ctx, tg::Tensor x) {
    ctx->mark_dirty({x});
    return x * 1;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0]}; }
};

TEST(AutogradApi, MarkDirtyRebasesTheInputOntoTheFunction) {
  tg::Tensor a = tg::ones({3}, tg::requires_grad());
  tg::Tensor b = a * 1;
  const uint64_t version = b.version();
  tg::Tensor y = DoubleInPlace::apply(b);
  EXPECT_TRUE(y.is_same(b));
  EXPECT_EQ(b.version(), version + 1);
  EXPECT_EQ(b.grad_fn()->name(), "DoubleInPlaceBackward");
  EXPECT_EQ(Values(b), (std::vector<float>{2, 2, 2}));
  y.sum().backward();
  EXPECT_EQ(Values(a.grad()), (std::vector<float>{2, 2, 2}));
  try {
    DoubleInPlace::apply(a);
    FAIL() << "a leaf that requires grad was modified in place";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "a leaf Variable that requires grad has been used in an in-place operation."),
              std::string::npos)
        << e.what();
  }
  try {
    DirtyButNotReturned::apply(a * 1);
    FAIL() << "a dirty input that is not returned";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Some elements marked as dirty during the forward "
                                         "method were not returned as output."),
              std::string::npos)
        << e.what();
  }
  // As in PyTorch, the refused call's forward already ran: a was doubled before the check.
  EXPECT_EQ(Values(a), (std::vector<float>{2, 2, 2}));
  {
    tg::NoGradGuard no_grad;  // nothing recorded: a leaf may be modified
    tg::Tensor z = DoubleInPlace::apply(a);
    EXPECT_TRUE(z.is_same(a));
    EXPECT_EQ(Values(a), (std::vector<float>{4, 4, 4}));
  }
}

// Python's @once_differentiable, as tapegrad's kOnceDifferentiable: the first backward works;
// under create_graph its result carries the error only when a gradient fed to it requires grad
// (PyTorch's rule: otherwise the result simply has no history).
struct CubeOnce : tg::Function<CubeOnce> {
  static constexpr const char* kName = "CubeOnce";
  static constexpr bool kOnceDifferentiable = true;
  static tg::VariableList Forward(tg::FunctionCtx& ctx, const tg::VariableList& in) {
    ctx.save_for_backward({in[0]});
    return {in[0] * in[0] * in[0]};
  }
  static tg::VariableList Backward(tg::FunctionCtx& ctx, const tg::VariableList& grads) {
    const tg::Tensor x = ctx.saved_variables()[0];
    EXPECT_FALSE(tg::GradMode::is_enabled());  // run under no-grad
    return {grads[0] * x * x * 3};
  }
};

TEST(AutogradApi, OnceDifferentiableRefusesASecondDerivative) {
  tg::Tensor x = tg::tensor({2.0}, tg::requires_grad());
  tg::Tensor y = CubeOnce::Apply({x})[0];
  tg::Tensor g = tg::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_EQ(g.item<float>(), 12.0f);
  EXPECT_FALSE(g.requires_grad());
  tg::Tensor v = tg::ones({1}, tg::requires_grad());
  tg::Tensor h = tg::autograd::grad({y}, {x}, {v}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  EXPECT_EQ(h.item<float>(), 12.0f);
  EXPECT_TRUE(h.requires_grad());
  EXPECT_EQ(h.grad_fn()->name(), "Error");  // PyTorch: torch::autograd::Error
  try {
    h.backward();
    FAIL() << "a second derivative through a once-differentiable function";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("trying to differentiate twice a function that was "
                                         "marked with @once_differentiable"),
              std::string::npos)
        << e.what();
  }
  tg::Tensor x2 = tg::tensor({2.0}, tg::requires_grad());
  CubeOnce::Apply({x2})[0].backward();  // without create_graph: a plain gradient
  EXPECT_EQ(x2.grad().item<float>(), 12.0f);
}

// GradientEdge: a backward split as zero-bubble pipeline schedules split it, first the
// activation's gradient, then from the activation's edge the weight's; PyTorch 2.15 prints
// dh = [2, -3, 13], dw = [2, -6, 39], dx (through x's leaf edge) = [1, 3, 26], and no .grad.
TEST(AutogradApi, GradientEdgesSplitABackward) {
  tg::Tensor x = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
  tg::Tensor w = tg::tensor({0.5, -1.0, 2.0}, tg::requires_grad());
  tg::Tensor h = x * w;
  tg::Tensor y = (h * h).sum() + h.sum();
  const tg::GradientEdge e = tg::get_gradient_edge(h);
  tg::GradOptions retain;
  retain.retain_graph = true;
  const tg::Tensor dh = tg::Engine::GradEdges({y}, {e}, {}, retain)[0];
  EXPECT_EQ(Values(dh), (std::vector<float>{2, -3, 13}));
  const tg::Tensor dw = tg::Engine::GradEdges({e}, {w}, {dh}, retain)[0];
  EXPECT_EQ(Values(dw), (std::vector<float>{2, -6, 39}));
  const tg::Tensor dx = tg::Engine::GradEdges({y}, {tg::get_gradient_edge(x)}, {}, retain)[0];
  EXPECT_EQ(Values(dx), (std::vector<float>{1, 3, 26}));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  h = tg::Tensor();  // the edge outlives the tensor
  EXPECT_EQ(Values(tg::Engine::GradEdges({e}, {x}, {dh}, retain)[0]),
            (std::vector<float>{1, 3, 26}));
  try {
    tg::Engine::GradEdges({e}, {w}, {}, retain);
    FAIL() << "a 3-element edge needs its grad_output";
  } catch (const tg::Error& err) {
    EXPECT_NE(std::string(err.what()).find("a gradient can be implied only for one-element roots"),
              std::string::npos)
        << err.what();
  }
  try {
    tg::get_gradient_edge(tg::ones({2}));
    FAIL() << "no edge for a tensor without grad";
  } catch (const tg::Error& err) {
    EXPECT_NE(std::string(err.what())
                  .find("It is not possible to get the gradient edge for a "
                        "Tensor that does not require gradients"),
              std::string::npos);
  }
}

// save_on_cpu: the same gradients as without it; on the CPU the saved tensors are the tensors
// themselves, so a saved input unpacks as the input (its hooks fire as usual).
TEST(AutogradApi, SaveOnCpuGivesTheSameGradients) {
  auto run = [](bool offload) {
    tg::Tensor x = tg::tensor({0.5, -1.0, 2.0}, tg::requires_grad());
    tg::Tensor w = tg::tensor({1.5, 0.25, -0.5}, tg::requires_grad());
    int hook_calls = 0;
    x.register_hook([&](const tg::Tensor&) {
      ++hook_calls;
      return tg::Tensor();
    });
    tg::Tensor y;
    {
      std::optional<tg::SaveOnCpu> guard;
      if (offload) guard.emplace();
      y = (x.exp() * w * x).sum();
    }
    y.backward();
    EXPECT_EQ(hook_calls, 1);
    return std::make_pair(Values(x.grad()), Values(w.grad()));
  };
  EXPECT_EQ(run(true), run(false));
}

// allow_mutation_on_saved_tensors: PyTorch 2.15 prints a.grad = [4.7182817459106445,
// 11.389056205749512, 26.08553695678711] (2 b + exp(b) of b before the write) and refuses a
// backward after the context closed.
TEST(AutogradApi, AllowMutationOnSavedTensorsUsesTheValueBeforeTheWrite) {
  {
    tg::AllowMutationOnSavedTensors allow;
    tg::Tensor a = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
    tg::Tensor b = a.clone();
    tg::Tensor out = (b * b).sum() + b.exp().sum();
    b.mul_(2);
    out.backward();
    const std::vector<float> want = {4.7182817459106445f, 11.389056205749512f, 26.08553695678711f};
    EXPECT_EQ(Values(a.grad()), want);
    EXPECT_EQ(Values(b), (std::vector<float>{2, 4, 6}));
  }
  tg::Tensor out;
  tg::Tensor b;
  {
    tg::AllowMutationOnSavedTensors allow;
    tg::Tensor a = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
    b = a.clone();
    out = (b * b).sum();
  }
  b.mul_(2);
  try {
    out.backward();
    FAIL() << "a backward after the context closed";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Trying to backward outside of the "
                                         "'allow_mutation_on_saved_tensors' context"),
              std::string::npos)
        << e.what();
  }
  // Without the guard the version counter refuses the backward, as PyTorch does.
  tg::Tensor a = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
  tg::Tensor c = a.clone();
  tg::Tensor plain = (c * c).sum();
  c.mul_(2);
  EXPECT_THROW(plain.backward(), tg::Error);
}

}  // namespace
