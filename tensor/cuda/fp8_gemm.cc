// Fp8Gemm of the kernel list on CUDA: cuBLASLt's FP8 matmul where it applies, else the exact bf16
// fallback (tensor/cuda/fp8.h describes both paths and when each runs).
//
// Mapping to cuBLASLt (column-major, as in matmul.cc): out [m, n] row-major is the column-major
// D [n, m]; cuBLASLt's A is our b ([n, k] row-major = column-major [k, n], ld k, transa = T) and
// its B is our a ([m, k] row-major = column-major [k, m], ld k, transb = N): the "TN" layout that
// FP8 tensor cores require on sm_89/sm_90, with no copy. So cuBLASLt's M is our n, its N our m,
// and CUBLASLT_MATMUL_DESC_A_SCALE_POINTER takes b's scale_inv, B_SCALE_POINTER a's.
//
// Scales: per-tensor, the scale pointers are the two f32 scale_inv scalars on the device
// (cuBLASLt's D = scale_A * scale_B * sum). Block scaling (sm_90, cuBLAS 12.9+): the scale mode
// of each operand is CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for our 1x128 tiles (scales
// [rows, L] stored with the non-k dim contiguous, so our row-major grid is transposed) and
// BLK128x128_32F for 128x128 tiles (stored k-major with a column stride that is a multiple of 4,
// so our grid's rows are padded to a multiple of 4); Fp8ScalesForCublasLt writes both layouts.
// cuBLASLt then sums each 128-wide k block, scales it by the two blocks' factors and accumulates
// in f32: the kernel list's rule.
//
// Accumulation: FAST_ACCUM stays off (cuBLASLt's default, TE's choice for gradients): the FP8
// MMA instructions of Ada and Hopper accumulate in about 13 mantissa bits (products aligned to
// the largest exponent and truncated; measured by DeepSeek-V3 and SageAttention2, not documented
// by NVIDIA), and cuBLASLt then promotes their partial sums to f32 registers at intervals along k.
// So this path is f32 accumulation between those intervals only: it differs from the contract's
// f32 sum by more than reordering (tests/tensor/cuda/fp8_kernels_test bounds it and prints how
// much); the bf16 fallback is f32 accumulation throughout. The FP8 output amax (AMAX_D_POINTER) is
// not used: the contract's outputs are f32/bf16/f16, whose amax no recipe reads.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/fp8.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/lt_desc.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tg::cuda {
namespace {

// As matmul.cc: NVIDIA recommends 32 MiB of workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

thread_local Fp8GemmPlan last_plan;

bool IsFp8(DType d) { return d == kF8E4M3 || d == kF8E5M2; }

cudaDataType LtType(DType d) {
  switch (d) {
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kF8E5M2:
      return CUDA_R_8F_E5M2;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

int32_t LtScaleMode(Fp8Tiling t) {
  switch (t) {
    case Fp8Tiling::k1x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Tiling::k128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case Fp8Tiling::kTensor:
      break;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

int ComputeCapability(int device) {
  int major = 0, minor = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// The largest power of two (at most 256) dividing the address: cuBLASLt may pick kernels that
// rely on it, so it is part of the algorithm cache's key.
int64_t AlignmentOf(const void* p) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256;
  return static_cast<int64_t>(bits & (~bits + 1));
}

LayoutDesc MakeLayout(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, type, rows, cols, ld));
  return LayoutDesc(raw);
}

LtAlgoCache& AlgoCache() {
  static auto* cache = new LtAlgoCache;
  return *cache;
}

// One cuBLASLt FP8 call: d [m, n] (d_dtype) = a @ b^T with the given scale pointers (per-tensor
// scalars, or block scales already in cuBLASLt's layouts) and an optional bias epilogue (bias of
// d's dtype). Returns false, with nothing enqueued and the reason in *why, when cuBLASLt has no
// algorithm.
bool RunLtFp8(int device, void* d, DType d_dtype, const RawTensor& a, const void* a_scale,
              Fp8Tiling a_tiling, const RawTensor& b, const void* b_scale, Fp8Tiling b_tiling,
              const void* bias, std::string* why) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const bool block = a_tiling != Fp8Tiling::kTensor;
  const cublasLtEpilogue_t epilogue =
      bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  MatmulDesc desc(raw_desc);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  // cuBLASLt's A is our b, its B our a.
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale);
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale);
  if (block) {
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, LtScaleMode(b_tiling));
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, LtScaleMode(a_tiling));
  }
  SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (bias != nullptr) {
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    SetDesc(raw_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(LtType(d_dtype)));
  }
  const LayoutDesc la = MakeLayout(LtType(b.dtype()), k, n, k);
  const LayoutDesc lb = MakeLayout(LtType(a.dtype()), k, m, k);
  const LayoutDesc ld = MakeLayout(LtType(d_dtype), n, m, n);
  const cublasLtHandle_t handle = CublasLtHandle(device);

  const std::vector<int64_t> key = {device,
                                    m,
                                    n,
                                    k,
                                    static_cast<int64_t>(a.dtype()),
                                    static_cast<int64_t>(b.dtype()),
                                    static_cast<int64_t>(d_dtype),
                                    static_cast<int64_t>(a_tiling),
                                    static_cast<int64_t>(b_tiling),
                                    epilogue,
                                    AlignmentOf(a.raw_data()),
                                    AlignmentOf(b.raw_data()),
                                    AlignmentOf(d),
                                    AlignmentOf(bias)};
  LtAlgo algo{};
  if (const std::optional<LtAlgo> cached = AlgoCache().Find(key)) {
    algo = *cached;
  } else {
    cublasLtMatmulPreference_t raw_pref = nullptr;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
    PreferenceDesc pref(raw_pref);
    const uint64_t max_workspace = kWorkspaceBytes;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    // Split-K partial sums in f32 only (matmul.cc says why).
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        raw_pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
    cublasLtMatmulHeuristicResult_t result = {};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, raw_desc, la.get(), lb.get(), ld.get(), ld.get(), raw_pref, 1, &result, &count);
    // NOT_SUPPORTED (and INVALID_VALUE, which cuBLASLt gives for a scale mode or epilogue this
    // architecture lacks) mean "no algorithm here": the caller falls back.
    if (status != CUBLAS_STATUS_SUCCESS || count == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      *why = absl::StrCat("cuBLASLt has no FP8 algorithm for m ", m, ", n ", n, ", k ", k, ", ",
                          DTypeName(a.dtype()), " x ", DTypeName(b.dtype()), " -> ",
                          DTypeName(d_dtype), ", scales ", Fp8TilingName(a_tiling), " x ",
                          Fp8TilingName(b_tiling), bias != nullptr ? ", bias epilogue" : "",
                          " (status ", cublasLtGetStatusName(status), ", ", count, " results)");
      return false;
    }
    algo = {result.algo, result.workspaceSize};
    AlgoCache().Put(key, algo);
  }
  void* workspace = algo.workspace > 0 ? Workspace(kWorkspaceBytes, device) : nullptr;
  const size_t workspace_bytes = algo.workspace > 0 ? kWorkspaceBytes : 0;
  const float alpha = 1.0f, beta = 0.0f;
  TG_CUBLAS_CHECK(cublasLtMatmul(handle, raw_desc, &alpha, b.raw_data(), la.get(), a.raw_data(),
                                 lb.get(), &beta, d, ld.get(), d, ld.get(), &algo.algo, workspace,
                                 workspace_bytes, CurrentStream(device)));
  return true;
}

// The bf16 fallback: exact decoding, bf16 GEMMs with f32 output and accumulation, the scales
// applied to f32 partial sums (per tensor: one product; per block: one per 128-wide k slice).
void Bf16Fallback(const RawTensor& out, const RawTensor& a, const RawTensor& a_scale_inv,
                  Fp8Tiling a_tiling, const RawTensor& b, const RawTensor& b_scale_inv,
                  Fp8Tiling b_tiling, const RawTensor& bias) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const Device device = out.device();
  RawTensor a16 = RawTensor::Empty({m, k}, kBF16, device);
  RawTensor b16 = RawTensor::Empty({n, k}, kBF16, device);
  Copy(a16, a);  // every e4m3 / e5m2 value is a bf16: exact
  Copy(b16, b);
  const RawTensor acc = out.dtype() == kF32 ? out : RawTensor::Empty({m, n}, kF32, device);
  if (a_tiling == Fp8Tiling::kTensor) {
    MatmulEx(acc, a16, false, b16, true, Epilogue::kNone, RawTensor(), RawTensor());
    Fp8AccumulateSlice(acc, acc, a_scale_inv, a_tiling, b_scale_inv, b_tiling, 0, true);
  } else {
    const int64_t slices = (k + kFp8BlockSize - 1) / kFp8BlockSize;
    const RawTensor partial = slices == 1 ? acc : RawTensor::Empty({m, n}, kF32, device);
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t begin = s * kFp8BlockSize;
      const int64_t width = std::min<int64_t>(kFp8BlockSize, k - begin);
      MatmulEx(partial, a16.narrow(1, begin, width), false, b16.narrow(1, begin, width), true,
               Epilogue::kNone, RawTensor(), RawTensor());
      Fp8AccumulateSlice(acc, partial, a_scale_inv, a_tiling, b_scale_inv, b_tiling, s, s == 0);
    }
  }
  if (bias.defined() || !acc.shares_storage(out)) FinishFp8Gemm(out, acc, bias);
}

void CheckScaleGrid(const char* op, const char* what, const RawTensor& t, int64_t rows, int64_t k,
                    Fp8Tiling tiling, const RawTensor& out) {
  const Fp8Tile grid = Fp8GridOf(rows, k, tiling);
  TG_CHECK(t.defined() && t.device() == out.device() && t.dtype() == kF32 && t.is_contiguous() &&
               t.numel() == grid.rows * grid.cols,
           op, ": ", what, " must be a contiguous f32 grid of ", grid.rows, " x ", grid.cols, " (",
           Fp8TilingName(tiling), " tiles) on ", out.device().ToString(), ", got ",
           t.defined() ? absl::StrCat(DTypeName(t.dtype()), " ", ShapeToString(t.shape()), " on ",
                                      t.device().ToString())
                       : std::string("an undefined tensor"));
}

}  // namespace

const char* Fp8GemmPathName(Fp8GemmPlan::Path path) {
  return path == Fp8GemmPlan::Path::kCublasLt ? "cublaslt" : "bf16_fallback";
}

Fp8GemmPlan PlanFp8Gemm(int sm, int64_t m, int64_t n, int64_t k, DType a_dtype, DType b_dtype,
                        Fp8Tiling a_tiling, Fp8Tiling b_tiling, DType out_dtype, bool has_bias,
                        bool aligned) {
  Fp8GemmPlan plan;
  const bool block = a_tiling != Fp8Tiling::kTensor;
  auto fallback = [&](std::string reason) {
    plan.reason = std::move(reason);
    return plan;
  };
  if (sm < 89) {
    return fallback(absl::StrCat("FP8 tensor cores need sm_89 or newer, this GPU is sm_", sm));
  }
  if (a_dtype == kF8E5M2 && b_dtype == kF8E5M2) {
    return fallback("cuBLASLt has no e5m2 x e5m2 FP8 matmul");
  }
  if (block && sm != 90) {
    return fallback(
        absl::StrCat("cuBLASLt's 128-element block scaling runs on sm_90 only, this "
                     "GPU is sm_",
                     sm));
  }
  if (a_tiling == Fp8Tiling::k128x128 && b_tiling == Fp8Tiling::k128x128) {
    return fallback("cuBLASLt has no 128x128 x 128x128 block scaling");
  }
  if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0) {
    return fallback(absl::StrCat("cuBLASLt's FP8 matmul needs m, n, k multiples of 16, got m ", m,
                                 ", n ", n, ", k ", k));
  }
  if (!aligned) return fallback("cuBLASLt's FP8 matmul needs 16-byte aligned operands");
  plan.path = Fp8GemmPlan::Path::kCublasLt;
  plan.block_scaled = block;
  // An f32 D takes a bf16 bias in cuBLASLt's FP8 kernels, which would round ours: the bias is
  // added by FinishFp8Gemm instead (the same f32 sum, rounded once).
  plan.bias_epilogue = has_bias && out_dtype != kF32;
  return plan;
}

Fp8GemmPlan LastFp8GemmPlan() { return last_plan; }

void Fp8Gemm(const RawTensor& out, const RawTensor& a, const RawTensor& a_scale_inv,
             Fp8Tiling a_tiling, const RawTensor& b, const RawTensor& b_scale_inv,
             Fp8Tiling b_tiling, const RawTensor& bias) {
  const char* op = "fp8_gemm";
  TG_CHECK(out.defined() && a.defined() && b.defined(), op, ": out, a and b must be defined");
  TG_CHECK(out.device().is_cuda(), op, ": out is on ", out.device().ToString(),
           ", expected a CUDA device");
  TG_CHECK(a.device() == out.device() && b.device() == out.device(), op, ": a is on ",
           a.device().ToString(), " and b on ", b.device().ToString(), " but out is on ",
           out.device().ToString());
  TG_CHECK(IsFp8(a.dtype()) && IsFp8(b.dtype()), op, ": a and b must be f8e4m3 or f8e5m2, got ",
           DTypeName(a.dtype()), " and ", DTypeName(b.dtype()));
  TG_CHECK(!(a.dtype() == kF8E5M2 && b.dtype() == kF8E5M2), op,
           ": a and b are both f8e5m2 (FP8 tensor cores take e4m3 x e4m3, e4m3 x e5m2 and "
           "e5m2 x e4m3)");
  TG_CHECK(out.dtype() == kF32 || out.dtype() == kBF16 || out.dtype() == kF16, op,
           ": out must be f32, bf16 or f16, got ", DTypeName(out.dtype()));
  TG_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.size(1) == b.size(1) &&
               out.size(0) == a.size(0) && out.size(1) == b.size(0),
           op, ": out ", ShapeToString(out.shape()), ", a ", ShapeToString(a.shape()), ", b ",
           ShapeToString(b.shape()), " do not form out [m, n] = a [m, k] @ b [n, k]^T");
  TG_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(), op,
           ": out, a and b must be contiguous");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  TG_CHECK(k > 0, op, ": k is 0 (a ", ShapeToString(a.shape()), ")");
  TG_CHECK((a_tiling == Fp8Tiling::kTensor) == (b_tiling == Fp8Tiling::kTensor), op,
           ": the tiles along k must agree: a has ", Fp8TilingName(a_tiling), " scales and b ",
           Fp8TilingName(b_tiling));
  CheckScaleGrid(op, "a_scale_inv", a_scale_inv, m, k, a_tiling, out);
  CheckScaleGrid(op, "b_scale_inv", b_scale_inv, n, k, b_tiling, out);
  if (bias.defined()) {
    TG_CHECK(bias.device() == out.device() && bias.dtype() == out.dtype() && bias.is_contiguous() &&
                 bias.shape() == Shape({n}),
             op, ": bias must be a contiguous ", DTypeName(out.dtype()), " [", n, "] on ",
             out.device().ToString(), ", got ", DTypeName(bias.dtype()), " ",
             ShapeToString(bias.shape()), " on ", bias.device().ToString());
  }
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (m == 0 || n == 0) {
    last_plan = Fp8GemmPlan();
    last_plan.reason = "empty out";
    return;
  }
  bool aligned = true;
  for (const RawTensor* t : {&out, &a, &b, &a_scale_inv, &b_scale_inv, &bias}) {
    if (t->defined()) aligned = aligned && AlignmentOf(t->raw_data()) >= 16;
  }
  Fp8GemmPlan plan = PlanFp8Gemm(ComputeCapability(device), m, n, k, a.dtype(), b.dtype(), a_tiling,
                                 b_tiling, out.dtype(), bias.defined(), aligned);
  if (plan.path == Fp8GemmPlan::Path::kCublasLt) {
    RawTensor a_scales = a_scale_inv, b_scales = b_scale_inv;
    if (plan.block_scaled) {
      a_scales = Fp8ScalesForCublasLt(
          a_scale_inv.view(Shape({Fp8GridOf(m, k, a_tiling).rows, Fp8GridOf(m, k, a_tiling).cols})),
          a_tiling);
      b_scales = Fp8ScalesForCublasLt(
          b_scale_inv.view(Shape({Fp8GridOf(n, k, b_tiling).rows, Fp8GridOf(n, k, b_tiling).cols})),
          b_tiling);
    }
    std::string why;
    // 1. D = out, with the bias epilogue for a bf16/f16 out.
    if (RunLtFp8(device, out.raw_data(), out.dtype(), a, a_scales.raw_data(), a_tiling, b,
                 b_scales.raw_data(), b_tiling, plan.bias_epilogue ? bias.raw_data() : nullptr,
                 &why)) {
      if (bias.defined() && !plan.bias_epilogue) FinishFp8Gemm(out, out, bias);  // f32 out
      last_plan = plan;
      return;
    }
    // 2. The bias epilogue declined: an f32 D, then the bias and one rounding.
    if (plan.bias_epilogue) {
      const RawTensor acc = RawTensor::Empty({m, n}, kF32, out.device());
      std::string why_f32;
      if (RunLtFp8(device, acc.raw_data(), kF32, a, a_scales.raw_data(), a_tiling, b,
                   b_scales.raw_data(), b_tiling, nullptr, &why_f32)) {
        FinishFp8Gemm(out, acc, bias);
        plan.bias_epilogue = false;
        plan.reason = why;
        last_plan = plan;
        return;
      }
      why = absl::StrCat(why, "; ", why_f32);
    }
    // 3. No FP8 algorithm at all.
    plan = Fp8GemmPlan();
    plan.reason = why;
  }
  Bf16Fallback(out, a, a_scale_inv, a_tiling, b, b_scale_inv, b_tiling, bias);
  last_plan = plan;
}

}  // namespace tg::cuda
