// Fused CUDA kernels for transformer training that have no single-op equivalent in the kernel list
// (tensor/ops.h): softmax cross-entropy with its gradient in one kernel, the layer-norm
// backward, and a residual add followed by layer norm. Each is the composition of tg ops named
// in its comment, computed in f32 for f16/bf16/f32 (f64 for f64) and rounded to the tensors'
// dtype once per output element; tests/tensor/cuda/nn_kernels_test.cc compares each with that
// composition on the CPU.
//
// Unlike the kernels of tensor/cuda/kernels.h (which the dispatch feeds validated tensors),
// these are called directly, so each validates its arguments and throws tg::Error naming the
// op and the offending shape, dtype or device. All tensors must be contiguous and on one CUDA
// device; kernels enqueue on that device's current stream (tensor/cuda/runtime.h) and never
// wait for the device. Target range errors are reported as described in
// tensor/cuda/index_errors.h.
//
//   // Classifier head of a GPT step: loss per token and d(mean loss)/d(logits), in place.
//   tg::cuda::SoftmaxCrossEntropyFused(losses, logits, logits, targets, tg::RawTensor(), -100);
//   // Pre-norm block: x += attn_out; h = layer_norm(x), in one pass.
//   tg::cuda::AddLayerNorm(x, h, mean, rstd, x, attn_out, ln_w, ln_b, 1e-5);
#ifndef TAPEGRAD_TENSOR_CUDA_NN_FUSED_H_
#define TAPEGRAD_TENSOR_CUDA_NN_FUSED_H_

#include <cstdint>

#include "tensor/kernel_table.h"
#include "tensor/tensor.h"

namespace tg::cuda {

// Cross-entropy and its gradient for logits [N, C] (f32, f64, f16 or bf16) and targets [N] (i64,
// each in [0, C) or == ignore_index), reading each row of logits twice in one kernel (statistics,
// then gradient; the second read comes from cache) and never storing probabilities:
//   losses[r]         = logsumexp(logits[r]) - logits[r][t_r]    (0 where t_r == ignore_index)
//   grad_logits[r][i] = (softmax(logits[r])[i] - (i == t_r)) * scale_r   (0 rows where ignored)
// which equals tg::CrossEntropy(logits, targets, ignore_index, Reduction::kNone) and
// tg::CrossEntropyBackward(logits, targets, grad, ignore_index, ...) with the same row scales.
// - losses: [N] of logits' dtype, or undefined when only the gradient is wanted.
// - grad_logits: [N, C] of logits' dtype. It may be logits itself: the gradient then overwrites
//   the logits in place (llm.c's fused classifier), saving an [N, C] buffer.
// - row_scale: f64 [N], the loss gradient of each row (as for tg::cuda::CrossEntropyBackward),
//   or undefined for the gradient of the mean over non-ignored rows: scale = 1 / count, where
//   the count of rows with t_r != ignore_index is computed on the device (no host wait). An
//   all-ignored batch gives zero gradients and zero losses (the mean itself, 0/0, is the
//   caller's).
void SoftmaxCrossEntropyFused(const RawTensor& losses, const RawTensor& grad_logits,
                              const RawTensor& logits, const RawTensor& targets,
                              const RawTensor& row_scale, int64_t ignore_index);

// The backward of tg::LayerNorm for x [rows, n] (f32, f64, f16 or bf16) from its saved
// statistics, with xhat = (x - mean) * rstd and dxhat = grad_out * weight (grad_out when weight
// is undefined):
//   grad_x      = rstd * (dxhat - mean_n(dxhat) - xhat * mean_n(dxhat * xhat))
//   grad_weight = sum over rows of grad_out * xhat
//   grad_bias   = sum over rows of grad_out
// (the formulas of autograd/ops/nn.cc LayerNorm). grad_out and x are [rows, n] of x's dtype;
// mean and rstd are [rows] f32 (f64 for f64 x), as tg::LayerNorm returns them; weight is [n] of
// x's dtype or undefined. Each gradient is an output of x's dtype ([rows, n], [n], [n]) or
// undefined when not wanted; grad_x may be grad_out or x itself (in place) but no other view of
// their memory. grad_x takes one kernel (one warp or block per row); grad_weight and grad_bias
// are accumulated by that same kernel into per-warp/per-block f32 (f64) partial sums, which a
// second kernel adds up in a fixed order: deterministic, no atomics.
// An entry of the kernel list (tensor/kernel_list.inc): always KernelStatus::kDone.
KernelStatus LayerNormBackward(const RawTensor& grad_x, const RawTensor& grad_weight,
                               const RawTensor& grad_bias, const RawTensor& grad_out,
                               const RawTensor& x, const RawTensor& mean, const RawTensor& rstd,
                               const RawTensor& weight);

// residual_out = a + b (rounded to the dtype), then ln_out, mean, rstd =
// tg::LayerNorm(residual_out, weight, bias, eps), in one kernel: that is
// tg::LayerNorm(tg::Add(a, b), weight, bias, eps) plus the sum itself. a, b, residual_out and
// ln_out are [rows, n] of one floating dtype; residual_out may be a or b (an in-place residual
// stream update); mean and rstd are [rows] f32 (f64 for f64); weight and bias are [n] of that
// dtype or undefined; eps >= 0.
// An entry of the kernel list (tensor/kernel_list.inc): always KernelStatus::kDone.
KernelStatus AddLayerNorm(const RawTensor& residual_out, const RawTensor& ln_out,
                          const RawTensor& mean, const RawTensor& rstd, const RawTensor& a,
                          const RawTensor& b, const RawTensor& weight, const RawTensor& bias,
                          double eps);

// grad_in = grad_out * gelu_tanh'(pre), computed in f32 (f64 for f64) with the operations of
// composed::GeluTanhGrad and rounded once: the first step of a Linear + GELU backward (tg::cuda
// LinearBackward). One elementwise pass over tensors of one shape, dtype and device, any strides
// (pre may be the forward epilogue's padded-row buffer); grad_in may be grad_out (in place).
void GeluTanhBackward(const RawTensor& grad_in, const RawTensor& grad_out, const RawTensor& pre);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_NN_FUSED_H_
