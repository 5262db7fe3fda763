#include "optim/adam.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "tests/optim/torch_trace_inputs.h"
#include "tests/optim/trace.h"
#include "tests/tensor/throws.h"

namespace tg::optim {
namespace {

using testing::ExpectTrace;
using testing::kTraceSteps;

// Expected values: tests/optim/reference_traces.py (the formula in optim/adam.h in f32).
constexpr float kAdam[kTraceSteps][3] = {
    {0.50999999f, -1.25999999f, 2.0f},         {0.516700566f, -1.25947368f, 1.9925586f},
    {0.515841901f, -1.26122093f, 1.98912287f}, {0.516491771f, -1.25812078f, 1.98363662f},
    {0.517034292f, -1.25550044f, 1.97900736f}, {0.517508388f, -1.25325203f, 1.97501373f},
    {0.517919242f, -1.25128531f, 1.97153711f}, {0.518290699f, -1.24955785f, 1.96847224f},
    {0.518620431f, -1.24801803f, 1.9657408f},  {0.518905699f, -1.24664688f, 1.96330655f},
};
constexpr float kAdamExpAvg[3] = {-0.00945925526f, -0.0442724861f, 0.0693103224f};
constexpr float kAdamExpAvgSq[3] = {0.00258066459f, 0.00244661514f, 0.00190256897f};

constexpr float kAdamL2Amsgrad[kTraceSteps][3] = {
    {0.50999999f, -1.25999999f, 1.99000001f},  {0.51669383f, -1.25945675f, 1.98254657f},
    {0.515829563f, -1.26118505f, 1.97908509f}, {0.516473174f, -1.25807011f, 1.97357857f},
    {0.517008364f, -1.25543416f, 1.96892679f}, {0.517474174f, -1.2531693f, 1.96490836f},
    {0.517876029f, -1.25118506f, 1.96140456f}, {0.51823771f, -1.24943912f, 1.95831025f},
    {0.518557072f, -1.24787986f, 1.95554721f}, {0.518831372f, -1.24648821f, 1.95307922f},
};
constexpr float kAmsgradExpAvg[3] = {-0.00912322197f, -0.0450890213f, 0.0705930963f};
constexpr float kAmsgradExpAvgSq[3] = {0.00258032745f, 0.00244849757f, 0.00190843712f};
constexpr float kAmsgradMaxExpAvgSq[3] = {0.0025958342f, 0.00246321922f, 0.00191988854f};

constexpr float kAdamW[kTraceSteps][3] = {
    {0.509500027f, -1.25874996f, 1.99800003f}, {0.515691102f, -1.25696492f, 1.98856068f},
    {0.514316738f, -1.25745523f, 1.98313642f}, {0.514452279f, -1.25309765f, 1.975667f},
    {0.514480352f, -1.24922419f, 1.96906209f}, {0.51444f, -1.24572659f, 1.96309948f},
    {0.514336407f, -1.24251413f, 1.95765984f}, {0.514193535f, -1.23954415f, 1.95263731f},
    {0.514009058f, -1.23676479f, 1.94795322f}, {0.513780296f, -1.23415685f, 1.94357109f},
};

// f16 parameters and gradients: computed in f32 with f32 state, rounded to f16 once per step.
constexpr float kAdamWHalf[kTraceSteps][3] = {
    {0.509277344f, -1.25878906f, 1.99804688f}, {0.515625f, -1.25683594f, 1.98828125f},
    {0.514160156f, -1.2578125f, 1.98242188f},  {0.514160156f, -1.25390625f, 1.97460938f},
    {0.514160156f, -1.25f, 1.96777344f},       {0.514160156f, -1.24609375f, 1.96191406f},
    {0.514160156f, -1.24316406f, 1.95605469f}, {0.514160156f, -1.24023438f, 1.95117188f},
    {0.514160156f, -1.23730469f, 1.94628906f}, {0.514160156f, -1.234375f, 1.94238281f},
};

// f64 parameters compute in f64 (gradients: the f32 trace values widened).
constexpr double kAdamAmsgradF64[kTraceSteps][3] = {
    {0.50999999990990996, -1.2599999998648648, 2.0},
    {0.51669723123670697, -1.2594736840825034, 1.9925586318591144},
    {0.51583855410170465, -1.2612209393971519, 1.989122905328524},
    {0.51648843795272747, -1.25812079653592, 1.9836366310804652},
    {0.51703069233524079, -1.2555017793953094, 1.9790096832729727},
    {0.51750429257539843, -1.2532556383360409, 1.9750200732554428},
    {0.51791454004149962, -1.2512918274165044, 1.9715486534013518},
    {0.51828524737209503, -1.2495677957933835, 1.9684899186476903},
    {0.5186141730182513, -1.2480318456535044, 1.965765329381914},
    {0.51889856530818967, -1.2466648187015836, 1.9633384135798715},
};
constexpr double kAmsgradF64ExpAvgSq[3] = {0.002580664143635324, 0.0024466152089560353,
                                           0.0019025687921699638};
constexpr double kAmsgradF64MaxExpAvgSq[3] = {0.0025961753619842729, 0.0024613273532930681,
                                              0.0019140001814333203};

std::vector<float> F(const float (&v)[3]) { return std::vector<float>(v, v + 3); }

TEST(AdamTest, TraceMatchesFormula) {
  AdamOptions o;
  o.lr(0.01);
  ExpectTrace<Adam>(o, kAdam);
}

TEST(AdamTest, L2WeightDecayAmsgradTrace) {
  AdamOptions o;
  o.lr(0.01);
  o.weight_decay(0.001);
  o.amsgrad(true);
  ExpectTrace<Adam>(o, kAdamL2Amsgrad);
}

TEST(AdamTest, AdamWTrace) {
  AdamWOptions o;
  o.lr(0.01);
  o.weight_decay(0.1);
  ExpectTrace<AdamW>(o, kAdamW);
}

TEST(AdamTest, AdamWHalfParamsTrace) {
  AdamWOptions o;
  o.lr(0.01);
  o.weight_decay(0.1);
  ExpectTrace<AdamW>(o, kAdamWHalf, kF16);
}

// The state after the traces: f32 moments, the step count, and amsgrad's running maximum, which
// here is above exp_avg_sq (the gradients shrink after step 4).
TEST(AdamTest, StateAfterTrace) {
  for (bool fused : {true, false}) {
    AdamOptions o;
    o.lr(0.01);
    o.fused(fused);
    Tensor p = testing::TraceParam();
    Adam opt(std::vector<Tensor>{p}, o);
    o.weight_decay(0.001);
    o.amsgrad(true);
    Tensor q = testing::TraceParam();
    Adam ams(std::vector<Tensor>{q}, o);
    for (int k = 0; k < testing::kTraceSteps; ++k) {
      testing::SetTraceGrad(p, k, kF32);
      testing::SetTraceGrad(q, k, kF32);
      opt.step();
      ams.step();
    }
    const StateDict& s = *opt.param_state(p);
    EXPECT_EQ(s.scalar("step"), 10);
    EXPECT_EQ(s.tensor("exp_avg").to_vector<float>(), F(kAdamExpAvg));
    EXPECT_EQ(s.tensor("exp_avg_sq").to_vector<float>(), F(kAdamExpAvgSq));
    EXPECT_FALSE(s.has_tensor("max_exp_avg_sq"));
    const StateDict& a = *ams.param_state(q);
    EXPECT_EQ(a.tensor("exp_avg").to_vector<float>(), F(kAmsgradExpAvg));
    EXPECT_EQ(a.tensor("exp_avg_sq").to_vector<float>(), F(kAmsgradExpAvgSq));
    EXPECT_EQ(a.tensor("max_exp_avg_sq").to_vector<float>(), F(kAmsgradMaxExpAvgSq));
  }
}

TEST(AdamTest, F64ParamsComputeInF64) {
  for (bool fused : {true, false}) {
    AdamOptions o;
    o.lr(0.01);
    o.amsgrad(true);
    o.fused(fused);
    Tensor p = testing::TraceParam(kF64);
    Adam opt(std::vector<Tensor>{p}, o);
    for (int k = 0; k < testing::kTraceSteps; ++k) {
      testing::SetTraceGrad(p, k, kF64);
      opt.step();
      const std::vector<double> got = p.data().to_vector<double>();
      for (int j = 0; j < 3; ++j) EXPECT_EQ(got[j], kAdamAmsgradF64[k][j]) << k << " " << j;
    }
    const StateDict& s = *opt.param_state(p);
    EXPECT_EQ(s.tensor("exp_avg_sq").dtype(), kF64);
    EXPECT_EQ(s.tensor("exp_avg_sq").to_vector<double>(),
              std::vector<double>(kAmsgradF64ExpAvgSq, kAmsgradF64ExpAvgSq + 3));
    EXPECT_EQ(s.tensor("max_exp_avg_sq").to_vector<double>(),
              std::vector<double>(kAmsgradF64MaxExpAvgSq, kAmsgradF64MaxExpAvgSq + 3));
  }
}

// 1000 steps on the inputs of tests/optim/torch_trace_inputs.h: every parameter and state tensor
// equals torch's _single_tensor_adam (torch 2.15.0+cu132 on the CPU, foreach=False) bit for bit
// once torch's f32 sqrt, which is not correctly rounded, is replaced by the correctly rounded one
// (torch_trace_compare.py's "ieee"; with torch's own sqrt the moments of AdamW stay bit for bit
// and the parameters differ by up to 2.4e-7). The fingerprints (FNV-1a of the bits, each
// parameter's state tensors in name order, then the parameter) were printed by
// `torch_trace_compare.py --fingerprint`. Both paths, fused and per-tensor.
TEST(AdamTest, ThousandStepTracesAreTorchsBitForBit) {
  for (bool fused : {true, false}) {
    const std::vector<Tensor> aw = testing::TorchTraceParams();
    AdamW adamw(aw, AdamWOptions(0.01).weight_decay(0.1).fused(fused));
    const std::vector<Tensor> a = testing::TorchTraceParams();
    Adam adam(a, AdamOptions(0.01).weight_decay(0.1).amsgrad(true).fused(fused));
    testing::RunTorchTrace(adamw, aw, 1000);
    testing::RunTorchTrace(adam, a, 1000);
    const auto fingerprint = [](const Optimizer& opt, const std::vector<Tensor>& params) {
      std::vector<RawTensor> tensors;
      for (const Tensor& p : params) {
        for (const auto& [name, t] : opt.param_state(p)->tensors) tensors.push_back(t);
        tensors.push_back(p.data());
      }
      return testing::Fingerprint(tensors);
    };
    EXPECT_EQ(fingerprint(adamw, aw), 0x87d747b34db687aeull) << "AdamW, fused " << fused;
    EXPECT_EQ(fingerprint(adam, a), 0x579e584633162bbdull) << "Adam L2 amsgrad, fused " << fused;
  }
}

// With weight_decay 0 AdamW is Adam: the decoupled factor is exactly 1.
TEST(AdamTest, AdamWWithoutDecayIsAdam) {
  AdamWOptions o;
  o.lr(0.01);
  o.weight_decay(0);
  ExpectTrace<AdamW>(o, kAdam);
}

TEST(AdamTest, DefaultsLikePyTorch) {
  Tensor p = testing::TraceParam();
  Adam adam(std::vector<Tensor>{p});
  EXPECT_EQ(adam.defaults().named(), (std::vector<NamedOption>{{"amsgrad", 0},
                                                               {"beta1", 0.9},
                                                               {"beta2", 0.999},
                                                               {"eps", 1e-8},
                                                               {"lr", 1e-3},
                                                               {"weight_decay", 0}}));
  EXPECT_STREQ(adam.defaults().type_name(), "AdamOptions");
  EXPECT_FALSE(adam.decoupled_weight_decay());
  EXPECT_EQ(adam.name(), "Adam");
  AdamW adamw(std::vector<Tensor>{p});
  EXPECT_EQ(dynamic_cast<const AdamWOptions&>(adamw.defaults()).weight_decay(), 1e-2);
  EXPECT_TRUE(adamw.decoupled_weight_decay());
  EXPECT_EQ(adamw.name(), "AdamW");
  EXPECT_TRUE(adamw.fused());
}

TEST(AdamTest, TurningAmsgradOnLaterStartsTheMaximumAtZero) {
  Tensor p = testing::TraceParam();
  AdamOptions o;
  o.lr(0.01);
  Adam opt(std::vector<Tensor>{p}, o);
  testing::SetTraceGrad(p, 0, kF32);
  opt.step();
  opt.param_groups()[0].options_as<AdamOptions>().amsgrad(true);
  testing::SetTraceGrad(p, 1, kF32);
  opt.step();
  const StateDict& s = *opt.param_state(p);
  // max(0, v) = v.
  EXPECT_EQ(s.tensor("max_exp_avg_sq").to_vector<float>(),
            s.tensor("exp_avg_sq").to_vector<float>());
}

// 2x whose backward gives no gradient: what reaches the parameter below it is "no gradient".
struct ReturnsNone : Function<ReturnsNone> {
  static constexpr const char* kName = "ReturnsNone";
  static VariableList Forward(FunctionCtx&, const VariableList& in) {
    return {Tensor(tg::MulScalar(in[0].data(), 2))};
  }
  static VariableList Backward(FunctionCtx&, const VariableList&) { return {Tensor()}; }
};

// A parameter whose gradient is undefined after backward (every path to it went through a
// custom function that returned none) is skipped: neither momentum nor weight decay moves it,
// as PyTorch (its grad is None). A zero gradient would move it under both.
TEST(AdamTest, ParameterWithoutGradientIsNotStepped) {
  for (const bool decoupled : {false, true}) {
    for (const bool fused : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (decoupled ? "AdamW" : "Adam") << " fused=" << fused);
      Tensor p(RawTensor::FromVector<float>({0.5f, -1.5f}, {2}), /*requires_grad=*/true);
      Tensor q(RawTensor::FromVector<float>({2.0f, 3.0f}, {2}), /*requires_grad=*/true);
      AdamOptions o;
      o.lr(0.1);
      o.weight_decay(0.1);
      o.fused(fused);
      std::unique_ptr<Optimizer> opt;
      if (decoupled) {
        AdamWOptions w;
        static_cast<AdamOptions&>(w) = o;
        opt = std::make_unique<AdamW>(std::vector<Tensor>{p, q}, w);
      } else {
        opt = std::make_unique<Adam>(std::vector<Tensor>{p, q}, o);
      }
      // A first step with gradients for both: p gets momentum.
      Add(Sum(Mul(p, p)), Sum(Mul(q, q))).backward();
      opt->step();
      opt->zero_grad();
      const std::vector<float> p_after_first = p.data().to_vector<float>();
      const std::vector<float> q_after_first = q.data().to_vector<float>();

      Add(Sum(ReturnsNone::Apply({Mul(p, p)})[0]), Sum(Mul(q, q))).backward();
      ASSERT_FALSE(p.grad().defined());
      ASSERT_TRUE(q.grad().defined());
      opt->step();
      EXPECT_EQ(p.data().to_vector<float>(), p_after_first);
      EXPECT_NE(q.data().to_vector<float>(), q_after_first);
    }
  }
}

TEST(AdamTest, InvalidOptionsAreNamed) {
  Tensor p = testing::TraceParam();
  AdamOptions o;
  o.beta1(1);
  EXPECT_TRUE(
      tg::testing::ThrowsErrorExactly([&] { Adam(std::vector<Tensor>{p}, o); },
                                      "Adam: param group 0: invalid beta1 1 (must be in [0, 1))"));
  o = AdamOptions();
  o.beta2(-0.5);
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
      [&] { Adam(std::vector<Tensor>{p}, o); },
      "Adam: param group 0: invalid beta2 -0.5 (must be in [0, 1))"));
  AdamWOptions w;
  w.eps(-1e-8);
  EXPECT_TRUE(
      tg::testing::ThrowsErrorExactly([&] { AdamW(std::vector<Tensor>{p}, w); },
                                      "AdamW: param group 0: invalid eps -1e-08 (must be > 0)"));
  w.eps(0);
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly([&] { AdamW(std::vector<Tensor>{p}, w); },
                                              "AdamW: param group 0: invalid eps 0 (must be > 0)"));
  {  // A boolean can only be out of range in a state dict.
    AdamW opt(std::vector<Tensor>{p});
    StateDict sd = opt.state_dict();
    sd.scalars["param_groups.0.amsgrad"] = 2;
    EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
        [&] { opt.load_state_dict(sd); },
        "AdamW.load_state_dict: param group 0: amsgrad must be 0 or 1, got 2"));
    EXPECT_FALSE(opt.param_groups()[0].options_as<AdamOptions>().amsgrad());
  }
  EXPECT_TRUE(tg::testing::ThrowsErrorExactly([&] { Adam(std::vector<Tensor>{}); },
                                              "Adam: got an empty parameter list"));
}

}  // namespace
}  // namespace tg::optim
