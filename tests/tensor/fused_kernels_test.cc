// The CPU's fused kernels (tensor/cpu/fused*.cc) against the composed forms they replace
// (tensor/composed.h), through the public ops of tensor/ops.h, in f64, f32, f16 and bf16: Linear
// and its backward, attention and its backward, the layer-norm backward, add + layer norm and
// softmax + cross-entropy. The shapes exercise what the kernels special-case: bias or not, GELU
// or not, sizes that are not multiples of 8 (pre's padded rows), causal and non-causal masks,
// Tq != Tk, transposed (strided) heads, ignored rows, an undefined layer-norm weight. Each
// kernel is also checked against the composed f64 op on the same values (a second reference
// that a wrong kernel cannot match by sharing the composed form's rounding), and each fused
// entry of the CPU's kernel table is checked to run (kDone) rather than decline.
//
// Tolerances against the composed form, relative to each element's own magnitude (rtol) and to
// the largest magnitude of the output (atol: products and sums cancel, so an element's error
// follows the magnitudes summed into it):
//   f64: 1e-12 / 1e-12 -- the same arithmetic; only OpenBLAS's blocking may order a product's
//        terms differently (a few 2^-53);
//   f32: 1e-6 / 1e-6 -- the same, at 2^-24 per rounding over at most a few dozen terms;
//   f16, bf16: two ulps of the element (2 * 2^-10, 2 * 2^-7 relative) plus one ulp of the scale:
//        the f32 value before the final rounding may differ in its last bits (GEMM order, a
//        double rounding f64 -> f32 -> f16 in the composed column sums) and land on the
//        neighbouring value, and an intermediate rounded to the dtype before a product
//        (Linear's g, attention's p and ds) may do the same.
// (On the shapes below the kernels currently agree with the composed forms bit for bit in every
// dtype; the tolerances leave room for what the kernels do not promise: OpenBLAS's term order
// for a different operand layout, the composed form's double rounding of column sums.)
// Add + layer norm and softmax + cross-entropy share the plain kernels' row code: they are
// compared for equality.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/composed.h"
#include "tensor/generator.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/op_table_support.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

const std::vector<DType> kFloatTypes = {kF64, kF32, kF16, kBF16};

// Tol {rtol of each element's reference value, atol of the output's largest reference magnitude
// (at least 1)}, shared with the op tables.
using ::tg::testing::Tol;

// Fused kernel against the composed form in the same dtype (see the file comment).
Tol ComposedTol(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return {1e-12, 1e-12};
    case DType::kF32:
      return {1e-6, 1e-6};
    case DType::kF16:
      return {2.0 / 1024, 1.0 / 1024};
    default:
      return {2.0 / 128, 1.0 / 128};
  }
}

// Fused kernel in `dtype` against the composed f64 op on the same values: the dtype's own
// rounding of the output and of one intermediate (half an ulp each, plus the f32 error).
Tol F64RefTol(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return {1e-12, 1e-12};
    case DType::kF32:
      return {1e-5, 1e-5};
    case DType::kF16:
      return {2e-3, 2e-3};
    default:
      return {1.6e-2, 1.6e-2};
  }
}

void ExpectClose(const RawTensor& got, const RawTensor& want, Tol tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::string m = ::tg::testing::ValueMismatches(want, got, tol, 1, "reference", "kernel");
  EXPECT_TRUE(m.empty()) << what << ":" << m;
}

// Bit-for-bit equality (compared as f64, which holds every value of every dtype exactly).
void ExpectEqual(const RawTensor& got, const RawTensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]));
    if (!same && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << g[i] << ", want " << w[i];
    }
  }
}

RawTensor Randn(const Shape& shape, Generator& gen, DType dtype, double stddev = 1) {
  return RandNormal(shape, gen, 0, stddev, dtype);
}

std::string Name(const std::string& what, DType dtype) { return what + " " + DTypeName(dtype); }

// ---- Linear -----------------------------------------------------------------------------------

struct LinearCase {
  int64_t m, k, n;
};
// n = 4 and 9 are not multiples of 8 (pre's rows are padded); m = 13 is not either.
const LinearCase kLinearCases[] = {{6, 5, 4}, {13, 16, 9}, {8, 7, 16}, {1, 3, 1}};

TEST(FusedLinearTest, ForwardMatchesComposed) {
  Generator gen(101);
  for (DType dtype : kFloatTypes) {
    for (const LinearCase& c : kLinearCases) {
      for (bool gelu : {false, true}) {
        for (bool with_bias : {false, true}) {
          const Activation act = gelu ? Activation::kGeluTanh : Activation::kNone;
          const RawTensor x = Randn({c.m, c.k}, gen, dtype);
          const RawTensor w = Randn({c.n, c.k}, gen, dtype, 0.5);
          const RawTensor b = with_bias ? Randn({c.n}, gen, dtype) : RawTensor();
          const std::string what = Name(std::to_string(c.m) + "x" + std::to_string(c.k) + "x" +
                                            std::to_string(c.n) + (gelu ? " gelu" : " none") +
                                            (with_bias ? " bias" : ""),
                                        dtype);
          const LinearResult got = Linear(x, w, b, act);
          const LinearResult want = composed::Linear(x, w, b, act);
          ExpectClose(got.output, want.output, ComposedTol(dtype), "output " + what);
          const LinearResult want64 =
              composed::Linear(x.to(kF64), w.to(kF64), with_bias ? b.to(kF64) : RawTensor(), act);
          ExpectClose(got.output, want64.output, F64RefTol(dtype), "output vs f64 " + what);
          ASSERT_EQ(got.pre_activation.defined(), gelu) << what;
          if (gelu) {
            ExpectClose(got.pre_activation, want.pre_activation, ComposedTol(dtype),
                        "pre " + what);
            ExpectClose(got.pre_activation, want64.pre_activation, F64RefTol(dtype),
                        "pre vs f64 " + what);
          }
        }
      }
    }
  }
}

TEST(FusedLinearTest, BatchedInputKeepsItsShape) {
  Generator gen(102);
  const RawTensor x = Randn({2, 3, 5}, gen, kF32), w = Randn({9, 5}, gen, kF32);
  const RawTensor b = Randn({9}, gen, kF32);
  const LinearResult got = Linear(x, w, b, Activation::kGeluTanh);
  EXPECT_EQ(got.output.shape(), (Shape{2, 3, 9}));
  EXPECT_EQ(got.pre_activation.shape(), (Shape{2, 3, 9}));
  const LinearResult want = composed::Linear(x.reshape({6, 5}), w, b, Activation::kGeluTanh);
  ExpectClose(got.output.reshape({6, 9}), want.output, ComposedTol(kF32), "output");
  ExpectClose(got.pre_activation.reshape({6, 9}), want.pre_activation, ComposedTol(kF32), "pre");
}

TEST(FusedLinearTest, BackwardMatchesComposed) {
  Generator gen(103);
  struct Wanted {
    bool input, weight, bias;
  };
  const Wanted kWanted[] = {{true, true, true}, {true, false, false}, {false, true, true},
                            {false, false, true}};
  for (DType dtype : kFloatTypes) {
    for (const LinearCase& c : kLinearCases) {
      for (bool gelu : {false, true}) {
        const Activation act = gelu ? Activation::kGeluTanh : Activation::kNone;
        const RawTensor x = Randn({c.m, c.k}, gen, dtype);
        const RawTensor w = Randn({c.n, c.k}, gen, dtype, 0.5);
        const RawTensor b = Randn({c.n}, gen, dtype);
        const RawTensor go = Randn({c.m, c.n}, gen, dtype);
        // pre as the forward returns it: a view with padded rows.
        const RawTensor pre = Linear(x, w, b, act).pre_activation;
        for (const Wanted& want_grads : kWanted) {
          const std::string what =
              Name(std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) +
                       (gelu ? " gelu" : " none") + " wants " + std::to_string(want_grads.input) +
                       std::to_string(want_grads.weight) + std::to_string(want_grads.bias),
                   dtype);
          const LinearGrads got = LinearBackward(go, x, w, pre, act, want_grads.input,
                                                 want_grads.weight, want_grads.bias);
          const LinearGrads want =
              composed::LinearBackward(go, x, w, pre, act, want_grads.input, want_grads.weight,
                                       want_grads.bias);
          const LinearGrads want64 = composed::LinearBackward(
              go.to(kF64), x.to(kF64), w.to(kF64), gelu ? pre.to(kF64) : RawTensor(), act,
              want_grads.input, want_grads.weight, want_grads.bias);
          EXPECT_EQ(got.grad_input.defined(), want_grads.input) << what;
          EXPECT_EQ(got.grad_weight.defined(), want_grads.weight) << what;
          EXPECT_EQ(got.grad_bias.defined(), want_grads.bias) << what;
          if (want_grads.input) {
            ExpectClose(got.grad_input, want.grad_input, ComposedTol(dtype), "grad_input " + what);
            ExpectClose(got.grad_input, want64.grad_input, F64RefTol(dtype),
                        "grad_input vs f64 " + what);
          }
          if (want_grads.weight) {
            ExpectClose(got.grad_weight, want.grad_weight, ComposedTol(dtype),
                        "grad_weight " + what);
            ExpectClose(got.grad_weight, want64.grad_weight, F64RefTol(dtype),
                        "grad_weight vs f64 " + what);
          }
          if (want_grads.bias) {
            ExpectClose(got.grad_bias, want.grad_bias, ComposedTol(dtype), "grad_bias " + what);
            ExpectClose(got.grad_bias, want64.grad_bias, F64RefTol(dtype),
                        "grad_bias vs f64 " + what);
          }
        }
      }
    }
  }
}

// ---- Attention --------------------------------------------------------------------------------

struct AttentionCase {
  int64_t b, h, tq, tk, d;
  bool causal;
  bool transposed;  // q, k, v as transposes of [B, T, H, D] (strided heads)
};
const AttentionCase kAttentionCases[] = {
    {2, 3, 5, 5, 4, false, false}, {2, 3, 7, 7, 8, true, false}, {1, 2, 3, 6, 8, false, false},
    {1, 1, 1, 1, 2, true, false},  {2, 2, 9, 9, 5, true, true},  {1, 3, 4, 11, 6, false, true},
    {2, 2, 10, 10, 3, false, true},
    // Causal attention over more than one block of queries (the CPU kernel's blocks of 32).
    {1, 2, 70, 70, 8, true, true},  {2, 1, 33, 33, 4, true, false}};

std::string CaseName(const AttentionCase& c) {
  return "[" + std::to_string(c.b) + ", " + std::to_string(c.h) + ", " + std::to_string(c.tq) +
         "/" + std::to_string(c.tk) + ", " + std::to_string(c.d) + "]" +
         (c.causal ? " causal" : "") + (c.transposed ? " transposed" : "");
}

// [B, H, T, D] of `dtype`: contiguous, or the [B, H, T, D] transpose of a [B, T, H, D] tensor.
RawTensor Heads(const AttentionCase& c, int64_t t, Generator& gen, DType dtype) {
  if (!c.transposed) return Randn({c.b, c.h, t, c.d}, gen, dtype);
  const RawTensor heads = Randn({c.b, t, c.h, c.d}, gen, dtype).transpose(1, 2);
  EXPECT_FALSE(heads.is_contiguous());
  return heads;
}

TEST(FusedAttentionTest, ForwardMatchesComposed) {
  Generator gen(201);
  for (DType dtype : kFloatTypes) {
    for (const AttentionCase& c : kAttentionCases) {
      const RawTensor q = Heads(c, c.tq, gen, dtype), k = Heads(c, c.tk, gen, dtype),
                      v = Heads(c, c.tk, gen, dtype);
      const double scale = 1 / std::sqrt(static_cast<double>(c.d));
      const std::string what = Name(CaseName(c), dtype);
      const AttentionResult got = ScaledDotProductAttention(q, k, v, c.causal, scale);
      const AttentionResult want = composed::Attention(q, k, v, c.causal, scale);
      ExpectClose(got.output, want.output, ComposedTol(dtype), "output " + what);
      // The statistics are of the compute dtype (f32 for f16/bf16): the composed f32 tolerance.
      ExpectClose(got.stats, want.stats, ComposedTol(dtype == kF64 ? kF64 : kF32),
                  "stats " + what);
      const AttentionResult want64 =
          composed::Attention(q.to(kF64), k.to(kF64), v.to(kF64), c.causal, scale);
      ExpectClose(got.output, want64.output, F64RefTol(dtype), "output vs f64 " + what);
      ExpectClose(got.stats, want64.stats, F64RefTol(dtype == kF64 ? kF64 : kF32),
                  "stats vs f64 " + what);
    }
  }
}

TEST(FusedAttentionTest, BackwardMatchesComposed) {
  Generator gen(202);
  for (DType dtype : kFloatTypes) {
    for (const AttentionCase& c : kAttentionCases) {
      const RawTensor q = Heads(c, c.tq, gen, dtype), k = Heads(c, c.tk, gen, dtype),
                      v = Heads(c, c.tk, gen, dtype);
      const RawTensor go = Randn({c.b, c.h, c.tq, c.d}, gen, dtype);
      const double scale = 1 / std::sqrt(static_cast<double>(c.d));
      const std::string what = Name(CaseName(c), dtype);
      const AttentionResult fwd = ScaledDotProductAttention(q, k, v, c.causal, scale);
      const AttentionGrads got =
          ScaledDotProductAttentionBackward(go, q, k, v, fwd.output, fwd.stats, c.causal, scale);
      const AttentionGrads want =
          composed::AttentionBackward(go, q, k, v, fwd.output, fwd.stats, c.causal, scale);
      ExpectClose(got.grad_q, want.grad_q, ComposedTol(dtype), "grad_q " + what);
      ExpectClose(got.grad_k, want.grad_k, ComposedTol(dtype), "grad_k " + what);
      ExpectClose(got.grad_v, want.grad_v, ComposedTol(dtype), "grad_v " + what);
      // The f64 reference: the f64 forward and backward on the same values.
      const RawTensor q64 = q.to(kF64), k64 = k.to(kF64), v64 = v.to(kF64);
      const AttentionResult fwd64 = composed::Attention(q64, k64, v64, c.causal, scale);
      const AttentionGrads want64 = composed::AttentionBackward(
          go.to(kF64), q64, k64, v64, fwd64.output, fwd64.stats, c.causal, scale);
      // Against f64, the low-precision backward also carries the forward's rounded output
      // (through delta): one more rounding.
      Tol tol = F64RefTol(dtype);
      if (dtype == kF16 || dtype == kBF16) tol = {2 * tol.rtol, 2 * tol.atol};
      ExpectClose(got.grad_q, want64.grad_q, tol, "grad_q vs f64 " + what);
      ExpectClose(got.grad_k, want64.grad_k, tol, "grad_k vs f64 " + what);
      ExpectClose(got.grad_v, want64.grad_v, tol, "grad_v vs f64 " + what);
    }
  }
}

// ---- Layer norm -------------------------------------------------------------------------------

// Attention runs its heads in parallel, each head's products (oneDNN or OpenBLAS) on its own
// thread; matmuls also run from several user threads at once. Each must give the same bits every
// time, as a single call does: no state shared between concurrent calls (oneDNN's scratchpad).
TEST(FusedAttentionTest, SameBitsRunToRunAndAcrossConcurrentCalls) {
  Generator gen(77);
  const RawTensor q = Randn({4, 8, 40, 16}, gen, kF32, 1.0);
  const RawTensor k = Randn({4, 8, 40, 16}, gen, kF32, 1.0);
  const RawTensor v = Randn({4, 8, 40, 16}, gen, kF32, 1.0);
  const RawTensor go = Randn({4, 8, 40, 16}, gen, kF32, 1.0);
  const AttentionResult first = ScaledDotProductAttention(q, k, v, true, 0.25);
  const AttentionGrads first_grads =
      ScaledDotProductAttentionBackward(go, q, k, v, first.output, first.stats, true, 0.25);
  for (int run = 0; run < 10; ++run) {
    const AttentionResult r = ScaledDotProductAttention(q, k, v, true, 0.25);
    const AttentionGrads g =
        ScaledDotProductAttentionBackward(go, q, k, v, r.output, r.stats, true, 0.25);
    ASSERT_EQ(r.output.to_vector<float>(), first.output.to_vector<float>()) << "run " << run;
    ASSERT_EQ(g.grad_q.to_vector<float>(), first_grads.grad_q.to_vector<float>()) << run;
    ASSERT_EQ(g.grad_k.to_vector<float>(), first_grads.grad_k.to_vector<float>()) << run;
    ASSERT_EQ(g.grad_v.to_vector<float>(), first_grads.grad_v.to_vector<float>()) << run;
  }
  const RawTensor a = Randn({96, 200}, gen, kF32, 1.0), b = Randn({200, 72}, gen, kF32, 1.0);
  const std::vector<float> want = Matmul(a, b).to_vector<float>();
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) mismatches[t] += Matmul(a, b).to_vector<float>() != want;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(FusedLayerNormBackwardTest, MatchesComposed) {
  Generator gen(301);
  const Shape kShapes[] = {{6, 10}, {5, 33}, {2, 3, 7}, {1, 1}};
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : kShapes) {
      for (bool with_weight : {false, true}) {
        for (bool need_weight_bias : {false, true}) {
          const int64_t n = shape.back();
          const RawTensor x = Randn(shape, gen, dtype, 2.0);
          const RawTensor w = with_weight ? Randn({n}, gen, dtype) : RawTensor();
          const RawTensor b = Randn({n}, gen, dtype);
          const RawTensor go = Randn(shape, gen, dtype);
          const LayerNormResult fwd = LayerNorm(x, w, b);
          const std::string what =
              Name(ShapeToString(shape) + (with_weight ? " weight" : " no weight") +
                       (need_weight_bias ? " +params" : ""),
                   dtype);
          const LayerNormGrads got =
              LayerNormBackward(go, x, fwd.mean, fwd.rstd, w, need_weight_bias);
          const int64_t rows = x.numel() / n;
          const LayerNormGrads want =
              composed::LayerNormBackward(go.reshape({rows, n}), x.reshape({rows, n}), fwd.mean,
                                          fwd.rstd, w, need_weight_bias);
          ASSERT_EQ(got.grad_input.shape(), x.shape()) << what;
          ExpectClose(got.grad_input.reshape({rows, n}), want.grad_input, ComposedTol(dtype),
                      "grad_input " + what);
          const LayerNormGrads want64 = composed::LayerNormBackward(
              go.reshape({rows, n}).to(kF64), x.reshape({rows, n}).to(kF64), fwd.mean.to(kF64),
              fwd.rstd.to(kF64), with_weight ? w.to(kF64) : RawTensor(), need_weight_bias);
          ExpectClose(got.grad_input.reshape({rows, n}), want64.grad_input, F64RefTol(dtype),
                      "grad_input vs f64 " + what);
          EXPECT_EQ(got.grad_weight.defined(), need_weight_bias) << what;
          EXPECT_EQ(got.grad_bias.defined(), need_weight_bias) << what;
          if (need_weight_bias) {
            ExpectClose(got.grad_weight, want.grad_weight, ComposedTol(dtype),
                        "grad_weight " + what);
            ExpectClose(got.grad_bias, want.grad_bias, ComposedTol(dtype), "grad_bias " + what);
            ExpectClose(got.grad_weight, want64.grad_weight, F64RefTol(dtype),
                        "grad_weight vs f64 " + what);
            ExpectClose(got.grad_bias, want64.grad_bias, F64RefTol(dtype),
                        "grad_bias vs f64 " + what);
          }
        }
      }
    }
  }
}

// Layer-norm's parameter gradients are column sums over rows: rows in a fixed order, so the
// same input gives the same bits on every call.
TEST(FusedLayerNormBackwardTest, ParameterGradientsAreDeterministic) {
  Generator gen(302);
  const RawTensor x = Randn({257, 12}, gen, kF32), go = Randn({257, 12}, gen, kF32);
  const RawTensor w = Randn({12}, gen, kF32);
  const LayerNormResult fwd = LayerNorm(x, w, RawTensor());
  const LayerNormGrads first = LayerNormBackward(go, x, fwd.mean, fwd.rstd, w, true);
  for (int i = 0; i < 3; ++i) {
    const LayerNormGrads again = LayerNormBackward(go, x, fwd.mean, fwd.rstd, w, true);
    ExpectEqual(again.grad_weight, first.grad_weight, "grad_weight");
    ExpectEqual(again.grad_bias, first.grad_bias, "grad_bias");
    ExpectEqual(again.grad_input, first.grad_input, "grad_input");
  }
}

TEST(FusedAddLayerNormTest, EqualsAddThenLayerNorm) {
  Generator gen(401);
  const Shape kShapes[] = {{6, 10}, {2, 3, 33}, {1, 1}};
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : kShapes) {
      for (bool with_params : {false, true}) {
        const int64_t n = shape.back();
        const RawTensor a = Randn(shape, gen, dtype, 3.0), b = Randn(shape, gen, dtype);
        const RawTensor w = with_params ? Randn({n}, gen, dtype) : RawTensor();
        const RawTensor bias = with_params ? Randn({n}, gen, dtype) : RawTensor();
        const std::string what =
            Name(ShapeToString(shape) + (with_params ? " params" : " no params"), dtype);
        const AddLayerNormResult got = AddLayerNorm(a, b, w, bias, 1e-5);
        const AddLayerNormResult want = composed::AddLayerNorm(a, b, w, bias, 1e-5);
        ExpectEqual(got.residual, want.residual, "residual " + what);
        ExpectEqual(got.norm.output, want.norm.output, "output " + what);
        ExpectEqual(got.norm.mean, want.norm.mean, "mean " + what);
        ExpectEqual(got.norm.rstd, want.norm.rstd, "rstd " + what);
        // And against f64 on the same (rounded) residual.
        const LayerNormResult want64 =
            LayerNorm(want.residual.to(kF64), with_params ? w.to(kF64) : RawTensor(),
                      with_params ? bias.to(kF64) : RawTensor(), 1e-5);
        ExpectClose(got.norm.output, want64.output, F64RefTol(dtype), "output vs f64 " + what);
      }
    }
  }
}

// ---- Softmax + cross-entropy ------------------------------------------------------------------

TEST(FusedSoftmaxCrossEntropyTest, EqualsCrossEntropyAndItsBackward) {
  Generator gen(501);
  // Rows 1 and 4 are ignored; 9 classes is not a multiple of 8.
  const RawTensor targets = RawTensor::FromVector<int64_t>({2, -100, 0, 8, -100, 5}, {6});
  for (DType dtype : kFloatTypes) {
    const RawTensor logits = Randn({6, 9}, gen, dtype, 3.0);
    const double grad_scale = 0.5;
    const CrossEntropyResult got =
        CrossEntropyWithGrad(logits, targets, -100, Reduction::kNone, grad_scale);
    const CrossEntropyResult want = composed::SoftmaxCrossEntropy(
        logits, targets, RawTensor::Full({6}, grad_scale, kF64), -100);
    ExpectEqual(got.loss, want.loss, Name("loss", dtype));
    ExpectEqual(got.grad_logits, want.grad_logits, Name("grad_logits", dtype));
    // Ignored rows: 0 loss and a 0 gradient row.
    const std::vector<double> loss = got.loss.to_vector<double>();
    const std::vector<double> grad = got.grad_logits.to_vector<double>();
    for (int64_t r : {1, 4}) {
      EXPECT_EQ(loss[r], 0.0) << Name("row " + std::to_string(r), dtype);
      for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(grad[r * 9 + i], 0.0);
    }
    // Against f64: the loss and the gradient rows of the f64 op on the same logits.
    const CrossEntropyResult want64 = composed::SoftmaxCrossEntropy(
        logits.to(kF64), targets, RawTensor::Full({6}, grad_scale, kF64), -100);
    ExpectClose(got.loss, want64.loss, F64RefTol(dtype), Name("loss vs f64", dtype));
    ExpectClose(got.grad_logits, want64.grad_logits, F64RefTol(dtype),
                Name("grad_logits vs f64", dtype));
  }
}

TEST(FusedSoftmaxCrossEntropyTest, AllRowsIgnored) {
  for (DType dtype : kFloatTypes) {
    const CrossEntropyResult r = CrossEntropyWithGrad(
        RawTensor::Ones({3, 4}, dtype), RawTensor::FromVector<int64_t>({-1, -1, -1}, {3}), -1,
        Reduction::kNone);
    EXPECT_EQ(r.loss.to_vector<double>(), std::vector<double>(3, 0.0)) << DTypeName(dtype);
    EXPECT_EQ(r.grad_logits.to_vector<double>(), std::vector<double>(12, 0.0))
        << DTypeName(dtype);
  }
}

TEST(FusedSoftmaxCrossEntropyTest, TargetOutOfRange) {
  const RawTensor logits = RawTensor::Zeros({3, 5});
  // The first bad row in order is reported, with the plain cross-entropy kernel's text.
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        CrossEntropyWithGrad(logits, RawTensor::FromVector<int64_t>({1, 7, 9}, {3}), -100,
                             Reduction::kNone);
      },
      "cross_entropy: target 7 at position 1 is out of range for 5 classes"));
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly(
      [&] {
        CrossEntropyWithGrad(logits.to(kBF16), RawTensor::FromVector<int32_t>({-3, 0, 0}, {3}),
                             -100, Reduction::kMean);
      },
      "cross_entropy: target -3 at position 0 is out of range for 5 classes"));
}

// ---- Every CPU fused entry runs its kernel ----------------------------------------------------

TEST(FusedKernelTableTest, EveryCpuFusedEntryIsDone) {
  const KernelTable& cpu = KernelsFor(Device::Cpu());
  Generator gen(601);
  for (DType dtype : kFloatTypes) {
    const DType ct = composed::ComputeDType(dtype);
    const std::string what = DTypeName(dtype);
    {
      const RawTensor x = Randn({3, 4}, gen, dtype), w = Randn({5, 4}, gen, dtype);
      const RawTensor b = Randn({5}, gen, dtype);
      const RawTensor out = RawTensor::Empty({3, 5}, dtype);
      const RawTensor pre = RawTensor::Empty({3, 8}, dtype).narrow(1, 0, 5);
      EXPECT_EQ(cpu.LinearForward(out, pre, x, w, b, Activation::kGeluTanh), KernelStatus::kDone)
          << what;
      const RawTensor gi = RawTensor::Empty({3, 4}, dtype), gw = RawTensor::Empty({5, 4}, dtype),
                      gb = RawTensor::Empty({5}, dtype);
      EXPECT_EQ(cpu.LinearBackward(gi, gw, gb, Randn({3, 5}, gen, dtype), x, w, pre,
                                   Activation::kGeluTanh),
                KernelStatus::kDone)
          << what;
    }
    {
      const RawTensor q = Randn({1, 2, 3, 4}, gen, dtype), k = Randn({1, 2, 3, 4}, gen, dtype),
                      v = Randn({1, 2, 3, 4}, gen, dtype);
      const RawTensor out = RawTensor::Empty({1, 2, 3, 4}, dtype),
                      stats = RawTensor::Empty({1, 2, 3}, ct);
      EXPECT_EQ(cpu.ScaledDotProductAttention(out, stats, q, k, v, true, 0.5), KernelStatus::kDone)
          << what;
      const RawTensor gq = RawTensor::Empty(q.shape(), dtype),
                      gk = RawTensor::Empty(k.shape(), dtype),
                      gv = RawTensor::Empty(v.shape(), dtype);
      EXPECT_EQ(cpu.ScaledDotProductAttentionBackward(gq, gk, gv, Randn(q.shape(), gen, dtype), q,
                                                      k, v, out, stats, true, 0.5),
                KernelStatus::kDone)
          << what;
    }
    {
      const RawTensor x = Randn({3, 6}, gen, dtype), w = Randn({6}, gen, dtype);
      const LayerNormResult fwd = LayerNorm(x, w, RawTensor());
      const RawTensor gi = RawTensor::Empty({3, 6}, dtype), gw = RawTensor::Empty({6}, dtype),
                      gb = RawTensor::Empty({6}, dtype);
      EXPECT_EQ(cpu.LayerNormBackward(gi, gw, gb, Randn({3, 6}, gen, dtype), x, fwd.mean,
                                      fwd.rstd, w),
                KernelStatus::kDone)
          << what;
      const RawTensor residual = RawTensor::Empty({3, 6}, dtype),
                      out = RawTensor::Empty({3, 6}, dtype);
      const RawTensor mean = RawTensor::Empty({3}, ct), rstd = RawTensor::Empty({3}, ct);
      EXPECT_EQ(cpu.AddLayerNorm(residual, out, mean, rstd, x, Randn({3, 6}, gen, dtype), w,
                                 RawTensor(), 1e-5),
                KernelStatus::kDone)
          << what;
    }
    {
      const RawTensor logits = Randn({3, 4}, gen, dtype);
      const RawTensor losses = RawTensor::Empty({3}, dtype), grad = RawTensor::Empty({3, 4}, dtype);
      EXPECT_EQ(cpu.SoftmaxCrossEntropy(losses, grad, logits,
                                        RawTensor::FromVector<int64_t>({0, -100, 3}, {3}),
                                        RawTensor::Full({3}, 1.0, kF64), -100),
                KernelStatus::kDone)
          << what;
    }
    {
      const RawTensor t = Randn({4}, gen, dtype == kF64 ? kF64 : kF32);
      const RawTensor found_inf = RawTensor::Zeros({}, kF32);
      EXPECT_EQ(cpu.NonFiniteCheckAndUnscale({t}, found_inf, RawTensor::Scalar(0.5, kF32)),
                KernelStatus::kDone)
          << what;
    }
  }
}

}  // namespace
}  // namespace tg
