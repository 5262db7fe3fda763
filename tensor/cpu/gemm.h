// The one call into OpenBLAS GEMM used by the CPU kernels (matmul, conv), with the optional
// per-thread time accounting of tensor/profile.h.
#ifndef TAPEGRAD_TENSOR_CPU_GEMM_H_
#define TAPEGRAD_TENSOR_CPU_GEMM_H_

#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <type_traits>

#include "tensor/profile.h"

namespace tg::cpu {

// C = A @ B (+ C when accumulate), row-major, with A [m, k] / B [k, n] optionally transposed.
template <typename T>
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T* c, int64_t ldc, bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "Gemm: f32 or f64");
  GemmProfile* profile = CurrentGemmProfile();
  const auto start = profile != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
  const CBLAS_TRANSPOSE transa = ta ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE transb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, transa, transb, m, n, k, 1.0f, a, lda, b, ldb,
                accumulate ? 1.0f : 0.0f, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, transa, transb, m, n, k, 1.0, a, lda, b, ldb,
                accumulate ? 1.0 : 0.0, c, ldc);
  }
  if (profile != nullptr) {
    profile->calls += 1;
    profile->seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    profile->flops += 2.0 * static_cast<double>(m) * n * k;
  }
}

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_GEMM_H_
