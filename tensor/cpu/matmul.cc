// Matmul: one GEMM per batch entry, transposed views passed as transposes. f32/f64 go to
// OpenBLAS; f16/bf16 to oneDNN where it multiplies them natively (f32 accumulation, each result
// rounded once: gemm.h LowPrecisionGemm), else they are converted to f32 first and the f32
// product rounded back once.
#include <array>

#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/strided_loop.h"

namespace tg::cpu {
namespace {

// How one matrix operand [rows, cols] with element strides (row_stride, col_stride) is handed
// to BLAS, or `ok == false` when its layout needs a copy.
struct BlasLayout {
  bool ok = false;
  bool transposed = false;
  int64_t ld = 0;
};

BlasLayout LayoutOf(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  const int64_t min_rows = std::max<int64_t>(rows, 1), min_cols = std::max<int64_t>(cols, 1);
  if ((cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= min_cols)) {
    return {true, false, rows == 1 ? min_cols : row_stride};
  }
  if ((rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= min_rows)) {
    return {true, true, cols == 1 ? min_rows : col_stride};
  }
  return {};
}

BlasLayout MatrixLayout(const RawTensor& t) {
  const int64_t d = t.dim();
  return LayoutOf(t.size(d - 2), t.size(d - 1), t.strides()[d - 2], t.strides()[d - 1]);
}

// Calls gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc) -> bool for each batch entry of out = a @ b
// (T: the storage type); false as soon as one call returns false.
template <typename T, typename GemmFn>
bool BatchedGemm(const RawTensor& out, RawTensor a, RawTensor b, GemmFn&& gemm) {
  if (!MatrixLayout(a).ok) a = a.contiguous();
  if (!MatrixLayout(b).ok) b = b.contiguous();
  const BlasLayout la = MatrixLayout(a), lb = MatrixLayout(b);
  const int64_t d = out.dim();
  const int64_t m = out.size(d - 2), n = out.size(d - 1), k = a.size(d - 1);
  if (m == 0 || n == 0) return true;
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  auto batch_strides = [&](const RawTensor& t) {
    Shape s = BroadcastByteStrides(t, t.shape());
    return Shape(s.begin(), s.end() - 2);
  };
  const std::array<Shape, 3> strides = {batch_strides(out), batch_strides(a), batch_strides(b)};
  bool ok = true;
  ForEachRow<3>(batch,
                {static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data()),
                 static_cast<char*>(b.raw_data())},
                strides, [&](std::array<char*, 3> p, int64_t count, std::array<int64_t, 3> step) {
                  for (int64_t i = 0; i < count && ok; ++i) {
                    T* c = reinterpret_cast<T*>(p[0] + i * step[0]);
                    if (k == 0) {
                      std::fill(c, c + m * n, T(0));
                      continue;
                    }
                    ok = gemm(la.transposed, lb.transposed, m, n, k,
                              reinterpret_cast<const T*>(p[1] + i * step[1]), la.ld,
                              reinterpret_cast<const T*>(p[2] + i * step[2]), lb.ld, c, n);
                  }
                });
  return ok;
}

template <typename T>
void BlasBatchedGemm(const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  BatchedGemm<T>(out, a, b, [](auto... args) {
    Gemm<T>(args...);
    return true;
  });
}

}  // namespace

void Matmul(const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  switch (out.dtype()) {
    case DType::kF32:
      return BlasBatchedGemm<float>(out, a, b);
    case DType::kF64:
      return BlasBatchedGemm<double>(out, a, b);
    default: {
      const bool done = VisitFloating("matmul", out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (kIsReduced<T>) {
          return BatchedGemm<T>(out, a, b, [](auto... args) {
            return LowPrecisionGemm<T, T>(args...);
          });
        }
        return false;
      });
      if (done) return;
      // Where oneDNN cannot: multiply in f32, round once.
      RawTensor out32 = RawTensor::Empty(out.shape(), kF32);
      BlasBatchedGemm<float>(out32, a.to(kF32), b.to(kF32));
      out.copy_(out32);
    }
  }
}

}  // namespace tg::cpu
