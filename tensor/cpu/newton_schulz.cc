// Muon's Newton-Schulz iteration on the CPU (tensor/kernel_list.inc: NewtonSchulz). Each product
// of an iteration is split into blocks (of rows for G and U, of columns of X for U X), each one
// single-threaded library call (oneDNN where it multiplies the dtype, else OpenBLAS on widened
// operands); a block's call and its operands depend on the shape alone, so the bits do not
// depend on the thread count. The threads take whole matrices of the batch when the matrices
// share them evenly (each matrix's iterations then run without a barrier), else the blocks of
// each phase. The symmetric G = X X^T and
// U = b G + c G G are computed for one triangle of blocks (a row block against the columns from
// its first row on; G rounded by the library where it can) and mirrored: at m = 256, 10 of the
// 16 blocks' products.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/dnnl.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cpu/thread_governor.h"
#include "tensor/cpu/vec_math.h"

namespace tg::cpu {
namespace {

// Rows per block of G and U, columns per block of U X: the blocks follow the shape alone.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kBlockCols = 512;

// `rows` rows of `cols` values at stride `ld`, widened (exactly) to f32 and packed.
template <typename T>
ScratchVector<float> WidenedRows(const T* p, int64_t rows, int64_t cols, int64_t ld) {
  ScratchVector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) WidenToF32(p + r * ld, out.data() + r * cols, cols);
  return out;
}

// c [pm, pn] (ldc) = a [pm, pk] (lda) @ b, with b [pk, pn] (ldb) or, with tb, b [pn, pk]
// transposed; summed in ComputeType<T> and not rounded to T. Called single-threaded.
template <typename T>
void BlockProduct(bool tb, int64_t pm, int64_t pn, int64_t pk, const T* a, int64_t lda, const T* b,
                  int64_t ldb, ComputeType<T>* c, int64_t ldc) {
  GemmTiming timing(pm, pn, pk);
  const CBLAS_TRANSPOSE transb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, transb, pm, pn, pk, 1.0, a, lda, b, ldb, 0.0, c, ldc);
  } else {
    if (DnnlMatmul(DTypeOf<T>(), DType::kF32, false, tb, pm, pn, pk, a, lda, b, ldb, c, ldc)) {
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, transb, pm, pn, pk, 1.0f, a, lda, b, ldb, 0.0f, c,
                  ldc);
    } else {
      const ScratchVector<float> wa = WidenedRows(a, pm, pk, lda);
      const int64_t b_rows = tb ? pn : pk, b_cols = tb ? pk : pn;
      const ScratchVector<float> wb = WidenedRows(b, b_rows, b_cols, ldb);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, transb, pm, pn, pk, 1.0f, wa.data(), pk, wb.data(),
                  b_cols, 0.0f, c, ldc);
    }
  }
}

// The same product's f32 (f64) sums rounded once to T, written to c (ldc) by the library where
// it can, else through `acc`. Which path runs depends on the dtype and the CPU alone (DnnlMatmul
// takes or declines a bf16 result exactly where it takes or declines an f32 one).
template <typename T>
void RoundedBlockProduct(bool tb, int64_t pm, int64_t pn, int64_t pk, const T* a, int64_t lda,
                         const T* b, int64_t ldb, T* c, int64_t ldc,
                         ScratchVector<ComputeType<T>>& acc) {
  if constexpr (std::is_same_v<T, double>) {
    BlockProduct<T>(tb, pm, pn, pk, a, lda, b, ldb, c, ldc);
  } else {
    if (DnnlMatmul(DTypeOf<T>(), DTypeOf<T>(), false, tb, pm, pn, pk, a, lda, b, ldb, c, ldc)) {
      return;
    }
    acc.resize(static_cast<size_t>(pm * pn));
    BlockProduct<T>(tb, pm, pn, pk, a, lda, b, ldb, acc.data(), pn);
    for (int64_t r = 0; r < pm; ++r) StoreRow(acc.data() + r * pn, pn, c + r * ldc, 1);
  }
}

template <typename T>
void NewtonSchulzOf(const RawTensor& out, const RawTensor& x, double a, double b, double c,
                    int64_t ns_steps, double eps) {
  using C = ComputeType<T>;
  const int64_t batch = x.size(0), m = x.size(1), n = x.size(2);
  if (batch == 0 || m == 0) return;
  const int64_t mn = m * n, mm = m * m;
  const T* src = static_cast<const T*>(x.raw_data());
  T* const dst = static_cast<T*>(out.raw_data());
  // The iterate alternates between dst and `next`, starting where the last step writes dst.
  ScratchVector<T> next(static_cast<size_t>(ns_steps > 0 ? batch * mn : 0));
  T* cur = ns_steps % 2 == 1 ? next.data() : dst;
  T* nxt = ns_steps % 2 == 1 ? dst : next.data();

  // X = x / max(norm, eps), the norm's squares exact in f64 and summed in SumF64's order.
  const C floor = static_cast<C>(Widen(Convert<T>(eps)));
  ParallelFor(batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* xi = src + i * mn;
      double sum = 0;
      if constexpr (std::is_same_v<T, double>) {
        sum = SumF64(mn, [&](int64_t j) { return xi[j] * xi[j]; });
      } else {
        ScratchVector<float> widened(static_cast<size_t>(kIsReduced<T> ? mn : 0));
        sum = SumSquaredDeviationsF64(RowAs<float>(xi, mn, widened.data()), mn, 0.0);
      }
      const C norm =
          static_cast<C>(Widen(Convert<T>(std::sqrt(static_cast<double>(static_cast<C>(sum))))));
      const C denom = std::isnan(norm) ? norm : std::max(norm, floor);
      // Row by row, widened to C, divided and rounded back to T.
      ScratchVector<C> row(static_cast<size_t>(n));
      for (int64_t r = 0; r < m; ++r) {
        LoadRow(xi + r * n, 1, n, row.data());
        for (int64_t j = 0; j < n; ++j) row[j] /= denom;
        StoreRow(row.data(), n, cur + i * mn + r * n, 1);
      }
    }
  });
  if (ns_steps == 0) return;

  // fn(matrix, first, count, scratch) for every matrix in [i0, i1) and every block [first,
  // first + count) of rows or columns: `starts` (each block `size` long, the last one clipped
  // to `extent`). The tasks are spread over the threads (on the calling thread alone inside a
  // parallel region).
  auto for_each_block = [&](int64_t i0, int64_t i1, const std::vector<int64_t>& starts,
                            int64_t size, int64_t extent, auto&& fn) {
    const int64_t blocks = static_cast<int64_t>(starts.size());
    ParallelFor((i1 - i0) * blocks, 1, [&](int64_t begin, int64_t end) {
      const LibraryThreads single(1);
      ScratchVector<C> scratch;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t first = starts[static_cast<size_t>(t % blocks)];
        fn(i0 + t / blocks, first, std::min(size, extent - first), scratch);
      }
    });
  };
  // The row blocks of the triangles G and U. They shrink with their first row, so they are
  // ordered first, last, second, second to last, ...: ParallelFor's contiguous shares then get
  // equal work.
  std::vector<int64_t> triangle_rows;
  for (int64_t lo = 0, hi = (m - 1) / kBlockRows; lo <= hi; ++lo, --hi) {
    triangle_rows.push_back(lo * kBlockRows);
    if (hi != lo) triangle_rows.push_back(hi * kBlockRows);
  }
  // The column blocks of U X: each multiplies all of U by a block of X's columns, so X is read
  // (packed) once per product rather than once per block of rows.
  const int64_t block_cols = std::min(n, kBlockCols);
  std::vector<int64_t> column_starts;
  for (int64_t j = 0; j < n; j += block_cols) column_starts.push_back(j);
  // Mirrors the rows [r0, r0 + rows) of a symmetric matrix s, stored from their diagonal on,
  // into s[j, r] column by column, so that the writes are contiguous.
  auto mirror_rows = [&](T* s, int64_t r0, int64_t rows) {
    for (int64_t j = r0 + 1; j < m; ++j) {
      const int64_t r_end = std::min(r0 + rows, j);
      for (int64_t r = r0; r < r_end; ++r) s[j * m + r] = s[r * m + j];
    }
  };
  ScratchVector<T> gram(static_cast<size_t>(batch * mm)), update(static_cast<size_t>(batch * mm));
  const C ca = static_cast<C>(a), cb = static_cast<C>(b), cc = static_cast<C>(c);

  // The ns_steps iterations of the matrices [i0, i1).
  auto iterate = [&](int64_t i0, int64_t i1) {
    T* cur_i = cur;
    T* nxt_i = nxt;
    for (int64_t step = 0; step < ns_steps; ++step) {
      // G = X X^T.
      for_each_block(i0, i1, triangle_rows, kBlockRows, m,
                     [&](int64_t i, int64_t r0, int64_t rows, ScratchVector<C>& acc) {
                       const T* xi = cur_i + i * mn;
                       T* gi = gram.data() + i * mm;
                       RoundedBlockProduct<T>(true, rows, m - r0, n, xi + r0 * n, n, xi + r0 * n, n,
                                              gi + r0 * m + r0, m, acc);
                       mirror_rows(gi, r0, rows);
                     });
      // U = b G + c G G.
      for_each_block(
          i0, i1, triangle_rows, kBlockRows, m,
          [&](int64_t i, int64_t r0, int64_t rows, ScratchVector<C>& acc) {
            const T* g = gram.data() + i * mm;
            const int64_t cols = m - r0;
            acc.resize(static_cast<size_t>(rows * cols));
            BlockProduct<T>(false, rows, cols, m, g + r0 * m, m, g + r0, m, acc.data(), cols);
            ScratchVector<C> row(static_cast<size_t>(cols));
            for (int64_t r = r0; r < r0 + rows; ++r) {
              const int64_t len = m - r;
              C* cgg = acc.data() + (r - r0) * cols + (r - r0);
              LoadRow(g + r * m + r, 1, len, row.data());
              for (int64_t j = 0; j < len; ++j) {
                const C bg = cb * row[j];
                const C p = cc * cgg[j];
                cgg[j] = bg + p;
              }
            }
            T* ui = update.data() + i * mm;
            for (int64_t r = r0; r < r0 + rows; ++r) {
              StoreRow(acc.data() + (r - r0) * cols + (r - r0), m - r, ui + r * m + r, 1);
            }
            mirror_rows(ui, r0, rows);
          });
      // X = a X + U X, into the other buffer, by blocks of columns.
      for_each_block(i0, i1, column_starts, block_cols, n,
                     [&](int64_t i, int64_t j0, int64_t cols, ScratchVector<C>& acc) {
                       const T* xi = cur_i + i * mn + j0;
                       acc.resize(static_cast<size_t>(m * cols));
                       BlockProduct<T>(false, m, cols, m, update.data() + i * mm, m, xi, n,
                                       acc.data(), cols);
                       ScratchVector<C> row(static_cast<size_t>(cols));
                       for (int64_t r = 0; r < m; ++r) {
                         const C* ux = acc.data() + r * cols;
                         LoadRow(xi + r * n, 1, cols, row.data());
                         for (int64_t j = 0; j < cols; ++j) {
                           const C ax = ca * row[j];
                           row[j] = ax + ux[j];
                         }
                         StoreRow(row.data(), cols, nxt_i + i * mn + r * n + j0, 1);
                       }
                     });
      std::swap(cur_i, nxt_i);
    }
  };
  // Each block's products and roundings are the same whichever thread runs them, so only the
  // schedule depends on the thread count: whole matrices per thread when they share the threads
  // evenly (no barrier between the 3 * ns_steps phases), else the blocks of each phase.
  const int threads = RegionThreads();
  if (threads > 1 && (batch % threads == 0 || batch >= 4 * threads)) {
    ParallelFor(batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) iterate(i, i + 1);
    });
  } else {
    iterate(0, batch);
  }
}

}  // namespace

KernelStatus NewtonSchulz(const RawTensor& out, const RawTensor& x, double a, double b, double c,
                          int64_t ns_steps, double eps) {
  VisitFloating("NewtonSchulz", x.dtype(),
                [&](auto tag) { NewtonSchulzOf<decltype(tag)>(out, x, a, b, c, ns_steps, eps); });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
