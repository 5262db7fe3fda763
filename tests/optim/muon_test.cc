// optim::Muon against torch.optim.Muon (torch 2.15): the parameters after 3 steps from fixed
// inputs, printed by tests/optim/muon_reference.py (the literals below); the f64 cases run torch's
// own code with an f64 iteration, so they pin the algorithm (the lerps, Nesterov, the transposed
// tall matrix, the norm's eps, the coefficients, each adjust_lr_fn, decoupled decay) to 1e-12;
// the bf16 case is torch's unchanged bf16 iteration. Also: the 2-D rule, options, state_dict
// round trip, and Muon inside the mixed-precision step (f32 masters, skipped steps).
#include "optim/muon.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "amp/loss_scaler.h"
#include "amp/mixed_precision_optimizer.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "gtest/gtest.h"
#include "optim/sgd.h"
#include "tensor/tensor.h"
#include "tests/optim/torch_trace_inputs.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

using ::tg::testing::ThrowsErrorExactly;

// clang-format off
// torch 2.15.0+cu132, tests/optim/muon_reference.py
// DefaultsF64: {'lr': 0.02}
const std::vector<std::vector<double>> kDefaultsF64 = {
    {-0.026398444185615502, 0.29858957365344563, 0.4965861531040221, 0.45679025795557043,
     0.18487214368584984, 0.46900291010432993, 0.4230642232937647, 0.19611822072881596,
     -0.11292351507536699, -0.3776214571334126, 0.2703086735421587, -0.09269195215144632,
     -0.40320182263664006, -0.5072309268861561, -0.36631271874225235},
    {0.4114459124402532, 0.463696812035358, 0.3160198001037007, 0.031970266380919696,
     0.3883997586889313, 0.056127805399042184, -0.29382101325879934, -0.48660188492897954,
     -0.19106090311687796, -0.4435905385148398, -0.4948065372075353, -0.3019683323989229,
     -0.4701673933931374, -0.2851264994589614, 0.016200106672938953, 0.30502503413850424,
     -0.04764637205650535, 0.3113155878916611, 0.5090284958715547, 0.4499283505247192,
     0.4401791724133067, 0.46855481613803523, 0.27593552607054156, -0.06322125145520573},
};
// PlainMomentumMatchRmsAdamWF64: {'lr': 0.01, 'momentum': 0.9, 'nesterov': False, 'weight_decay': 0.01, 'adjust_lr_fn': 'match_rms_adamw'}
const std::vector<std::vector<double>> kPlainMomentumMatchRmsAdamWF64 = {
    {-0.006009217065649133, 0.3174144684976265, 0.4944152343137689, 0.4377405423756409,
     0.17128951639692638, 0.478929284926527, 0.44792963512924194, 0.21035935611712991,
     -0.12411285480001442, -0.4024658794381209, 0.2603193168966879, -0.08243517598277822,
     -0.3841868679494738, -0.5015773112495943, -0.3819690007662811},
    {0.4188341825748543, 0.4894770504774771, 0.33377478530400306, 0.023493038918291072,
     0.37602341163660113, 0.0672500248053683, -0.2711048390755608, -0.4780541783445589,
     -0.2153376923107178, -0.4558276556365383, -0.48325312708824875, -0.2809477110681568,
     -0.487081111038922, -0.3096168075891202, 0.009778825275074126, 0.3237197725792408,
     -0.04241820012861889, 0.2943773614523438, 0.4894581541819911, 0.45082609988958905,
     0.4637600161087578, 0.4708220914734945, 0.2560769870170235, -0.0826170423462546},
};
// SpectralUnclampedTwoStepsF64: {'lr': 0.05, 'adjust_lr_fn': 'spectral_unclamped', 'ns_steps': 2, 'eps': 0.001}
const std::vector<std::vector<double>> kSpectralUnclampedTwoStepsF64 = {
    {-0.046454792648574765, 0.2943827377001788, 0.5110341093210546, 0.4713629988571541,
     0.18124332510564584, 0.46673243457396707, 0.4108502767636718, 0.1847789583390874,
     -0.11218527746611512, -0.36490164731966696, 0.290591725644614, -0.10079205474025263,
     -0.4303944328459325, -0.5216945953522195, -0.3494600073321945},
    {0.40069765738801055, 0.4224554295159206, 0.2865957358610247, 0.044639468971737595,
     0.3949167773677711, 0.038813068368108224, -0.3164383724720311, -0.48833162599910446,
     -0.16985060285717749, -0.42342857516607096, -0.49517761460403403, -0.3197995497604966,
     -0.451715802840218, -0.2456454279188728, 0.035321396073399736, 0.28284387775553965,
     -0.04902648697555932, 0.3382394896350778, 0.5332247529635231, 0.4422626990186927,
     0.4197488397293449, 0.4643766832440955, 0.28995871290001557, -0.04771505316041375},
};
// DefaultsBf16IterationF32Params: {'lr': 0.02}
const std::vector<std::vector<double>> kDefaultsBf16IterationF32Params = {
    {-0.02782551757991314, 0.3058744966983795, 0.49429789185523987, 0.4590422213077545,
     0.18889309465885162, 0.47069239616394043, 0.4143526256084442, 0.1993711292743683,
     -0.11574678122997284, -0.38298046588897705, 0.2690477669239044, -0.08563403785228729,
     -0.405843585729599, -0.5052021741867065, -0.36207419633865356},
    {0.41050344705581665, 0.46364936232566833, 0.3159656822681427, 0.03091486543416977,
     0.37977275252342224, 0.06435687094926834, -0.3028663694858551, -0.48603835701942444,
     -0.19333092868328094, -0.4420253336429596, -0.4968518018722534, -0.30218520760536194,
     -0.47225189208984375, -0.28357696533203125, 0.014483002945780754, 0.3051396906375885,
     -0.05061740428209305, 0.3130774199962616, 0.5070255994796753, 0.4490295648574829,
     0.4317324161529541, 0.47688233852386475, 0.26701462268829346, -0.06258697807788849},
};
// clang-format on

const std::vector<std::vector<int64_t>> kShapes = {{3, 5}, {6, 4}};
constexpr int kSteps = 3;

// p[i][j] = 0.5 sin(1.3 i + 0.7 j + k), as the reference script.
std::vector<Tensor> Params(DType dtype) {
  std::vector<Tensor> params;
  for (size_t k = 0; k < kShapes.size(); ++k) {
    const int64_t r = kShapes[k][0], c = kShapes[k][1];
    std::vector<double> v;
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) v.push_back(0.5 * std::sin(1.3 * i + 0.7 * j + k));
    }
    params.push_back(Tensor(RawTensor::FromVector(v, {r, c}).to(dtype), true));
  }
  return params;
}

// g_t[i][j] = cos(0.9 i - 1.1 j + 0.5 t + k).
RawTensor Grad(int64_t k, int t, DType dtype) {
  const int64_t r = kShapes[k][0], c = kShapes[k][1];
  std::vector<double> v;
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) v.push_back(std::cos(0.9 * i - 1.1 * j + 0.5 * t + k));
  }
  return RawTensor::FromVector(v, {r, c}).to(dtype);
}

void SetGrads(const std::vector<Tensor>& params, int t) {
  for (size_t k = 0; k < params.size(); ++k) {
    params[k].set_grad(Tensor(Grad(static_cast<int64_t>(k), t, params[k].dtype())));
  }
}

std::vector<std::vector<double>> RunMuon(DType dtype, const MuonOptions& options,
                                         int steps = kSteps) {
  std::vector<Tensor> params = Params(dtype);
  Muon opt(params, options);
  for (int t = 0; t < steps; ++t) {
    SetGrads(params, t);
    opt.step();
  }
  std::vector<std::vector<double>> out;
  for (const Tensor& p : params) out.push_back(p.data().to_vector<double>());
  return out;
}

void ExpectNear(const std::vector<std::vector<double>>& got,
                const std::vector<std::vector<double>>& want, double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size());
    for (size_t i = 0; i < want[k].size(); ++i) {
      EXPECT_NEAR(got[k][i], want[k][i], atol) << "param " << k << " [" << i << "]";
    }
  }
}

MuonOptions F64Iteration(double lr) { return MuonOptions(lr).ns_dtype(kF64); }

TEST(MuonTest, DefaultsMatchTorchWithAnF64Iteration) {
  ExpectNear(RunMuon(kF64, F64Iteration(0.02)), kDefaultsF64, 1e-12);
}

TEST(MuonTest, PlainMomentumAndMatchRmsAdamWMatchTorch) {
  ExpectNear(
      RunMuon(kF64,
              F64Iteration(0.01).momentum(0.9).nesterov(false).weight_decay(0.01).adjust_lr_fn(
                  MuonAdjustLr::kMatchRmsAdamW)),
      kPlainMomentumMatchRmsAdamWF64, 1e-12);
}

TEST(MuonTest, SpectralUnclampedTwoNewtonSchulzStepsMatchTorch) {
  ExpectNear(
      RunMuon(
          kF64,
          F64Iteration(0.05).adjust_lr_fn(MuonAdjustLr::kSpectralUnclamped).ns_steps(2).eps(1e-3)),
      kSpectralUnclampedTwoStepsF64, 1e-12);
}

// torch's bf16 iteration on f32 parameters. On the machine the literals were printed on (AMD
// EPYC, AVX-512 BF16) every bf16 value of the iteration agreed (the parameter update rounds
// once on both sides since AddScaled). Both sum
// the products in the GEMM's order, which another CPU may change, flipping an entry of the
// update o (|o| < 1.5) by one bf16 ulp (<= 2^-7): that moves a parameter by lr 2^-7 = 1.6e-4 per
// step; the bound allows one such flip in each of the 3 steps.
TEST(MuonTest, TheBf16IterationMatchesTorchWithinBf16Rounding) {
  ExpectNear(RunMuon(kF32, MuonOptions(0.02)), kDefaultsBf16IterationF32Params, 5e-4);
}

// 1000 steps on the inputs of tests/optim/torch_trace_inputs.h with an f64 iteration: every
// parameter and momentum buffer equals torch.optim.Muon's bit for bit (torch's lerp and
// add_(alpha) round once; so do Lerp and AddScaled). The fingerprints (FNV-1a of the bits) were
// printed by `torch_trace_compare.py --fingerprint` (torch 2.15.0+cu132, CPU).
TEST(MuonTest, ThousandStepF64TracesAreTorchsBitForBit) {
  const struct {
    bool nesterov;
    MuonAdjustLr adjust;
    uint64_t torch;
  } cases[] = {{true, MuonAdjustLr::kOriginal, 0x463e31af73cc7a38ull},
               {false, MuonAdjustLr::kMatchRmsAdamW, 0xfaa220f31ff630f7ull}};
  for (const auto& c : cases) {
    const std::vector<Tensor> params = testing::TorchTraceParams();
    Muon opt(params, MuonOptions(0.02).nesterov(c.nesterov).adjust_lr_fn(c.adjust).ns_dtype(kF64));
    testing::RunTorchTrace(opt, params, 1000);
    std::vector<RawTensor> tensors;
    for (const Tensor& p : params) {
      tensors.push_back(p.data());
      tensors.push_back(opt.param_state(p)->tensors.at("momentum_buffer"));
    }
    EXPECT_EQ(testing::Fingerprint(tensors), c.torch) << "nesterov " << c.nesterov;
  }
}

TEST(MuonTest, AdjustedLearningRates) {
  EXPECT_EQ(MuonAdjustedLr(0.1, MuonAdjustLr::kOriginal, 8, 2), 0.1 * 2);
  EXPECT_EQ(MuonAdjustedLr(0.1, MuonAdjustLr::kOriginal, 2, 8), 0.1);
  EXPECT_EQ(MuonAdjustedLr(0.1, MuonAdjustLr::kMatchRmsAdamW, 4, 9), 0.1 * 0.2 * 3);
  EXPECT_EQ(MuonAdjustedLr(0.1, MuonAdjustLr::kSpectralUnclamped, 1, 4), 0.1 * 0.5);
}

TEST(MuonTest, OnlyTwoDimensionalParametersAreTaken) {
  const Tensor bias(RawTensor::Zeros({5}), true);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Muon opt({Params(kF32)[0], bias});
      },
      "Muon: param 1 of param group 0 has shape [5]: Muon only supports 2-D parameters (give "
      "embeddings' other parameters, biases and norms to AdamW)"));
  Muon opt(Params(kF32));
  EXPECT_TRUE(ThrowsErrorExactly([&] { opt.add_param_group(ParamGroup({bias})); },
                                 "Muon: param 0 of param group 1 has shape [5]: Muon only supports "
                                 "2-D parameters (give embeddings' other parameters, biases and "
                                 "norms to AdamW)"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Muon bad(Params(kF32), MuonOptions().ns_steps(100)); },
                                 "Muon: param group 0: invalid ns_steps 100 (must be in 0..99)"));
}

// Two steps, a state_dict, a fresh optimizer that loads it: the third step is the same bits as
// an uninterrupted run's.
TEST(MuonTest, StateDictRoundTripResumesBitForBit) {
  const std::vector<std::vector<double>> straight = RunMuon(kF32, MuonOptions(0.02));
  std::vector<Tensor> params = Params(kF32);
  StateDict saved;
  {
    Muon opt(params, MuonOptions(0.02));
    for (int t = 0; t < 2; ++t) {
      SetGrads(params, t);
      opt.step();
    }
    saved = opt.state_dict();
  }
  EXPECT_EQ(saved.scalars.at("param_groups.0.ns_steps"), 5);
  EXPECT_EQ(saved.scalars.at("param_groups.0.adjust_lr_fn"), 0);
  EXPECT_EQ(saved.tensors.at("state.1.momentum_buffer").shape(), (Shape{6, 4}));
  Muon resumed(params, MuonOptions(0.5));  // the state_dict's lr replaces this one
  resumed.load_state_dict(saved);
  SetGrads(params, 2);
  resumed.step();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_EQ(params[k].data().to_vector<double>(), straight[k]) << k;
  }
}

// Muon as the optimizer of the mixed-precision step: bf16 model matrices, f32 masters that Muon
// updates (the same bits as Muon on f32 parameters with the same gradients), and an overflowing
// step that changes neither the masters nor the momentum buffers.
TEST(MuonTest, InsideTheMixedPrecisionStepMastersMoveAndSkippedStepsChangeNothing) {
  std::vector<Tensor> model = Params(kBF16);
  std::vector<Tensor> reference = Params(kBF16);
  for (Tensor& p : reference) p = Tensor(p.data().to(kF32), true);  // the masters' start
  amp::MixedPrecisionOptions o;
  o.scaler = std::make_shared<amp::LossScaler>(amp::LossScaler::PyTorch(4));
  amp::MixedPrecisionOptimizer opt(std::make_unique<Muon>(model, MuonOptions(0.02)), o);
  Muon plain(reference, MuonOptions(0.02));
  const Tensor x(RawTensor::Ones({2, 3}));
  auto loss_of = [&](double factor) {
    return MulScalar(Sum(Add(Matmul(Cast(x, kBF16), model[0]), Sum(model[1]))), factor);
  };
  // A clean step, then the same gradients given to the f32 reference.
  opt.backward(loss_of(1.0));
  const std::vector<RawTensor> grads = *opt.inspect_master_grads();
  ASSERT_FALSE(opt.step().skipped);
  for (size_t k = 0; k < reference.size(); ++k) reference[k].set_grad(Tensor(grads[k]));
  plain.step();
  for (size_t k = 0; k < model.size(); ++k) {
    EXPECT_EQ(opt.master_params()[k].data().to_vector<float>(),
              reference[k].data().to_vector<float>());
    EXPECT_EQ(model[k].data().to_vector<float>(), reference[k].data().to(kBF16).to_vector<float>());
  }
  // An overflow: skipped, and Muon's state is as it was.
  const StateDict before = opt.state_dict();
  opt.zero_grad();
  opt.backward(loss_of(1e38));
  EXPECT_TRUE(opt.step().skipped);
  const StateDict after = opt.state_dict();
  for (const auto& [key, t] : before.tensors) {
    EXPECT_EQ(after.tensors.at(key).to_vector<double>(), t.to_vector<double>()) << key;
  }
}

// The hybrid in one object: its Muon group steps as Muon, its AdamW groups as AdamW, bit for bit
// as the two optimizers apart; one state_dict holds both and resumes exactly.
TEST(MuonWithAdamWTest, StepsEachGroupAsItsOwnOptimizerWould) {
  auto make = [] {
    std::vector<Tensor> p = Params(kF32);                           // [3, 5] and [6, 4]: Muon's
    p.push_back(Tensor(RawTensor::Arange(0, 5, 1, kF32), true));    // a bias: AdamW's, no decay
    p.push_back(Tensor(RawTensor::Full({3, 4}, 0.5, kF32), true));  // an embedding: AdamW's
    return p;
  };
  auto set_grads = [](std::vector<Tensor>& p, int t) {
    SetGrads({p[0], p[1]}, t);  // the matrices
    for (size_t k = 2; k < p.size(); ++k) {
      p[k].set_grad(Tensor(MulScalar(RawTensor::Ones(p[k].shape()), 0.1 * (t + 1) * (k + 1))));
    }
  };
  const MuonOptions muon = MuonOptions(0.02).ns_dtype(kF32);
  const AdamWOptions decayed = AdamWOptions(3e-3).weight_decay(0.1);
  const AdamWOptions no_decay = AdamWOptions(decayed).weight_decay(0);
  std::vector<Tensor> a = make(), b = make();
  MuonWithAdamW hybrid(
      {ParamGroup({a[0], a[1]}, muon), ParamGroup({a[3]}, decayed), ParamGroup({a[2]}, no_decay)},
      muon);
  Muon alone_muon({b[0], b[1]}, muon);
  AdamW alone_adamw({ParamGroup({b[3]}, decayed), ParamGroup({b[2]}, no_decay)}, decayed);
  for (int t = 0; t < 3; ++t) {
    set_grads(a, t);
    set_grads(b, t);
    hybrid.step();
    alone_muon.step();
    alone_adamw.step();
  }
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].data().to_vector<float>(), b[k].data().to_vector<float>()) << k;
  }
  const StateDict sd = hybrid.state_dict();
  EXPECT_EQ(sd.tensors.count("state.0.momentum_buffer"), 1u);
  EXPECT_EQ(sd.tensors.count("state.2.exp_avg"), 1u);
  EXPECT_EQ(sd.scalars.at("param_groups.0.ns_steps"), 5);
  EXPECT_EQ(sd.scalars.at("param_groups.1.beta2"), 0.999);

  // A fresh hybrid loads it; the next step equals the uninterrupted one's.
  std::vector<Tensor> c = make();
  for (size_t k = 0; k < c.size(); ++k) c[k].data().copy_(b[k].data());
  MuonWithAdamW resumed(
      {ParamGroup({c[0], c[1]}, muon), ParamGroup({c[3]}, decayed), ParamGroup({c[2]}, no_decay)},
      muon);
  resumed.load_state_dict(sd);
  set_grads(a, 3);
  set_grads(c, 3);
  hybrid.step();
  resumed.step();
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(c[k].data().to_vector<float>(), a[k].data().to_vector<float>()) << k;
  }
}

TEST(MuonWithAdamWTest, MuonGroupsTakeMatricesAndEveryGroupItsType) {
  const Tensor bias(RawTensor::Zeros({5}), true);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { MuonWithAdamW opt({ParamGroup({bias}, MuonOptions())}); },
      "MuonWithAdamW: param 0 of param group 0 has shape [5]: Muon only supports 2-D parameters "
      "(give embeddings' other parameters, biases and norms to AdamW)"));
  // A group without options is a Muon group; an AdamW group takes any shape.
  MuonWithAdamW opt({ParamGroup(Params(kF32)), ParamGroup({bias}, AdamWOptions())});
  EXPECT_NO_THROW(opt.param_groups()[0].options_as<MuonOptions>());
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { opt.add_param_group(ParamGroup({Tensor(RawTensor::Zeros({2}), true)}, SGDOptions())); },
      "MuonWithAdamW: param group 2: options are SGDOptions; MuonWithAdamW takes MuonOptions or "
      "AdamWOptions"));
}

}  // namespace
}  // namespace tg::optim
