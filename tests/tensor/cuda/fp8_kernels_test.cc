// The FP8 kernels on CUDA (tensor/cuda/fp8.cu, fp8_gemm.cc) against the CPU's:
//   - Fp8Amax, Fp8ScaleFromAmax and Fp8Cast (with its transpose and amax) bit for bit, every
//     tiling, input dtype and FP8 format, edge tiles, inf / NaN / -0 / saturating inputs;
//   - Fp8Gemm against an f64 product of the dequantized inputs: exactly for integer-valued inputs
//     with power-of-two scales (every path must then give the exact sum, rounded once), and within
//     accumulation bounds for general inputs and scales (f32's, and for cuBLASLt's tensor cores a
//     documented allowance for their narrower accumulator); per-tensor and block scales, shapes
//     that are multiples of 16 (cuBLASLt on sm_89/sm_90) and odd ones (the bf16 fallback), bias,
//     f32 / bf16 / f16 outputs, and which path ran;
//   - PlanFp8Gemm (which path a GEMM takes, and why) without a GPU.
// Tests that need a GPU skip without one.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/fp8.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/fp8_scale.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::cuda::Fp8GemmPlan;
using ::tg::cuda::PlanFp8Gemm;
using ::tg::testing::ThrowsErrorExactly;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::Available()) GTEST_SKIP() << "no CUDA device"

const Device kGpu = Device::Cuda(0);
constexpr Fp8Tiling kTilings[] = {Fp8Tiling::kTensor, Fp8Tiling::k1x128, Fp8Tiling::k128x128};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

RawTensor ToCpu(const RawTensor& t) { return t.to(Device::Cpu()).contiguous(); }

// Same dtype, shape and bytes (no NaN exemption: the FP8 casts give the canonical NaN 0x7f on
// both devices, and amaxes and scales are never NaN).
::testing::AssertionResult SameBytes(const RawTensor& expected, const RawTensor& actual,
                                     const std::string& what) {
  if (expected.dtype() != actual.dtype() || expected.shape() != actual.shape()) {
    return ::testing::AssertionFailure()
           << what << ": expected " << DTypeName(expected.dtype()) << " "
           << ShapeToString(expected.shape()) << ", got " << DTypeName(actual.dtype()) << " "
           << ShapeToString(actual.shape());
  }
  const RawTensor e = ToCpu(expected), a = ToCpu(actual);
  const size_t size = e.element_size();
  const auto* eb = static_cast<const unsigned char*>(e.raw_data());
  const auto* ab = static_cast<const unsigned char*>(a.raw_data());
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < e.numel(); ++i) {
    if (std::memcmp(eb + i * size, ab + i * size, size) != 0) {
      if (first < 0) first = i;
      ++mismatches;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  const std::vector<double> ev = e.to_vector<double>(), av = a.to_vector<double>();
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << e.numel() << " elements differ; first at "
         << first << ": expected " << ev[first] << ", got " << av[first] << " ("
         << DTypeName(e.dtype()) << ")";
}

// [rows, cols] of `dtype` whose tiles have different magnitudes (2^-20 .. 2^20 by 7-row and
// 50-column bands), with a zero 1x128 tile, inf, -inf, NaN, -0, values that saturate after
// scaling and tiny ones (an f16 x turns the largest into inf).
RawTensor Input(int64_t rows, int64_t cols, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int band = static_cast<int>((r / 7 * 3 + c / 50) % 41) - 20;
      v[r * cols + c] = std::ldexp(normal(rng), band);
    }
  }
  auto set = [&](int64_t r, int64_t c, float value) {
    if (r < rows && c < cols) v[r * cols + c] = value;
  };
  for (int64_t c = 128; c < std::min<int64_t>(cols, 256); ++c) set(2, c, 0.0f);
  set(0, 0, kNaN);
  set(1, 3, kInf);
  set(3, 1, -kInf);
  set(4, 2, -0.0f);
  set(5, 129, 3.0e38f);
  set(6, 7, -1.0e6f);
  set(rows - 1, cols - 1, 1.0e-30f);
  set(rows / 2, 0, -kNaN);
  return RawTensor::FromVector<float>(v, {rows, cols}).to(dtype);
}

struct Case {
  int64_t rows, cols;
};
// Edge tiles in both dims, one element, a single row, exact multiples of 128.
constexpr Case kCases[] = {{1, 1}, {3, 130}, {37, 300}, {130, 257}, {256, 128}, {1, 1000}};
constexpr DType kInputs[] = {kF32, kBF16, kF16};

std::string Label(const Case& c, DType dtype, Fp8Tiling tiling) {
  return absl::StrCat("[", c.rows, ", ", c.cols, "] ", DTypeName(dtype), " ",
                      Fp8TilingName(tiling));
}

// ---- PlanFp8Gemm (no GPU) ---------------------------------------------------------------------

TEST(Fp8GemmPlanTest, PerTensorScalesTakeCublasLtFromSm89) {
  for (int sm : {89, 90, 100}) {
    const Fp8GemmPlan p = PlanFp8Gemm(sm, 64, 32, 256, kF8E4M3, kF8E5M2, Fp8Tiling::kTensor,
                                      Fp8Tiling::kTensor, kBF16, /*has_bias=*/true, true);
    EXPECT_EQ(p.path, Fp8GemmPlan::Path::kCublasLt) << sm << ": " << p.reason;
    EXPECT_FALSE(p.block_scaled);
    EXPECT_TRUE(p.bias_epilogue);  // a bf16 bias for a bf16 D
    EXPECT_EQ(p.reason, "");
  }
  // An f32 D takes a bf16 bias in cuBLASLt's FP8 kernels: ours is added by FinishFp8Gemm.
  const Fp8GemmPlan f32 = PlanFp8Gemm(90, 64, 32, 256, kF8E5M2, kF8E4M3, Fp8Tiling::kTensor,
                                      Fp8Tiling::kTensor, kF32, true, true);
  EXPECT_EQ(f32.path, Fp8GemmPlan::Path::kCublasLt);
  EXPECT_FALSE(f32.bias_epilogue);
}

TEST(Fp8GemmPlanTest, BlockScalesTakeCublasLtOnHopperOnly) {
  for (auto [at, bt] : {std::pair{Fp8Tiling::k1x128, Fp8Tiling::k1x128},
                        std::pair{Fp8Tiling::k1x128, Fp8Tiling::k128x128},
                        std::pair{Fp8Tiling::k128x128, Fp8Tiling::k1x128}}) {
    const Fp8GemmPlan p =
        PlanFp8Gemm(90, 128, 256, 384, kF8E4M3, kF8E4M3, at, bt, kBF16, false, true);
    EXPECT_EQ(p.path, Fp8GemmPlan::Path::kCublasLt) << p.reason;
    EXPECT_TRUE(p.block_scaled);
    const Fp8GemmPlan ada =
        PlanFp8Gemm(89, 128, 256, 384, kF8E4M3, kF8E4M3, at, bt, kBF16, false, true);
    EXPECT_EQ(ada.path, Fp8GemmPlan::Path::kBf16Fallback);
    EXPECT_EQ(ada.reason,
              "cuBLASLt's 128-element block scaling runs on sm_90 only, this GPU is sm_89");
  }
  const Fp8GemmPlan both = PlanFp8Gemm(90, 128, 256, 384, kF8E4M3, kF8E4M3, Fp8Tiling::k128x128,
                                       Fp8Tiling::k128x128, kF32, false, true);
  EXPECT_EQ(both.path, Fp8GemmPlan::Path::kBf16Fallback);
  EXPECT_EQ(both.reason, "cuBLASLt has no 128x128 x 128x128 block scaling");
}

TEST(Fp8GemmPlanTest, FallbackReasons) {
  auto reason = [](int sm, int64_t m, int64_t n, int64_t k, DType a, DType b, bool aligned) {
    const Fp8GemmPlan p = PlanFp8Gemm(sm, m, n, k, a, b, Fp8Tiling::kTensor, Fp8Tiling::kTensor,
                                      kF32, false, aligned);
    EXPECT_EQ(p.path, Fp8GemmPlan::Path::kBf16Fallback);
    return p.reason;
  };
  EXPECT_EQ(reason(80, 64, 64, 64, kF8E4M3, kF8E4M3, true),
            "FP8 tensor cores need sm_89 or newer, this GPU is sm_80");
  EXPECT_EQ(reason(90, 33, 32, 128, kF8E4M3, kF8E4M3, true),
            "cuBLASLt's FP8 matmul needs m, n, k multiples of 16, got m 33, n 32, k 128");
  EXPECT_EQ(reason(90, 32, 32, 200, kF8E4M3, kF8E4M3, true),
            "cuBLASLt's FP8 matmul needs m, n, k multiples of 16, got m 32, n 32, k 200");
  EXPECT_EQ(reason(90, 32, 32, 128, kF8E4M3, kF8E4M3, false),
            "cuBLASLt's FP8 matmul needs 16-byte aligned operands");
  EXPECT_EQ(reason(90, 32, 32, 128, kF8E5M2, kF8E5M2, true),
            "cuBLASLt has no e5m2 x e5m2 FP8 matmul");
  EXPECT_STREQ(cuda::Fp8GemmPathName(Fp8GemmPlan::Path::kCublasLt), "cublaslt");
  EXPECT_STREQ(cuda::Fp8GemmPathName(Fp8GemmPlan::Path::kBf16Fallback), "bf16_fallback");
}

// ---- Amax, scale, cast: bit for bit with the CPU ------------------------------------------------

TEST(CudaFp8KernelsTest, AmaxOfAKnownTensor) {
  SKIP_WITHOUT_GPU();
  const RawTensor x = RawTensor::FromVector<float>({1, -3, kNaN, 0.5f, -0.0f, 2}, {2, 3}).to(kGpu);
  EXPECT_EQ(ToCpu(Fp8Amax(x, Fp8Tiling::kTensor)).to_vector<float>(), std::vector<float>({3}));
  EXPECT_EQ(ToCpu(Fp8Amax(x, Fp8Tiling::k1x128)).to_vector<float>(), std::vector<float>({3, 2}));
  const RawTensor inf = RawTensor::FromVector<float>({kNaN, -kInf}, {1, 2}).to(kGpu);
  EXPECT_EQ(ToCpu(Fp8Amax(inf, Fp8Tiling::k128x128)).to_vector<float>(),
            std::vector<float>({kInf}));
  const RawTensor nan = RawTensor::FromVector<float>({kNaN, kNaN}, {1, 2}).to(kGpu);
  EXPECT_EQ(ToCpu(Fp8Amax(nan, Fp8Tiling::kTensor)).to_vector<float>(), std::vector<float>({0}));
}

TEST(CudaFp8KernelsTest, AmaxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    for (DType dtype : kInputs) {
      const RawTensor x = Input(c.rows, c.cols, dtype, seed++);
      const RawTensor gx = x.to(kGpu);
      for (Fp8Tiling tiling : kTilings) {
        EXPECT_TRUE(SameBytes(Fp8Amax(x, tiling), Fp8Amax(gx, tiling), Label(c, dtype, tiling)));
      }
    }
  }
  // Many blocks combining one per-tensor amax (atomicMax), the largest value in the last one.
  RawTensor big = Input(1024, 1000, kF32, 99);
  big.select(0, 1023).select(0, 999).fill_(7.0e37);
  for (Fp8Tiling tiling : kTilings) {
    EXPECT_TRUE(SameBytes(Fp8Amax(big, tiling), Fp8Amax(big.to(kGpu), tiling),
                          Label({1024, 1000}, kF32, tiling)));
  }
}

TEST(CudaFp8KernelsTest, ScaleMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const RawTensor amax = RawTensor::FromVector<float>(
      {0, kInf, kNaN, 1, 3.5f, 448, 1e-30f, 1e-45f, 1e30f, 57344, 2.5e-3f, 3.0e38f}, {3, 4});
  const RawTensor gamax = amax.to(kGpu);
  std::vector<Fp8ScaleOptions> options(5);
  options[1].fp8_max = 57344;
  options[2].amax_epsilon = 1e-3f;
  options[3].force_pow_2_scales = true;
  options[4].value_for_inf = 1e10f;
  options[4].force_pow_2_scales = true;
  for (size_t i = 0; i < options.size(); ++i) {
    const Fp8Scales cpu = Fp8ScaleFromAmax(amax, options[i]);
    const Fp8Scales gpu = Fp8ScaleFromAmax(gamax, options[i]);
    EXPECT_TRUE(SameBytes(cpu.scale, gpu.scale, absl::StrCat("scale, options ", i)));
    EXPECT_TRUE(SameBytes(cpu.scale_inv, gpu.scale_inv, absl::StrCat("scale_inv, options ", i)));
  }
}

TEST(CudaFp8KernelsTest, CastMatchesCpu) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    for (DType dtype : kInputs) {
      const RawTensor x = Input(c.rows, c.cols, dtype, seed++);
      const RawTensor gx = x.to(kGpu);
      for (Fp8Tiling tiling : kTilings) {
        for (DType format : {kF8E4M3, kF8E5M2}) {
          Fp8ScaleOptions o;
          o.fp8_max = format == kF8E4M3 ? 448.0f : 57344.0f;
          // TE's scales, then 4x them: the largest values of each tile saturate.
          const RawTensor scale = Fp8ScaleFromAmax(Fp8Amax(x, tiling), o).scale;
          for (const RawTensor& s : {scale, Mul(scale, RawTensor::Scalar(4.0))}) {
            for (bool extras : {false, true}) {
              const std::string label = absl::StrCat(Label(c, dtype, tiling), " -> ",
                                                     DTypeName(format), extras ? " +t +amax" : "");
              const Fp8CastResult cpu = Fp8Cast(x, s, tiling, format, extras, extras);
              const Fp8CastResult gpu = Fp8Cast(gx, s.to(kGpu), tiling, format, extras, extras);
              EXPECT_TRUE(SameBytes(cpu.data, gpu.data, label + " data"));
              ASSERT_EQ(cpu.data_t.defined(), extras);
              ASSERT_EQ(gpu.data_t.defined(), extras);
              ASSERT_EQ(gpu.amax.defined(), extras);
              if (extras) {
                EXPECT_TRUE(SameBytes(cpu.data_t, gpu.data_t, label + " data_t"));
                EXPECT_TRUE(SameBytes(cpu.amax, gpu.amax, label + " amax"));
                EXPECT_TRUE(SameBytes(Fp8Amax(x, tiling), gpu.amax, label + " amax = Fp8Amax"));
              }
            }
          }
        }
      }
    }
  }
}

// ---- GEMM against f64 ---------------------------------------------------------------------------

struct GemmShape {
  int64_t m, n, k;
  bool path_checked;  // the path must be PlanFp8Gemm's (else cuBLASLt may decline, e.g. too small)
};
// Multiples of 16 (cuBLASLt on sm_89/sm_90; k not a multiple of 128 in the second: a partial last
// block) and shapes that are not (the bf16 fallback).
constexpr GemmShape kGemmShapes[] = {{64, 32, 256, true},
                                     {32, 48, 400, true},
                                     {16, 16, 16, false},
                                     {33, 17, 200, true},
                                     {5, 130, 129, true}};
constexpr std::pair<Fp8Tiling, Fp8Tiling> kGemmTilings[] = {
    {Fp8Tiling::kTensor, Fp8Tiling::kTensor},
    {Fp8Tiling::k1x128, Fp8Tiling::k1x128},
    {Fp8Tiling::k1x128, Fp8Tiling::k128x128},
    {Fp8Tiling::k128x128, Fp8Tiling::k1x128},
    {Fp8Tiling::k128x128, Fp8Tiling::k128x128}};
constexpr std::pair<DType, DType> kGemmFormats[] = {
    {kF8E4M3, kF8E4M3}, {kF8E4M3, kF8E5M2}, {kF8E5M2, kF8E4M3}};

struct GemmOperands {
  RawTensor a, a_scale_inv, b, b_scale_inv, bias;  // on the CPU
};

// FP8 a [m, k], b [n, k] and their scale_inv grids. integers: values in -4..4 (exact in both
// formats) and power-of-two scales 2^-2..2^1, so that every partial sum is exact in f32 and in
// the tensor cores' accumulators; else normal values and scales in [0.05, 2).
GemmOperands MakeGemmOperands(const GemmShape& s, std::pair<Fp8Tiling, Fp8Tiling> tilings,
                              std::pair<DType, DType> formats, DType out, bool bias, bool integers,
                              uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4), exponent(-2, 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.05f, 2.0f);
  auto values = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = integers ? static_cast<float>(small(rng)) : normal(rng) * 8.0f;
    return v;
  };
  auto scales = [&](int64_t rows, Fp8Tiling tiling) {
    const Fp8Tile g = Fp8GridOf(rows, s.k, tiling);
    std::vector<float> v(g.rows * g.cols);
    for (float& x : v) x = integers ? std::ldexp(1.0f, exponent(rng)) : uniform(rng);
    return RawTensor::FromVector<float>(v, {g.rows, g.cols});
  };
  GemmOperands o;
  o.a = RawTensor::FromVector<float>(values(s.m * s.k), {s.m, s.k}).to(formats.first);
  o.b = RawTensor::FromVector<float>(values(s.n * s.k), {s.n, s.k}).to(formats.second);
  o.a_scale_inv = scales(s.m, tilings.first);
  o.b_scale_inv = scales(s.n, tilings.second);
  if (bias) o.bias = RawTensor::FromVector<float>(values(s.n), {s.n}).to(out);
  return o;
}

// The contract's sum in f64: per 128-wide k slice (one slice per tensor), the exact dot product
// times the two tiles' scale_invs, summed, plus the bias. *abs: the same with absolute values
// (for the error bound).
std::vector<double> ReferenceGemm(const GemmOperands& o, Fp8Tiling at, Fp8Tiling bt,
                                  std::vector<double>* abs) {
  const int64_t m = o.a.size(0), k = o.a.size(1), n = o.b.size(0);
  const std::vector<double> a = o.a.to_vector<double>(), b = o.b.to_vector<double>();
  const std::vector<double> sa = o.a_scale_inv.to_vector<double>();
  const std::vector<double> sb = o.b_scale_inv.to_vector<double>();
  const std::vector<double> bias =
      o.bias.defined() ? o.bias.to_vector<double>() : std::vector<double>(n, 0.0);
  const int64_t slice = at == Fp8Tiling::kTensor ? k : kFp8BlockSize;
  const int64_t slices = (k + slice - 1) / slice;
  auto scale = [&](const std::vector<double>& g, Fp8Tiling t, int64_t row, int64_t s) {
    if (t == Fp8Tiling::kTensor) return g[0];
    const int64_t grid_row = t == Fp8Tiling::k1x128 ? row : row / kFp8BlockSize;
    return g[grid_row * slices + s];
  };
  std::vector<double> out(m * n);
  abs->assign(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double total = bias[j], total_abs = std::fabs(bias[j]);
      for (int64_t s = 0; s < slices; ++s) {
        double dot = 0, dot_abs = 0;
        for (int64_t l = s * slice; l < std::min(k, (s + 1) * slice); ++l) {
          dot += a[i * k + l] * b[j * k + l];
          dot_abs += std::fabs(a[i * k + l] * b[j * k + l]);
        }
        const double f = scale(sa, at, i, s) * scale(sb, bt, j, s);
        total += dot * f;
        total_abs += dot_abs * std::fabs(f);
      }
      out[i * n + j] = total;
      (*abs)[i * n + j] = total_abs;
    }
  }
  return out;
}

int DeviceSm() {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  return major * 10 + minor;
}

// Runs every shape, tiling pair, format pair, out dtype and bias choice; check(out, reference,
// abs, path, label) judges each result. Also checks that the GEMM took the path PlanFp8Gemm
// predicts (cuBLASLt may decline a case: the test then says why, since the fallback is slower).
template <typename Check>
void ForEachGemm(bool integers, const Check& check) {
  const int sm = DeviceSm();
  uint32_t seed = integers ? 1000 : 2000;
  for (const GemmShape& s : kGemmShapes) {
    for (const auto& tilings : kGemmTilings) {
      for (const auto& formats : kGemmFormats) {
        for (DType out : {kF32, kBF16, kF16}) {
          for (bool bias : {false, true}) {
            const GemmOperands o =
                MakeGemmOperands(s, tilings, formats, out, bias, integers, seed++);
            const std::string label = absl::StrCat(
                "[", s.m, ", ", s.n, ", ", s.k, "] ", DTypeName(formats.first), " (",
                Fp8TilingName(tilings.first), ") x ", DTypeName(formats.second), " (",
                Fp8TilingName(tilings.second), ") -> ", DTypeName(out), bias ? " + bias" : "");
            const RawTensor got = Fp8Gemm(o.a.to(kGpu), o.a_scale_inv.to(kGpu), tilings.first,
                                          o.b.to(kGpu), o.b_scale_inv.to(kGpu), tilings.second,
                                          bias ? o.bias.to(kGpu) : RawTensor(), out);
            const Fp8GemmPlan ran = cuda::LastFp8GemmPlan();
            const Fp8GemmPlan planned =
                PlanFp8Gemm(sm, s.m, s.n, s.k, formats.first, formats.second, tilings.first,
                            tilings.second, out, bias, /*aligned=*/true);
            if (s.path_checked) {
              EXPECT_EQ(cuda::Fp8GemmPathName(ran.path), cuda::Fp8GemmPathName(planned.path))
                  << label << ": " << ran.reason;
            }
            std::vector<double> abs;
            const std::vector<double> ref = ReferenceGemm(o, tilings.first, tilings.second, &abs);
            check(ToCpu(got), ref, abs, ran.path,
                  absl::StrCat(label, " [", cuda::Fp8GemmPathName(ran.path), "]"));
          }
        }
      }
    }
  }
}

// Integer inputs and power-of-two scales: the exact sum, rounded once to out's dtype, on every
// path (any summation order and the tensor cores' accumulators are exact here).
TEST(CudaFp8KernelsTest, GemmIsExactForExactSums) {
  SKIP_WITHOUT_GPU();
  ForEachGemm(true, [](const RawTensor& got, const std::vector<double>& ref,
                       const std::vector<double>&, Fp8GemmPlan::Path, const std::string& label) {
    const RawTensor expected = RawTensor::FromVector<double>(ref, got.shape()).to(got.dtype());
    EXPECT_TRUE(SameBytes(expected, got, label));
  });
}

// General inputs and scales: within the bound of f32 accumulation of exact products. A sum of k
// products has error at most (k - 1) u sum|p| in any order (u = 2^-24); scaling each slice sum by
// the f32 product of two scale_invs adds 2u, the L slice sums L u, the bias u; then out's
// rounding (u_out = 2^-8 for bf16, 2^-11 for f16) of the f32 result. That bound holds for the
// bf16 fallback (cuBLASLt's bf16 GEMM accumulates in f32).
//
// cuBLASLt's FP8 path gets 2^-8 sum|p| more: Hopper's (and Ada's) FP8 MMA instructions do not
// accumulate in f32 but align the products to the largest exponent and keep about 13 mantissa
// bits, truncating (DeepSeek-V3's report, section 3.3.2, and SageAttention2 measured it);
// cuBLASLt's default (FAST_ACCUM off) adds those partial sums into f32 registers at intervals of
// at most 128 k, so each interval contributes up to about 2^-13 of its largest product per
// product. 2^-8 is an assumption to be confirmed on a GPU: the summary line this test prints
// gives, per path, the largest |error| / f32 bound, which shows how far from f32 accumulation the
// tensor cores really are (1 or less: as exact as f32).
TEST(CudaFp8KernelsTest, GemmMatchesF64WithinAccumulationBounds) {
  SKIP_WITHOUT_GPU();
  double worst_f32_ratio[2] = {0, 0};  // per path: the largest |error| / f32 bound
  ForEachGemm(
      false, [&](const RawTensor& got, const std::vector<double>& ref,
                 const std::vector<double>& abs, Fp8GemmPlan::Path path, const std::string& label) {
        const std::vector<double> v = got.to_vector<double>();
        const double u_out = got.dtype() == kBF16  ? std::ldexp(1.0, -8)
                             : got.dtype() == kF16 ? std::ldexp(1.0, -11)
                                                   : 0;
        const bool tensor_cores = path == Fp8GemmPlan::Path::kCublasLt;
        int64_t bad = 0, first = -1;
        double worst = 0;
        for (size_t i = 0; i < v.size(); ++i) {
          // k + L + 4 roundings at most: 600 covers the largest k (400) and its 4 slices.
          const double f32_error = 600 * std::ldexp(1.0, -24) * abs[i];
          const double acc_error = f32_error + (tensor_cores ? std::ldexp(1.0, -8) * abs[i] : 0.0);
          const double out_error = u_out * (std::fabs(ref[i]) + acc_error) +
                                   (got.dtype() == kF16 ? std::ldexp(1.0, -24) : 0.0);
          const double err = std::fabs(v[i] - ref[i]);
          const double bound = acc_error + out_error;
          if (bound > 0) worst = std::max(worst, err / bound);
          if (f32_error + out_error > 0) {
            double& w = worst_f32_ratio[tensor_cores ? 0 : 1];
            w = std::max(w, err / (f32_error + out_error));
          }
          if (!(err <= bound)) {
            if (first < 0) first = static_cast<int64_t>(i);
            ++bad;
          }
        }
        EXPECT_EQ(bad, 0) << label << ": first at " << first << ": got " << v[first] << ", f64 "
                          << ref[first] << ", |error| / bound = " << worst;
      });
  std::cout << "fp8_gemm: largest |error| / f32-accumulation bound: cublaslt " << worst_f32_ratio[0]
            << ", bf16_fallback " << worst_f32_ratio[1] << std::endl;
}

TEST(CudaFp8KernelsTest, GemmArgumentErrors) {
  SKIP_WITHOUT_GPU();
  const RawTensor a = RawTensor::Zeros({16, 32}, kF8E5M2, kGpu);
  const RawTensor b = RawTensor::Zeros({16, 32}, kF8E5M2, kGpu);
  const RawTensor s = RawTensor::Ones({1, 1}, kF32, kGpu);
  const RawTensor out = RawTensor::Empty({16, 16}, kF32, kGpu);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { cuda::Fp8Gemm(out, a, s, Fp8Tiling::kTensor, b, s, Fp8Tiling::kTensor, RawTensor()); },
      "fp8_gemm: a and b are both f8e5m2 (FP8 tensor cores take e4m3 x e4m3, e4m3 x e5m2 and "
      "e5m2 x e4m3)"));
  const RawTensor a4 = RawTensor::Zeros({16, 32}, kF8E4M3, kGpu);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { cuda::Fp8Gemm(out, a4, s, Fp8Tiling::kTensor, b, s, Fp8Tiling::k1x128, RawTensor()); },
      "fp8_gemm: the tiles along k must agree: a has tensor scales and b 1x128"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { cuda::Fp8Gemm(out, a4, s, Fp8Tiling::k1x128, b, s, Fp8Tiling::k1x128, RawTensor()); },
      "fp8_gemm: a_scale_inv must be a contiguous f32 grid of 16 x 1 (1x128 tiles) on cuda:0, "
      "got f32 [1, 1] on cuda:0"));
}

}  // namespace
}  // namespace tg
