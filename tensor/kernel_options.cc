#include "tensor/kernel_options.h"

#include <atomic>

namespace tg {
namespace {

std::atomic<bool> cudnn_attention{KernelOptions().cudnn_attention};
std::atomic<bool> allow_tf32{KernelOptions().allow_tf32};

}  // namespace

void SetKernelOptions(const KernelOptions& options) {
  cudnn_attention.store(options.cudnn_attention);
  allow_tf32.store(options.allow_tf32);
}

KernelOptions GetKernelOptions() {
  KernelOptions options;
  options.cudnn_attention = cudnn_attention.load();
  options.allow_tf32 = allow_tf32.load();
  return options;
}

}  // namespace tg
