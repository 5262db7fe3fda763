#include "tensor/kernel_options.h"

#include <atomic>

namespace tg {
namespace {

std::atomic<bool> cudnn_attention{KernelOptions().cudnn_attention};
std::atomic<bool> allow_tf32{KernelOptions().allow_tf32};
std::atomic<bool> cpu_thread_governor{KernelOptions().cpu_thread_governor};

}  // namespace

void SetKernelOptions(const KernelOptions& options) {
  cudnn_attention.store(options.cudnn_attention);
  allow_tf32.store(options.allow_tf32);
  cpu_thread_governor.store(options.cpu_thread_governor);
}

KernelOptions GetKernelOptions() {
  KernelOptions options;
  options.cudnn_attention = cudnn_attention.load();
  options.allow_tf32 = allow_tf32.load();
  options.cpu_thread_governor = cpu_thread_governor.load();
  return options;
}

}  // namespace tg
