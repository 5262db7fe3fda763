// Module: registration and dotted names, modes, to(dtype), to(device) errors, state_dict round
// trips and strict-load errors, forward hooks, and the to_string summary (to(cuda) round trips are
// in cuda_gpt_test).
#include "nn/module.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/layers.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace nn {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

// A module with a parameter, a buffer and two children, the second a container.
class Net : public Module {
 public:
  explicit Net(Generator& gen) : Module("Net") {
    scale_ = register_parameter("scale", RawTensor::Full({2}, 3.0));
    register_buffer("steps", RawTensor::Zeros({1}, kI64));
    register_buffer("running", RawTensor::Ones({2}));
    encoder_ = register_module("encoder", std::make_shared<LinearImpl>(3, 2, gen));
    head_ =
        register_module("head", Sequential(ReLU(), Linear(LinearOptions(2, 2).bias(false), gen)));
  }
  Tensor forward(const Tensor& x) override { return (*head_)(Mul((*encoder_)(x), scale_)); }
  using Module::register_buffer;
  using Module::register_parameter;

  Tensor scale_;
  std::shared_ptr<LinearImpl> encoder_;
  Sequential head_{nullptr};
};

std::vector<std::string> Names(const std::vector<std::pair<std::string, Tensor>>& list) {
  std::vector<std::string> out;
  for (const auto& e : list) out.push_back(e.first);
  return out;
}

TEST(ModuleTest, NamesAreDottedInRegistrationOrder) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  EXPECT_EQ(Names(net->named_parameters()),
            (std::vector<std::string>{"scale", "encoder.weight", "encoder.bias", "head.1.weight"}));
  EXPECT_EQ(Names(net->named_parameters(/*recurse=*/false)), std::vector<std::string>{"scale"});
  std::vector<std::string> buffers;
  for (const auto& e : net->named_buffers()) buffers.push_back(e.first);
  EXPECT_EQ(buffers, (std::vector<std::string>{"steps", "running"}));
  std::vector<std::string> modules;
  for (const auto& e : net->named_modules()) modules.push_back(e.first);
  EXPECT_EQ(modules, (std::vector<std::string>{"", "encoder", "head", "head.0", "head.1"}));
  EXPECT_EQ(net->num_parameters(), 2 + 6 + 2 + 4);
  // Parameters are the very Tensors the layers use, and they require grad.
  EXPECT_TRUE(net->parameters()[1].is_same(net->encoder_->weight));
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  EXPECT_EQ(net->parameters()[1].name(), "weight");
}

TEST(ModuleTest, RegistrationErrorsNameTheModuleAndKey) {
  Generator gen(0);
  Net net(gen);
  EXPECT_TRUE(ThrowsErrorExactly([&] { net.register_parameter("scale", RawTensor::Ones({1})); },
                                 "Net: parameter name 'scale' is already registered"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { net.register_buffer("encoder", RawTensor::Ones({1})); },
                                 "Net: buffer name 'encoder' is already registered"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { net.register_parameter("a.b", RawTensor::Ones({1})); },
                                 "Net: parameter name 'a.b' must be non-empty and contain no '.'"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { net.parameter("nope"); }, "Net: no parameter 'nope'"));
  ModuleList list;
  list->push_back(ReLU());
  EXPECT_TRUE(ThrowsErrorExactly([&] { list->at<LinearImpl>(0); },
                                 "ModuleList: module 0 is a ReLU, not the requested type"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { list(Tensor(RawTensor::Ones({1}))); },
                                 "ModuleList: this module has no single-input forward(); call "
                                 "its parts or its own methods"));
}

TEST(ModuleTest, TrainEvalReachesEveryDescendant) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  net->eval();
  for (const auto& [name, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net->train();
  for (const auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
}

TEST(ModuleTest, ToDtypeConvertsInPlaceAndKeepsHandles) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  Tensor w = net->encoder_->weight;
  std::vector<float> before = w.data().to_vector<float>();
  Tensor x(RawTensor::Ones({4, 3}));
  Sum((*net)(x)).backward();
  net->to(kBF16);
  EXPECT_EQ(w.dtype(), kBF16);                    // the handle held outside sees the change
  EXPECT_EQ(w.grad().dtype(), kBF16);             // and its gradient too
  EXPECT_EQ(net->buffer("steps").dtype(), kI64);  // integer buffers are kept
  EXPECT_EQ(net->buffer("running").dtype(), kBF16);
  net->to(kF32);
  std::vector<float> after = w.data().to_vector<float>();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[i], RawTensor::Scalar(before[i]).to(kBF16).item()) << i;  // one bf16 rounding
  }
  EXPECT_TRUE(ThrowsError([&] { net->to(kI32); }, "the target must be a floating dtype"));
}

TEST(ModuleTest, ToAnUnusableDeviceThrowsBeforeMovingAnything) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  Tensor w = net->encoder_->weight;
  const RawTensor before = w.data();
  // No machine has 100 GPUs; without a GPU (or without the CUDA backend) cuda:0 fails the same
  // way, with the reason after the prefix.
  EXPECT_TRUE(ThrowsError([&] { net->to(Device::Cuda(99)); }, "Net.to(cuda:99): "));
  EXPECT_TRUE(w.data().shares_storage(before));
  for (const auto& [name, p] : net->named_parameters()) EXPECT_TRUE(p.data().device().is_cpu());
  net->to(Device::Cpu());  // already there: nothing is copied
  EXPECT_TRUE(w.data().shares_storage(before));
}

TEST(ModuleTest, StateDictRoundTripIsExact) {
  Generator gen_a(1), gen_b(2);
  auto a = std::make_shared<Net>(gen_a);
  auto b = std::make_shared<Net>(gen_b);
  a->buffer("steps").fill_(7);
  StateDict sd = a->state_dict();
  EXPECT_EQ(sd.tensors.size(), 6u);
  Tensor bw = b->encoder_->weight;
  b->load_state_dict(sd);
  EXPECT_TRUE(bw.is_same(b->encoder_->weight));  // loaded in place
  for (const auto& [name, t] : b->state_dict().tensors) {
    EXPECT_EQ(t.to_vector<double>(), sd.tensor(name).to_vector<double>()) << name;
    EXPECT_FALSE(t.shares_storage(sd.tensor(name))) << name;
  }
  Tensor x(RandNormal({5, 3}, gen_a));
  EXPECT_EQ((*a)(x).data().to_vector<float>(), (*b)(x).data().to_vector<float>());
}

TEST(ModuleTest, StrictLoadListsEveryProblemAndChangesNothing) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  StateDict sd = net->state_dict();
  std::vector<float> before = net->encoder_->weight.data().to_vector<float>();
  StateDict bad;
  bad.tensors = sd.tensors;
  bad.tensors.erase("head.1.weight");
  bad.tensors.erase("steps");
  bad.tensors["extra.weight"] = RawTensor::Ones({1});
  bad.tensors["encoder.weight"] = RawTensor::Zeros({3, 2});
  bad.tensors["scale"] = RawTensor::Zeros({3});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { net->load_state_dict(bad); },
      "load_state_dict(Net): missing keys: head.1.weight, steps; unexpected keys: extra.weight; "
      "shape mismatch: encoder.weight: checkpoint [3, 2] vs model [2, 3]; scale: checkpoint [3] "
      "vs model [2]"));
  EXPECT_EQ(net->encoder_->weight.data().to_vector<float>(), before);
  // Non-strict ignores missing and unexpected keys but never loads a wrong shape.
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { net->load_state_dict(bad, /*strict=*/false); },
      "load_state_dict(Net): shape mismatch: encoder.weight: checkpoint [3, 2] vs model [2, 3]; "
      "scale: checkpoint [3] vs model [2]"));
  StateDict partial;
  partial.tensors["scale"] = RawTensor::Full({2}, 5.0, kF64);  // converted as copy_ does
  partial.tensors["unknown"] = RawTensor::Ones({1});
  net->load_state_dict(partial, /*strict=*/false);
  EXPECT_EQ(net->scale_.data().to_vector<float>(), (std::vector<float>{5, 5}));
  EXPECT_EQ(net->encoder_->weight.data().to_vector<float>(), before);
}

TEST(ModuleTest, ForwardHooksRunInOrderReplaceAndRemove) {
  Generator gen(0);
  LinearImpl lin(2, 2, gen);
  std::vector<std::string> events;
  HookHandle pre1 = lin.register_forward_pre_hook([&](Module& m, const Tensor& x) {
    events.push_back("pre1 " + m.type_name());
    return MulScalar(x, 2.0);  // replaces the input
  });
  HookHandle pre2 = lin.register_forward_pre_hook([&](Module&, const Tensor& x) {
    events.push_back("pre2 " + std::to_string(x.data().to_vector<float>()[0]));
    return Tensor();
  });
  HookHandle post = lin.register_forward_hook([&](Module&, const Tensor& x, const Tensor& y) {
    events.push_back("post " + std::to_string(x.data().to_vector<float>()[0]));
    return AddScalar(y, 100.0);
  });
  Tensor x(RawTensor::FromVector<float>({1, 1}, {1, 2}));
  Tensor expected = tg::Linear(MulScalar(x, 2.0), lin.weight, lin.bias);
  Tensor y = lin(x);
  EXPECT_EQ(events, (std::vector<std::string>{"pre1 Linear", "pre2 2.000000", "post 2.000000"}));
  std::vector<float> got = y.data().to_vector<float>(), want = expected.data().to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i] + 100.0f);
  pre1.remove();
  post.remove();
  post.remove();  // idempotent
  events.clear();
  y = lin(x);
  EXPECT_EQ(events, std::vector<std::string>{"pre2 1.000000"});
  EXPECT_EQ(y.data().to_vector<float>(),
            tg::Linear(x, lin.weight, lin.bias).data().to_vector<float>());
  // forward() called directly bypasses the hooks.
  events.clear();
  lin.forward(x);
  EXPECT_TRUE(events.empty());
}

// operator() runs pre-hooks, forward and hooks inside a ForwardScope (autograd/engine.h): a
// backward a forward or a hook starts is flagged as issued in forward (the epilogues of amp,
// DDP and ZeRO wait for the user's backward); the user's backward after it is not.
class BackwardInForward : public Module {
 public:
  explicit BackwardInForward(Generator& gen) : Module("BackwardInForward") {
    lin_ = register_module("lin", std::make_shared<LinearImpl>(2, 2, gen));
  }
  Tensor forward(const Tensor& x) override {
    {
      EnableGradGuard grad;
      Sum(Mul(lin_->weight, lin_->weight)).backward();  // an auxiliary backward
    }
    return (*lin_)(x);
  }
  std::shared_ptr<LinearImpl> lin_;
};

TEST(ModuleTest, OperatorCallEntersAForwardScope) {
  Generator gen(0);
  BackwardInForward net(gen);
  std::vector<std::string> events;
  HookHandle flag = net.lin_->weight.register_post_accumulate_grad_hook([&](const Tensor&) {
    events.push_back(backward_issued_in_forward() ? "in forward" : "user");
  });
  HookHandle hook = net.lin_->register_forward_hook([&](Module&, const Tensor&, const Tensor& y) {
    EXPECT_TRUE(ForwardScope::active());
    Sum(y).backward(Tensor(), /*retain_graph=*/true);  // from a forward hook
    return Tensor();
  });
  EXPECT_FALSE(ForwardScope::active());
  Tensor y = net(Tensor(RawTensor::Ones({1, 2})));
  EXPECT_FALSE(ForwardScope::active());
  Sum(y).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"in forward", "in forward", "user"}));
  // forward() called directly enters no scope (as it runs no hooks).
  events.clear();
  hook.remove();
  net.forward(Tensor(RawTensor::Ones({1, 2})));
  EXPECT_EQ(events, std::vector<std::string>{"user"});
}

TEST(ModuleTest, ToStringShowsTheTreeAndParameterCounts) {
  Generator gen(0);
  auto net = std::make_shared<Net>(gen);
  EXPECT_EQ(net->to_string(),
            "Net(  # 14 params\n"
            "  (encoder): Linear(in=3, out=2, bias=true)  # 8 params\n"
            "  (head): Sequential(  # 4 params\n"
            "    (0): ReLU()\n"
            "    (1): Linear(in=2, out=2, bias=false)  # 4 params\n"
            "  )\n"
            ")\n");
}

}  // namespace
}  // namespace nn
}  // namespace tg
