// The FP8 entries of the kernel list on CUDA (Fp8Amax, Fp8Scale, Fp8Cast: fp8.cu; Fp8Gemm:
// fp8_gemm.cc), and the host-side pieces they share: the choice of Fp8Gemm's path, which needs no
// GPU and is tested without one (tests/tensor/cuda:fp8_kernels_test), and the kernels Fp8Gemm's
// fallback and its cuBLASLt path launch around the library call.
//
// Fp8Gemm's paths (PlanFp8Gemm says which, and why):
//   - cuBLASLt FP8 matmul (tensor cores; the "TN" layout: our a [m, k] and b [n, k] row-major are
//     both k-major, which is cuBLASLt's transa = T for b and transb = N for a):
//       per-tensor scales (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER = the scale_inv scalars) on
//       sm_89 and newer; block scales (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE = VEC128_32F for
//       1x128, BLK128x128_32F for 128x128) on sm_90 only (cuBLAS 12.9+: Hopper is the only
//       architecture with these modes), except 128x128 x 128x128, which cuBLASLt does not offer.
//       m, n and k must be multiples of 16 and every operand 16-byte aligned (cuBLASLt's FP8
//       requirements). The FP8 MMA accumulates in about 13 mantissa bits between cuBLASLt's
//       promotions to f32 (fp8_gemm.cc), so this path is close to, not exactly, f32 accumulation.
//   - otherwise the bf16 fallback: every e4m3/e5m2 value is exactly a bf16, so the operands are
//     decoded to bf16 (exact) and multiplied by the bf16 cuBLASLt GEMM with f32 output and f32
//     accumulation; per-tensor, the f32 product is then multiplied by a_scale_inv * b_scale_inv;
//     per block, one bf16 GEMM per 128-wide slice of k gives the slice's f32 partial sums, which
//     a kernel multiplies by the two tiles' scale_invs and adds in f32 (the kernel list's rule).
// Either way the bias is added to the f32 result, which is rounded once to out's dtype: through
// CUBLASLT_EPILOGUE_BIAS for a bf16/f16 out (cuBLASLt's FP8 kernels take a bias of D's type
// there), and through FinishFp8Gemm for an f32 out (their bias for an f32 D is bf16, which would
// round ours) or where cuBLASLt declines the bias epilogue (then D is an f32 buffer).
#ifndef TAPEGRAD_TENSOR_CUDA_FP8_H_
#define TAPEGRAD_TENSOR_CUDA_FP8_H_

#include <cstdint>
#include <string>

#include "tensor/dtype.h"
#include "tensor/fp8_scale.h"
#include "tensor/tensor.h"

namespace tg::cuda {

struct Fp8GemmPlan {
  enum class Path { kCublasLt, kBf16Fallback };
  Path path = Path::kBf16Fallback;
  bool block_scaled = false;   // cuBLASLt's VEC128_32F / BLK128x128_32F scale modes
  bool bias_epilogue = false;  // CUBLASLT_EPILOGUE_BIAS writes out directly
  std::string reason;          // why the fallback (empty for cuBLASLt)
};

// "cublaslt" or "bf16_fallback".
const char* Fp8GemmPathName(Fp8GemmPlan::Path path);

// The path of Fp8Gemm for out [m, n] = a [m, k] @ b [n, k]^T on a GPU of compute capability
// `sm` (major * 10 + minor: 89 for Ada, 90 for Hopper), before asking cuBLASLt: the library may
// still find no algorithm, and Fp8Gemm then falls back (with an f32 D first where the bias
// epilogue was declined). `aligned`: every operand pointer is 16-byte aligned.
Fp8GemmPlan PlanFp8Gemm(int sm, int64_t m, int64_t n, int64_t k, DType a_dtype, DType b_dtype,
                        Fp8Tiling a_tiling, Fp8Tiling b_tiling, DType out_dtype, bool has_bias,
                        bool aligned);

// The path the last Fp8Gemm call on this thread took (cuBLASLt's decline included), for tests.
Fp8GemmPlan LastFp8GemmPlan();

// ---- Kernels of fp8.cu that fp8_gemm.cc launches ------------------------------------------

// Block scale_inv grids in cuBLASLt's layouts (dst: a new f32 tensor on src's device).
// VEC128_32F: src [rows, L] row-major -> dst [L, rows] (the operand's non-k dim contiguous).
// BLK128x128_32F: src [row_blocks, L] -> dst [row_blocks, ceil4(L)] (k-major, the stride
// between row blocks a multiple of 4, the padding zero).
RawTensor Fp8ScalesForCublasLt(const RawTensor& src, Fp8Tiling tiling);

// acc [m, n] (f32) = (first ? 0 : acc) + partial [m, n] (f32) * (a_scale_inv[a tile of (i, slice)]
// * b_scale_inv[b tile of (j, slice)]), the scale grids of a_tiling / b_tiling with `slices`
// columns (1 for kTensor). acc and partial may be the same tensor.
void Fp8AccumulateSlice(const RawTensor& acc, const RawTensor& partial,
                        const RawTensor& a_scale_inv, Fp8Tiling a_tiling,
                        const RawTensor& b_scale_inv, Fp8Tiling b_tiling, int64_t slice,
                        bool first);

// out [m, n] (f32, bf16 or f16) = acc [m, n] (f32) + bias [n] (out's dtype, or undefined), added
// in f32 and rounded once (acc may be out when out is f32).
void FinishFp8Gemm(const RawTensor& out, const RawTensor& acc, const RawTensor& bias);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_FP8_H_
