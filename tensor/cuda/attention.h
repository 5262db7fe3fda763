// Scaled dot-product attention on CUDA, forward and backward, for [B, H, T, D] heads:
//
//   out = softmax(scale * q k^T + mask) v,   mask = -inf above the diagonal when causal
//
// One fused cuDNN 9 kernel per direction (flash attention: the scores never reach memory), built
// with the backend graph API as the operation pattern cuDNN fuses (matmul -> scale -> causal mask
// -> softmax with statistics -> matmul, and its backward). f16/bf16 only; D a multiple of 8, at
// most 128; every tensor 16-byte aligned with unit stride along D and other strides multiples of
// 8 elements (any permutation of [B, H, T], e.g. heads sliced out of a [B, T, 3, H, D]
// projection). The CUDA kernel table (tensor/cuda/fused.cc) takes it whenever the tensors qualify
// and the kernel options allow it (KernelOptions::cudnn_attention, tensor/kernel_options.h), and
// declines the case otherwise: the op then runs the composed form every device shares
// (tensor/composed.h; CUDA has no second one). It returns false, with nothing enqueued and the
// reason in *why ("cuDNN has no fused attention engine ..."), when cuDNN has no engine for the
// graph (or rejects its descriptors), and on cuDNN releases with known wrong results (the forward
// on 9.10.0/9.10.1; the backward with Tk not a multiple of 128 before 9.15.1).
// CudnnAttentionSupported() says whether the tensors qualify.
//
//   // q, k, v: [B, H, T, D] bf16 views; out like q; stats f32 [B, H, T, 1]
//   AttentionForward(out, stats, q, k, v, /*causal=*/true, 1 / std::sqrt(D));
//   AttentionBackward(dq, dk, dv, dout, q, k, v, out, stats, /*causal=*/true, 1 / std::sqrt(D));
//
// softmax_stats holds, per query row, the log-sum-exp of its scaled (and masked) scores,
// lse = max + log(sum(exp(s - max))); the backward recomputes the probabilities as
// exp(s - lse) instead of saving them, as the composed form does.
#ifndef TAPEGRAD_TENSOR_CUDA_ATTENTION_H_
#define TAPEGRAD_TENSOR_CUDA_ATTENTION_H_

#include <initializer_list>
#include <string>

#include "tensor/tensor.h"

namespace tg::cuda {

// out [B, H, Tq, D] (q's dtype, unit stride along D) and softmax_stats (f32, contiguous
// [B, H, Tq, 1]) are written; q [B, H, Tq, D], k and v [B, H, Tk, D] share a dtype (f16 or
// bf16) and a CUDA device. causal needs Tq == Tk (query i sees keys 0..i).
// dropout must be 0: attention dropout is not implemented (the backward takes no mask or seed).
// Enqueues on the current stream and returns true; throws tg::Error on invalid input (tensors
// CudnnAttentionSupported rejects included). Returns false (no engine for the problem; *why says
// which) with nothing enqueued.
bool AttentionForward(const RawTensor& out, const RawTensor& softmax_stats, const RawTensor& q,
                      const RawTensor& k, const RawTensor& v, bool causal, double scale,
                      double dropout = 0, std::string* why = nullptr);

// dq, dk, dv (shapes of q, k, v, their dtype, unit stride along D) are written from dout (out's
// shape) and the forward's q, k, v, out and softmax_stats, with the forward's causal and scale.
// Returns false as AttentionForward does.
bool AttentionBackward(const RawTensor& dq, const RawTensor& dk, const RawTensor& dv,
                       const RawTensor& dout, const RawTensor& q, const RawTensor& k,
                       const RawTensor& v, const RawTensor& out, const RawTensor& softmax_stats,
                       bool causal, double scale, std::string* why = nullptr);

// Whether the fused kernel accepts these tensors (dtype, head size, strides, alignment);
// when not, *why (if given) says which rule fails. Pass every tensor of the call (forward: out,
// q, k, v; backward: also dq, dk, dv, dout); undefined ones are skipped.
bool CudnnAttentionSupported(std::initializer_list<const RawTensor*> tensors, std::string* why);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_ATTENTION_H_
