// How the CUDA kernels that read indices from device memory (embedding, cross-entropy targets,
// gather/scatter/index_select/index_add, max-pool indices) report an index out of range.
//
// The indices live on the device, so checking them on the host would cost a copy and a stream
// synchronisation on every call. Instead each kernel checks every index it reads; a bad one is
// skipped (nothing outside a tensor is ever read or written) and the first one is recorded in a
// small per-device record in mapped pinned host memory, which the host can read without a copy
// or a sync. The error is thrown as tg::Error with the CPU kernel's message (op, bad value,
// position, range) plus the device, e.g.
//   "gather: index 7 at position [1, 0] is out of range for dim 1 of size 3 (on cuda:0)",
// at the first of:
//   - CheckIndexErrors() below (synchronises, so it sees every kernel enqueued before it);
//   - tg::cuda::CrossEntropy, which synchronises anyway to return its count;
//   - the start of any later index-reading kernel call on that device (no sync: it sees kernels
//     that have already finished).
// Outputs of the failing call are unspecified (skipped elements), so a caller that wants the
// CPU's "throw before writing" behaviour calls CheckIndexErrors() after the op.
//
//   tg::cuda::Gather(out, x, index, 1);
//   tg::cuda::CheckIndexErrors();   // throws if an index was out of range
#ifndef TAPEGRAD_TENSOR_CUDA_INDEX_ERRORS_H_
#define TAPEGRAD_TENSOR_CUDA_INDEX_ERRORS_H_

namespace tg::cuda {

// Waits for the current stream of `device` (default: the current device), then throws the first
// index error recorded on that device since the last report, and clears it.
void CheckIndexErrors(int device = -1);

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_INDEX_ERRORS_H_
