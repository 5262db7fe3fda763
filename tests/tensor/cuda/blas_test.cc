// Tests of the cuBLASLt products (tensor/cuda/blas.h, tg::cuda::Matmul of kernels.h) against
// f64 products of the same (already rounded) inputs on the CPU: 2-D and batched shapes, stride-0
// broadcast batches, transposed views and layouts that must be copied, alpha/beta, f32 output
// from f16/bf16 inputs, every epilogue (bias, GELU with its saved input, dGELU, both bias
// gradients) against compositions, shapes that are not multiples of 8 and pointers that are only
// element-aligned. Without a GPU every test skips except the validation tests that run on CPU
// tensors.
//
// Tolerances are per element and derived, not tuned. A dot product of k terms accumulated in a
// format with unit roundoff u has |error| <= k u sum_i |a_i b_i| (the classical bound, whatever
// the summation order); we allow 2 k u (tensor cores align the products before adding them,
// which can lose up to one more rounding per step) times mag = |a| @ |b| (f64), with u = 2^-24
// for f32 accumulation (f32, f16 and bf16 inputs: their products are exact in f32) and 2^-53 for
// f64, plus the final rounding to the output dtype, u_out |ref| (2^-24 f32, 2^-11 f16, 2^-8 bf16).
// Epilogue math adds its own terms, written next to each check. Some cuBLASLt kernels apply the
// epilogue (alpha, beta * C, the bias, GELU) to the accumulator already rounded to the output
// type: seen on the H200 (2026-11-26) with f16/bf16 outputs for alpha/beta and for widths that
// are not multiples of 8, 1-2 ulps off. Those checks allow that rounding too, u_out |acc| <=
// u_out mag (EpilogueRounding), as PyTorch's cuBLASLt path has it.
#include "tensor/cuda/blas.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!Available()) GTEST_SKIP() << "no CUDA device"

constexpr double kSqrt2OverPi = 0.79788456080286535588;

RawTensor Randn(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return RandNormal(shape, gen, 0, 1, dtype);
}
RawTensor Dev(const RawTensor& t) { return t.to(Device::Cuda(0)); }
// The values of t (either device) as an f64 CPU tensor of the same shape.
RawTensor F64(const RawTensor& t) { return t.to(Device::Cpu(), kF64).contiguous(); }
RawTensor Scale(const RawTensor& t, double s) { return MulScalar(t, s); }
RawTensor T(const RawTensor& t) { return t.transpose(-1, -2); }

double AccRoundoff(DType in) { return in == kF64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }
double OutRoundoff(DType out) {
  switch (out) {
    case DType::kF64:
      return std::ldexp(1.0, -53);
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kF16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -8);  // bf16
  }
}

// Every element of got within bound of ref (both converted to f64 on the CPU).
void ExpectWithin(const RawTensor& got, const RawTensor& ref, const RawTensor& bound,
                  const std::string& what) {
  ASSERT_EQ(ShapeToString(got.shape()), ShapeToString(ref.shape())) << what;
  const std::vector<double> g = got.to_vector<double>(), r = ref.to_vector<double>(),
                            b = bound.to_vector<double>();
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::abs(g[i] - r[i]) <= b[i])) {
      if (++failures <= 5) {
        ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", expected " << r[i]
                      << " +- " << b[i];
      }
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << g.size() << " elements off";
}

// op(a) @ op(b) in f64 with the bound of the file comment; a and b on either device.
struct Reference {
  RawTensor value;  // f64
  RawTensor mag;    // f64 |op(a)| @ |op(b)|
};
Reference Product(const RawTensor& a, bool ta, const RawTensor& b, bool tb) {
  const RawTensor a64 = ta ? T(F64(a)) : F64(a), b64 = tb ? T(F64(b)) : F64(b);
  return {tg::Matmul(a64, b64), tg::Matmul(Abs(a64), Abs(b64))};
}
// One more rounding of the (scaled) accumulator to the output type before the epilogue.
RawTensor EpilogueRounding(const Reference& r, DType out, double scale = 1) {
  return Scale(r.mag, OutRoundoff(out) * scale);
}
RawTensor ProductBound(const Reference& r, int64_t k, DType in, DType out, double scale = 1) {
  return Add(Scale(r.mag, 2.0 * k * AccRoundoff(in) * scale),
             Scale(Abs(r.value), OutRoundoff(out) * scale));
}

double GeluTanhRef(double x) {
  return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
double GeluTanhGradRef(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kSqrt2OverPi * (1 + 3 * 0.044715 * x * x);
}
// Elementwise f(x) of an f64 CPU tensor.
template <typename F>
RawTensor Map(const RawTensor& x, F f) {
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v) e = f(e);
  return RawTensor::FromVector(v, x.shape());
}

class CudaBlasTest : public ::testing::TestWithParam<DType> {};

std::string Name(const ::testing::TestParamInfo<DType>& info) { return DTypeName(info.param); }

TEST_P(CudaBlasTest, MatmulMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // Multiples of 8 (tensor-core tiles), odd sizes (alignment fallbacks), vectors, and k = 1.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {64, 128, 32}, {7, 13, 5}, {1, 9, 1}, {33, 1, 17}, {5, 200, 3}};
  uint64_t seed = 1;
  for (const auto& [m, k, n] : shapes) {
    const RawTensor a = Randn({m, k}, dt, seed++), b = Randn({k, n}, dt, seed++);
    const RawTensor out = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
    Matmul(out, Dev(a), Dev(b));
    const Reference r = Product(a, false, b, false);
    ExpectWithin(out, r.value, ProductBound(r, k, dt, dt),
                 absl::StrCat("[", m, ", ", k, "] @ [", k, ", ", n, "]"));
  }
}

TEST_P(CudaBlasTest, BatchedWithBroadcastBatchDims) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // a broadcast along dim 0 and b along dim 1 (stride 0): neither dims merge into one strided
  // batch for all operands, so the outer dim is looped and the inner one batched.
  const RawTensor a = Randn({1, 3, 6, 10}, dt, 11), b = Randn({2, 1, 10, 9}, dt, 12);
  const RawTensor ae = Dev(a).expand({2, 3, 6, 10}), be = Dev(b).expand({2, 3, 10, 9});
  const RawTensor out = RawTensor::Empty({2, 3, 6, 9}, dt, Device::Cuda(0));
  Matmul(out, ae, be);
  const Reference r = Product(a.expand({2, 3, 6, 10}), false, b.expand({2, 3, 10, 9}), false);
  ExpectWithin(out, r.value, ProductBound(r, 10, dt, dt), "broadcast batch");

  // One operand shared by every batch entry (stride 0 throughout): a single strided batch.
  const RawTensor w = Randn({10, 4}, dt, 13);
  const RawTensor x = Randn({5, 6, 10}, dt, 14);
  const RawTensor out2 = RawTensor::Empty({5, 6, 4}, dt, Device::Cuda(0));
  Matmul(out2, Dev(x), Dev(w).unsqueeze(0).expand({5, 10, 4}));
  const Reference r2 = Product(x, false, w.unsqueeze(0).expand({5, 10, 4}), false);
  ExpectWithin(out2, r2.value, ProductBound(r2, 10, dt, dt), "shared right operand");
}

TEST_P(CudaBlasTest, TransposedAndStridedViews) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t m = 12, k = 20, n = 7;
  // Transposed views (unit row stride): passed to cuBLASLt as transposes, no copy.
  const RawTensor at = Randn({k, m}, dt, 21), bt = Randn({n, k}, dt, 22);
  const RawTensor out = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
  Matmul(out, T(Dev(at)), T(Dev(bt)));
  const Reference r = Product(at, true, bt, true);
  ExpectWithin(out, r.value, ProductBound(r, k, dt, dt), "transposed views");

  // A column slice with a step (neither stride is 1): copied to a contiguous matrix first. And
  // a row-major view with a padded row stride (a narrow of a wider matrix).
  const RawTensor wide = Randn({m, 2 * k}, dt, 23), padded = Randn({k, n + 5}, dt, 24);
  const RawTensor a_view = Dev(wide).slice(1, 0, 2 * k, 2), b_view = Dev(padded).narrow(1, 2, n);
  Matmul(out, a_view, b_view);
  const Reference r2 = Product(wide.slice(1, 0, 2 * k, 2), false, padded.narrow(1, 2, n), false);
  ExpectWithin(out, r2.value, ProductBound(r2, k, dt, dt), "strided views");

  // Batched transposed views: [B, k, m] transposed per batch.
  const RawTensor bat = Randn({3, k, m}, dt, 25), bb = Randn({3, k, n}, dt, 26);
  const RawTensor out3 = RawTensor::Empty({3, m, n}, dt, Device::Cuda(0));
  Matmul(out3, T(Dev(bat)), Dev(bb));
  const Reference r3 = Product(bat, true, bb, false);
  ExpectWithin(out3, r3.value, ProductBound(r3, k, dt, dt), "batched transposed view");
}

TEST_P(CudaBlasTest, ElementAlignedPointers) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // Views that start one element into their storage: only element-aligned (2 bytes for
  // f16/bf16), so cuBLASLt must pick kernels without vector loads (the alignment preferences).
  const int64_t m = 9, k = 15, n = 11;
  const RawTensor a = Randn({m * k + 1}, dt, 31), b = Randn({k * n + 1}, dt, 32);
  const RawTensor a_view = Dev(a).narrow(0, 1, m * k).view({m, k});
  const RawTensor b_view = Dev(b).narrow(0, 1, k * n).view({k, n});
  const RawTensor out_storage = RawTensor::Empty({m * n + 1}, dt, Device::Cuda(0));
  const RawTensor out = out_storage.narrow(0, 1, m * n).view({m, n});
  MatmulEx(out, a_view, false, b_view, false, Epilogue::kNone, RawTensor(), RawTensor());
  const Reference r =
      Product(a.narrow(0, 1, m * k).view({m, k}), false, b.narrow(0, 1, k * n).view({k, n}), false);
  ExpectWithin(out, r.value, ProductBound(r, k, dt, dt), "element-aligned pointers");
}

TEST_P(CudaBlasTest, MatmulExTransposesAlphaBeta) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  const int64_t m = 16, k = 24, n = 8;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const RawTensor a = Randn(ta ? Shape{k, m} : Shape{m, k}, dt, 41);
      const RawTensor b = Randn(tb ? Shape{n, k} : Shape{k, n}, dt, 42);
      const RawTensor c = Randn({m, n}, dt, 43);
      const RawTensor out = Dev(c);
      MatmulEx(out, Dev(a), ta, Dev(b), tb, Epilogue::kNone, RawTensor(), RawTensor(), 0.5f, 1.0f);
      // 0.5 * op(a) @ op(b) + c: the product's bound halves; adding c costs one rounding of
      // the accumulator (u_acc |c|) and the result one output rounding.
      const Reference r = Product(a, ta, b, tb);
      const RawTensor ref = Add(Scale(r.value, 0.5), F64(c));
      const RawTensor bound = Add(Add(Add(Scale(r.mag, 2.0 * k * AccRoundoff(dt) * 0.5),
                                          Scale(Abs(F64(c)), AccRoundoff(dt))),
                                      Scale(Abs(ref), OutRoundoff(dt))),
                                  EpilogueRounding(r, dt, 0.5));
      ExpectWithin(out, ref, bound, absl::StrCat("transpose_a ", ta, ", transpose_b ", tb));
    }
  }
}

TEST_P(CudaBlasTest, F32OutputFromLowPrecisionInputs) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt != kF16 && dt != kBF16) GTEST_SKIP() << "only f16/bf16 inputs may write f32";
  const int64_t m = 10, k = 70, n = 6;
  const RawTensor a = Randn({m, k}, dt, 51), b = Randn({k, n}, dt, 52);
  const RawTensor out = RawTensor::Empty({m, n}, kF32, Device::Cuda(0));
  MatmulEx(out, Dev(a), false, Dev(b), false, Epilogue::kNone, RawTensor(), RawTensor());
  // The f32 accumulator is stored as is: only the f32 rounding, not f16's.
  const Reference r = Product(a, false, b, false);
  ExpectWithin(out, r.value, ProductBound(r, k, dt, kF32), "f32 output");
}

TEST_P(CudaBlasTest, EpilogueBias) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // y = x W^T + b, a Linear layer; n = 13 is not a multiple of 8.
  for (int64_t n : {16, 13}) {
    const int64_t m = 21, k = 40;
    const RawTensor x = Randn({m, k}, dt, 61), w = Randn({n, k}, dt, 62), b = Randn({n}, dt, 63);
    const RawTensor y = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
    MatmulEx(y, Dev(x), false, Dev(w), true, Epilogue::kBias, Dev(b), RawTensor());
    const Reference r = Product(x, false, w, true);
    const RawTensor ref = Add(r.value, F64(b));  // b broadcast over rows
    // The bias is added to the f32 accumulator (one more f32 rounding of |ref|), or to the
    // accumulator rounded to the output type (EpilogueRounding).
    const RawTensor bound =
        Add(Add(ProductBound({ref, r.mag}, k, dt, dt), Scale(Abs(ref), AccRoundoff(dt))),
            EpilogueRounding(r, dt));
    ExpectWithin(y, ref, bound, absl::StrCat("bias epilogue, n = ", n));
  }
}

// The GELU-input buffer: out's shape with a row stride rounded up to a multiple of 8 (the
// cuBLASLt rule for aux), as a narrow() view.
RawTensor AuxLike(int64_t m, int64_t n, DType dt) {
  const int64_t ld = (n + 7) / 8 * 8;
  return RawTensor::Empty({m, ld}, dt, Device::Cuda(0)).narrow(1, 0, n);
}

TEST_P(CudaBlasTest, EpilogueBiasGeluSavesItsInput) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  for (int64_t n : {24, 13}) {
    const int64_t m = 17, k = 32;
    const RawTensor x = Randn({m, k}, dt, 71), w = Randn({n, k}, dt, 72), b = Randn({n}, dt, 73);
    const RawTensor h = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
    const RawTensor pre = AuxLike(m, n, dt);
    MatmulEx(h, Dev(x), false, Dev(w), true, Epilogue::kBiasGelu, Dev(b), pre);
    const Reference r = Product(x, false, w, true);
    const RawTensor pre_ref = Add(r.value, F64(b));
    const RawTensor pre_bound =
        Add(Add(ProductBound({pre_ref, r.mag}, k, dt, dt), Scale(Abs(pre_ref), AccRoundoff(dt))),
            EpilogueRounding(r, dt));
    ExpectWithin(pre, pre_ref, pre_bound, absl::StrCat("aux (GELU input), n = ", n));
    // gelu is 1.13-Lipschitz, so the input's error passes through scaled by at most 1.13; the
    // epilogue's tanh may be a fast approximation (we allow 1e-4 absolute, relative to 1 +
    // |x|), and the result is rounded once more.
    const RawTensor ref = Map(pre_ref, GeluTanhRef);
    const RawTensor bound =
        Add(Add(Scale(pre_bound, 1.13), Scale(Abs(ref), OutRoundoff(dt))),
            Scale(Map(pre_ref, [](double v) { return 1 + std::abs(v); }), 1e-4));
    ExpectWithin(h, ref, bound, absl::StrCat("bias_gelu output, n = ", n));

    // kGelu without bias and without aux (inference).
    const RawTensor h2 = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
    MatmulEx(h2, Dev(x), false, Dev(w), true, Epilogue::kGelu, RawTensor(), RawTensor());
    const RawTensor ref2 = Map(r.value, GeluTanhRef);
    const RawTensor bound2 =
        Add(Add(Scale(Add(ProductBound(r, k, dt, dt), EpilogueRounding(r, dt)), 1.13),
                Scale(Abs(ref2), OutRoundoff(dt))),
            Scale(Map(r.value, [](double v) { return 1 + std::abs(v); }), 1e-4));
    ExpectWithin(h2, ref2, bound2, absl::StrCat("gelu output, n = ", n));
  }
}

TEST_P(CudaBlasTest, EpilogueDGeluWithBiasGradient) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // Backward through y = h W2^T with h = gelu(pre): dpre = (dy W2) * gelu'(pre) and
  // db1 = sum over rows of dpre.
  const int64_t m = 19, o = 12, n = 16;
  const RawTensor dy = Randn({m, o}, dt, 81), w2 = Randn({o, n}, dt, 82);
  const RawTensor pre_host = Randn({m, n}, dt, 83);
  const RawTensor pre = AuxLike(m, n, dt);
  pre.copy_(Dev(pre_host));
  const RawTensor dpre = RawTensor::Empty({m, n}, dt, Device::Cuda(0));
  const RawTensor db = RawTensor::Empty({n}, dt, Device::Cuda(0));
  MatmulEx(dpre, Dev(dy), false, Dev(w2), false, Epilogue::kDGeluBgrad, db, pre);
  const Reference r = Product(dy, false, w2, false);
  const RawTensor grad = Map(F64(pre_host), GeluTanhGradRef);
  const RawTensor ref = Mul(r.value, grad);
  // The product's error scaled by |gelu'| <= 1.13, the approximate derivative (1e-4 of the
  // product's magnitude), and the output rounding.
  const RawTensor bound = Add(Add(Scale(ProductBound(r, o, dt, dt), 1.13), Scale(r.mag, 1e-4)),
                              Scale(Abs(ref), OutRoundoff(dt)));
  ExpectWithin(dpre, ref, bound, "dgelu output");
  // db sums the m rows of the f32 dgelu results: m f32 additions on top of each element's
  // error, then one rounding.
  const RawTensor db_ref = tg::Sum(ref, {0});
  const RawTensor db_bound =
      Add(Add(tg::Sum(bound, {0}), Scale(tg::Sum(Abs(ref), {0}), m * AccRoundoff(dt))),
          Scale(Abs(db_ref), OutRoundoff(dt)));
  ExpectWithin(db, db_ref, db_bound, "dgelu_bgrad bias gradient");

  // kDGelu alone.
  MatmulEx(dpre, Dev(dy), false, Dev(w2), false, Epilogue::kDGelu, RawTensor(), pre);
  ExpectWithin(dpre, ref, bound, "dgelu output without bgrad");
}

TEST_P(CudaBlasTest, EpilogueBgradGivesTheBiasGradientOfALinear) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // dW = dY^T X [o, i] and db = sum over the m rows of dY [o].
  for (int64_t o : {16, 11}) {
    const int64_t m = 40, i = 24;
    const RawTensor dy = Randn({m, o}, dt, 91), x = Randn({m, i}, dt, 92);
    const RawTensor dw = RawTensor::Empty({o, i}, dt, Device::Cuda(0));
    const RawTensor db = RawTensor::Empty({o}, dt, Device::Cuda(0));
    MatmulEx(dw, Dev(dy), true, Dev(x), false, Epilogue::kBgrad, db, RawTensor());
    const Reference r = Product(dy, true, x, false);
    ExpectWithin(dw, r.value, ProductBound(r, m, dt, dt), absl::StrCat("dW, o = ", o));
    const RawTensor dy64 = F64(dy);
    const RawTensor db_ref = tg::Sum(dy64, {0});
    const RawTensor db_bound = Add(Scale(tg::Sum(Abs(dy64), {0}), 2.0 * m * AccRoundoff(dt)),
                                   Scale(Abs(db_ref), OutRoundoff(dt)));
    ExpectWithin(db, db_ref, db_bound, absl::StrCat("bgrad, o = ", o));
  }
}

TEST_P(CudaBlasTest, BatchedEpilogues) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // 3-D: one bias for every batch entry in the forward, one bias gradient per entry backward.
  const int64_t bsz = 3, m = 8, k = 16, n = 24;
  const RawTensor x = Randn({bsz, m, k}, dt, 101), w = Randn({n, k}, dt, 102),
                  b = Randn({n}, dt, 103);
  const RawTensor we = Dev(w).unsqueeze(0).expand({bsz, n, k});
  const RawTensor y = RawTensor::Empty({bsz, m, n}, dt, Device::Cuda(0));
  MatmulEx(y, Dev(x), false, we, true, Epilogue::kBias, Dev(b), RawTensor());
  const Reference r = Product(x, false, w.unsqueeze(0).expand({bsz, n, k}), true);
  const RawTensor ref = Add(r.value, F64(b));
  ExpectWithin(y, ref, Add(ProductBound({ref, r.mag}, k, dt, dt), Scale(Abs(ref), AccRoundoff(dt))),
               "batched bias");

  const RawTensor dy = Randn({bsz, m, n}, dt, 104);
  const RawTensor dw = RawTensor::Empty({bsz, n, k}, dt, Device::Cuda(0));
  const RawTensor db = RawTensor::Empty({bsz, n}, dt, Device::Cuda(0));
  MatmulEx(dw, Dev(dy), true, Dev(x), false, Epilogue::kBgrad, db, RawTensor());
  const Reference rw = Product(dy, true, x, false);
  ExpectWithin(dw, rw.value, ProductBound(rw, m, dt, dt), "batched dW");
  const RawTensor dy64 = F64(dy);
  const RawTensor db_ref = tg::Sum(dy64, {1});
  ExpectWithin(db, db_ref,
               Add(Scale(tg::Sum(Abs(dy64), {1}), 2.0 * m * AccRoundoff(dt)),
                   Scale(Abs(db_ref), OutRoundoff(dt))),
               "batched bgrad");
}

TEST_P(CudaBlasTest, DGeluOfAnAccumulatedOutputAsLinearBackwardUsesIt) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // LinearBackward (tensor/ops_*.cc) gets dpre = dy * gelu'(pre) from the dGELU epilogue of a
  // rank-1 product that contributes zero, with dy in out and beta = 1:
  // out = dgelu(0 * (zeros [m, 1] @ ones [1, n]) + 1 * dy). That relies on cuBLASLt applying
  // the epilogue to alpha * A B + beta * C (its documented order), not to the product alone.
  const int64_t m = 23, n = 40;
  const RawTensor dy = Randn({m, n}, dt, 121), pre_host = Randn({m, n}, dt, 122);
  const RawTensor pre = AuxLike(m, n, dt);
  pre.copy_(Dev(pre_host));
  const RawTensor ref = Mul(F64(dy), Map(F64(pre_host), GeluTanhGradRef));
  // dy is exact in f32; the approximate derivative (1e-4 of |dy|), the f32 product and the
  // output rounding.
  const RawTensor bound = Add(Add(Scale(Abs(F64(dy)), 1e-4), Scale(Abs(ref), AccRoundoff(dt))),
                              Scale(Abs(ref), OutRoundoff(dt)));
  const RawTensor zeros = RawTensor::Zeros({m, 1}, dt, Device::Cuda(0));
  const RawTensor ones = OnesVector(n, dt, 0).view({1, n});
  for (bool with_bgrad : {true, false}) {
    const RawTensor g = Dev(dy).contiguous();
    const RawTensor db = with_bgrad ? RawTensor::Empty({n}, dt, Device::Cuda(0)) : RawTensor();
    MatmulEx(g, zeros, false, ones, false, with_bgrad ? Epilogue::kDGeluBgrad : Epilogue::kDGelu,
             db, pre, 1.0f, 1.0f);
    ExpectWithin(g, ref, bound, absl::StrCat("dgelu of beta * C, bgrad ", with_bgrad));
    if (with_bgrad) {
      const RawTensor db_ref = tg::Sum(ref, {0});
      const RawTensor db_bound =
          Add(Add(tg::Sum(bound, {0}), Scale(tg::Sum(Abs(ref), {0}), m * AccRoundoff(dt))),
              Scale(Abs(db_ref), OutRoundoff(dt)));
      ExpectWithin(db, db_ref, db_bound, "dgelu_bgrad of beta * C");
    }
  }
}

TEST_P(CudaBlasTest, BgradOfAnEmptyOutputSumsOpA) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // n == 0: out is empty, but the bias gradient (the row sums of op(a) over k) is not zero.
  const int64_t m = 6, k = 9;
  for (bool ta : {false, true}) {
    const RawTensor a = Randn(ta ? Shape{k, m} : Shape{m, k}, dt, 131);
    const RawTensor out = RawTensor::Empty({m, 0}, dt, Device::Cuda(0));
    const RawTensor b = RawTensor::Empty(Shape{k, 0}, dt, Device::Cuda(0));
    const RawTensor db = RawTensor::Full({m}, 7.0, dt, Device::Cuda(0));
    MatmulEx(out, Dev(a), ta, b, false, Epilogue::kBgrad, db, RawTensor());
    const RawTensor a64 = ta ? T(F64(a)) : F64(a);
    const RawTensor db_ref = tg::Sum(a64, {1});
    ExpectWithin(db, db_ref,
                 Add(Scale(tg::Sum(Abs(a64), {1}), 2.0 * k * AccRoundoff(dt)),
                     Scale(Abs(db_ref), OutRoundoff(dt))),
                 absl::StrCat("bgrad of an empty out, transpose_a ", ta));
  }
}

TEST_P(CudaBlasTest, LoopedBatchesWithLessAlignedBiasGradients) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  if (dt == kF64) GTEST_SKIP() << "cuBLASLt epilogues are for f32/f16/bf16";
  // a is broadcast along dim 0 only, so the batch dims do not merge: two host calls of a
  // 3-matrix strided batch. m = 5 makes the bias gradient's batch steps (5 elements) only
  // element-aligned, while the first call's bias pointer is the allocation's (256 bytes): the
  // algorithm picked for the first call must also suit the second.
  const int64_t m = 5, k = 24, n = 16;
  const RawTensor a = Randn({1, 3, m, k}, dt, 141), b = Randn({2, 3, k, n}, dt, 142);
  const RawTensor out = RawTensor::Empty({2, 3, m, n}, dt, Device::Cuda(0));
  const RawTensor db = RawTensor::Empty({2, 3, m}, dt, Device::Cuda(0));
  MatmulEx(out, Dev(a).expand({2, 3, m, k}), false, Dev(b), false, Epilogue::kBgrad, db,
           RawTensor());
  const Reference r = Product(a.expand({2, 3, m, k}), false, b, false);
  ExpectWithin(out, r.value, ProductBound(r, k, dt, dt), "looped batches, product");
  const RawTensor a64 = F64(a.expand({2, 3, m, k}));
  const RawTensor db_ref = tg::Sum(a64, {3});
  ExpectWithin(db, db_ref,
               Add(Scale(tg::Sum(Abs(a64), {3}), 2.0 * k * AccRoundoff(dt)),
                   Scale(Abs(db_ref), OutRoundoff(dt))),
               "looped batches, bias gradient");
}

TEST_P(CudaBlasTest, EmptyProducts) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  // k == 0: the product is zero.
  const RawTensor out = RawTensor::Full({3, 4}, 7.0, dt, Device::Cuda(0));
  Matmul(out, RawTensor::Empty({3, 0}, dt, Device::Cuda(0)),
         RawTensor::Empty({0, 4}, dt, Device::Cuda(0)));
  for (double v : out.to_vector<double>()) EXPECT_EQ(v, 0.0);
  // m == 0: nothing to do.
  Matmul(RawTensor::Empty({0, 4}, dt, Device::Cuda(0)),
         RawTensor::Empty({0, 5}, dt, Device::Cuda(0)),
         RawTensor::Empty({5, 4}, dt, Device::Cuda(0)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaBlasTest, ::testing::Values(kF32, kF64, kF16, kBF16), Name);

TEST(CudaBlasTf32Test, Tf32IsOffByDefaultAndScoped) {
  EXPECT_FALSE(Tf32Allowed());
  {
    AllowTf32Scope tf32;
    EXPECT_TRUE(Tf32Allowed());
    {
      AllowTf32Scope off(false);
      EXPECT_FALSE(Tf32Allowed());
    }
    EXPECT_TRUE(Tf32Allowed());
  }
  EXPECT_FALSE(Tf32Allowed());
}

TEST(CudaBlasTf32Test, Tf32ProductsAreWithinTf32Rounding) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 64, k = 256, n = 64;
  const RawTensor a = Randn({m, k}, kF32, 111), b = Randn({k, n}, kF32, 112);
  const RawTensor out = RawTensor::Empty({m, n}, kF32, Device::Cuda(0));
  {
    AllowTf32Scope tf32;
    Matmul(out, Dev(a), Dev(b));
  }
  // TF32 rounds each input to an 11-bit significand (u = 2^-11): each product is off by at most
  // 2 * 2^-11 relative, then f32 accumulation as usual.
  const Reference r = Product(a, false, b, false);
  ExpectWithin(out, r.value,
               Add(ProductBound(r, k, kF32, kF32), Scale(r.mag, 2 * std::ldexp(1.0, -11))), "tf32");
}

TEST(CudaBlasValidationTest, RejectsCpuTensors) {
  // Runs without a GPU: validation happens before any CUDA call.
  const RawTensor a = RawTensor::Zeros({2, 3}), b = RawTensor::Zeros({3, 4}),
                  out = RawTensor::Zeros({2, 4});
  EXPECT_TRUE(tg::testing::ThrowsError(
      [&] { MatmulEx(out, a, false, b, false, Epilogue::kNone, RawTensor(), RawTensor()); },
      "matmul_ex: out is on cpu, expected a CUDA device"));
  EXPECT_TRUE(tg::testing::ThrowsError([&] { Matmul(out, a, b); },
                                       "matmul: out is on cpu, expected a CUDA device"));
  EXPECT_STREQ(EpilogueName(Epilogue::kDGeluBgrad), "dgelu_bgrad");
}

TEST(CudaBlasValidationTest, RejectsBadShapesAndEpilogueOperands) {
  SKIP_WITHOUT_GPU();
  const Device d = Device::Cuda(0);
  const RawTensor a = RawTensor::Zeros({4, 8}, kF16, d), b = RawTensor::Zeros({8, 6}, kF16, d);
  const RawTensor out = RawTensor::Empty({4, 6}, kF16, d);
  auto throws = [](auto fn, const std::string& text) {
    EXPECT_TRUE(tg::testing::ThrowsError(fn, text));
  };
  throws([&] { MatmulEx(out, a, true, b, false, Epilogue::kNone, RawTensor(), RawTensor()); },
         "matmul_ex: out [4, 6], a [4, 8], b [8, 6] (a transposed) do not form");
  throws(
      [&] {
        MatmulEx(out, a, false, b.to(kBF16), false, Epilogue::kNone, RawTensor(), RawTensor());
      },
      "matmul_ex: a is f16 but b is bf16");
  throws([&] { MatmulEx(out, a, false, b, false, Epilogue::kBias, RawTensor(), RawTensor()); },
         "matmul_ex: bias is required (epilogue bias)");
  throws(
      [&] {
        MatmulEx(out, a, false, b, false, Epilogue::kBias, RawTensor::Zeros({4}, kF16, d),
                 RawTensor());
      },
      "matmul_ex: bias [4] does not match [6] for out [4, 6] (epilogue bias)");
  throws([&] { MatmulEx(out, a, false, b, false, Epilogue::kDGelu, RawTensor(), RawTensor()); },
         "matmul_ex: aux (the GELU input saved by the forward) is required (epilogue dgelu)");
  // A contiguous aux whose row stride (6) is not a multiple of 8.
  throws(
      [&] {
        MatmulEx(out, a, false, b, false, Epilogue::kDGelu, RawTensor(),
                 RawTensor::Empty({4, 6}, kF16, d));
      },
      "multiples of 8");
  throws(
      [&] {
        MatmulEx(RawTensor::Empty({4, 6}, kBF16, d), a, false, b, false, Epilogue::kNone,
                 RawTensor(), RawTensor());
      },
      "matmul_ex: out is bf16 for f16 inputs");
  // A forward GELU epilogue writes aux: a batch-broadcast aux is rejected.
  const RawTensor a3 = RawTensor::Zeros({2, 4, 8}, kF16, d),
                  b3 = RawTensor::Zeros({2, 8, 8}, kF16, d);
  throws(
      [&] {
        MatmulEx(RawTensor::Empty({2, 4, 8}, kF16, d), a3, false, b3, false, Epilogue::kGelu,
                 RawTensor(), RawTensor::Empty({1, 4, 8}, kF16, d).expand({2, 4, 8}));
      },
      "matmul_ex: aux [2, 4, 8] is broadcast along batch dim 0, but the epilogue writes it");
}

}  // namespace
}  // namespace tg::cuda
