// The calls into GEMM used by the CPU kernels (matmul, conv, the fused Linear and attention):
// OpenBLAS for f32/f64, oneDNN for f16/bf16 operands where it multiplies them natively
// (LowPrecisionGemm), with the optional per-thread time accounting of tensor/profile.h; and the
// widening of f16/bf16 operands to f32 that the kernels do where oneDNN cannot.
#ifndef TAPEGRAD_TENSOR_CPU_GEMM_H_
#define TAPEGRAD_TENSOR_CPU_GEMM_H_

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/dnnl.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/profile.h"

namespace tg::cpu {

// ScratchVector<T>: a std::vector whose resize leaves new elements uninitialised, for buffers that
// are written before they are read (a GEMM's operand copy or result): no memset of memory the next
// pass overwrites anyway. A buffer that cannot be allocated throws the CPU allocator's tg::Error
// ("CPU allocator: out of memory allocating N bytes"), as a tensor would, not std::bad_alloc: the
// kernels allocate their scratch inside ParallelFor's regions, whose exceptions reach the caller,
// and the training binaries turn a tg::Error into a clean exit.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  // n <= max_size() (std::vector checks it first), so n * sizeof(T) does not overflow.
  T* allocate(size_t n) {
    try {
      return std::allocator<T>::allocate(n);
    } catch (const std::bad_alloc&) {
      throw Error(absl::StrCat("CPU allocator: out of memory allocating ", n * sizeof(T),
                               " bytes (a kernel's scratch buffer)"));
    }
  }
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <typename T>
using ScratchVector = std::vector<T, UninitializedAllocator<T>>;

// c[i, j] += bias[j] for the rows of an [m, n] result (nothing without a bias).
template <typename T>
void AddBias(int64_t m, int64_t n, const T* bias, T* c, int64_t ldc) {
  if (bias == nullptr) return;
  ParallelFor(m, RowsPerThread(n), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
    }
  });
}

// The optional per-thread accounting of one product (tensor/profile.h): its time from
// construction to destruction, its multiply-adds, unless cancelled.
class GemmTiming {
 public:
  GemmTiming(int64_t m, int64_t n, int64_t k)
      : profile_(CurrentGemmProfile()), flops_(2.0 * static_cast<double>(m) * n * k) {
    if (profile_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~GemmTiming() {
    if (profile_ == nullptr) return;
    profile_->calls += 1;
    profile_->seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    profile_->flops += flops_;
  }
  void Cancel() { profile_ = nullptr; }
  GemmTiming(const GemmTiming&) = delete;
  GemmTiming& operator=(const GemmTiming&) = delete;

 private:
  GemmProfile* profile_;
  double flops_;
  std::chrono::steady_clock::time_point start_;
};

// How a product is split into parts so that its bits do not depend on the thread count. OpenBLAS
// and oneDNN each choose how to share a product among threads, and with it how the sums over k
// are blocked, from the thread count (measured 2026-11-28 on an AVX2 EPYC: OpenBLAS 0.3.21 at 1
// and 2 threads differs in 4% of the elements of a 1024x768x3072 product; oneDNN 2.6's gemm:jit
// for [2048, 64] x [64, 64]^T and for weight gradients with k = 2048). So the product is split
// here, by its shape alone, into parts that are each one single-threaded library call, spread
// over the threads by ParallelFor:
//   kRows / kCols: runs of `size` rows (or columns) of C, the last one shorter;
//   kDepth (a small result over a long k: weight gradients): runs of `size` of k, each part's
//     product written to a scratch buffer and the parts added into C in order.
// A part's call sees the same operands whichever thread makes it, so the result is the same at
// any thread count, and the same run to run. The cost is each part packing its share of the
// operand the parts have in common; parts of at least 64 rows keep that small (tools/bench:
// train_step measures it).
struct GemmSplit {
  enum Kind { kRows, kCols, kDepth };
  Kind kind = kRows;
  int64_t size = 0;   // rows, columns or k per part
  int64_t count = 1;  // parts
};

inline GemmSplit SplitGemm(int64_t m, int64_t n, int64_t k, bool allow_depth) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  constexpr int64_t kOneCall = 64 * 64 * 64;  // multiply-adds one call does alone
  constexpr int64_t kMaxParts = 4, kMinRun = 64, kMinDepth = 512;
  if (m * n * k <= kOneCall) return {GemmSplit::kRows, m, 1};
  if (allow_depth && k >= 4 * std::max(m, n) && m * n <= (int64_t{1} << 16)) {
    const int64_t count = std::clamp<int64_t>(k / kMinDepth, 1, kMaxParts);
    const int64_t size = ceil_div(ceil_div(k, count), 16) * 16;
    return {GemmSplit::kDepth, size, ceil_div(k, size)};
  }
  const bool rows = m >= n;
  const int64_t dim = rows ? m : n;
  const int64_t count = std::clamp<int64_t>(dim / kMinRun, 1, kMaxParts);
  const int64_t size = ceil_div(ceil_div(dim, count), 16) * 16;
  return {rows ? GemmSplit::kRows : GemmSplit::kCols, size, ceil_div(dim, size)};
}

// Calls part(m, n, k, a, b, c, ldc, bias, first) for each part of `split` of the product
// C [m, n] = A [m, k] @ B [k, n] (A, B optionally transposed, leading dimensions lda/ldb/ldc,
// element type T for A and B, R for C), the parts spread over the threads with each part's
// library call single-threaded. kDepth parts write to `depth_scratch` (count x m x n, of R) with
// ldc = n, and `first` says whether a part is the first of the k runs. Returns false if any call
// did (then C is unreliable).
template <typename T, typename R, typename Part>
bool ForEachGemmPart(const GemmSplit& split, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                     const T* a, int64_t lda, const T* b, int64_t ldb, R* c, int64_t ldc,
                     const R* bias, R* depth_scratch, Part&& part) {
  std::atomic<bool> ok{true};
  ParallelFor(split.count, 1, [&](int64_t begin, int64_t end) {
    const LibraryThreads single(1);
    for (int64_t p = begin; p < end && ok.load(std::memory_order_relaxed); ++p) {
      const int64_t lo = p * split.size;
      bool done = false;
      switch (split.kind) {
        case GemmSplit::kRows: {
          const int64_t rows = std::min(split.size, m - lo);
          done = part(rows, n, k, a + (ta ? lo : lo * lda), b, c + lo * ldc, ldc, bias);
          break;
        }
        case GemmSplit::kCols: {
          const int64_t cols = std::min(split.size, n - lo);
          done = part(m, cols, k, a, b + (tb ? lo * ldb : lo), c + lo, ldc,
                      bias == nullptr ? nullptr : bias + lo);
          break;
        }
        case GemmSplit::kDepth: {
          const int64_t depth = std::min(split.size, k - lo);
          done = part(m, n, depth, a + (ta ? lo * lda : lo), b + (tb ? lo : lo * ldb),
                      depth_scratch + p * m * n, n, static_cast<const R*>(nullptr));
          break;
        }
      }
      if (!done) ok.store(false, std::memory_order_relaxed);
    }
  });
  return ok.load();
}

// C (+)= the kDepth parts in `scratch` (count x m x n), added in part order per element
// ((c + part 0) + part 1) + ...: a row at a time, so that each pass is a vector loop.
template <typename R>
void AddDepthParts(int64_t count, int64_t m, int64_t n, const R* scratch, R* c, int64_t ldc,
                   bool accumulate) {
  ParallelFor(m, RowsPerThread(n * count), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      R* row = c + i * ldc;
      const R* first = scratch + i * n;
      if (accumulate) {
        for (int64_t j = 0; j < n; ++j) row[j] += first[j];
      } else {
        std::copy(first, first + n, row);
      }
      for (int64_t p = 1; p < count; ++p) {
        const R* part = scratch + (p * m + i) * n;
        for (int64_t j = 0; j < n; ++j) row[j] += part[j];
      }
    }
  });
}

// C = A @ B (+ C when accumulate), row-major, with A [m, k] / B [k, n] optionally transposed;
// f32 through oneDNN or OpenBLAS (the same values up to the order of the additions), f64 through
// OpenBLAS. With `bias` [n] (not with accumulate), C[i, j] = (A @ B)[i, j] + bias[j], the sum
// rounded and then the bias added (oneDNN adds it in the product's own pass). The same bits at
// every thread count (SplitGemm).
template <typename T>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T* c, int64_t ldc, bool accumulate = false, const T* bias = nullptr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "Gemm: f32 or f64");
  GemmTiming timing(m, n, k);
  const CBLAS_TRANSPOSE transa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE transb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    // The smallest products (an attention head's) in one pass of our own: OpenBLAS's fixed
    // costs per call (zeroing C, packing both operands) were most of their time.
    if (m * n * k <= 64 * 64 * 64) {
      SmallGemmF32(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
      AddBias(m, n, bias, c, ldc);
      return;
    }
  }
  const GemmSplit split = SplitGemm(m, n, k, /*allow_depth=*/bias == nullptr);
  const bool depth = split.kind == GemmSplit::kDepth;
  // f32: oneDNN's matmul where it has a fast kernel (it is faster than OpenBLAS on the
  // products of these models), else OpenBLAS; accumulation is OpenBLAS's.
  ScratchVector<T> parts(depth ? static_cast<size_t>(split.count * m * n) : 0);
  ForEachGemmPart<T, T>(split, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, bias, parts.data(),
                        [&](int64_t pm, int64_t pn, int64_t pk, const T* pa, const T* pb, T* pc,
                            int64_t pldc, const T* pbias) {
                          if constexpr (std::is_same_v<T, float>) {
                            if (!accumulate && DnnlMatmul(DType::kF32, DType::kF32, ta, tb, pm, pn,
                                                          pk, pa, lda, pb, ldb, pc, pldc, pbias)) {
                              return true;
                            }
                            cblas_sgemm(CblasRowMajor, transa, transb, pm, pn, pk, 1.0f, pa, lda,
                                        pb, ldb, accumulate && !depth ? 1.0f : 0.0f, pc, pldc);
                          } else {
                            cblas_dgemm(CblasRowMajor, transa, transb, pm, pn, pk, 1.0, pa, lda, pb,
                                        ldb, accumulate && !depth ? 1.0 : 0.0, pc, pldc);
                          }
                          AddBias(pm, pn, pbias, pc, pldc);
                          return true;
                        });
  if (depth) AddDepthParts(split.count, m, n, parts.data(), c, ldc, accumulate);
}

// C = A @ B as in Gemm, for A and B of f16/bf16 T, accumulated in f32 and written as Out (float:
// unrounded; T: rounded once per element), through oneDNN (AVX-512 BF16 / AMX where present).
// Returns false where oneDNN cannot (see DnnlMatmul): the caller then widens the operands and
// calls Gemm<float>, which gives the same values up to the order of the f32 additions.
template <typename T, typename Out>
bool LowPrecisionGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                      const T* b, int64_t ldb, Out* c, int64_t ldc) {
  static_assert(kIsReduced<T> && (std::is_same_v<Out, T> || std::is_same_v<Out, float>),
                "LowPrecisionGemm: f16/bf16 operands, an f32 or same-type result");
  GemmTiming timing(m, n, k);
  // Split as Gemm splits (SplitGemm), for the same bits at every thread count; no kDepth parts,
  // since a rounded result is rounded once from the whole sum.
  const bool done = ForEachGemmPart<T, Out>(
      SplitGemm(m, n, k, /*allow_depth=*/false), ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
      static_cast<const Out*>(nullptr), static_cast<Out*>(nullptr),
      [&](int64_t pm, int64_t pn, int64_t pk, const T* pa, const T* pb, Out* pc, int64_t pldc,
          const Out*) {
        return DnnlMatmul(DTypeOf<T>(), DTypeOf<Out>(), ta, tb, pm, pn, pk, pa, lda, pb, ldb, pc,
                          pldc);
      });
  if (!done) timing.Cancel();  // the caller multiplies instead, and that product is timed
  return done;
}

// A GEMM operand of `count` contiguous values in the compute type C (float for f16/bf16/f32,
// double for f64): `p` itself when T is C, else its values widened (exactly) into `scratch`,
// which the caller keeps alive while the pointer is used.
template <typename C, typename T>
const C* GemmOperand(const T* p, int64_t count, ScratchVector<C>& scratch) {
  if constexpr (std::is_same_v<T, C>) {
    return p;
  } else {
    scratch.resize(static_cast<size_t>(count));
    C* s = scratch.data();
    ParallelFor(count, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<C, float>) {
        WidenToF32(p + begin, s + begin, end - begin);
      } else {
        for (int64_t i = begin; i < end; ++i) s[i] = static_cast<C>(Widen(p[i]));
      }
    });
    return s;
  }
}

// Where a GEMM writes `count` values bound for `out` (contiguous, of T): `out` itself when T is
// C, else `scratch`, which StoreGemmResult then rounds into `out` (once per element).
template <typename C, typename T>
C* GemmResult(T* out, int64_t count, ScratchVector<C>& scratch) {
  if constexpr (std::is_same_v<T, C>) {
    return out;
  } else {
    scratch.resize(static_cast<size_t>(count));
    return scratch.data();
  }
}
template <typename C, typename T>
void StoreGemmResult(const C* result, int64_t count, T* out) {
  if constexpr (!std::is_same_v<T, C>) {
    ParallelFor(count, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<C, float>) {
        RoundFromF32(result + begin, out + begin, end - begin);
      } else {
        for (int64_t i = begin; i < end; ++i) out[i] = Convert<T>(result[i]);
      }
    });
  }
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_GEMM_H_
