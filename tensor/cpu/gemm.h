// The calls into GEMM used by the CPU kernels (matmul, conv, the fused Linear and attention):
// OpenBLAS for f32/f64, oneDNN for f16/bf16 operands where it multiplies them natively
// (LowPrecisionGemm), with the optional per-thread time accounting of tensor/profile.h; and the
// widening of f16/bf16 operands to f32 that the kernels do where oneDNN cannot.
#ifndef TAPEGRAD_TENSOR_CPU_GEMM_H_
#define TAPEGRAD_TENSOR_CPU_GEMM_H_

#include <cblas.h>

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

// C = A @ B (+ C when accumulate), row-major, with A [m, k] / B [k, n] optionally transposed;
// f32 through oneDNN or OpenBLAS (the same values up to the order of the additions), f64 through
// OpenBLAS. With `bias` [n] (not with accumulate), C[i, j] = (A @ B)[i, j] + bias[j], the sum
// rounded and then the bias added (oneDNN adds it in the product's own pass).
template <typename T>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T* c, int64_t ldc, bool accumulate = false, const T* bias = nullptr) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "Gemm: f32 or f64");
  GemmProfile* profile = CurrentGemmProfile();
  const auto start = profile != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
  const CBLAS_TRANSPOSE transa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE transb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    // f32: oneDNN's matmul where it has a fast kernel (it scales better than OpenBLAS over
    // threads on the products of these models), else OpenBLAS; accumulation is OpenBLAS's, and
    // so are the smallest products (an attention head's): there oneDNN's cost per call (the
    // primitive's lookup, its memory objects: ~1-2 us) exceeds the product's own time.
    constexpr int64_t kSmallProduct = 64 * 64 * 64;
    if (accumulate || m * n * k <= kSmallProduct ||
        !DnnlMatmul(DType::kF32, DType::kF32, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, bias)) {
      cblas_sgemm(CblasRowMajor, transa, transb, m, n, k, 1.0f, a, lda, b, ldb,
                  accumulate ? 1.0f : 0.0f, c, ldc);
      AddBias(m, n, bias, c, ldc);
    }
  } else {
    cblas_dgemm(CblasRowMajor, transa, transb, m, n, k, 1.0, a, lda, b, ldb, accumulate ? 1.0 : 0.0,
                c, ldc);
    AddBias(m, n, bias, c, ldc);
  }
  if (profile != nullptr) {
    profile->calls += 1;
    profile->seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    profile->flops += 2.0 * static_cast<double>(m) * n * k;
  }
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
  GemmProfile* profile = CurrentGemmProfile();
  const auto start = profile != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
  if (!DnnlMatmul(DTypeOf<T>(), DTypeOf<Out>(), ta, tb, m, n, k, a, lda, b, ldb, c, ldc)) {
    return false;
  }
  if (profile != nullptr) {
    profile->calls += 1;
    profile->seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    profile->flops += 2.0 * static_cast<double>(m) * n * k;
  }
  return true;
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
