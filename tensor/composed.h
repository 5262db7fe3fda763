// The composed forms of the fused ops of tensor/ops.h: each fused op written as a chain of the
// plain ops, in the compute dtype (f64 for f64, f32 for f32/f16/bf16), rounding each output once.
// An op runs its composed form when the device's fused kernel declines the case
// (KernelStatus::kNoKernel, tensor/kernel_list.inc), and tests use them as the reference that
// every device's fused kernel is compared with. They take validated inputs (the ops validate)
// and run on any device through the kernel list.
#ifndef TAPEGRAD_TENSOR_COMPOSED_H_
#define TAPEGRAD_TENSOR_COMPOSED_H_

#include <cstdint>
#include <vector>

#include "tensor/ops.h"

namespace tg::composed {

// The compute dtype of the fused ops: f64 for f64, f32 for f32/f16/bf16.
DType ComputeDType(DType dtype);

// Linear on x [m, k] (2-D): output and, for act != kNone, the pre-activation.
LinearResult Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);
// Its gradients for grad_out [m, n]; pre is Linear's pre-activation (act != kNone).
LinearGrads LinearBackward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                           const Tensor& pre, Activation act, bool need_input, bool need_weight,
                           bool need_bias);
// d gelu_tanh(x) / dx, elementwise, in x's dtype.
Tensor GeluTanhGrad(const Tensor& x);

AttentionResult Attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          double scale);
AttentionGrads AttentionBackward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& output, const Tensor& stats,
                                 bool causal, double scale);

// x and grad_out [rows, n]; mean and rstd [rows] or [rows, 1].
LayerNormGrads LayerNormBackward(const Tensor& grad_out, const Tensor& x, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& weight, bool need_weight_bias);
// residual = a + b, then LayerNorm(residual, weight, bias, eps).
AddLayerNormResult AddLayerNorm(const Tensor& a, const Tensor& b, const Tensor& weight,
                                const Tensor& bias, double eps);

// losses [N] of logits' dtype and the gradient rows (softmax - onehot) * row_scale (f64 [N]).
CrossEntropyResult SoftmaxCrossEntropy(const Tensor& logits, const Tensor& targets,
                                       const Tensor& row_scale, int64_t ignore_index);

// The check and unscale with inv_scale read on the host.
void NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                              const Tensor& inv_scale);

// The optimizer ops as per-parameter chains of the plain ops, with inv_scale, found_inf and
// device_step read on the host (the order and roundings of tensor/kernel_list.inc's contracts;
// optim/ runs these for fused = false).
void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& options);
void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& options);
// Writes the norm into `norm` (0-d f64 or f32 on the tensors' device).
void GlobalGradNorm(const Tensor& norm, const std::vector<Tensor>& tensors, double norm_type);
void ClipByNorm(const std::vector<Tensor>& tensors, const Tensor& total_norm, double max_norm);

}  // namespace tg::composed

#endif  // TAPEGRAD_TENSOR_COMPOSED_H_
