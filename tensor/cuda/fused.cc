// The fused entries of the kernel list (tensor/kernel_list.inc) on CUDA that combine library calls:
// Linear through cuBLASLt's epilogues, attention through cuDNN's fused kernel or the cuBLASLt
// composition, softmax cross-entropy through its one-pass kernel. A case a library has no
// kernel for is declined (KernelStatus::kNoKernel, nothing written): tensor/ops_*.cc then runs the
// composed form, whose ops run on CUDA too.
#include <string>
#include <vector>

#include "tensor/cuda/attention.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_fused.h"
#include "tensor/kernel_options.h"

namespace tg::cuda {

// One cuBLASLt product with the bias (+ GELU) epilogue; the GELU epilogues also store the
// pre-activation (aux). cuBLASLt has no GELU epilogue for f64.
KernelStatus LinearForward(const Tensor& out, const Tensor& pre, const Tensor& x,
                           const Tensor& weight, const Tensor& bias, Activation act) {
  if (act == Activation::kNone) {
    MatmulEx(out, x, false, weight, true, bias.defined() ? Epilogue::kBias : Epilogue::kNone, bias,
             Tensor());
    return KernelStatus::kDone;
  }
  if (x.dtype() == kF64) return KernelStatus::kNoKernel;
  const bool done = TryMatmulEx(out, x, false, weight, true,
                                bias.defined() ? Epilogue::kBiasGelu : Epilogue::kGelu, bias, pre,
                                1.0f, 0.0f, nullptr);
  return done ? KernelStatus::kDone : KernelStatus::kNoKernel;
}

// g [m, n] = grad_out * gelu'(pre) for GELU, one elementwise pass (GeluTanhBackward), then the
// products; the bias gradient (the column sums of g) comes from the weight gradient's product
// (kBgrad), or from ones [1, m] @ g without one. (cuBLASLt's dGELU epilogue needs a product in
// front of it, and a layer's own backward has none; run on a zero rank-1 product, as before, it
// took 0.33 ms on the H200 for a [16384, 3072] bf16 gradient, plus a copy of grad_out.)
KernelStatus LinearBackward(const Tensor& grad_input, const Tensor& grad_weight,
                            const Tensor& grad_bias, const Tensor& grad_out, const Tensor& x,
                            const Tensor& weight, const Tensor& pre, Activation act) {
  const DType dtype = x.dtype();
  const Device device = x.device();
  const int64_t m = x.size(0), n = weight.size(0);
  Tensor g = grad_out;
  if (act == Activation::kGeluTanh) {
    g = Tensor::Empty({m, n}, dtype, device);
    GeluTanhBackward(g, grad_out, pre);
  }
  const bool bgrad = grad_bias.defined() && grad_weight.defined();
  if (grad_weight.defined()) {
    // grad_weight = g^T @ x, and the bias gradient (the row sums of g^T) from the same product.
    MatmulEx(grad_weight, g, true, x, false, bgrad ? Epilogue::kBgrad : Epilogue::kNone,
             bgrad ? grad_bias : Tensor(), Tensor());
  }
  if (grad_bias.defined() && !bgrad) {  // the column sums of g as ones [1, m] @ g
    AllowTf32Scope exact(false);
    MatmulEx(grad_bias.view({1, n}), OnesVector(m, dtype, device.index).view({1, m}), false, g,
             false, Epilogue::kNone, Tensor(), Tensor());
  }
  if (grad_input.defined()) {
    MatmulEx(grad_input, g, false, weight, false, Epilogue::kNone, Tensor(), Tensor());
  }
  return KernelStatus::kDone;
}

// cuDNN's fused kernel where the options allow it and the tensors qualify; declined otherwise
// (the op then runs the composed form of tensor/composed.h, the one every device shares).
KernelStatus ScaledDotProductAttention(const Tensor& out, const Tensor& stats, const Tensor& q,
                                       const Tensor& k, const Tensor& v, bool causal,
                                       double scale) {
  const Tensor stats4 = stats.view({q.size(0), q.size(1), q.size(2), 1});
  if (GetKernelOptions().cudnn_attention && CudnnAttentionSupported({&out, &q, &k, &v}, nullptr) &&
      AttentionForward(out, stats4, q, k, v, causal, scale)) {
    return KernelStatus::kDone;
  }
  return KernelStatus::kNoKernel;
}

KernelStatus ScaledDotProductAttentionBackward(const Tensor& grad_q, const Tensor& grad_k,
                                               const Tensor& grad_v, const Tensor& grad_out,
                                               const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& out, const Tensor& stats, bool causal,
                                               double scale) {
  const Tensor stats4 = stats.view({q.size(0), q.size(1), q.size(2), 1});
  if (GetKernelOptions().cudnn_attention &&
      CudnnAttentionSupported({&grad_q, &grad_k, &grad_v, &grad_out, &q, &k, &v, &out}, nullptr) &&
      AttentionBackward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, stats4, causal, scale)) {
    return KernelStatus::kDone;
  }
  return KernelStatus::kNoKernel;
}

KernelStatus SoftmaxCrossEntropy(const Tensor& losses, const Tensor& grad_logits,
                                 const Tensor& logits, const Tensor& targets,
                                 const Tensor& row_scale, int64_t ignore_index) {
  SoftmaxCrossEntropyFused(losses, grad_logits, logits, targets, row_scale, ignore_index);
  return KernelStatus::kDone;
}

}  // namespace tg::cuda
