// The fused Linear kernels of the kernel list on the CPU: LinearForward (GEMM + bias + tanh-GELU
// epilogue) and LinearBackward (GELU derivative + bias gradient in one pass, then the two
// gradient GEMMs). The products go through gemm.h: f16/bf16 operands to oneDNN where it
// multiplies them natively (f32 sums), else OpenBLAS (f32 for f16/bf16/f32, f64 for f64);
// everything else is one pass over the [m, n] result, in place of the composed chain
// (tensor/composed.cc) that writes and re-reads a full [m, n] tensor per op.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"

namespace tg::cpu {
namespace {

// col[j] += sum over the m rows of v[r, j] (v [m, n] row-major), accumulated in f64 in row order
// for each column (deterministic); threads split the columns.
template <typename V>
void ColumnSums(const V* v, int64_t m, int64_t n, double* col) {
  ParallelFor(n, std::max<int64_t>(16, (int64_t{1} << 14) / std::max<int64_t>(1, m)),
              [&](int64_t begin, int64_t end) {
                const int64_t cols = end - begin;
                if constexpr (std::is_same_v<V, float>) {
                  AddColumnsToF64(v + begin, m, n, cols, col + begin);
                } else if constexpr (kIsReduced<V>) {
                  // f16/bf16: blocks of rows widened to f32 (exactly), then summed as f32 rows.
                  constexpr int64_t kRows = 64;
                  ScratchVector<float> block(static_cast<size_t>(kRows * cols));
                  for (int64_t r0 = 0; r0 < m; r0 += kRows) {
                    const int64_t rows = std::min(kRows, m - r0);
                    for (int64_t r = 0; r < rows; ++r) {
                      WidenToF32(v + (r0 + r) * n + begin, block.data() + r * cols, cols);
                    }
                    AddColumnsToF64(block.data(), rows, cols, cols, col + begin);
                  }
                } else {
                  for (int64_t r = 0; r < m; ++r) {
                    const V* row = v + r * n;
                    for (int64_t j = begin; j < end; ++j)
                      col[j] += static_cast<double>(Widen(row[j]));
                  }
                }
              });
}

// out [m, n] = act(x [m, k] @ weight [n, k]^T + bias), pre [m, n] (strided rows) = the sum
// before act, each rounded once to T from the compute type C.
template <typename T>
void LinearForwardImpl(const RawTensor& out, const RawTensor& pre, const RawTensor& x,
                       const RawTensor& weight, const RawTensor& bias, Activation act) {
  using C = ComputeType<T>;
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  if (m == 0 || n == 0) return;
  ScratchVector<C> x_scratch, w_scratch, acc_scratch;
  T* o = out.data<T>();
  // The product [m, n] in C (with the bias in f32/f64). In f32/f64 it goes straight into out (no
  // activation) or into pre (GELU, when pre's rows are dense); otherwise into a scratch buffer
  // that the epilogue reads.
  const bool in_place = std::is_same_v<T, C> && act == Activation::kNone;
  const bool into_pre = std::is_same_v<T, C> && act != Activation::kNone &&
                        pre.strides()[1] == 1 && (m == 1 || pre.strides()[0] == n);
  // (acc is written again by the epilogue: GELU's input row becomes its output row.)
  C* acc;
  if (in_place) {
    acc = reinterpret_cast<C*>(o);
  } else if (into_pre) {
    acc = reinterpret_cast<C*>(pre.data<T>());
  } else {
    acc_scratch.resize(static_cast<size_t>(m * n));
    acc = acc_scratch.data();
  }
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  // f32/f64: the product adds the bias itself (gemm.h: the same roundings, in the GEMM's pass);
  // f16/bf16: the epilogue adds it in C.
  const bool bias_in_product = std::is_same_v<T, C> && b != nullptr;
  bool multiplied = false;
  if constexpr (kIsReduced<T>) {
    multiplied = LowPrecisionGemm<T, C>(false, /*tb=*/true, m, n, k, x.data<T>(), k,
                                        weight.data<T>(), k, acc, n);
  }
  if (!multiplied) {
    const C* xc = GemmOperand<C>(x.data<T>(), m * k, x_scratch);       // [m, k]
    const C* wc = GemmOperand<C>(weight.data<T>(), n * k, w_scratch);  // [n, k]
    Gemm<C>(/*ta=*/false, /*tb=*/true, m, n, k, xc, k, wc, k, acc, n, /*accumulate=*/false,
            bias_in_product ? reinterpret_cast<const C*>(b) : nullptr);
  }
  if (in_place) return;  // out holds the product and the bias

  std::vector<C> bc;  // bias [n] in C, widened once rather than per row
  if (b != nullptr && !bias_in_product) {
    bc.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) bc[j] = static_cast<C>(Widen(b[j]));
  }
  // The epilogue, one pass per row: p = acc + bias in C; pre = round(p); out = round(act(p)) --
  // GELU reads the unrounded sum, as the composed GeluTanh(Matmul + bias) does.
  T* p_base = act == Activation::kNone ? nullptr : pre.data<T>();
  const int64_t p_row = act == Activation::kNone ? 0 : pre.strides()[0];
  const int64_t p_col = act == Activation::kNone ? 0 : pre.strides()[1];
  ParallelFor(m, RowsPerThread(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* orow = o + r * n;
      if (act == Activation::kNone) {  // f16/bf16 (f32/f64 returned above)
        C* p = acc + r * n;              // the bias in place, then rounded into out
        if (!bc.empty()) {
          for (int64_t j = 0; j < n; ++j) p[j] += bc[j];
        }
        StoreRow(p, n, orow, 1);
        continue;
      }
      // GELU of the row in place in the product buffer (the row is read by this thread only).
      C* p = acc + r * n;
      if (!bc.empty()) {
        for (int64_t j = 0; j < n; ++j) p[j] += bc[j];
      }
      if (!into_pre) StoreRow(p, n, p_base + r * p_row, p_col);
      if constexpr (std::is_same_v<T, C>) {
        GeluTanhRow(p, orow, n);
      } else {
        GeluTanhRow(p, p, n);
        StoreRow(p, n, orow, 1);
      }
    }
  });
}

// grad_input = g @ weight, grad_weight = g^T @ x, grad_bias = column sums of g, for g =
// grad_out * act'(pre) computed in C and rounded to T before the products.
template <typename T>
void LinearBackwardImpl(const RawTensor& grad_input, const RawTensor& grad_weight,
                        const RawTensor& grad_bias, const RawTensor& grad_out, const RawTensor& x,
                        const RawTensor& weight, const RawTensor& pre, Activation act) {
  using C = ComputeType<T>;
  const int64_t m = grad_out.size(0), n = grad_out.size(1), k = x.size(1);
  const T* go = grad_out.data<T>();
  // The bias gradient accumulates in f64, rows in order (deterministic), and rounds once.
  std::vector<double> col;
  if (grad_bias.defined()) col.assign(static_cast<size_t>(n), 0.0);
  const bool need_products = grad_input.defined() || grad_weight.defined();

  // g [m, n], the products' operand: values of T, held in T for oneDNN (f16/bf16: g_low) and
  // in C for OpenBLAS (g; for f16/bf16 widened from g_low only if oneDNN declines).
  ScratchVector<C> g_scratch;
  ScratchVector<T> g_low_scratch;
  const C* g = nullptr;
  const T* g_low = nullptr;
  if (act == Activation::kNone) {
    if constexpr (kIsReduced<T>) {
      g_low = go;
    } else if (need_products) {
      g = go;
    }
    if (!col.empty()) ColumnSums(go, m, n, col.data());
  } else {
    // gc = grad_out * gelu'(pre) in C, row by row in parallel; the bias sums gc before it is
    // rounded to T for the products.
    g_scratch.resize(static_cast<size_t>(m * n));
    C* gc = g_scratch.data();
    const T* p_base = pre.data<T>();
    const int64_t p_row = pre.strides()[0], p_col = pre.strides()[1];
    ParallelFor(m, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      ScratchVector<C> g_row(static_cast<size_t>(n));
      for (int64_t r = begin; r < end; ++r) {
        C* row = gc + r * n;
        if (std::is_same_v<T, C> && p_col == 1) {  // gelu'(pre) read straight from pre
          GeluTanhGradRow(reinterpret_cast<const C*>(p_base + r * p_row), row, n);
        } else {
          LoadRow(p_base + r * p_row, p_col, n, row);
          GeluTanhGradRow(row, row, n);
        }
        const C* g_in = RowAs<C>(go + r * n, n, g_row.data());
        for (int64_t j = 0; j < n; ++j) row[j] = g_in[j] * row[j];
      }
    });
    if (!col.empty()) ColumnSums(gc, m, n, col.data());
    if constexpr (kIsReduced<T>) {
      if (need_products) {  // rounded once into T (g_compute widens it back if oneDNN declines)
        g_low_scratch.resize(static_cast<size_t>(m * n));
        T* low = g_low_scratch.data();
        ParallelFor(m * n, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
          StoreRow(gc + begin, end - begin, low + begin, 1);
        });
        g_low = low;
      }
    } else {
      g = gc;
    }
  }
  auto g_compute = [&]() -> const C* {  // g in C, widened from g_low on first use
    if (g == nullptr) g = GemmOperand<C>(g_low, m * n, g_scratch);
    return g;
  };
  if (grad_bias.defined()) {
    T* gb = grad_bias.data<T>();
    for (int64_t j = 0; j < n; ++j) gb[j] = Convert<T>(col[j]);
  }
  ScratchVector<C> operand_scratch, result_scratch;
  if (grad_input.defined()) {  // [m, k] = g [m, n] @ weight [n, k]
    T* gi = grad_input.data<T>();
    bool done = false;
    if constexpr (kIsReduced<T>) {
      done = LowPrecisionGemm<T, T>(false, false, m, k, n, g_low, n, weight.data<T>(), k, gi, k);
    }
    if (!done) {
      const C* wc = GemmOperand<C>(weight.data<T>(), n * k, operand_scratch);
      C* dst = GemmResult<C>(gi, m * k, result_scratch);
      Gemm<C>(false, false, m, k, n, g_compute(), n, wc, k, dst, k);
      StoreGemmResult(dst, m * k, gi);
    }
  }
  if (grad_weight.defined()) {  // [n, k] = g^T (the transpose flag, no copy) @ x [m, k]
    T* gw = grad_weight.data<T>();
    bool done = false;
    if constexpr (kIsReduced<T>) {
      done = LowPrecisionGemm<T, T>(/*ta=*/true, false, n, k, m, g_low, n, x.data<T>(), k, gw, k);
    }
    if (!done) {
      const C* xc = GemmOperand<C>(x.data<T>(), m * k, operand_scratch);
      C* dst = GemmResult<C>(gw, n * k, result_scratch);
      Gemm<C>(/*ta=*/true, false, n, k, m, g_compute(), n, xc, k, dst, k);
      StoreGemmResult(dst, n * k, gw);
    }
  }
}

}  // namespace

KernelStatus LinearForward(const RawTensor& out, const RawTensor& pre, const RawTensor& x,
                           const RawTensor& weight, const RawTensor& bias, Activation act) {
  VisitFloating("linear", x.dtype(), [&](auto tag) {
    LinearForwardImpl<decltype(tag)>(out, pre, x, weight, bias, act);
  });
  return KernelStatus::kDone;
}

KernelStatus LinearBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                            const RawTensor& grad_bias, const RawTensor& grad_out,
                            const RawTensor& x, const RawTensor& weight, const RawTensor& pre,
                            Activation act) {
  VisitFloating("linear_backward", x.dtype(), [&](auto tag) {
    LinearBackwardImpl<decltype(tag)>(grad_input, grad_weight, grad_bias, grad_out, x, weight, pre,
                                      act);
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
