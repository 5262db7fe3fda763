// Tests of the cuDNN-backed kernels: Conv2d / Conv2dBackward (tensor/cuda/conv.cc, compared with
// f64 convolutions of the same rounded inputs on the CPU) and scaled dot-product attention
// (tensor/cuda/attention.h, both implementations, compared with an f64 composition of matmul and
// softmax on the CPU, causal and not). Without a GPU every test skips except the validation
// tests that run on CPU tensors.
//
// Tolerances are per element and derived from the arithmetic, not tuned; u32 = 2^-24 is f32's
// unit roundoff (the accumulation precision of f32/f16/bf16 data), u_io that of the data type
// (2^-24 f32, 2^-11 f16, 2^-8 bf16, 2^-53 f64 with f64 accumulation).
// - Convolution: each output is a dot product of k terms (C*kh*kw forward, O*kh*kw for the input
//   gradient, N*Ho*Wo for the weight and bias gradients) computed with f32 accumulation, so
//   |error| <= 2 k u_acc * mag + u_io |ref|, with mag the same convolution of |x|, |w| (and |b|,
//   |grad|). The factor 2 allows tensor cores' aligned accumulation. conv.cc excludes FFT and
//   Winograd engines, whose error is only bounded by whole-input norms.
// - Attention: the scores s = scale q k^T carry at most ds = 2 D u32 scale (|q| @ |k|^T) + 2 u32
//   |s|; the
//   softmax turns a score error ds into a relative probability error of at most 2 max_j ds; the
//   kernels' own exp/log/sum roundings add a few u32 (16 u32 allowed, which also covers the
//   online rescaling of a fused kernel); the probabilities are rounded to the data type before
//   they multiply v (u_io relative); each product adds 2 k u32 of its |.| @ |.| magnitude; each
//   stored result one u_io |ref|. The backward bounds compose the same terms (see
//   BackwardBounds).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/composed.h"
#include "tensor/cuda/attention.h"
#include "tensor/cuda/blas.h"
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

const double kU32 = std::ldexp(1.0, -24);

double Roundoff(DType dt) {
  switch (dt) {
    case DType::kF64:
      return std::ldexp(1.0, -53);
    case DType::kF32:
      return kU32;
    case DType::kF16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -8);  // bf16
  }
}
double AccRoundoff(DType dt) { return dt == kF64 ? std::ldexp(1.0, -53) : kU32; }
// The absolute error of rounding a subnormal to dt: half its smallest spacing. Relative bounds
// miss it: f16 gradients of 1e-5 are subnormal (the H200 run showed dk and dv off by up to
// 1.8e-8 there, within 2^-25 but not within their relative bounds).
double SubnormalHalfStep(DType dt) {
  switch (dt) {
    case DType::kF64:
      return std::ldexp(1.0, -1075);
    case DType::kF32:
      return std::ldexp(1.0, -150);
    case DType::kF16:
      return std::ldexp(1.0, -25);
    default:
      return std::ldexp(1.0, -134);  // bf16
  }
}

RawTensor Randn(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return RandNormal(shape, gen, 0, 1, dtype);
}
RawTensor Dev(const RawTensor& t) { return t.to(Device::Cuda(0)); }
RawTensor F64(const RawTensor& t) { return t.to(Device::Cpu(), kF64).contiguous(); }
RawTensor Scale(const RawTensor& t, double s) { return MulScalar(t, s); }
RawTensor T(const RawTensor& t) { return t.transpose(-1, -2); }
double MaxOf(const RawTensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

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

// ---------------------------------------------------------------------------------------------
// Convolution.

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  int64_t sh, sw, ph, pw, dh, dw;
  bool bias;
};

Window2d WindowOf(const ConvCase& k) {
  Window2d g;
  g.n = k.n, g.c = k.c, g.h = k.h, g.w = k.w, g.o = k.o, g.kh = k.kh, g.kw = k.kw;
  g.sh = k.sh, g.sw = k.sw, g.ph = k.ph, g.pw = k.pw, g.dh = k.dh, g.dw = k.dw;
  g.oh = (k.h + 2 * k.ph - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  g.ow = (k.w + 2 * k.pw - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  return g;
}

std::string Describe(const ConvCase& k) {
  return absl::StrCat("x [", k.n, ", ", k.c, ", ", k.h, ", ", k.w, "], w [", k.o, ", ", k.c, ", ",
                      k.kh, ", ", k.kw, "], stride [", k.sh, ", ", k.sw, "], padding [", k.ph, ", ",
                      k.pw, "], dilation [", k.dh, ", ", k.dw, "]", k.bias ? ", bias" : "");
}

// Stride 1 and 2, padding, dilation, non-square kernels, 1x1, a single input channel (the first
// layer of an MNIST CNN), channel counts that are and are not multiples of 8.
const ConvCase kConvCases[] = {
    {2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, true},
    {3, 8, 16, 16, 16, 3, 3, 2, 2, 1, 1, 1, 1, true},
    {1, 5, 10, 7, 4, 2, 5, 1, 2, 0, 2, 2, 1, false},
    {4, 1, 28, 28, 32, 3, 3, 1, 1, 0, 0, 1, 1, true},
    {2, 16, 7, 7, 8, 1, 1, 1, 1, 0, 0, 1, 1, true},
};

class CudaConvTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaConvTest, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 1;
  for (const ConvCase& k : kConvCases) {
    const Window2d g = WindowOf(k);
    const RawTensor x = Randn({k.n, k.c, k.h, k.w}, dt, seed++);
    const RawTensor w = Randn({k.o, k.c, k.kh, k.kw}, dt, seed++);
    const RawTensor b = k.bias ? Randn({k.o}, dt, seed++) : RawTensor();
    const RawTensor out = RawTensor::Empty({g.n, g.o, g.oh, g.ow}, dt, Device::Cuda(0));
    Conv2d(out, Dev(x), Dev(w), k.bias ? Dev(b) : RawTensor(), g);
    Conv2dParams p;
    p.stride = {k.sh, k.sw};
    p.padding = {k.ph, k.pw};
    p.dilation = {k.dh, k.dw};
    const RawTensor ref = tg::Conv2d(F64(x), F64(w), k.bias ? F64(b) : RawTensor(), p);
    const RawTensor mag =
        tg::Conv2d(Abs(F64(x)), Abs(F64(w)), k.bias ? Abs(F64(b)) : RawTensor(), p);
    // The bias add is one more rounding of the stored convolution (u_io) and of the sum.
    const double k_terms = static_cast<double>(k.c * k.kh * k.kw);
    const RawTensor bound = Add(Scale(mag, 2 * k_terms * AccRoundoff(dt) + Roundoff(dt)),
                                Scale(Abs(ref), (k.bias ? 2 : 1) * Roundoff(dt)));
    ExpectWithin(out, ref, bound, Describe(k));
  }
}

TEST_P(CudaConvTest, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const DType dt = GetParam();
  uint64_t seed = 100;
  for (const ConvCase& k : kConvCases) {
    const Window2d g = WindowOf(k);
    const RawTensor x = Randn({k.n, k.c, k.h, k.w}, dt, seed++);
    const RawTensor w = Randn({k.o, k.c, k.kh, k.kw}, dt, seed++);
    const RawTensor gy = Randn({g.n, g.o, g.oh, g.ow}, dt, seed++);
    const Device d = Device::Cuda(0);
    const RawTensor gx = RawTensor::Empty(x.shape(), dt, d),
                    gw = RawTensor::Empty(w.shape(), dt, d), gb = RawTensor::Empty({k.o}, dt, d);
    Conv2dBackward(gx, gw, gb, Dev(gy), Dev(x), Dev(w), g);
    Conv2dParams p;
    p.stride = {k.sh, k.sw};
    p.padding = {k.ph, k.pw};
    p.dilation = {k.dh, k.dw};
    const Conv2dGrads ref = tg::Conv2dBackward(F64(gy), F64(x), F64(w), p);
    const Conv2dGrads mag = tg::Conv2dBackward(Abs(F64(gy)), Abs(F64(x)), Abs(F64(w)), p);
    const double u = AccRoundoff(dt), uo = Roundoff(dt);
    const double k_input = static_cast<double>(k.o * k.kh * k.kw);
    const double k_weight = static_cast<double>(g.n * g.oh * g.ow);
    ExpectWithin(gx, ref.grad_input,
                 Add(Scale(mag.grad_input, 2 * k_input * u), Scale(Abs(ref.grad_input), uo)),
                 "grad_input, " + Describe(k));
    ExpectWithin(gw, ref.grad_weight,
                 Add(Scale(mag.grad_weight, 2 * k_weight * u), Scale(Abs(ref.grad_weight), uo)),
                 "grad_weight, " + Describe(k));
    ExpectWithin(gb, ref.grad_bias,
                 Add(Scale(mag.grad_bias, 2 * k_weight * u), Scale(Abs(ref.grad_bias), uo)),
                 "grad_bias, " + Describe(k));

    // Only the input gradient (the weight is not read for the others and vice versa).
    const RawTensor gx2 = RawTensor::Empty(x.shape(), dt, d);
    Conv2dBackward(gx2, RawTensor(), RawTensor(), Dev(gy), RawTensor(), Dev(w), g);
    ExpectWithin(gx2, ref.grad_input,
                 Add(Scale(mag.grad_input, 2 * k_input * u), Scale(Abs(ref.grad_input), uo)),
                 "grad_input alone, " + Describe(k));
  }
}

TEST_P(CudaConvTest, Tf32ScopeStillMatchesAtTf32Precision) {
  SKIP_WITHOUT_GPU();
  if (GetParam() != kF32) GTEST_SKIP() << "TF32 applies to f32 only";
  // With TF32 allowed, each input may be rounded to 11 significant bits: products off by
  // 2 * 2^-11 relative, on top of the f32 bound.
  const ConvCase k = kConvCases[1];
  const Window2d g = WindowOf(k);
  const RawTensor x = Randn({k.n, k.c, k.h, k.w}, kF32, 7),
                  w = Randn({k.o, k.c, k.kh, k.kw}, kF32, 8);
  const RawTensor out = RawTensor::Empty({g.n, g.o, g.oh, g.ow}, kF32, Device::Cuda(0));
  {
    AllowTf32Scope tf32;
    Conv2d(out, Dev(x), Dev(w), RawTensor(), g);
  }
  Conv2dParams p;
  p.stride = {k.sh, k.sw};
  p.padding = {k.ph, k.pw};
  const RawTensor ref = tg::Conv2d(F64(x), F64(w), RawTensor(), p);
  const RawTensor mag = tg::Conv2d(Abs(F64(x)), Abs(F64(w)), RawTensor(), p);
  const double k_terms = static_cast<double>(k.c * k.kh * k.kw);
  ExpectWithin(
      out, ref,
      Add(Scale(mag, 2 * k_terms * kU32 + 2 * std::ldexp(1.0, -11)), Scale(Abs(ref), kU32)),
      "tf32 conv");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaConvTest, ::testing::Values(kF32, kF64, kF16, kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(CudaConvValidationTest, RejectsCpuTensors) {
  const ConvCase k = kConvCases[0];
  const Window2d g = WindowOf(k);
  const RawTensor x = RawTensor::Zeros({k.n, k.c, k.h, k.w}),
                  w = RawTensor::Zeros({k.o, k.c, k.kh, k.kw});
  const RawTensor out = RawTensor::Empty({g.n, g.o, g.oh, g.ow});
  EXPECT_TRUE(tg::testing::ThrowsError([&] { Conv2d(out, x, w, RawTensor(), g); },
                                       "conv2d: out is on cpu, expected a CUDA device"));
  EXPECT_TRUE(tg::testing::ThrowsError(
      [&] { Conv2dBackward(RawTensor(), RawTensor(), RawTensor(), out, x, w, g); },
      "conv2d_backward: the gradient is on cpu, expected a CUDA device"));
}

// ---------------------------------------------------------------------------------------------
// Attention.

// f32 [t, t] with -inf above the diagonal, as an f64 CPU tensor.
RawTensor CausalMask64(int64_t tq, int64_t tk) {
  std::vector<double> m(static_cast<size_t>(tq * tk), 0.0);
  for (int64_t i = 0; i < tq; ++i) {
    for (int64_t j = i + 1; j < tk; ++j) m[i * tk + j] = -std::numeric_limits<double>::infinity();
  }
  return RawTensor::FromVector(m, {tq, tk});
}

// The f64 forward of the same (rounded) inputs, and the bound terms of the file comment.
struct AttentionRef {
  RawTensor s;      // [B, H, Tq, Tk] scaled, masked scores
  RawTensor lse;    // [B, H, Tq, 1]
  RawTensor p;      // softmax(s)
  RawTensor out;    // p @ v
  RawTensor s_abs;  // [B, H, Tq, 1]: max_j |unmasked score|
  double eps_s;  // the largest score error bound, 2 D u32 scale max(|q| @ |k|^T)
};

AttentionRef Forward64(const RawTensor& q, const RawTensor& k, const RawTensor& v, bool causal,
                       double scale) {
  const RawTensor q64 = F64(q), k64 = F64(k), v64 = F64(v);
  const int64_t tq = q.size(2), tk = k.size(2), d = q.size(3);
  AttentionRef r;
  const RawTensor raw = Scale(tg::Matmul(q64, T(k64)), scale);
  r.s = causal ? Add(raw, CausalMask64(tq, tk)) : raw;
  const RawTensor mx = Max(r.s, 3, /*keepdim=*/true);
  r.lse = Add(mx, Log(Sum(Exp(Sub(r.s, mx)), {3}, /*keepdim=*/true)));
  r.p = Exp(Sub(r.s, r.lse));
  r.out = tg::Matmul(r.p, v64);
  r.s_abs = Max(Abs(raw), 3, /*keepdim=*/true);
  r.eps_s = 2 * d * kU32 * scale * MaxOf(tg::Matmul(Abs(q64), T(Abs(k64))));
  return r;
}

struct AttentionCase {
  int64_t b, h, tq, tk, d;
  bool causal;
};

// What computes attention on CUDA: cuDNN's fused kernels (attention.h), or, where they decline,
// the composed form every device shares (tensor/composed.h, run on CUDA tensors). Both are held
// to the same f64 bounds.
enum class AttentionImpl { kComposed, kCudnn };

bool RunForward(const RawTensor& out, const RawTensor& stats, const RawTensor& q,
                const RawTensor& k, const RawTensor& v, bool causal, double scale,
                AttentionImpl impl, std::string* why = nullptr) {
  if (impl == AttentionImpl::kCudnn)
    return AttentionForward(out, stats, q, k, v, causal, scale, 0, why);
  const AttentionResult r = composed::Attention(q, k, v, causal, scale);
  out.copy_(r.output);
  stats.copy_(r.stats.unsqueeze(-1));
  return true;
}

bool RunBackward(const RawTensor& dq, const RawTensor& dk, const RawTensor& dv,
                 const RawTensor& dout, const RawTensor& q, const RawTensor& k, const RawTensor& v,
                 const RawTensor& out, const RawTensor& stats, bool causal, double scale,
                 AttentionImpl impl, std::string* why = nullptr) {
  if (impl == AttentionImpl::kCudnn) {
    return AttentionBackward(dq, dk, dv, dout, q, k, v, out, stats, causal, scale, why);
  }
  const AttentionGrads g =
      composed::AttentionBackward(dout, q, k, v, out, stats.squeeze(-1), causal, scale);
  dq.copy_(g.grad_q);
  dk.copy_(g.grad_k);
  dv.copy_(g.grad_v);
  return true;
}

std::string Describe(const AttentionCase& c, DType dt, AttentionImpl impl) {
  return absl::StrCat("B=", c.b, " H=", c.h, " Tq=", c.tq, " Tk=", c.tk, " D=", c.d,
                      c.causal ? " causal " : " ", DTypeName(dt),
                      impl == AttentionImpl::kCudnn ? " cudnn" : " composed");
}

struct AttentionParam {
  DType dtype;
  AttentionImpl impl;
};

// The phrase of kCudnn's "no fused kernel for this problem" reason (the call returns false, the
// CUDA kernel table declines, and the op runs the composed form).
constexpr char kNoCudnnAttention[] = "cuDNN has no fused attention engine";

// Whether attention.cc declines cuDNN's fused kernels: 9.10.0/9.10.1 have forward bugs, and
// before 9.15.1 the backward miscomputes key lengths that are not multiples of 128
// (cudnn-frontend issue #160).
bool CudnnForwardDeclined() {
  const size_t v = cudnnGetVersion();
  return v == 91000 || v == 91001;
}
bool CudnnBackwardDeclined(int64_t tk) { return cudnnGetVersion() < 91501 && tk % 128 != 0; }

class CudaAttentionTest : public ::testing::TestWithParam<AttentionParam> {};

// Sequence lengths that are and are not multiples of 8 (the fused kernel pads its tiles), Tq !=
// Tk without the mask, head sizes the fused kernel accepts (multiples of 8).
const AttentionCase kAttentionCases[] = {
    {2, 3, 40, 40, 32, true}, {2, 3, 40, 40, 32, false},  {1, 2, 17, 17, 64, true},
    {2, 1, 9, 23, 16, false}, {1, 4, 128, 128, 64, true},
};

void CheckForward(const AttentionCase& c, const RawTensor& q, const RawTensor& k,
                  const RawTensor& v, DType dt, AttentionImpl impl, const std::string& what) {
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));
  const Device dev = Device::Cuda(0);
  const RawTensor out = RawTensor::Empty({c.b, c.h, c.tq, c.d}, dt, dev);
  const RawTensor stats = RawTensor::Empty({c.b, c.h, c.tq, 1}, kF32, dev);
  if (impl == AttentionImpl::kCudnn && CudnnForwardDeclined()) {
    std::string why;
    EXPECT_FALSE(RunForward(out, stats, q, k, v, c.causal, scale, impl, &why)) << what;
    EXPECT_NE(why.find(kNoCudnnAttention), std::string::npos) << what << ": " << why;
    return;
  }
  ASSERT_TRUE(RunForward(out, stats, q, k, v, c.causal, scale, impl)) << what;
  const AttentionRef r = Forward64(q, k, v, c.causal, scale);
  const double uo = Roundoff(dt);
  // Per row, the largest score error: the product's bound plus the rounding of the scaled score.
  const RawTensor row_eps =
      Add(Max(Scale(tg::Matmul(Abs(F64(q)), T(Abs(F64(k)))), 2 * c.d * kU32 * scale), 3,
              /*keepdim=*/true),
          Scale(r.s_abs, 2 * kU32));
  const RawTensor pv = tg::Matmul(r.p, Abs(F64(v)));
  // Relative error of each probability: 2 row_eps (softmax) + 16 u32 (kernel roundings) + u_io
  // (rounding to the data type before the product); then the product (2 Tk u32) and the store.
  const RawTensor rel = AddScalar(Scale(row_eps, 2), 16 * kU32 + uo + 2 * c.tk * kU32);
  ExpectWithin(out, r.out, Add(Mul(rel, pv), Scale(Abs(r.out), uo)), what + ": out");
  // lse: the score error plus roundings of quantities as large as the scores and the lse.
  ExpectWithin(stats, r.lse, Add(row_eps, Scale(Add(r.s_abs, Abs(r.lse)), 16 * kU32)),
               what + ": softmax_stats");
}

TEST_P(CudaAttentionTest, ForwardMatchesF64Composition) {
  SKIP_WITHOUT_GPU();
  const auto [dt, impl] = GetParam();
  uint64_t seed = 1;
  for (const AttentionCase& c : kAttentionCases) {
    const RawTensor q = Randn({c.b, c.h, c.tq, c.d}, dt, seed++);
    const RawTensor k = Randn({c.b, c.h, c.tk, c.d}, dt, seed++);
    const RawTensor v = Randn({c.b, c.h, c.tk, c.d}, dt, seed++);
    CheckForward(c, Dev(q), Dev(k), Dev(v), dt, impl, Describe(c, dt, impl));
  }
}

TEST_P(CudaAttentionTest, ForwardOnHeadsSlicedFromAProjection) {
  SKIP_WITHOUT_GPU();
  const auto [dt, impl] = GetParam();
  // GPT's layout: qkv [B, T, 3, H, D] -> q, k, v [B, H, T, D] views (strides T*3*H*D, D,
  // 3*H*D, 1), passed without copies.
  const AttentionCase c = {2, 4, 24, 24, 16, true};
  const RawTensor qkv = Dev(Randn({c.b, c.tq, 3, c.h, c.d}, dt, 42));
  const RawTensor heads = qkv.permute({2, 0, 3, 1, 4});
  CheckForward(c, heads.select(0, 0), heads.select(0, 1), heads.select(0, 2), dt, impl,
               Describe(c, dt, impl) + " (strided heads)");
}

TEST_P(CudaAttentionTest, BackwardMatchesF64Composition) {
  SKIP_WITHOUT_GPU();
  const auto [dt, impl] = GetParam();
  const double u_io = Roundoff(dt);
  uint64_t seed = 500;
  for (const AttentionCase& c : kAttentionCases) {
    const std::string what = Describe(c, dt, impl);
    const double scale = 1 / std::sqrt(static_cast<double>(c.d));
    const RawTensor q = Randn({c.b, c.h, c.tq, c.d}, dt, seed++);
    const RawTensor k = Randn({c.b, c.h, c.tk, c.d}, dt, seed++);
    const RawTensor v = Randn({c.b, c.h, c.tk, c.d}, dt, seed++);
    const RawTensor dout = Randn({c.b, c.h, c.tq, c.d}, dt, seed++);
    // The saved forward results the backward receives: the f64 ones rounded to their storage
    // types (the reference uses exactly these values, so the check isolates the backward).
    const AttentionRef r = Forward64(q, k, v, c.causal, scale);
    const RawTensor out = r.out.to(dt), lse32 = r.lse.to(kF32);
    const Device dev = Device::Cuda(0);
    const RawTensor dq = RawTensor::Empty(q.shape(), dt, dev),
                    dk = RawTensor::Empty(k.shape(), dt, dev),
                    dv = RawTensor::Empty(v.shape(), dt, dev);
    if (impl == AttentionImpl::kCudnn && CudnnBackwardDeclined(c.tk)) {
      // The fused backward is declined with the phrase (and the reason), never run.
      std::string why;
      EXPECT_FALSE(RunBackward(dq, dk, dv, Dev(dout), Dev(q), Dev(k), Dev(v), Dev(out), Dev(lse32),
                               c.causal, scale, impl, &why))
          << what;
      EXPECT_NE(why.find(kNoCudnnAttention), std::string::npos) << what << ": " << why;
      continue;
    }
    RunBackward(dq, dk, dv, Dev(dout), Dev(q), Dev(k), Dev(v), Dev(out), Dev(lse32), c.causal,
                scale, impl);

    // Reference in f64 from the same inputs.
    const RawTensor q64 = F64(q), k64 = F64(k), v64 = F64(v), do64 = F64(dout), o64 = F64(out);
    const RawTensor p = Exp(Sub(r.s, F64(lse32)));
    const RawTensor dv_ref = tg::Matmul(T(p), do64);
    const RawTensor dp = tg::Matmul(do64, T(v64));
    const RawTensor delta = Sum(Mul(do64, o64), {3}, /*keepdim=*/true);
    const RawTensor ds = Scale(Mul(p, Sub(dp, delta)), scale);
    const RawTensor dq_ref = tg::Matmul(ds, k64), dk_ref = tg::Matmul(T(ds), q64);

    // Bounds (file comment): probabilities off by (eps_s + 4 u32) relative and, where they feed
    // dv, by u_io more; dp and delta are D-term products; ds is stored in the data type.
    const double eps = r.eps_s + 2 * kU32 * MaxOf(r.s_abs) + 4 * kU32;
    const int64_t longest = std::max({c.tq, c.tk, c.d});
    const double sub = SubnormalHalfStep(dt);  // each rounding to dt, absolute
    const RawTensor dv_bound = AddScalar(
        Add(Scale(tg::Matmul(T(p), Abs(do64)), eps + u_io + 2 * longest * kU32 + 16 * kU32),
            Scale(Abs(dv_ref), u_io)),
        sub);
    ExpectWithin(dv, dv_ref, dv_bound, what + ": dv");
    const RawTensor dp_mag = tg::Matmul(Abs(do64), T(Abs(v64)));
    const RawTensor delta_mag = Sum(Abs(Mul(do64, o64)), {3}, /*keepdim=*/true);
    const RawTensor ds_bound = Add(Scale(Mul(p, Add(Scale(Abs(Sub(dp, delta)), eps),
                                                    Scale(Add(dp_mag, delta_mag), 2 * c.d * kU32))),
                                         scale),
                                   AddScalar(Scale(Abs(ds), u_io + 4 * kU32), sub));
    const RawTensor dq_bound = Add(
        Add(tg::Matmul(ds_bound, Abs(k64)), Scale(tg::Matmul(Abs(ds), Abs(k64)), 2 * c.tk * kU32)),
        AddScalar(Scale(Abs(dq_ref), u_io), sub));
    ExpectWithin(dq, dq_ref, dq_bound, what + ": dq");
    const RawTensor dk_bound = Add(Add(tg::Matmul(T(ds_bound), Abs(q64)),
                                       Scale(tg::Matmul(T(Abs(ds)), Abs(q64)), 2 * c.tq * kU32)),
                                   AddScalar(Scale(Abs(dk_ref), u_io), sub));
    ExpectWithin(dk, dk_ref, dk_bound, what + ": dk");
  }
}

TEST_P(CudaAttentionTest, RejectsDropoutAndBadShapes) {
  SKIP_WITHOUT_GPU();
  const auto [dt, impl] = GetParam();
  if (impl != AttentionImpl::kCudnn) GTEST_SKIP() << "attention.h's validation";
  const Device dev = Device::Cuda(0);
  const RawTensor q = RawTensor::Zeros({1, 2, 8, 16}, dt, dev),
                  k = RawTensor::Zeros({1, 2, 6, 16}, dt, dev);
  const RawTensor out = RawTensor::Empty({1, 2, 8, 16}, dt, dev);
  const RawTensor stats = RawTensor::Empty({1, 2, 8, 1}, kF32, dev);
  EXPECT_TRUE(tg::testing::ThrowsError(
      [&] { AttentionForward(out, stats, q, k, k, /*causal=*/false, 0.25, 0.1); },
      "attention_forward: attention dropout 0.1 is not supported"));
  EXPECT_TRUE(tg::testing::ThrowsError(
      [&] { AttentionForward(out, stats, q, k, k, /*causal=*/true, 0.25, 0); },
      "attention_forward: causal attention needs as many queries as keys, got 8 and 6"));
  EXPECT_TRUE(tg::testing::ThrowsError(
      [&] {
        // Statistics in f16 (f32 whatever the inputs' type; the f32 run once passed f32 here).
        AttentionForward(out, RawTensor::Empty({1, 2, 8, 1}, kF16, dev), q, k, k, false, 0.25, 0);
      },
      "attention_forward: softmax_stats is f16, expected f32"));
}

std::vector<AttentionParam> AttentionParams() {
  return {{kF32, AttentionImpl::kComposed},
          {kF16, AttentionImpl::kComposed},
          {kBF16, AttentionImpl::kComposed},
          {kF16, AttentionImpl::kCudnn},
          {kBF16, AttentionImpl::kCudnn}};
}

INSTANTIATE_TEST_SUITE_P(Impls, CudaAttentionTest, ::testing::ValuesIn(AttentionParams()),
                         [](const ::testing::TestParamInfo<AttentionParam>& info) {
                           return absl::StrCat(
                               DTypeName(info.param.dtype),
                               info.param.impl == AttentionImpl::kCudnn ? "_cudnn" : "_composed");
                         });

// The op-level entry points (tensor/ops_*.cc) take the fused kernel where attention.cc offers one
// and the composed one where it declines (Tk = 40 before cuDNN 9.15.1), so the gradients are
// finite and agree with kComposed's; a declined backward gives exactly kComposed's.
TEST(CudaAttentionOpsTest, DeclinedFusedBackwardFallsBackToComposed) {
  SKIP_WITHOUT_GPU();
  for (const DType dt : {kF16, kBF16}) {
    const AttentionCase c = {2, 3, 40, 40, 32, true};
    const double scale = 1 / std::sqrt(static_cast<double>(c.d));
    const RawTensor q = Dev(Randn({c.b, c.h, c.tq, c.d}, dt, 901));
    const RawTensor k = Dev(Randn({c.b, c.h, c.tk, c.d}, dt, 902));
    const RawTensor v = Dev(Randn({c.b, c.h, c.tk, c.d}, dt, 903));
    const RawTensor dout = Dev(Randn({c.b, c.h, c.tq, c.d}, dt, 904));
    const AttentionResult fwd = tg::ScaledDotProductAttention(q, k, v, c.causal, scale);
    const AttentionGrads got = tg::ScaledDotProductAttentionBackward(dout, q, k, v, fwd.output,
                                                                     fwd.stats, c.causal, scale);
    const Device dev = Device::Cuda(0);
    const RawTensor dq = RawTensor::Empty(q.shape(), dt, dev),
                    dk = RawTensor::Empty(k.shape(), dt, dev),
                    dv = RawTensor::Empty(v.shape(), dt, dev);
    RunBackward(dq, dk, dv, dout, q, k, v, fwd.output, fwd.stats.view({c.b, c.h, c.tq, 1}),
                c.causal, scale, AttentionImpl::kComposed);
    const std::string what = Describe(c, dt, AttentionImpl::kComposed) + " through tensor/ops";
    for (const auto& [g, ref, name] :
         {std::tuple{got.grad_q, dq, "dq"}, std::tuple{got.grad_k, dk, "dk"},
          std::tuple{got.grad_v, dv, "dv"}}) {
      const std::vector<double> a = g.to_vector<double>(), b = ref.to_vector<double>();
      ASSERT_EQ(a.size(), b.size()) << what << ": " << name;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i])) << what << ": " << name << "[" << i << "] = " << a[i];
        if (CudnnBackwardDeclined(c.tk)) {
          ASSERT_EQ(a[i], b[i]) << what << ": " << name << "[" << i << "] differs from kComposed";
        } else {
          // Both are within the f64 bounds of BackwardMatchesF64Composition; here a loose
          // agreement (64 roundings of the data type, relative to the gradient's scale) suffices.
          ASSERT_NEAR(a[i], b[i], 64 * Roundoff(dt) * (1 + std::abs(b[i])))
              << what << ": " << name << "[" << i << "]";
        }
      }
    }
  }
}

TEST(CudaAttentionValidationTest, RejectsCpuTensors) {
  const RawTensor q = RawTensor::Zeros({1, 1, 4, 8}), stats = RawTensor::Zeros({1, 1, 4, 1});
  EXPECT_TRUE(tg::testing::ThrowsError([&] { AttentionForward(q, stats, q, q, q, true, 1.0); },
                                       "attention_forward: q is on cpu, expected a CUDA device"));
}

TEST(CudaAttentionValidationTest, CudnnSupportRules) {
  // Pure checks of dtypes, shapes, strides and alignment: run on CPU tensors.
  std::string why;
  const RawTensor good = RawTensor::Zeros({2, 4, 16, 64}, kBF16);
  EXPECT_TRUE(CudnnAttentionSupported({&good}, &why)) << why;
  const RawTensor f32 = RawTensor::Zeros({2, 4, 16, 64});
  EXPECT_FALSE(CudnnAttentionSupported({&good, &f32}, &why));
  EXPECT_NE(why.find("takes f16 or bf16"), std::string::npos) << why;
  const RawTensor odd = RawTensor::Zeros({2, 4, 16, 20}, kF16);
  EXPECT_FALSE(CudnnAttentionSupported({&odd}, &why));
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;
  const RawTensor transposed = RawTensor::Zeros({2, 4, 64, 16}, kF16).transpose(2, 3);
  EXPECT_FALSE(CudnnAttentionSupported({&transposed}, &why));
  EXPECT_NE(why.find("unit stride along D"), std::string::npos) << why;
  const RawTensor shifted = RawTensor::Zeros({2 * 4 * 16 * 64 + 1}, kF16)
                                .narrow(0, 1, 2 * 4 * 16 * 64)
                                .view({2, 4, 16, 64});
  EXPECT_FALSE(CudnnAttentionSupported({&shifted}, &why));
  EXPECT_NE(why.find("16-byte aligned"), std::string::npos) << why;
}

}  // namespace
}  // namespace tg::cuda
