// Module backward hooks (register_full_backward_pre_hook / register_full_backward_hook) and the
// forward hooks' prepend / always_call, against the event orders, values and messages PyTorch
// 2.15 printed for the same module (tests/nn/module_hooks_reference.py, its output quoted in
// each test).
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "autograd/warning.h"
#include "gtest/gtest.h"
#include "nn/module.h"

namespace tg::nn {
namespace {

std::string List(const Tensor& t) {
  if (!t.defined()) return "None";
  return "[" + absl::StrJoin(t.data().to_vector<float>(), ", ") + "]";
}

// y = x * w, w = [2, 3].
struct Scale : Module {
  Scale() { w = register_parameter("w", RawTensor::FromVector<float>({2, 3}, {2})); }
  Tensor forward(const Tensor& x) override { return x * w; }
  Tensor w;
};

// The engine names the node an error came from after the message (" [in ...Backward]").
bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// PyTorch: y_hook [1, 2]; pre [1, 2]; acc_w [10, -20]; bwd [20, 60] [10, 20]; x_hook [21, 61];
// x.grad [21, 61] (the pre-hook multiplies grad_output by 10, the hook adds 1 to grad_input).
TEST(ModuleBackwardHooks, OrderAndReplacementsAsPyTorch) {
  Scale m;
  std::vector<std::string> ev;
  m.register_full_backward_pre_hook([&](Module&, const VariableList& go) -> VariableList {
    ev.push_back("pre " + List(go[0]));
    return {go[0] * 10};
  });
  m.register_full_backward_hook(
      [&](Module&, const VariableList& gi, const VariableList& go) -> VariableList {
        ev.push_back("bwd " + List(gi[0]) + " " + List(go[0]));
        if (!gi[0].defined()) return {};
        return {gi[0] + 1};
      });
  m.w.register_post_accumulate_grad_hook(
      [&](const Tensor& p) { ev.push_back("acc_w " + List(p.grad())); });
  Tensor x(RawTensor::FromVector<float>({1, -1}, {2}), /*requires_grad=*/true);
  x.register_hook([&](const Tensor& g) {
    ev.push_back("x_hook " + List(g));
    return Tensor();
  });
  Tensor y = m(x);
  EXPECT_EQ(y.grad_fn()->name(), "BackwardHookFunctionBackward");
  y.register_hook([&](const Tensor& g) {
    ev.push_back("y_hook " + List(g));
    return Tensor();
  });
  Sum(y * Tensor(RawTensor::FromVector<float>({1, 2}, {2}))).backward();
  ev.push_back("x.grad " + List(x.grad()));
  EXPECT_EQ(ev, (std::vector<std::string>{"y_hook [1, 2]", "pre [1, 2]", "acc_w [10, -20]",
                                          "bwd [20, 60] [10, 20]", "x_hook [21, 61]",
                                          "x.grad [21, 61]"}));

  // An input without grad: the hooks run at the output with grad_input None, and warn.
  // PyTorch: pre [1, 1]; bwd None [10, 10]; acc_w [10, -10].
  ev.clear();
  m.w.set_grad(Tensor());
  std::vector<std::string> warnings;
  {
    WarningHandlerGuard guard([&](const std::string& w) { warnings.push_back(w); });
    Sum(m(Tensor(RawTensor::FromVector<float>({1, -1}, {2})))).backward();
  }
  EXPECT_EQ(ev, (std::vector<std::string>{"pre [1, 1]", "bwd None [10, 10]", "acc_w [10, -10]"}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].rfind("Full backward hook is firing when gradients are computed with "
                              "respect to module outputs since no inputs require gradients.",
                              0),
            0u);
}

TEST(ModuleBackwardHooks, WrongReturnsAreRefusedWithPyTorchsMessages) {
  const Tensor x(RawTensor::FromVector<float>({1, 1}, {2}), /*requires_grad=*/true);
  Scale a;
  a.register_full_backward_hook(
      [](Module&, const VariableList& gi, const VariableList&) -> VariableList {
        return {gi[0], gi[0]};
      });
  EXPECT_TRUE(StartsWith(ErrorOf([&] { Sum(a(x)).backward(); }),
                         "Backward hook returned an invalid number of grad_input, got 2, but "
                         "expected 1"));
  Scale b;
  b.register_full_backward_pre_hook([](Module&, const VariableList& go) -> VariableList {
    return {go[0], go[0]};
  });
  EXPECT_TRUE(StartsWith(ErrorOf([&] { Sum(b(x)).backward(); }),
                         "Backward pre hook returned an invalid number of grad_output, got 2, but "
                         "expected 1"));
  Scale c;
  c.register_full_backward_hook([](Module&, const VariableList&, const VariableList&) {
    return VariableList{Tensor(RawTensor::Ones({2}))};
  });
  WarningHandlerGuard quiet([](const std::string&) {});
  EXPECT_TRUE(StartsWith(ErrorOf([&] { Sum(c(Tensor(RawTensor::Ones({2})))).backward(); }),
                         "Backward hook for Modules where no input requires gradient should always "
                         "return None or None for all gradients."));
}

TEST(ModuleBackwardHooks, HooksRegisteredAtTheCallRunAndRemovedOnesDoNot) {
  Scale m;
  int runs = 0;
  HookHandle h = m.register_full_backward_hook(
      [&](Module&, const VariableList&, const VariableList&) -> VariableList {
        ++runs;
        return {};
      });
  const Tensor x(RawTensor::FromVector<float>({1, 1}, {2}), /*requires_grad=*/true);
  Tensor y = m(x);
  h.remove();
  Sum(y).backward();  // registered when m ran: it runs
  EXPECT_EQ(runs, 1);
  Sum(m(x)).backward();  // removed before this call
  EXPECT_EQ(runs, 1);
}

struct Boom : Module {
  Tensor forward(const Tensor&) override { throw std::runtime_error("boom"); }
};

// PyTorch: ERR boom, [('always', None)]; and ['prepended', 'first'].
TEST(ModuleForwardHooks, AlwaysCallRunsAfterAThrowAndPrependGoesFirst) {
  Boom b;
  std::vector<std::string> ev;
  ForwardHookOptions always;
  always.always_call = true;
  b.register_forward_hook(
      [&](Module&, const Tensor&, const Tensor& out) {
        ev.push_back("always " + List(out));
        return Tensor();
      },
      always);
  b.register_forward_hook([&](Module&, const Tensor&, const Tensor& out) {
    ev.push_back("normal " + List(out));
    return Tensor();
  });
  EXPECT_EQ(ErrorOf([&] { b(Tensor(RawTensor::Ones({1}))); }), "boom");
  EXPECT_EQ(ev, (std::vector<std::string>{"always None"}));

  Scale s;
  ev.clear();
  s.register_forward_hook([&](Module&, const Tensor&, const Tensor&) {
    ev.push_back("first");
    return Tensor();
  });
  ForwardHookOptions prepend;
  prepend.prepend = true;
  s.register_forward_hook(
      [&](Module&, const Tensor&, const Tensor&) {
        ev.push_back("prepended");
        return Tensor();
      },
      prepend);
  s(Tensor(RawTensor::Ones({2})));
  EXPECT_EQ(ev, (std::vector<std::string>{"prepended", "first"}));
}

}  // namespace
}  // namespace tg::nn
