// The fused entries of the op list (tensor/kernel_list.inc) on the CPU.
#include <vector>

#include "tensor/cpu/kernels.h"

namespace tg::cpu {

KernelStatus NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                                      const Tensor& inv_scale) {
  const double inv = inv_scale.item();
  bool found = false;
  for (const Tensor& t : tensors) found = ScaleInPlace(t, inv, true) || found;
  if (found) found_inf.fill_(1);
  return KernelStatus::kDone;
}

KernelStatus LinearForward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, Activation) {
  return KernelStatus::kNoKernel;
}

KernelStatus LinearBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, Activation) {
  return KernelStatus::kNoKernel;
}

KernelStatus ScaledDotProductAttention(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, bool, double) {
  return KernelStatus::kNoKernel;
}

KernelStatus ScaledDotProductAttentionBackward(const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const Tensor&,
                                               const Tensor&, const Tensor&, const Tensor&, bool,
                                               double) {
  return KernelStatus::kNoKernel;
}

KernelStatus LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  return KernelStatus::kNoKernel;
}

KernelStatus AddLayerNorm(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  return KernelStatus::kNoKernel;
}

KernelStatus SoftmaxCrossEntropy(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, int64_t) {
  return KernelStatus::kNoKernel;
}

}  // namespace tg::cpu
