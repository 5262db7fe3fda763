// The module-level API of issue 40 that module_cases_test does not print: containers and
// OrderedDict, Dropout2d, the layers' errors, tg::save/tg::load, tg::amp::GradScaler and Muon,
// each against the rule of libtorch / PyTorch it follows (messages included).
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tapegrad.h"

namespace {

namespace nn = tg::nn;

std::vector<float> Values(const tg::Tensor& t) { return t.data().to_vector<float>(); }

// The message of the tg::Error that f throws ("" if it throws none).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const tg::Error& e) {
    return e.what();
  }
  return "";
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// A user's module whose forward takes its tensor by value (hiding Module::forward), as
// libtorch programs write it.
struct TwiceImpl : nn::Module {
  tg::Tensor forward(tg::Tensor x) { return x * 2; }
};
TG_MODULE(Twice);

TEST(Containers, SequentialRunsHoldersAndUserModulesInOrder) {
  tg::manual_seed(0);
  nn::Sequential seq(nn::Linear(3, 2), Twice(), nn::ReLU());
  seq->push_back("tail", nn::Tanh());
  EXPECT_EQ(seq->size(), 4u);
  const tg::Tensor x = tg::randn({5, 3});
  auto& lin = seq->at<nn::LinearImpl>(0);
  const tg::Tensor want = tg::tanh(tg::relu(tg::Linear(x, lin.weight, lin.bias) * 2));
  EXPECT_EQ(Values(seq->forward(x)), Values(want));
  EXPECT_EQ(seq->named_children().keys(), (std::vector<std::string>{"0", "1", "2", "tail"}));
  EXPECT_EQ(ErrorOf([&] { seq->at<nn::LinearImpl>(2); }),
            "Sequential: module 2 is a ReLU, not the requested type");
  // A holder made from a holder is the same module, not a Sequential around it.
  nn::Sequential same(seq);
  EXPECT_EQ(same.get(), seq.get());
  nn::Sequential named({{"fc", nn::Linear(3, 3)}, {"act", nn::ReLU()}});
  EXPECT_EQ(named->named_parameters().keys(), (std::vector<std::string>{"fc.weight", "fc.bias"}));
}

TEST(Containers, ModuleListAndModuleDict) {
  nn::ModuleList list(nn::Linear(2, 2), nn::ReLU());
  list->push_back(nn::Linear(2, 1));
  int n = 0;
  for (const auto& m : *list) n += m->parameters().size();
  EXPECT_EQ(n, 4);
  EXPECT_EQ(list->ptr<nn::LinearImpl>(2)->weight.sizes().vec(), (std::vector<int64_t>{1, 2}));
  nn::ModuleDict dict({{"enc", nn::Linear(4, 2).ptr()}, {"act", nn::ReLU().ptr()}});
  EXPECT_TRUE(dict->contains("enc"));
  EXPECT_EQ(dict->keys(), (std::vector<std::string>{"enc", "act"}));
  EXPECT_EQ(dict->at<nn::LinearImpl>("enc").weight.size(0), 2);
  EXPECT_EQ(ErrorOf([&] { (*dict)["dec"]; }), "ModuleDict: no module 'dec' (keys: enc, act)");
  EXPECT_EQ(ErrorOf([&] { dict->insert("act", nn::ReLU().ptr()); }),
            "ModuleDict: key 'act' is already there");
}

TEST(OrderedDictTest, NamedParametersByPositionNameAndBinding) {
  nn::Linear fc(3, 2);
  auto named = fc->named_parameters();
  EXPECT_EQ(named[0].key(), "weight");
  EXPECT_TRUE(named["bias"].is_same(fc->bias));
  for (const auto& [name, p] : named) EXPECT_TRUE(p.requires_grad()) << name;
  EXPECT_EQ(ErrorOf([&] { named["nope"]; }), "OrderedDict: key 'nope' not found");
}

TEST(Layers, Dropout2dZeroesWholeChannelsAndScalesTheRest) {
  tg::manual_seed(3);
  nn::Dropout2d drop(nn::Dropout2dOptions(0.5));
  const tg::Tensor x = tg::ones({4, 8, 3, 3});
  const std::vector<float> y = Values(drop(x));
  int zeroed = 0;
  for (int c = 0; c < 32; ++c) {
    const float first = y[c * 9];
    EXPECT_TRUE(first == 0.0f || first == 2.0f) << first;
    for (int i = 1; i < 9; ++i) EXPECT_EQ(y[c * 9 + i], first);
    zeroed += first == 0.0f;
  }
  EXPECT_GT(zeroed, 4);
  EXPECT_LT(zeroed, 28);
  drop->eval();
  EXPECT_EQ(Values(drop(x)), Values(x));
}

TEST(Layers, ErrorsNameTheLayerAndTheShape) {
  nn::BatchNorm2d bn(3);
  EXPECT_EQ(ErrorOf([&] {
              bn(tg::ones({2, 3, 4}));
            }),
            "BatchNorm2d: expected 4D input (got 3D input)");
  EXPECT_EQ(ErrorOf([&] {
              bn(tg::ones({1, 3, 1, 1}));
            }),
            "batch_norm: expected more than 1 value per channel when training, got input size "
            "[1, 3, 1, 1]");
  EXPECT_EQ(ErrorOf([] { nn::GroupNorm(3, 4); }),
            "GroupNorm: num_channels must be divisible by num_groups, got 4 channels and 3 groups");
  EXPECT_EQ(ErrorOf([] {
              nn::ConvTranspose2d(nn::ConvTranspose2dOptions(1, 1, 3).stride(2).output_padding(2));
            }),
            "ConvTranspose2d: output padding must be smaller than either stride or dilation, got "
            "output_padding=(2, 2) stride=(2, 2) dilation=(1, 1)");
  EXPECT_EQ(
      ErrorOf([] {
        nn::LayerNorm(nn::LayerNormOptions({2, 3}));
      }),
      "LayerNorm: normalized_shape [2, 3] is not supported; tapegrad normalizes over the last "
      "dim only (give one size)");
  using namespace tg::indexing;
  const tg::Tensor x = tg::zeros({2, 3});
  EXPECT_EQ(ErrorOf([&] {
              x.index({0, 3});
            }),
            "index: index 3 is out of bounds for dimension 0 with size 3");
  EXPECT_EQ(ErrorOf([&] {
              x.index({"...", 0, "..."});
            }),
            "index: an index can only have a single ellipsis ('...')");
}

TEST(Serialize, ModuleOptimizerAndTensorsRoundTrip) {
  tg::manual_seed(1);
  nn::Sequential net(nn::Linear(3, 4), nn::BatchNorm1d(4), nn::ReLU(), nn::Linear(4, 1));
  tg::optim::Adam opt(net->parameters(), tg::optim::AdamOptions(0.01));
  net->forward(tg::randn({6, 3})).sum().backward();
  opt.step();
  const std::string dir = TempPath("");
  tg::save(net, dir + "net.st");
  tg::save(opt, dir + "opt.st");
  tg::manual_seed(2);
  nn::Sequential other(nn::Linear(3, 4), nn::BatchNorm1d(4), nn::ReLU(), nn::Linear(4, 1));
  tg::optim::Adam other_opt(other->parameters(), tg::optim::AdamOptions(0.01));
  tg::load(other, dir + "net.st");
  tg::load(other_opt, dir + "opt.st");
  const auto a = net->state_dict(), b = other->state_dict();
  for (const auto& [key, t] : a.tensors) {
    EXPECT_EQ(t.to_vector<double>(), b.tensor(key).to_vector<double>()) << key;
  }
  EXPECT_EQ(other_opt.state_dict().tensors.size(), opt.state_dict().tensors.size());

  const tg::Tensor t = tg::arange(6, tg::kFloat32).reshape({2, 3});
  tg::save(t, dir + "t.st");
  tg::Tensor back;
  tg::load(back, dir + "t.st");
  EXPECT_TRUE(tg::equal(back, t));
  std::vector<tg::Tensor> list = {t, t * 2}, list_back;
  tg::save(list, dir + "list.st");
  tg::load(list_back, dir + "list.st");
  ASSERT_EQ(list_back.size(), 2u);
  EXPECT_TRUE(tg::equal(list_back[1], t * 2));

  // A file of another kind, a module of another shape, a missing file: errors naming them.
  EXPECT_EQ(ErrorOf([&] { tg::load(other, dir + "opt.st"); }),
            "tg::load(Sequential, \"" + dir +
                "opt.st\"): the file holds optimizer:Adam, not "
                "module:...");
  nn::Linear wrong(2, 2);
  EXPECT_NE(ErrorOf([&] { tg::load(wrong, dir + "net.st"); }).find("unexpected"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { tg::load(wrong, dir + "missing.st"); }).find("tg::load(Linear, \""),
            std::string::npos);
}

// Muon through the one header, set up as torch's documentation does: a Linear's weight to Muon,
// its bias to AdamW, in one MuonWithAdamW. With momentum 0 the direction is the gradient itself,
// so the weight moves by exactly -lr times the Newton-Schulz iterate of its gradient (bf16,
// torch's coefficients), widened; the bias takes AdamW's step; a 1-D parameter given to Muon is
// refused with the rule.
TEST(MuonApi, MuonWithAdamWStepsTheWeightWithMuonAndTheBiasWithAdamW) {
  tg::manual_seed(3);
  nn::Linear fc(8, 4);
  const tg::Tensor x = tg::randn({5, 8});
  fc(x).pow(2).sum().backward();
  const tg::RawTensor w0 = fc->weight.data().clone(), b0 = fc->bias.data().clone();
  const tg::RawTensor g = fc->weight.grad().data().clone();
  tg::optim::MuonWithAdamW opt(
      {tg::optim::ParamGroup({fc->weight},
                             tg::optim::MuonOptions(0.02).momentum(0).weight_decay(0)),
       tg::optim::ParamGroup({fc->bias}, tg::optim::AdamWOptions(1e-3))});
  opt.step();
  const tg::RawTensor ortho =
      tg::optim::MuonNewtonSchulz(g, 3.4445, -4.775, 2.0315, 5, 1e-7, tg::kBF16);
  // [4, 8]: the original adjustment is lr * sqrt(max(1, 4 / 8)) = lr.
  EXPECT_EQ(fc->weight.data().to_vector<float>(),
            tg::AddScaled(w0, ortho.to(tg::kF32), -0.02).to_vector<float>());
  EXPECT_NE(fc->bias.data().to_vector<float>(), b0.to_vector<float>());
  EXPECT_EQ(opt.param_state(fc->bias)->tensors.count("exp_avg"), 1u);
  EXPECT_EQ(opt.param_state(fc->weight)->tensors.count("momentum_buffer"), 1u);
  const std::string refused = ErrorOf([&] { tg::optim::Muon muon({fc->bias}, 0.02); });
  EXPECT_NE(refused.find("Muon only supports 2-D parameters"), std::string::npos) << refused;
}

// Parameters whose gradients are set by hand, for the scaler's rules.
struct ScalerCase {
  tg::Tensor w = tg::ones({2}, tg::requires_grad());
  tg::optim::SGD opt{std::vector<tg::Tensor>{w}, tg::optim::SGDOptions(1.0)};
  void SetGrad(std::vector<float> g) { w.set_grad(tg::tensor(g)); }
};

TEST(GradScalerTest, PyTorchsSequenceSkipsInfStepsAndAdjustsTheScale) {
  ScalerCase c;
  tg::amp::GradScaler scaler(tg::amp::GradScalerOptions().init_scale(8).growth_interval(2));
  EXPECT_EQ(scaler.scale(tg::tensor({1.5})).item<float>(), 12.0f);
  c.SetGrad({8, 16});
  scaler.step(c.opt);  // unscales to {1, 2}, steps
  EXPECT_EQ(Values(c.w), (std::vector<float>{0, -1}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8);
  c.SetGrad({8, std::numeric_limits<float>::infinity()});
  scaler.step(c.opt);  // skipped
  EXPECT_EQ(Values(c.w), (std::vector<float>{0, -1}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4);  // backoff 0.5, tracker reset
  for (int i = 0; i < 2; ++i) {
    c.SetGrad({0, 0});
    scaler.unscale_(c.opt);
    EXPECT_EQ(ErrorOf([&] { scaler.unscale_(c.opt); }),
              "unscale_() has already been called on this optimizer since the last update().");
    scaler.step(c.opt);
    EXPECT_EQ(ErrorOf([&] { scaler.step(c.opt); }),
              "step() has already been called since the last update().");
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 8);  // grown after 2 clean steps
  EXPECT_EQ(ErrorOf([&] { scaler.update(); }), "No inf checks were recorded prior to update.");
  const tg::StateDict sd = scaler.state_dict();
  EXPECT_EQ(sd.scalar("scale"), 8);
  EXPECT_EQ(sd.scalar("_growth_tracker"), 0);
  tg::amp::GradScaler restored;
  restored.load_state_dict(sd);
  EXPECT_EQ(restored.get_scale(), 8);
  c.w.set_grad(tg::ones({2}, tg::kHalf));
  EXPECT_EQ(ErrorOf([&] { scaler.unscale_(c.opt); }), "Attempting to unscale FP16 gradients.");
}

TEST(GradScalerTest, DisabledPassesThrough) {
  ScalerCase c;
  tg::amp::GradScaler scaler(tg::amp::GradScalerOptions().enabled(false));
  EXPECT_EQ(scaler.scale(tg::tensor({1.5})).item<float>(), 1.5f);
  c.SetGrad({1, std::numeric_limits<float>::infinity()});
  scaler.step(c.opt);  // steps: a disabled scaler checks nothing
  EXPECT_EQ(Values(c.w)[0], 0.0f);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

}  // namespace
