// Choices among kernels that a user may need to change, as explicit options of the API (the
// training binaries expose them as --cudnn_attention and --tf32, tools/bench:train_step the
// governor as --cpu_thread_governor). The library never reads an environment variable to choose
// a kernel.
//
//   tg::KernelOptions options;
//   options.allow_tf32 = true;            // f32 products on CUDA may use TF32 tensor cores
//   tg::SetKernelOptions(options);        // process-wide, like torch.backends.cuda.matmul
#ifndef TAPEGRAD_TENSOR_KERNEL_OPTIONS_H_
#define TAPEGRAD_TENSOR_KERNEL_OPTIONS_H_

namespace tg {

struct KernelOptions {
  // CUDA attention through cuDNN's fused kernel where it applies (f16/bf16, head size a multiple
  // of 8 up to 128); false: the cuBLASLt composition only (to validate a machine or a cuDNN
  // release against it). No effect on the CPU.
  bool cudnn_attention = true;
  // CUDA f32 matmuls and convolutions may use TF32 (10-bit mantissa inputs, f32 accumulation),
  // like torch.backends.cuda.matmul.allow_tf32; off by default so that CUDA results compare
  // with the CPU's at f32 tolerances. A thread's tg::cuda::AllowTf32Scope overrides it there.
  bool allow_tf32 = false;
  // The CPU thread governor (tensor/cpu/thread_governor.h): parallel regions use fewer threads
  // while other processes hold this process's cores. Results are the same bits either way (every
  // kernel is thread-count invariant); off: every region uses omp_get_max_threads().
  bool cpu_thread_governor = true;
};

// The process-wide options: set them before training starts (reads and writes are atomic, but
// a kernel already chosen is not revisited).
void SetKernelOptions(const KernelOptions& options);
KernelOptions GetKernelOptions();

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_KERNEL_OPTIONS_H_
