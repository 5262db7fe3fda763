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

// Muon's Newton-Schulz iteration: no CUDA kernel of its own yet; the composed form runs the batch
// through batched cuBLAS products (Bmm) on the device.
KernelStatus NewtonSchulz(const RawTensor&, const RawTensor&, double, double, double, int64_t,
                          double) {
  return KernelStatus::kNoKernel;
}

// One cuBLASLt product with the bias (+ GELU) epilogue; the GELU epilogues also store the
// pre-activation (aux). cuBLASLt has no GELU epilogue for f64.
KernelStatus LinearForward(const RawTensor& out, const RawTensor& pre, const RawTensor& x,
                           const RawTensor& weight, const RawTensor& bias, Activation act) {
  if (act == Activation::kNone) {
    MatmulEx(out, x, false, weight, true, bias.defined() ? Epilogue::kBias : Epilogue::kNone, bias,
             RawTensor());
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
KernelStatus LinearBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                            const RawTensor& grad_bias, const RawTensor& grad_out,
                            const RawTensor& x, const RawTensor& weight, const RawTensor& pre,
                            Activation act) {
  const DType dtype = x.dtype();
  const Device device = x.device();
  const int64_t m = x.size(0), n = weight.size(0);
  RawTensor g = grad_out;
  if (act == Activation::kGeluTanh) {
    g = RawTensor::Empty({m, n}, dtype, device);
    GeluTanhBackward(g, grad_out, pre);
  }
  const bool bgrad = grad_bias.defined() && grad_weight.defined();
  if (grad_weight.defined()) {
    // grad_weight = g^T @ x, and the bias gradient (the row sums of g^T) from the same product.
    MatmulEx(grad_weight, g, true, x, false, bgrad ? Epilogue::kBgrad : Epilogue::kNone,
             bgrad ? grad_bias : RawTensor(), RawTensor());
  }
  if (grad_bias.defined() && !bgrad) {  // the column sums of g as ones [1, m] @ g
    AllowTf32Scope exact(false);
    MatmulEx(grad_bias.view({1, n}), OnesVector(m, dtype, device.index).view({1, m}), false, g,
             false, Epilogue::kNone, RawTensor(), RawTensor());
  }
  if (grad_input.defined()) {
    MatmulEx(grad_input, g, false, weight, false, Epilogue::kNone, RawTensor(), RawTensor());
  }
  return KernelStatus::kDone;
}

// cuDNN's fused kernel where the options allow it and the tensors qualify; declined otherwise
// (the op then runs the composed form of tensor/composed.h, the one every device shares).
KernelStatus ScaledDotProductAttention(const RawTensor& out, const RawTensor& stats,
                                       const RawTensor& q, const RawTensor& k, const RawTensor& v,
                                       bool causal, double scale) {
  // Grouped-query heads (k, v with fewer heads than q): the composed form repeats them.
  if (k.size(1) != q.size(1)) return KernelStatus::kNoKernel;
  const RawTensor stats4 = stats.view({q.size(0), q.size(1), q.size(2), 1});
  if (GetKernelOptions().cudnn_attention && CudnnAttentionSupported({&out, &q, &k, &v}, nullptr) &&
      AttentionForward(out, stats4, q, k, v, causal, scale)) {
    return KernelStatus::kDone;
  }
  return KernelStatus::kNoKernel;
}

KernelStatus ScaledDotProductAttentionBackward(const RawTensor& grad_q, const RawTensor& grad_k,
                                               const RawTensor& grad_v, const RawTensor& grad_out,
                                               const RawTensor& q, const RawTensor& k,
                                               const RawTensor& v, const RawTensor& out,
                                               const RawTensor& stats, bool causal, double scale) {
  if (k.size(1) != q.size(1)) return KernelStatus::kNoKernel;  // as the forward
  const RawTensor stats4 = stats.view({q.size(0), q.size(1), q.size(2), 1});
  if (GetKernelOptions().cudnn_attention &&
      CudnnAttentionSupported({&grad_q, &grad_k, &grad_v, &grad_out, &q, &k, &v, &out}, nullptr) &&
      AttentionBackward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, stats4, causal, scale)) {
    return KernelStatus::kDone;
  }
  return KernelStatus::kNoKernel;
}

KernelStatus SoftmaxCrossEntropy(const RawTensor& losses, const RawTensor& grad_logits,
                                 const RawTensor& logits, const RawTensor& targets,
                                 const RawTensor& row_scale, int64_t ignore_index) {
  SoftmaxCrossEntropyFused(losses, grad_logits, logits, targets, row_scale, ignore_index);
  return KernelStatus::kDone;
}

}  // namespace tg::cuda
