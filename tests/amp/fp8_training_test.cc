// FP8 training (amp/fp8.h, autograd/fp8.h, autograd/ops/fp8_linear.cc): Linear's three GEMMs on
// FP8 operands. The forward output and both gradients are checked against an f64 reference
// built from the scalar casts of tensor/float8.h and the recipes' host rules of
// amp/fp8_recipe.h (ComputeScaleFromAmax, ComputeBlockScales, Fp8DelayedScaling), not from the
// kernels under test; the delayed recipe's scales against its update rule after forward and
// backward; the amax reducer's calls; checkpoints (a resumed run equals an uninterrupted one bit
// for bit); and every refusal with its message.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/fp8.h"
#include "amp/fp8_recipe.h"
#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "autograd/trace.h"
#include "autograd/variable.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor/float8.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace amp {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;

RawTensor Random(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return RandNormal(shape, gen, 0.0, scale);
}

// Host quantization: x [rows, cols] row-major cast with one scale per tile (grid from `scales`),
// decoded; with the scale_invs of the tiles: the dequantized value is q * scale_inv.
struct HostQuantized {
  std::vector<float> q;          // decoded FP8 values
  std::vector<float> scale_inv;  // per element (its tile's)
};

HostQuantized QuantizeOnHost(const std::vector<float>& x, int64_t rows, int64_t cols,
                             const std::vector<float>& scales, int64_t tile_rows, int64_t tile_cols,
                             bool e4m3) {
  const int64_t grid_cols = (cols + tile_cols - 1) / tile_cols;
  HostQuantized h;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scales[(r / tile_rows) * grid_cols + c / tile_cols];
      const float v = x[r * cols + c] * s;
      h.q.push_back(e4m3 ? E4M3BitsToFloat(FloatToE4M3Bits(v))
                         : E5M2BitsToFloat(FloatToE5M2Bits(v)));
      h.scale_inv.push_back(1.0f / s);
    }
  }
  return h;
}

// out [m, n] = sum_k dequant(a)[i, k] * dequant(b)[j, k] in f64.
std::vector<double> ReferenceGemm(const HostQuantized& a, const HostQuantized& b, int64_t m,
                                  int64_t n, int64_t k) {
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        sum += static_cast<double>(a.q[i * k + p]) * a.scale_inv[i * k + p] *
               static_cast<double>(b.q[j * k + p]) * b.scale_inv[j * k + p];
      }
      out[i * n + j] = sum;
    }
  }
  return out;
}

// |got - want| within f32 accumulation over k terms (plus the scale products' roundings), relative
// to the sum of magnitudes.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 const HostQuantized& a, const HostQuantized& b, int64_t m, int64_t n, int64_t k,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i) {
    for (int64_t j = 0; j < n && failures < 5; ++j) {
      double magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        magnitude += std::fabs(static_cast<double>(a.q[i * k + p]) * a.scale_inv[i * k + p] *
                               b.q[j * k + p] * b.scale_inv[j * k + p]);
      }
      const double bound = (k + 4) * std::ldexp(1.0, -24) * magnitude + 1e-30;
      const double err = std::fabs(got[i * n + j] - want[i * n + j]);
      if (err > bound) {
        ++failures;
        ADD_FAILURE() << what << " [" << i << ", " << j << "]: got " << got[i * n + j] << ", want "
                      << want[i * n + j] << " (bound " << bound << ")";
      }
    }
  }
}

std::vector<float> Transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

float AmaxOf(const std::vector<float>& x) {
  float a = 0;
  for (float v : x) a = std::max(a, std::fabs(v));
  return a;
}

// One FP8 Linear step with the training's recipe: forward y = x W^T (no bias), loss = sum(y * c),
// so grad_output = c. Returns y, dx, dW as host vectors.
struct StepResult {
  std::vector<float> y, dx, dw;
};

StepResult RunStep(Fp8Training& fp8, const Tensor& x, const Tensor& w, const RawTensor& c) {
  Tensor y;
  {
    Fp8Autocast on(fp8);
    y = Linear(x, w);
    on.Finish();
  }
  Sum(Mul(y, Tensor(c))).backward();
  return {y.data().to_vector<float>(), x.grad().data().to_vector<float>(),
          w.grad().data().to_vector<float>()};
}

// The reference of one step for per-tensor scales sx, sw, sg (E4M3 forward, `grad_e4m3` for g).
void CheckStepAgainstReference(const StepResult& got, const std::vector<float>& x,
                               const std::vector<float>& w, const std::vector<float>& g, int64_t m,
                               int64_t n, int64_t k, float sx, float sw, float sg, bool grad_e4m3) {
  const HostQuantized xq = QuantizeOnHost(x, m, k, {sx}, m, k, true);
  const HostQuantized wq = QuantizeOnHost(w, n, k, {sw}, n, k, true);
  ExpectClose(got.y, ReferenceGemm(xq, wq, m, n, k), xq, wq, m, n, k, "y");
  // dx [m, k] = g [m, n] @ W [n, k]: operands g (rows m, contraction n) and W^T [k, n].
  const HostQuantized gq = QuantizeOnHost(g, m, n, {sg}, m, n, grad_e4m3);
  const HostQuantized wtq = QuantizeOnHost(Transposed(w, n, k), k, n, {sw}, k, n, true);
  ExpectClose(got.dx, ReferenceGemm(gq, wtq, m, k, n), gq, wtq, m, k, n, "dx");
  // dW [n, k] = g^T [n, m] @ x [m, k]: operands g^T and x^T [k, m].
  const HostQuantized gtq = QuantizeOnHost(Transposed(g, m, n), n, m, {sg}, n, m, grad_e4m3);
  const HostQuantized xtq = QuantizeOnHost(Transposed(x, m, k), k, m, {sx}, k, m, true);
  ExpectClose(got.dw, ReferenceGemm(gtq, xtq, n, k, m), gtq, xtq, n, k, m, "dW");
}

Fp8TrainingOptions Options(Fp8Recipe recipe) {
  Fp8TrainingOptions o;
  o.recipe = recipe;
  o.delayed.amax_history_len = 4;
  return o;
}

// ---- Delayed scaling -------------------------------------------------------------------------

// Step 1 casts with scale 1 (the recipe's start); the updates after its forward and backward set
// the scales from the amaxes of x, W and g (HYBRID: 448 forward, 57344 gradients), which step 2
// then casts with.
TEST(Fp8TrainingTest, DelayedScalingStepsMatchTheReferenceAndTheRecipe) {
  const int64_t m = 6, n = 5, k = 40;
  const RawTensor xt = Random({m, k}, 1, 3.0), wt = Random({n, k}, 2, 0.05),
                  ct = Random({m, n}, 3, 1e-3);
  Tensor x(xt, true), w(wt, true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kDelayed));
  EXPECT_EQ(fp8.format(), Fp8Format::kHybrid);
  const std::vector<float> xv = xt.to_vector<float>(), wv = wt.to_vector<float>(),
                           gv = ct.to_vector<float>();
  const StepResult first = RunStep(fp8, x, w, ct);
  CheckStepAgainstReference(first, xv, wv, gv, m, n, k, 1.0f, 1.0f, 1.0f, false);
  // The recipe saw exactly these amaxes: scale = fp8_max / amax in f32.
  EXPECT_EQ(fp8.delayed()->scale(0, Fp8Role::kInput), 448.0f / AmaxOf(xv));
  EXPECT_EQ(fp8.delayed()->scale(0, Fp8Role::kWeight), 448.0f / AmaxOf(wv));
  EXPECT_EQ(fp8.delayed()->scale(0, Fp8Role::kGradOutput), 57344.0f / AmaxOf(gv));
  x.set_grad(Tensor());
  w.set_grad(Tensor());
  const StepResult second = RunStep(fp8, x, w, ct);
  CheckStepAgainstReference(second, xv, wv, gv, m, n, k, 448.0f / AmaxOf(xv), 448.0f / AmaxOf(wv),
                            57344.0f / AmaxOf(gv), false);
  // The FP8 result is not the f32 one (the casts happened): an f32 Linear differs.
  const std::vector<float> plain = Linear(Tensor(xt), Tensor(wt)).data().to_vector<float>();
  EXPECT_NE(plain, second.y);
  const Fp8RoleSummary s = fp8.Summary(Fp8Role::kWeight);
  EXPECT_EQ(s.min_scale, 448.0f / AmaxOf(wv));
  EXPECT_EQ(s.max_scale, s.min_scale);
}

// The reducer sees all of a pass's amaxes at once, in layer order (input, weight per layer
// forward; grad_output per layer backward); the scales follow the reduced values.
TEST(Fp8TrainingTest, DelayedScalingReducesEveryPassOnceBeforeUpdating) {
  const RawTensor x0 = Random({3, 8}, 4);
  Tensor w0(Random({4, 8}, 5), true), w1(Random({2, 4}, 6), true);
  Fp8Training fp8({w0, w1}, Options(Fp8Recipe::kDelayed));
  std::vector<std::vector<float>> seen;
  fp8.set_amax_reducer([&](std::vector<float>& amaxes) {
    seen.push_back(amaxes);
    for (float& a : amaxes) a *= 2;  // another rank saw twice as much
  });
  Tensor h;
  {
    Fp8Autocast on(fp8);
    h = Linear(Linear(Tensor(x0), w0), w1);
    on.Finish();
  }
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_EQ(seen[0].size(), 4u);
  EXPECT_EQ(seen[0][0], AmaxOf(x0.to_vector<float>()));
  EXPECT_EQ(seen[0][1], AmaxOf(w0.data().to_vector<float>()));
  EXPECT_EQ(seen[0][3], AmaxOf(w1.data().to_vector<float>()));
  EXPECT_EQ(fp8.delayed()->scale(1, Fp8Role::kWeight), 448.0f / (2 * seen[0][3]));
  Sum(h).backward();  // grad_output of layer 1 is all ones
  ASSERT_EQ(seen.size(), 2u);
  ASSERT_EQ(seen[1].size(), 2u);
  EXPECT_EQ(seen[1][1], 1.0f);
  EXPECT_EQ(fp8.delayed()->scale(1, Fp8Role::kGradOutput), 57344.0f / 2.0f);
}

// A run saved after step 2 and resumed in a fresh Fp8Training continues bit for bit.
TEST(Fp8TrainingTest, DelayedScalingResumeIsBitIdentical) {
  const int64_t m = 4, n = 3, k = 16;
  const RawTensor wt = Random({n, k}, 7, 0.1), ct = Random({m, n}, 8);
  const auto run = [&](Fp8Training& fp8, Tensor& w, int from, int to) {
    std::vector<float> out;
    for (int step = from; step < to; ++step) {
      Tensor x(Random({m, k}, 100 + step, 1.0 + step), true);
      w.set_grad(Tensor());
      const StepResult r = RunStep(fp8, x, w, ct);
      out.insert(out.end(), r.y.begin(), r.y.end());
      out.insert(out.end(), r.dw.begin(), r.dw.end());
    }
    return out;
  };
  Tensor w_full(wt.clone(), true);
  Fp8Training full({w_full}, Options(Fp8Recipe::kDelayed));
  run(full, w_full, 0, 2);
  const std::vector<float> expected = run(full, w_full, 2, 5);

  Tensor w_first(wt.clone(), true);
  Fp8Training first({w_first}, Options(Fp8Recipe::kDelayed));
  run(first, w_first, 0, 2);
  const StateDict saved = first.state_dict();
  Tensor w_resumed(wt.clone(), true);
  Fp8Training resumed({w_resumed}, Options(Fp8Recipe::kDelayed));
  resumed.load_state_dict(saved);
  EXPECT_EQ(run(resumed, w_resumed, 2, 5), expected);
  // Without the state the scales restart at 1 and the run differs.
  Tensor w_fresh(wt.clone(), true);
  Fp8Training fresh({w_fresh}, Options(Fp8Recipe::kDelayed));
  EXPECT_NE(run(fresh, w_fresh, 2, 5), expected);
}

TEST(Fp8TrainingTest, LoadStateDictRefusesAnotherRunsState) {
  Tensor w(Random({2, 4}, 9), true), v(Random({2, 2}, 10), true);
  Fp8Training delayed({w}, Options(Fp8Recipe::kDelayed));
  Fp8Training current({w}, Options(Fp8Recipe::kCurrent));
  Fp8Training two({w, v}, Options(Fp8Recipe::kDelayed));
  EXPECT_TRUE(ThrowsErrorExactly([&] { delayed.load_state_dict(current.state_dict()); },
                                 "Fp8Training::load_state_dict: the checkpoint's recipe is "
                                 "current, this run's is delayed"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { delayed.load_state_dict(two.state_dict()); },
                                 "Fp8Training::load_state_dict: unexpected scalar "
                                 "'delayed.layer.1.grad_output.scale'"));
  StateDict sd = delayed.state_dict();
  sd.scalars["num_layers"] = 3;
  EXPECT_TRUE(ThrowsErrorExactly([&] { delayed.load_state_dict(sd); },
                                 "Fp8Training::load_state_dict: the checkpoint has 3 FP8 layers, "
                                 "this run has 1"));
  sd = delayed.state_dict();
  sd.scalars["delayed.layer.0.input.scale"] = -1;
  EXPECT_TRUE(ThrowsError([&] { delayed.load_state_dict(sd); }, "scale"));
  EXPECT_EQ(delayed.delayed()->scale(0, Fp8Role::kInput), 1.0f);  // unchanged
}

// ---- Current and block scaling -----------------------------------------------------------------

// Current scaling: every cast's scale is this tensor's own amax (TE's compute_scale_from_amax).
TEST(Fp8TrainingTest, CurrentScalingMatchesTheReference) {
  const int64_t m = 5, n = 7, k = 33;
  const RawTensor xt = Random({m, k}, 11, 2.0), wt = Random({n, k}, 12, 0.1),
                  ct = Random({m, n}, 13);
  Tensor x(xt, true), w(wt, true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kCurrent));
  const StepResult r = RunStep(fp8, x, w, ct);
  const std::vector<float> xv = xt.to_vector<float>(), wv = wt.to_vector<float>(),
                           gv = ct.to_vector<float>();
  Fp8CurrentScalingOptions o;
  CheckStepAgainstReference(r, xv, wv, gv, m, n, k, ComputeScaleFromAmax(AmaxOf(xv), 448, o),
                            ComputeScaleFromAmax(AmaxOf(wv), 448, o),
                            ComputeScaleFromAmax(AmaxOf(gv), 57344, o), false);
  EXPECT_EQ(fp8.Summary(Fp8Role::kInput).min_scale, ComputeScaleFromAmax(AmaxOf(xv), 448, o));
  EXPECT_EQ(fp8.delayed(), nullptr);
}

// Block scaling: 1x128 tiles for x and g (their transposes tiled along the other GEMMs'
// contractions), 128x128 blocks for W, E4M3 throughout, power-of-two scales; the host reference
// takes its tile scales from ComputeBlockScales.
TEST(Fp8TrainingTest, BlockScalingMatchesTheReference) {
  const int64_t m = 130, n = 129, k = 260;
  const RawTensor xt = Random({m, k}, 14, 1e-3);
  // Tiles of very different magnitudes, so that one scale for all would lose the small ones.
  xt.narrow(1, 128, 128).copy_(MulScalar(xt.narrow(1, 128, 128), 1e4));
  const RawTensor wt = Random({n, k}, 15, 0.05), ct = Random({m, n}, 16);
  Tensor x(xt, true), w(wt, true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kBlock));
  EXPECT_EQ(fp8.format(), Fp8Format::kE4M3);
  const StepResult r = RunStep(fp8, x, w, ct);
  const std::vector<float> xv = xt.to_vector<float>(), wv = wt.to_vector<float>(),
                           gv = ct.to_vector<float>();
  const auto q1x128 = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
    const Fp8BlockScales s = ComputeBlockScales(v, rows, cols, Fp8BlockShape::k1x128, 448);
    return QuantizeOnHost(v, rows, cols, s.scales, 1, 128, true);
  };
  const auto q128 = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
    const Fp8BlockScales s = ComputeBlockScales(v, rows, cols, Fp8BlockShape::k128x128, 448);
    return QuantizeOnHost(v, rows, cols, s.scales, 128, 128, true);
  };
  const HostQuantized xq = q1x128(xv, m, k), wq = q128(wv, n, k);
  ExpectClose(r.y, ReferenceGemm(xq, wq, m, n, k), xq, wq, m, n, k, "y");
  // W^T's blocks are W's blocks transposed: quantize W and transpose the decoded values.
  HostQuantized wtq;
  wtq.q = Transposed(wq.q, n, k);
  wtq.scale_inv = Transposed(wq.scale_inv, n, k);
  const HostQuantized gq = q1x128(gv, m, n);
  ExpectClose(r.dx, ReferenceGemm(gq, wtq, m, k, n), gq, wtq, m, k, n, "dx");
  const HostQuantized gtq = q1x128(Transposed(gv, m, n), n, m);
  const HostQuantized xtq = q1x128(Transposed(xv, m, k), k, m);
  ExpectClose(r.dw, ReferenceGemm(gtq, xtq, n, k, m), gtq, xtq, n, k, m, "dW");
}

// ---- Non-finite values are not hidden ----------------------------------------------------------

bool AllFinite(const RawTensor& t) {
  for (float v : t.to_vector<float>()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// An inf in the input, or in the output gradient (an overflow), would cast to +-max under the
// saturating rule and reach the optimizer as a finite number; instead the GEMMs that read it give
// NaN, as bf16 would give inf or NaN, so the mixed-precision optimizer's check skips the step.
TEST(Fp8TrainingTest, InfInTheInputOrTheGradientIsNotHiddenBySaturation) {
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlock}) {
    SCOPED_TRACE(Fp8RecipeName(recipe));
    const float inf = std::numeric_limits<float>::infinity();
    Tensor w(Random({4, 8}, 30), true);
    Fp8Training fp8({w}, Options(recipe));
    RawTensor xt = Random({3, 8}, 31);
    xt.narrow(0, 1, 1).narrow(1, 2, 1).fill_(inf);
    Tensor y;
    {
      Fp8Autocast on(fp8);
      y = Linear(Tensor(xt), w);
      on.Finish();
    }
    // Per tensor the whole output is NaN (one scale for all); per 1x128 tile only the row whose
    // tile held the inf.
    EXPECT_EQ(AllFinite(y.data().narrow(0, 0, 1)), recipe == Fp8Recipe::kBlock);
    EXPECT_FALSE(AllFinite(y.data().narrow(0, 1, 1)));
    Sum(y).backward();
    EXPECT_FALSE(AllFinite(w.grad().data()));
    // A finite input with an overflowing output gradient.
    w.set_grad(Tensor());
    RawTensor ct = RawTensor::Ones({3, 4});
    ct.narrow(0, 2, 1).narrow(1, 1, 1).fill_(inf);
    {
      Fp8Autocast on(fp8);
      y = Linear(Tensor(Random({3, 8}, 32)), w);
      on.Finish();
    }
    Sum(Mul(y, Tensor(ct))).backward();
    EXPECT_FALSE(AllFinite(w.grad().data()));
  }
}

// ---- The event trace ---------------------------------------------------------------------------

std::vector<std::string> Fp8Events(const std::vector<TraceRecord>& events) {
  std::vector<std::string> out;
  for (const TraceRecord& e : events) {
    if (e.kind == TraceKind::kUser && e.name == std::string("fp8")) out.push_back(e.detail);
    if (e.kind == TraceKind::kCallbackRun) out.push_back("callback " + e.name);
  }
  return out;
}

// Delayed scaling's updates appear where they happen: the forward's at the scope's exit, the
// backward's in an engine callback after the backward's nodes; current scaling's casts each
// show their scale.
TEST(Fp8TrainingTest, TheEventTraceShowsUpdatesAndCasts) {
  const RawTensor xt = RawTensor::FromVector<float>({1, -3.5f, 2, 0.5f}, {2, 2});
  Tensor w(RawTensor::FromVector<float>({0.5f, 0.25f, -1, 2}, {2, 2}), true);
  {
    Fp8Training fp8({w}, Options(Fp8Recipe::kDelayed));
    TraceScope trace;
    Tensor y;
    {
      Fp8Autocast on(fp8);
      y = Linear(Tensor(xt), w);
      on.Finish();
    }
    Sum(y).backward();
    EXPECT_THAT(Fp8Events(trace.events()),
                ::testing::ElementsAre(
                    "forward update (delayed): input scales in [128, 128] over 1 layers",
                    "forward update (delayed): weight scales in [224, 224] over 1 layers",
                    "callback fp8 backward update",
                    "backward update (delayed): grad_output scales in [57344, 57344] over 1 "
                    "layers"));
  }
  w.set_grad(Tensor());
  Fp8Training current({w}, Options(Fp8Recipe::kCurrent));
  TraceScope trace;
  Fp8Autocast on(current);
  Linear(Tensor(xt), w);
  EXPECT_THAT(
      Fp8Events(trace.events()),
      ::testing::ElementsAre("cast layer 0 input (current, per tensor): scale in [128, 128]",
                             "cast layer 0 weight (current, per tensor): scale in [224, "
                             "224]"));
}

// ---- Scope, coverage and refusals ----------------------------------------------------------

TEST(Fp8TrainingTest, OnlyCoveredWeightsInsideTheScopeRunInFp8) {
  const RawTensor xt = Random({3, 8}, 17);
  Tensor w(Random({4, 8}, 18), true), other(Random({4, 8}, 19), true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kCurrent));
  const std::vector<float> plain_w = Linear(Tensor(xt), w).data().to_vector<float>();
  const std::vector<float> plain_other = Linear(Tensor(xt), other).data().to_vector<float>();
  Fp8Autocast on(fp8);
  EXPECT_NE(Linear(Tensor(xt), w).data().to_vector<float>(), plain_w);
  EXPECT_EQ(Linear(Tensor(xt), other).data().to_vector<float>(), plain_other);
  // The fused-activation form is the FP8 Linear, then its GELU, forward and backward (the GELU's
  // derivative in one pass either way).
  Tensor xa(xt, true), xb(xt, true);
  const Tensor y = Linear(xa, w, Tensor(), Activation::kGeluTanh);
  const Tensor unfused = GeluTanh(Linear(xb, w));
  EXPECT_EQ(y.data().to_vector<float>(), unfused.data().to_vector<float>());
  Sum(y).backward();
  const std::vector<float> gw = w.grad().data().to_vector<float>();
  w.set_grad(Tensor());
  Sum(unfused).backward();
  EXPECT_EQ(xa.grad().data().to_vector<float>(), xb.grad().data().to_vector<float>());
  EXPECT_EQ(gw, w.grad().data().to_vector<float>());
  {
    Fp8Autocast off(fp8, /*enabled=*/false);
    EXPECT_EQ(Linear(Tensor(xt), w).data().to_vector<float>(), plain_w);
  }
}

// Under bf16 autocast the output is bf16 and the f32 master weight is cast to FP8 directly
// (its gradient arrives in f32).
TEST(Fp8TrainingTest, UnderAutocastTheOutputIsLowPrecisionAndTheMasterGradF32) {
  Tensor x(Random({4, 16}, 20), true), w(Random({8, 16}, 21), true), b(Random({8}, 22), true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kCurrent));
  Tensor y;
  {
    AutocastGuard autocast(kBF16);
    Fp8Autocast on(fp8);
    y = Linear(x, w, b);
    on.Finish();
  }
  EXPECT_EQ(y.dtype(), kBF16);
  Sum(y).backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_EQ(x.grad().dtype(), kF32);
  // The bias gradient is the column sum of the (bf16) ones: 4 per column, exactly.
  EXPECT_EQ(b.grad().data().to_vector<float>(), std::vector<float>(8, 4.0f));
}

TEST(Fp8TrainingTest, RefusesWhatItCannotDo) {
  Tensor w(Random({2, 4}, 23), true);
  Fp8TrainingOptions e5m2;
  e5m2.format = Fp8Format::kE5M2;
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Training t({w}, e5m2); },
                                 "Fp8Training: E5M2 as the format is not supported (as in "
                                 "Transformer Engine: pure E5M2 training); use E4M3 or HYBRID"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Fp8Training t({w, w});
      },
      "Fp8Training: weight 1 is weight 0 again"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Training t({Tensor(Random({4}, 1), true)}); },
                                 "Fp8Training: weight 0 must be 2-D [out, in], got shape [4]"));
  EXPECT_TRUE(ThrowsErrorExactly([] { ParseFp8Recipe("mxfp8"); },
                                 "FP8 recipe 'mxfp8': expected delayed, current or block"));
  Fp8Training fp8({w}, Options(Fp8Recipe::kDelayed));
  Fp8Autocast on(fp8);
  // f64 has no FP8 GEMM.
  Tensor w64(Random({2, 4}, 24).to(kF64), true);
  Fp8Training fp8_64({w64}, Options(Fp8Recipe::kCurrent));
  {
    Fp8Autocast on64(fp8_64);
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] {
          Linear(Tensor(Random({1, 4}, 25).to(kF64)), w64);
        },
        "linear (FP8): expected f32, bf16 or f16 tensors (FP8 GEMMs have no f64 form), got f64"));
  }
  // Checkpointed segments inside the scope.
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        Checkpoint([&](const VariableList& in) { return Linear(in[0], w); },
                   {Tensor(Random({1, 4}, 26), true)}, CheckpointOptions{});
      },
      "checkpoint: FP8 training (an FP8 scope is installed) inside a checkpointed segment is "
      "not supported; turn activation checkpointing off or run the segment outside the scope"));
  // No second derivative.
  Tensor x(Random({3, 4}, 27), true);
  const Tensor y = Linear(x, w);
  EXPECT_TRUE(ThrowsError(
      [&] { Engine::Grad({Sum(y)}, {x}, {}, {.create_graph = true}); },
      "linear (FP8): no second derivative (the FP8 GEMMs take the straight-through gradient); "
      "run backward without create_graph"));
}

TEST(Fp8TrainingTest, BackwardAfterTheTrainingIsGoneFailsClearly) {
  Tensor w(Random({2, 4}, 28), true);
  Tensor y;
  {
    Fp8Training fp8({w}, Options(Fp8Recipe::kCurrent));
    Fp8Autocast on(fp8);
    y = Linear(Tensor(Random({3, 4}, 29)), w);
    on.Finish();
  }
  EXPECT_TRUE(ThrowsError([&] { Sum(y).backward(); },
                          "FP8 quantizer (layer 0, grad_output): its Fp8Training was destroyed "
                          "before this cast"));
}

// The forward's update is an explicit call: a scope that ends without it leaves the update owed,
// and the next scope and the backward's update say so; the guard itself never throws from its
// destructor, so it may live in a std::optional.
TEST(Fp8TrainingTest, AForwardWithoutFinishLeavesItsUpdateOwed) {
  Tensor w(Random({4, 8}, 40), true);
  Fp8Training fp8({w}, Options(Fp8Recipe::kDelayed));
  Tensor y;
  {
    std::optional<Fp8Autocast> on(std::in_place, fp8);
    y = Linear(Tensor(Random({3, 8}, 41)), w);
  }
  const char* owed =
      "amp::Fp8Autocast: a forward's FP8 update did not run: call Finish() on the "
      "Fp8Autocast at the end of the forward (or Fp8Training::FinishForward() "
      "after its scope)";
  EXPECT_TRUE(ThrowsErrorExactly([&] { Fp8Autocast again(fp8); }, owed));
  EXPECT_TRUE(ThrowsError([&] { Sum(y).backward(); }, owed));
  fp8.FinishForward();  // pays it
  {
    Fp8Autocast on(fp8);
    y = Linear(Tensor(Random({3, 8}, 42)), w);
    on.Finish();
    EXPECT_TRUE(ThrowsErrorExactly([&] { on.Finish(); },
                                   "amp::Fp8Autocast::Finish: called twice in one scope"));
  }
  Sum(y).backward();
  Fp8Autocast eval(fp8, /*enabled=*/true, /*update=*/false);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { eval.Finish(); }, "amp::Fp8Autocast::Finish: this scope was made with update = false"));
}

}  // namespace
}  // namespace amp
}  // namespace tg
