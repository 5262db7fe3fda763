// tg::Tensor's libtorch API (tapegrad.h): values and gradients of the methods, operators and
// factories, the in-place rules, the options, and printing, whose expected text libtorch itself
// printed (testdata/libtorch_print.txt, from golden/print_cases.cc).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tapegrad.h"

namespace {

std::vector<float> Values(const tg::Tensor& t) { return t.data().to_vector<float>(); }

// The autograd tutorial of libtorch's docs ("Autograd in C++"), its first part, ported.
TEST(TensorApi, AutogradTutorialValues) {
  tg::Tensor x = tg::ones({2, 2}, tg::requires_grad());
  tg::Tensor y = x + 2;
  EXPECT_NE(y.grad_fn(), nullptr);
  tg::Tensor z = y * y * 3;
  tg::Tensor out = z.mean();
  EXPECT_EQ(out.item<float>(), 27.0f);
  out.backward();
  EXPECT_EQ(Values(x.grad()), std::vector<float>(4, 4.5f));

  // Gradients of a vector output with explicit grad_outputs.
  tg::Tensor a = tg::tensor({1.0, 2.0, 3.0}, tg::requires_grad());
  tg::Tensor b = a * 2;
  while (b.norm().item<double>() < 1000) b = b * 2;  // 512 * a
  b.backward(tg::tensor({0.1, 1.0, 0.0001}));
  EXPECT_EQ(Values(a.grad()), (std::vector<float>{51.2f, 512.0f, 0.0512f}));

  EXPECT_TRUE(a.pow(2).requires_grad());
  {
    tg::NoGradGuard no_grad;
    EXPECT_FALSE(a.pow(2).requires_grad());
  }
  tg::Tensor d = a.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(a.eq(d).all().item<bool>());
}

TEST(TensorApi, ShapesAndViews) {
  tg::Tensor x = tg::arange(24, tg::kFloat32).view({2, 3, 4});
  EXPECT_EQ(x.sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(x.flatten(1).sizes().vec(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(x.flatten().sizes().vec(), (std::vector<int64_t>{24}));
  EXPECT_EQ(x.unsqueeze(0).squeeze().sizes().vec(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(x.permute({2, 0, 1}).sizes().vec(), (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(x.transpose(0, 2).contiguous().view({-1}).sizes().vec(), (std::vector<int64_t>{24}));
  EXPECT_THROW(x.transpose(0, 2).view({-1}), tg::Error);  // a view would need a copy
  EXPECT_EQ(x[1][2][3].item<float>(), 23.0f);
  EXPECT_EQ(x.select(2, 1).sizes().vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values(x.slice(2, 1, 4, 2)[0][0]), (std::vector<float>{1, 3}));
  tg::Tensor m = tg::tensor({{1.0, 2.0}, {3.0, 4.0}});
  EXPECT_EQ(Values(m.t().contiguous()), (std::vector<float>{1, 3, 2, 4}));
  EXPECT_EQ(m.dim(), 2);
  EXPECT_EQ(m.numel(), 4);
  EXPECT_EQ(m.size(-1), 2);
}

TEST(TensorApi, Reductions) {
  tg::Tensor m = tg::tensor({{1.0, 5.0, 3.0}, {4.0, 2.0, 6.0}});
  EXPECT_EQ(Values(m.sum(1)), (std::vector<float>{9, 12}));
  EXPECT_EQ(m.sum(0, /*keepdim=*/true).sizes().vec(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(m.mean().item<float>(), 3.5f);
  EXPECT_EQ(m.max().item<float>(), 6.0f);
  EXPECT_EQ(m.min().item<float>(), 1.0f);
  auto [values, indices] = m.max(1);
  EXPECT_EQ(Values(values), (std::vector<float>{5, 6}));
  EXPECT_EQ(indices.dtype(), tg::kLong);
  EXPECT_EQ(indices.data().to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  auto [low, where] = m.min(0);
  EXPECT_EQ(Values(low), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(where.data().to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_EQ(m.argmax().item<int64_t>(), 5);
  EXPECT_EQ(m.argmin(1).data().to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE((m > 0).all().item<bool>());
  EXPECT_FALSE((m > 5).all().item<bool>());
  EXPECT_TRUE((m > 5).any().item<bool>());
  EXPECT_FLOAT_EQ(tg::tensor({3.0, 4.0}).norm().item<float>(), 5.0f);
}

TEST(TensorApi, ScalarOperandsKeepTheDtypeAndRoundOnce) {
  tg::Tensor x = tg::tensor({1.0, 2.0, 7.0});
  EXPECT_EQ(Values(1 - x), (std::vector<float>{0, -1, -6}));
  EXPECT_EQ(Values(x * 2.0), (std::vector<float>{2, 4, 14}));
  EXPECT_EQ(Values(2.0 * x + 1), (std::vector<float>{3, 5, 15}));
  // Division by a number is f32 division, not multiplication by its reciprocal.
  const std::vector<float> q = Values(x / 3);
  EXPECT_EQ(q, (std::vector<float>{1.0f / 3.0f, 2.0f / 3.0f, 7.0f / 3.0f}));
  EXPECT_EQ(Values(6 / x), (std::vector<float>{6.0f, 3.0f, 6.0f / 7.0f}));
  // bf16 stays bf16: the quotient in f32, rounded once.
  tg::Tensor h = x.to(tg::kBFloat16) / 3;
  EXPECT_EQ(h.dtype(), tg::kBFloat16);
  EXPECT_EQ(Values(h),
            Values(tg::tensor({1.0f / 3.0f, 2.0f / 3.0f, 7.0f / 3.0f}).to(tg::kBFloat16)));
}

TEST(TensorApi, GradientsOfMethods) {
  tg::Tensor x = tg::tensor({-2.0, -0.5, 0.5, 3.0}, tg::requires_grad());
  // clamp passes the gradient inside [min, max] only.
  x.clamp(-1.0, 1.0).sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{0, 1, 1, 0}));
  x.grad().zero_();
  x.masked_fill(x < 0, 0.0).sum().backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{0, 0, 1, 1}));
  // softmax over dim 0 of a matrix equals softmax over dim 1 of its transpose, gradients too.
  tg::Tensor m = tg::tensor({{1.0, 2.0}, {3.0, 5.0}}, tg::requires_grad());
  tg::Tensor w = tg::tensor({{1.0, -1.0}, {2.0, 0.5}});
  (m.softmax(0) * w).sum().backward();
  tg::Tensor mt = tg::tensor({{1.0, 3.0}, {2.0, 5.0}}, tg::requires_grad());
  (mt.softmax(1) * w.t()).sum().backward();
  EXPECT_EQ(Values(m.grad()), Values(mt.grad().t().contiguous()));
  EXPECT_EQ(Values(m.log_softmax(0).exp()), Values(m.softmax(0)));
  // to(dtype) records a cast: the gradient comes back in the leaf's dtype.
  tg::Tensor f = tg::tensor({1.0, 2.0}, tg::requires_grad());
  (f.to(tg::kDouble) * 3).sum().backward();
  EXPECT_EQ(f.grad().dtype(), tg::kFloat32);
  EXPECT_EQ(Values(f.grad()), (std::vector<float>{3, 3}));
  // clone() records and gives its own storage.
  tg::Tensor c = f.clone();
  EXPECT_FALSE(c.data().shares_storage(f.data()));
  EXPECT_TRUE(c.requires_grad());
}

TEST(TensorApi, InPlaceFollowsTheVersionCounterRules) {
  tg::Tensor leaf = tg::ones({3}, tg::requires_grad());
  try {
    leaf += 1;
    FAIL() << "an in-place op on a leaf that requires grad must throw";
  } catch (const tg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a leaf variable that requires grad"), std::string::npos)
        << e.what();
  }
  tg::Tensor y = leaf * 2;
  const uint64_t before = y.version();
  y += 1;
  y.mul_(3);
  y -= tg::ones({3});
  EXPECT_EQ(y.version(), before + 3);
  EXPECT_EQ(Values(y), (std::vector<float>{8, 8, 8}));
  y.sum().backward();
  EXPECT_EQ(Values(leaf.grad()), (std::vector<float>{6, 6, 6}));
  {
    tg::NoGradGuard no_grad;
    leaf.add_(1);  // allowed without grad mode, as in libtorch's optimizers
  }
  EXPECT_EQ(Values(leaf), (std::vector<float>{2, 2, 2}));
  tg::Tensor z = tg::zeros({2});
  z.fill_(4).div_(8);
  EXPECT_EQ(Values(z), (std::vector<float>{0.5f, 0.5f}));
}

TEST(TensorApi, FactoriesAndOptions) {
  EXPECT_EQ(tg::zeros({2, 3}, tg::kBFloat16).dtype(), tg::kBFloat16);
  EXPECT_EQ(tg::arange(10).dtype(), tg::kLong);
  EXPECT_EQ(tg::arange(0.0, 1.0, 0.25).dtype(), tg::kFloat32);
  EXPECT_EQ(Values(tg::arange(0.0, 1.0, 0.25)), (std::vector<float>{0, 0.25f, 0.5f, 0.75f}));
  EXPECT_EQ(tg::tensor({1, 2, 3}).dtype(), tg::kLong);
  EXPECT_EQ(tg::tensor({true, false}).dtype(), tg::kBool);
  EXPECT_EQ(tg::tensor({{1, 2}, {3, 4}}).sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(tg::scalar_tensor(2.5).dim(), 0);
  tg::Tensor r = tg::randn({4}, tg::TensorOptions().dtype(tg::kFloat64).requires_grad(true));
  EXPECT_EQ(r.dtype(), tg::kDouble);
  EXPECT_TRUE(r.requires_grad());
  EXPECT_TRUE(r.is_leaf());
  EXPECT_THROW(tg::zeros({2}, tg::TensorOptions().dtype(tg::kLong).requires_grad(true)), tg::Error);
  tg::manual_seed(7);
  const std::vector<float> first = Values(tg::randn({5}));
  tg::manual_seed(7);
  EXPECT_EQ(Values(tg::randn({5})), first);
  tg::Tensor ints = tg::randint(3, 9, {1000});
  EXPECT_GE(ints.min().item<int64_t>(), 3);
  EXPECT_LE(ints.max().item<int64_t>(), 8);
  std::vector<int64_t> perm = tg::randperm(6).data().to_vector<int64_t>();
  std::sort(perm.begin(), perm.end());
  EXPECT_EQ(perm, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(tg::eye(3).sum().item<float>(), 3.0f);
  EXPECT_EQ(tg::ones_like(r).dtype(), tg::kDouble);
  EXPECT_TRUE(tg::allclose(tg::tensor({1.0, 2.0}), tg::tensor({1.0, 2.000001})));
  EXPECT_FALSE(tg::allclose(tg::tensor({1.0, std::nan("")}), tg::tensor({1.0, std::nan("")})));
}

TEST(TensorApi, ItemNeverReturnsAWrongInteger) {
  // Exact beyond 2^53 (no trip through double): 2^53 + 1.
  EXPECT_EQ(tg::scalar_tensor(int64_t{9007199254740993}).item<int64_t>(), 9007199254740993);
  EXPECT_EQ(tg::scalar_tensor(2.75).item<int>(), 2);  // truncation, as a C++ cast
  try {
    tg::scalar_tensor(std::nan("")).item<int64_t>();
    FAIL() << "NaN is no integer";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(), "item: nan is not a value of an integer type");
  }
  EXPECT_THROW(tg::scalar_tensor(int64_t{300}).item<uint8_t>(), tg::Error);
  EXPECT_THROW(tg::scalar_tensor(int64_t{-1}).item<uint32_t>(), tg::Error);
  EXPECT_THROW(tg::ones({2}).item<float>(), tg::Error);  // not one element
}

TEST(TensorApi, Devices) {
  EXPECT_EQ(tg::Device("cpu"), tg::Device(tg::kCPU));
  EXPECT_EQ(tg::Device("cuda:1"), tg::Device(tg::kCUDA, 1));
  EXPECT_EQ(tg::Device("cuda"), tg::Device::Cuda(0));
  try {
    tg::Device("gpu:0");
    FAIL() << "not a device";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(), "Device: 'gpu:0' is not a device (expected cpu, cuda or cuda:N)");
  }
  EXPECT_THROW(tg::Device("cuda:"), tg::Error);
  EXPECT_THROW(tg::Device("cuda:-1"), tg::Error);
  // Device::Parse: the same grammar without throwing, every name from the device list.
  EXPECT_EQ(tg::Device::Parse("cuda:12"), tg::Device(tg::kCUDA, 12));
  EXPECT_EQ(tg::Device::Parse("cpu:0"), tg::Device::Cpu());
  for (const char* bad : {"", "cpu:1", "cuda:", "cuda:x", "cuda:1x", "cuda0", "CUDA", "cuda:-1",
                          "cuda:1234567890", " cuda"}) {
    EXPECT_EQ(tg::Device::Parse(bad), std::nullopt) << bad;
  }
  EXPECT_EQ(tg::Device::Specs(), "cpu, cuda or cuda:N");
  EXPECT_EQ(tg::Device(tg::kCUDA, 3).ToString(), "cuda:3");
  EXPECT_STREQ(tg::DeviceTypeDisplayName(tg::kCUDA), "CUDA");
  EXPECT_EQ(tg::ones({1}).device(), tg::Device(tg::kCPU));
  EXPECT_EQ(tg::cuda::is_available(), tg::cuda::device_count() > 0);
}

// The golden file: "== name" lines, each followed by what libtorch printed for that case.
std::map<std::string, std::string> LibtorchPrints() {
  std::ifstream in("tests/api/testdata/libtorch_print.txt");
  std::map<std::string, std::string> cases;
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("== ", 0) == 0) {
      name = line.substr(3);
      cases[name];
    } else {
      cases[name] += line + "\n";
    }
  }
  return cases;
}

std::string Printed(const tg::Tensor& t) {
  std::ostringstream out;
  out << t << "\n";
  return out.str();
}

TEST(TensorApi, PrintsAsLibtorchDoes) {
  const std::map<std::string, std::string> golden = LibtorchPrints();
  ASSERT_EQ(golden.size(), 17u);
  const std::map<std::string, tg::Tensor> cases = {
      {"ones_2x2", tg::ones({2, 2})},
      {"floats_1d", tg::tensor({1.5, 2.25, -3.0})},
      {"arange_long", tg::arange(10)},
      {"mixed_magnitudes", tg::tensor({{0.001, 1000.0}, {1.0, 2.0}})},
      {"large_scale", tg::tensor({123456.0, 1.5})},
      {"small_scale", tg::tensor({0.0012, 0.0034})},
      {"scalar", tg::scalar_tensor(3.5)},
      {"bools", tg::tensor({true, false, true})},
      {"three_d", tg::arange(12).reshape({2, 2, 3})},
      {"four_d", tg::arange(24).reshape({2, 3, 2, 2}).to(tg::kFloat) / 4},
      {"bf16", tg::tensor({0.1, 0.2}).to(tg::kBFloat16)},
      {"empty", tg::zeros({0})},
      {"wide", tg::arange(30).reshape({2, 15}).to(tg::kFloat) * 1.5},
      {"int32_big", tg::tensor({int64_t{12345678901}, int64_t{2}})},
      {"nan_inf", tg::tensor({1.5, std::nan(""), std::numeric_limits<double>::infinity(), -2.0})},
      {"negatives_int", tg::tensor({-5, 3, 100})},
      {"double", tg::tensor({0.5, 0.25}, tg::kDouble)},
  };
  for (const auto& [name, t] : cases) {
    ASSERT_EQ(golden.count(name), 1u) << name;
    EXPECT_EQ(Printed(t), golden.at(name)) << name;
  }
  std::ostringstream sizes;
  sizes << tg::ones({2, 3}).sizes();
  EXPECT_EQ(sizes.str(), "[2, 3]");
}

namespace holders {

struct TwoLayerImpl : tg::nn::Module {
  TwoLayerImpl() {
    fc1 = register_module("fc1", tg::nn::Linear(3, 4));
    fc2 = register_module("fc2", tg::nn::Linear(tg::nn::LinearOptions(4, 2).bias(false)));
  }
  tg::Tensor forward(tg::Tensor x) { return fc2(fc1(x).relu()); }
  tg::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TG_MODULE(TwoLayer);

TEST(ModuleHolders, RegisterCallAndName) {
  tg::manual_seed(3);
  TwoLayer net;
  EXPECT_EQ(net->type_name(), "TwoLayer");
  EXPECT_EQ(net->fc1->type_name(), "Linear");
  std::vector<std::string> names;
  for (const auto& [name, p] : net->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight"}));
  // One tensor through a built-in layer's holder runs its forward hooks (Module::operator()).
  int calls = 0;
  net->fc1->register_forward_hook([&calls](tg::nn::Module&, const tg::Tensor&, const tg::Tensor&) {
    ++calls;
    return tg::Tensor();
  });
  tg::Tensor y = net(tg::ones({5, 3}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(y.sizes().vec(), (std::vector<int64_t>{5, 2}));
  // The same seed gives the same layers (the default generator, drawn in construction order).
  tg::manual_seed(3);
  TwoLayer again;
  EXPECT_EQ(Values(again->fc1->weight), Values(net->fc1->weight));
  tg::optim::SGD opt(net->parameters(), /*lr=*/0.1);
  y.sum().backward();
  opt.step();
  EXPECT_NE(Values(again->fc1->weight), Values(net->fc1->weight));
}

TEST(ModuleHolders, AnEmptyHolderSaysSo) {
  tg::nn::Linear empty{nullptr};
  EXPECT_TRUE(empty.is_empty());
  try {
    empty(tg::ones({1, 3}));
    FAIL() << "an empty holder was called";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(),
                 "module holder of Linear is empty (made from nullptr): assign it a module "
                 "first, e.g. with register_module");
  }
}

TEST(OptimizerOptions, LibtorchChains) {
  const auto sgd = tg::optim::SGDOptions(0.01).momentum(0.5).nesterov(true).weight_decay(1e-4);
  EXPECT_EQ(sgd.lr(), 0.01);
  EXPECT_EQ(sgd.momentum(), 0.5);
  EXPECT_TRUE(sgd.nesterov());
  EXPECT_EQ(sgd.weight_decay(), 1e-4);
  EXPECT_EQ(sgd.dampening(), 0.0);
  // The chain of AdamWOptions stays AdamWOptions (AdamW takes nothing else).
  const tg::optim::AdamWOptions adamw =
      tg::optim::AdamWOptions(1e-3).betas({0.8, 0.9}).weight_decay(0.2).eps(1e-6);
  EXPECT_EQ(adamw.betas(), std::make_tuple(0.8, 0.9));
  EXPECT_EQ(adamw.beta2(), 0.9);
  EXPECT_EQ(adamw.weight_decay(), 0.2);
  EXPECT_EQ(tg::optim::AdamWOptions().weight_decay(), 1e-2);  // AdamW's default
  EXPECT_EQ(tg::optim::AdamOptions(2e-3).amsgrad(true).lr(), 2e-3);
  tg::Tensor w = tg::ones({2}, tg::requires_grad());
  tg::optim::AdamW opt({w}, tg::optim::AdamWOptions(0.1).weight_decay(0));
  (w * w).sum().backward();
  opt.step();
  // One Adam step moves each weight by lr (m / sqrt(v) = 1 at the first step).
  EXPECT_NEAR(w.data().to_vector<float>()[0], 0.9f, 1e-6);
}

}  // namespace holders
}  // namespace
