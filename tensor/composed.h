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
LinearResult Linear(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                    Activation act);
// Its gradients for grad_out [m, n]; pre is Linear's pre-activation (act != kNone).
LinearGrads LinearBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           const RawTensor& pre, Activation act, bool need_input, bool need_weight,
                           bool need_bias);
// d gelu_tanh(x) / dx, elementwise, in x's dtype.
RawTensor GeluTanhGrad(const RawTensor& x);

AttentionResult Attention(const RawTensor& q, const RawTensor& k, const RawTensor& v, bool causal,
                          double scale);
AttentionGrads AttentionBackward(const RawTensor& grad_out, const RawTensor& q, const RawTensor& k,
                                 const RawTensor& v, const RawTensor& output,
                                 const RawTensor& stats, bool causal, double scale);

// x and grad_out [rows, n]; mean and rstd [rows] or [rows, 1].
LayerNormGrads LayerNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                 const RawTensor& mean, const RawTensor& rstd,
                                 const RawTensor& weight, bool need_weight_bias);
// LlamaRmsNorm of x and its backward (tensor/ops.h), of tensor ops (x as rows [rows, n]).
LlamaRmsNormResult LlamaRmsNorm(const RawTensor& x, const RawTensor& weight, double eps);
LlamaRmsNormGrads LlamaRmsNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                       const RawTensor& rstd, const RawTensor& weight,
                                       bool need_weight);
// Swiglu and its backward (tensor/ops.h) of tensor ops (inputs of one dtype and shape).
RawTensor Swiglu(const RawTensor& gate, const RawTensor& up);
SwigluGrads SwigluBackward(const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up);
// RotaryEmbedding and its backward (tensor/ops.h) of tensor ops.
RawTensor RotaryEmbedding(const RawTensor& x, const RawTensor& cos, const RawTensor& sin);
RawTensor RotaryEmbeddingBackward(const RawTensor& grad_out, const RawTensor& cos,
                                  const RawTensor& sin);
// residual = a + b, then LayerNorm(residual, weight, bias, eps).
AddLayerNormResult AddLayerNorm(const RawTensor& a, const RawTensor& b, const RawTensor& weight,
                                const RawTensor& bias, double eps);

// losses [N] of logits' dtype and the gradient rows (softmax - onehot) * row_scale (f64 [N]).
CrossEntropyResult SoftmaxCrossEntropy(const RawTensor& logits, const RawTensor& targets,
                                       const RawTensor& row_scale, int64_t ignore_index);

// The check and unscale with inv_scale read on the host.
void NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                              const RawTensor& inv_scale);

// The optimizer ops as per-parameter chains of the plain ops, with inv_scale, found_inf and
// device_step read on the host (the order and roundings of tensor/kernel_list.inc's contracts;
// optim/ runs these for fused = false).
void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& options);
void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& options);
// Writes the norm into `norm` (0-d f64 or f32 on the tensors' device).
void GlobalGradNorm(const RawTensor& norm, const std::vector<RawTensor>& tensors, double norm_type);
RawTensor AddScaled(const RawTensor& a, const RawTensor& b, double alpha);
RawTensor Addcmul(const RawTensor& self, const RawTensor& t1, const RawTensor& t2, double value);
RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight);
RawTensor NewtonSchulz(const RawTensor& x, double a, double b, double c, int64_t ns_steps,
                       double eps);
void ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                double max_norm);

}  // namespace tg::composed

#endif  // TAPEGRAD_TENSOR_COMPOSED_H_
