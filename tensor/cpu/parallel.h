// The CPU kernels' one threading model: OpenMP, sized by OMP_NUM_THREADS (tools/launch gives each
// rank its share of the cores, as torchrun does), so that a kernel's loop over rows or elements
// uses every core it is given -- fewer while other processes hold some of them (RegionThreads,
// thread_governor.h).
//
//   ParallelFor(rows, /*min_per_thread=*/64, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) ... row r ...
//   });
//
// [0, n) is split into contiguous blocks, one per thread; the split depends only on n and the
// thread count, and each item is computed by exactly one thread with the serial code, so results
// are the serial results bit for bit, whatever the thread count (loops whose items are
// independent: rows, elements; reductions across items stay serial). A loop too small to pay for
// waking the threads (fewer than 2 * min_per_thread items) runs on the calling thread, as does a
// loop inside a parallel region. fn may call GEMM: OpenBLAS is its OpenMP build (third_party/
// openblas.BUILD), which shares this pool and runs a GEMM issued inside a parallel region on the
// calling thread. An exception thrown by fn on any thread is rethrown on the calling thread (the
// first one, by block).
#ifndef TAPEGRAD_TENSOR_CPU_PARALLEL_H_
#define TAPEGRAD_TENSOR_CPU_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <vector>

#include "tensor/cpu/thread_governor.h"

namespace tg::cpu {

template <typename Fn>
void ParallelFor(int64_t n, int64_t min_per_thread, Fn&& fn) {
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread));
  const int threads = static_cast<int>(std::min<int64_t>(RegionThreads(), most));
  if (threads <= 1 || omp_in_parallel()) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t begin = n * t / count, end = n * (t + 1) / count;
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      errors[static_cast<size_t>(t)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Sets the thread count that OpenMP libraries called on this thread (OpenBLAS, oneDNN) use, for
// the guard's lifetime: LibraryThreads(1) makes a call single-threaded (gemm.h's parts).
class LibraryThreads {
 public:
  explicit LibraryThreads(int threads) : saved_(omp_get_max_threads()) {
    if (threads != saved_) omp_set_num_threads(threads);
  }
  ~LibraryThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  LibraryThreads(const LibraryThreads&) = delete;
  LibraryThreads& operator=(const LibraryThreads&) = delete;

 private:
  int saved_;
};

// The min_per_thread of a loop over rows of n elements each: about 2^14 elements of work per
// thread, the size below which waking a second thread costs more than it saves.
inline int64_t RowsPerThread(int64_t n) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, n));
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_PARALLEL_H_
