// The CPU kernels' vectorised float math, through Highway: each function is compiled for every
// x86 instruction set Highway targets (SSE4, AVX2, AVX-512, ...) and runs the best one the
// running CPU has (chosen once, at the first call), so no build flag assumes the build machine's
// CPU. Every element of an array, the tail included, goes through the same vector instructions:
// on one machine a value gets the same result whatever the array's length, alignment or thread
// split, so kernels that share these functions round alike (a fused Linear + GELU and the
// composed GeluTanh agree bit for bit). Machines with different instruction sets may differ in
// the last bits (FMA or not inside tanh's polynomial).
//
//   ExpF32(x, y, n);             // y[i] = exp(x[i]), at most 1 ulp from the exact value
//   TanhF32(x, y, n);            // y[i] = tanh(x[i]), at most 4 ulp from the exact value
//   GeluTanhF32(x, y, n);        // y[i] = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   GeluTanhGradF32(x, y, n);    // y[i] = d gelu_tanh / dx at x[i]
//   float m = MaxF32(x, n);      // the largest x[i], or the first NaN; -inf when n == 0
//
// x and y may be the same array (in place); otherwise they must not overlap.
#ifndef TAPEGRAD_TENSOR_CPU_VEC_MATH_H_
#define TAPEGRAD_TENSOR_CPU_VEC_MATH_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/half.h"

namespace tg::cpu {

void ExpF32(const float* x, float* y, int64_t n);
float MaxF32(const float* x, int64_t n);
// x[i] *= s for i < n, each an f32 product; with check_finite, returns whether any x[i] was inf or
// NaN before (else false).
bool ScaleF32(float* x, int64_t n, float s, bool check_finite);
// Max pooling's 2 x 2 windows at stride 2 along an output row of ow windows: window ox holds
// r0[2 ox], r0[2 ox + 1], r1[2 ox], r1[2 ox + 1], offsets 0, 1, below, below + 1 from its corner.
// value[ox] is its maximum and tap[ox] that element's offset, the elements taken in that order,
// a later one winning when larger or NaN (the first of equal maxima; the first NaN).
void MaxPool2x2RowF32(const float* r0, const float* r1, int64_t ow, int32_t below, float* value,
                      int32_t* tap);

// Sums of n terms in f64, in the order of tensor/cpu/rows.h's SumF64 (eight interleaved partial
// sums) and with its bits on every target: the terms are double(x[i]), double(x[i] * y[i]) (the
// product rounded to f32 first) and (double(x[i]) - mean)^2.
double SumAsF64(const float* x, int64_t n);
double SumProductsAsF64(const float* x, const float* y, int64_t n);
double SumSquaredDeviationsF64(const float* x, int64_t n, double mean);
// col[j] += double(x[r * stride + j]) for every row r < rows in order, j < cols: the column sums
// of a [rows, cols] block with row stride `stride` (bias gradients), in f64.
void AddColumnsToF64(const float* x, int64_t rows, int64_t stride, int64_t cols, double* col);
// Layer norm's parameter gradients over a [rows, cols] block of x and the output gradient g (row
// stride `stride`): for every column j, rows in order, gw[j] += double(g * ((x - mean[r]) *
// rstd[r])) with the products in f32, and gb[j] += double(g).
void LayerNormParamGradsF32(const float* x, const float* g, int64_t rows, int64_t stride,
                            int64_t cols, const float* mean, const float* rstd, double* gw,
                            double* gb);
// y[i] = ((x[i] - mean) * rstd) * w[i] + b[i], each operation rounded to f32 (layer norm's
// order); w and b may be null (no scale, no shift). y may be x.
void NormalizeF32(const float* x, int64_t n, float mean, float rstd, const float* w, const float* b,
                  float* y);
void TanhF32(const float* x, float* y, int64_t n);
void GeluTanhF32(const float* x, float* y, int64_t n);
// (1 + tanh u) / 2 + x / 2 (1 - tanh^2 u) k (1 + 3 c x^2), u = k (x + c x^3), with the
// operations and order of composed::GeluTanhGrad (each rounded to f32, no FMA), tanh as TanhF32:
// equal bit for bit to that chain of f32 tensor ops.
void GeluTanhGradF32(const float* x, float* y, int64_t n);
// sigmoid 1 / (1 + exp(-x)) and SiLU x / (1 + exp(-x)) with ExpF32's exp of the negated value,
// each operation rounded to f32.
void SigmoidF32(const float* x, float* y, int64_t n);
void SiluF32(const float* x, float* y, int64_t n);
// SwiGLU y = silu(gate) up, and its gradients from dy: grad_up = dy silu(gate), grad_gate =
// (dy up) (s ((gate (1 - s)) + 1)) with s = sigmoid(gate), SiluF32's and SigmoidF32's values from
// one exp, each operation rounded to f32: the bits of those ops composed with Mul and AddScalar.
// No output may overlap an input.
void SwigluF32(const float* gate, const float* up, float* y, int64_t n);
void SwigluGradF32(const float* gate, const float* up, const float* dy, float* grad_gate,
                   float* grad_up, int64_t n);
// out[i] = the saturating FP8 cast (tensor/float8.h's kSatFinite: e4m3fn when e4m3, else e5m2)
// of x[i] * scale (one f32 product): FloatToE4M3Bits / FloatToE5M2Bits bit for bit.
void ScaleToFp8F32(const float* x, float scale, uint8_t* out, int64_t n, bool e4m3);
// out[i] = the exact f32 value of the FP8 code in[i] (e4m3fn when e4m3, else e5m2):
// E4M3BitsToFloat / E5M2BitsToFloat bit for bit, NaN payloads included.
void Fp8ToF32(const uint8_t* in, float* out, int64_t n, bool e4m3);

// One Adam/AdamW update of n f32 parameters with f32 gradients and state (no AMSGrad), the
// operations of tensor/cpu/optimizer.cc's AdamLoop in its order, each rounded to f32 (the fused
// multiply-adds of the kernel list's FusedAdam, and no other): the same bits as that loop.
// weight_decay_kind: 0 none, 1 L2 (added to the gradient), 2 decoupled (p scaled by decay
// first). The first moment is m = fma(lerp_weight, g - m, lerp_from_end ? g : m) (torch's lerp
// towards g with weight 1 - beta1: lerp_weight is that weight, or -(1 - weight) from the end).
struct AdamF32Scalars {
  int weight_decay_kind;
  float weight_decay, decay, lerp_weight, beta2, one_minus_beta2, eps, step_size,
      bias_correction2_sqrt;
  bool lerp_from_end;
};
void AdamF32(float* p, const float* g, float* m, float* v, int64_t n, const AdamF32Scalars& s);

// Conversions of n values between f32 and the bits of f16 / bf16, rounding to nearest even as
// tensor/half.h's scalar conversions do (the same bits, NaNs included).
void HalfBitsToF32(const uint16_t* in, float* out, int64_t n);
void F32ToHalfBits(const float* in, uint16_t* out, int64_t n);
void BFloat16BitsToF32(const uint16_t* in, float* out, int64_t n);
void F32ToBFloat16Bits(const float* in, uint16_t* out, int64_t n);

// x[i] = x[i] rounded to bf16 and read back as f32, in one pass (the values of F32ToBFloat16Bits
// then BFloat16BitsToF32).
void RoundToBFloat16F32(float* x, int64_t n);
// The same conversions for a [rows, n] block whose bf16 rows lie `stride` elements apart (the
// f32 rows are dense): out[r * n + j] from in[r * in_stride + j], out[r * out_stride + j] from
// in[r * n + j].
void BFloat16BitsRowsToF32(const uint16_t* in, int64_t in_stride, int64_t rows, int64_t n,
                           float* out);
void F32RowsToBFloat16Bits(const float* in, int64_t rows, int64_t n, uint16_t* out,
                           int64_t out_stride);

// The same for typed arrays: T float (a copy), Half or BFloat16.
template <typename T>
void WidenToF32(const T* in, float* out, int64_t n) {
  if constexpr (std::is_same_v<T, Half>) {
    HalfBitsToF32(reinterpret_cast<const uint16_t*>(in), out, n);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16BitsToF32(reinterpret_cast<const uint16_t*>(in), out, n);
  } else {
    static_assert(std::is_same_v<T, float>, "WidenToF32: float, Half or BFloat16");
    std::copy(in, in + n, out);
  }
}
template <typename T>
void RoundFromF32(const float* in, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, Half>) {
    F32ToHalfBits(in, reinterpret_cast<uint16_t*>(out), n);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    F32ToBFloat16Bits(in, reinterpret_cast<uint16_t*>(out), n);
  } else {
    static_assert(std::is_same_v<T, float>, "RoundFromF32: float, Half or BFloat16");
    std::copy(in, in + n, out);
  }
}

// A [rows, n] block between T (rows `stride` elements apart) and dense f32 rows: one call for
// bf16, a call per row otherwise.
template <typename T>
void WidenRowsToF32(const T* in, int64_t in_stride, int64_t rows, int64_t n, float* out) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16BitsRowsToF32(reinterpret_cast<const uint16_t*>(in), in_stride, rows, n, out);
  } else {
    for (int64_t r = 0; r < rows; ++r) WidenToF32(in + r * in_stride, out + r * n, n);
  }
}
template <typename T>
void RoundRowsFromF32(const float* in, int64_t rows, int64_t n, T* out, int64_t out_stride) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    F32RowsToBFloat16Bits(in, rows, n, reinterpret_cast<uint16_t*>(out), out_stride);
  } else {
    for (int64_t r = 0; r < rows; ++r) RoundFromF32(in + r * n, out + r * out_stride, n);
  }
}

// x[i] = x[i] rounded to T's precision, kept as float (T float: unchanged): the value a float
// takes when stored as T and read back.
template <typename T>
void RoundToPrecisionOf(float* x, int64_t n) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    RoundToBFloat16F32(x, n);
  } else if constexpr (!std::is_same_v<T, float>) {
    constexpr int64_t kBlock = 256;
    T block[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      RoundFromF32(x + i, block, len);
      WidenToF32(block, x + i, len);
    }
  }
}

// C [m, n] = A @ B (+ C when accumulate), row-major, A [m, k] / B [k, n] optionally stored
// transposed (as cblas, alpha 1), for small f32 products (gemm.h sends those of at most 64^3
// multiply-adds here): each element is its sum over k in order, one fused multiply-add per term
// (on targets with FMA) from 0, then C added. Deterministic and the same for every element's
// position; no thread is used.
void SmallGemmF32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

// The name of the instruction set the functions above run with on this CPU ("AVX3", "AVX2", ...).
const char* VecMathTarget();

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_VEC_MATH_H_
