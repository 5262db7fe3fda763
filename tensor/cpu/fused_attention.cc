// The fused scaled dot-product attention kernels of the kernel list on the CPU, one (batch, head)
// at a time: the scores [Tq, Tk] of one head live in a scratch buffer (never a [B, H, Tq, Tk]
// tensor), the softmax runs once per row together with the causal mask (only the unmasked
// prefix of each row is read) and the log-sum-exp statistics, and OpenBLAS does the products
// (f32 for f16/bf16/f32, f64 for f64, through gemm.h). The rounding points are those of the
// composed forms in tensor/composed.cc: the probabilities (and, in the backward, ds) are rounded
// to the input dtype before they multiply, every output is rounded once. Heads run in parallel
// (tensor/cpu/parallel.h), each on one thread with the serial code. Grouped-query attention (k
// and v with fewer heads, each serving a run of query heads) reads each key/value head in place.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cpu/vec_math.h"

namespace tg::cpu {
namespace {

// The [T, D] matrix t[b, h] of a [B, H, T, D] tensor of any strides as a GEMM operand with
// leading dimension *ld: in place when it already holds C with unit column stride (the heads of
// a [B, T, H, D] projection, row stride 3 H D, say), else copied into `scratch` (contiguous,
// compute type C). The copy costs O(T D) against the O(T^2 D) products.
template <typename T, typename C>
const C* HeadOperand(const RawTensor& t, int64_t b, int64_t h, ScratchVector<C>& scratch,
                     int64_t* ld) {
  const Shape& st = t.strides();
  const int64_t rows = t.size(2), d = t.size(3);
  const T* base = t.data<T>() + b * st[0] + h * st[1];
  if constexpr (std::is_same_v<T, C>) {
    if (d > 0 && st[3] == 1 && st[2] >= d) {
      *ld = st[2];
      return base;
    }
  }
  scratch.resize(static_cast<size_t>(rows * d));
  LoadRows(base, st[2], st[3], rows, d, scratch.data());
  *ld = std::max<int64_t>(d, 1);
  return scratch.data();
}

// Where the product for the [T, D] matrix t[b, h] of a [B, H, T, D] output of any strides goes,
// with leading dimension *ld: in place when t holds C with unit column stride (the [B, T, H, D]
// layout the ops allocate on the CPU, or a contiguous one), else `scratch` (contiguous), which
// StoreHeadResult then rounds into t.
template <typename T, typename C>
C* HeadResult(const RawTensor& t, int64_t b, int64_t h, ScratchVector<C>& scratch, int64_t* ld) {
  const Shape& st = t.strides();
  const int64_t rows = t.size(2), d = t.size(3);
  if constexpr (std::is_same_v<T, C>) {
    if ((d == 1 || st[3] == 1) && (rows == 1 || st[2] >= d)) {
      *ld = rows == 1 ? d : st[2];
      return t.data<T>() + b * st[0] + h * st[1];
    }
  }
  scratch.resize(static_cast<size_t>(rows * d));
  *ld = d;
  return scratch.data();
}
template <typename T, typename C>
void StoreHeadResult(const C* result, const RawTensor& t, int64_t b, int64_t h) {
  const Shape& st = t.strides();
  T* base = t.data<T>() + b * st[0] + h * st[1];
  if (reinterpret_cast<const void*>(result) == reinterpret_cast<const void*>(base)) return;
  const int64_t rows = t.size(2), d = t.size(3);
  StoreRows(result, rows, d, base, st[2], st[3]);
}

// The f64 sums [T, D] (contiguous) rounded once into t[b, h].
template <typename T>
void StoreSummedHead(const std::vector<double>& sums, const RawTensor& t, int64_t b, int64_t h) {
  const Shape& st = t.strides();
  T* base = t.data<T>() + b * st[0] + h * st[1];
  const int64_t rows = t.size(2), d = t.size(3);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < d; ++j) {
      base[i * st[2] + j * st[3]] = Convert<T>(sums[static_cast<size_t>(i * d + j)]);
    }
  }
}

// s [rows, cols] (leading dimension lds) = q [rows, d] @ k [cols, d]^T, unscaled; zero when
// d == 0 (an empty sum).
template <typename C>
void Scores(const C* q, int64_t ldq, const C* k, int64_t ldk, int64_t rows, int64_t cols,
            int64_t d, C* s, int64_t lds) {
  if (d == 0) {
    for (int64_t i = 0; i < rows; ++i) std::fill(s + i * lds, s + i * lds + cols, C(0));
    return;
  }
  Gemm<C>(false, /*tb=*/true, rows, cols, d, q, ldq, k, ldk, s, lds);
}

// The largest of row[0, n), or its first NaN (as the Max reduction); -inf when n == 0.
inline float RowMax(const float* row, int64_t n) { return MaxF32(row, n); }
inline double RowMax(const double* row, int64_t n) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (row[j] != row[j]) return row[j];
    max = row[j] > max ? row[j] : max;
  }
  return max;
}

// Keys that query i sees: all of them, or 0..i when causal (Tq == Tk).
inline int64_t VisibleKeys(bool causal, int64_t i, int64_t tk) { return causal ? i + 1 : tk; }

// Causal attention runs its queries in blocks of this many: the products of a block stop at its
// last query's key, which skips the masked upper triangle's blocks (a quarter of the work at
// T = 64, half as T grows). Other attention is one block.
constexpr int64_t kCausalBlock = 32;

// Each block of queries [begin, end) and the keys it sees, [0, keys).
template <typename F>
void ForEachQueryBlock(bool causal, int64_t tq, int64_t tk, F f) {
  const int64_t block = causal ? kCausalBlock : std::max<int64_t>(tq, 1);
  for (int64_t begin = 0; begin < tq; begin += block) {
    const int64_t end = std::min(tq, begin + block);
    f(begin, end, causal ? end : tk);
  }
}

template <typename T>
void AttentionImpl(const RawTensor& out, const RawTensor& stats, const RawTensor& q,
                   const RawTensor& k, const RawTensor& v, bool causal, double scale) {
  using C = ComputeType<T>;
  const int64_t nb = q.size(0), nh = q.size(1), tq = q.size(2), tk = k.size(2), d = q.size(3);
  const int64_t rep = nh / k.size(1);  // query heads per key/value head (grouped-query attention)
  const C cscale = static_cast<C>(scale);
  // Per-head scratch, in C: q [tq, d], k and v [tk, d], the scores, then the rounded
  // probabilities, [tq, tk], and the product [tq, d] (f16/bf16 only: f32/f64 write out).
  C* stats_base = stats.data<C>();
  // Heads are independent: one block of heads per thread, each with its own scratch (GEMM inside
  // a parallel region runs on the calling thread, see parallel.h).
  ParallelFor(
      nb * nh, RowsPerThread(tq * tk * std::max<int64_t>(d, 1)), [&](int64_t begin, int64_t end) {
        ScratchVector<C> q_scratch, k_scratch, v_scratch, s(tq * tk), o_scratch;
        for (int64_t head = begin; head < end; ++head) {
          const int64_t b = head / nh, h = head % nh;
          int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0;
          const C* qh = HeadOperand<T>(q, b, h, q_scratch, &ldq);
          const C* kh = HeadOperand<T>(k, b, h / rep, k_scratch, &ldk);
          const C* vh = HeadOperand<T>(v, b, h / rep, v_scratch, &ldv);
          C* dst = d > 0 ? HeadResult<T>(out, b, h, o_scratch, &ldo) : nullptr;
          C* st = stats_base + head * tq;
          ForEachQueryBlock(causal, tq, tk, [&](int64_t i0, int64_t i1, int64_t keys) {
            Scores(qh + i0 * ldq, ldq, kh, ldk, i1 - i0, keys, d, s.data() + i0 * tk, tk);
            for (int64_t i = i0; i < i1; ++i) {
              // One row: scale, max, exp and sum over the visible keys; the masked ones get
              // probability 0 (exp(-inf - max) in the composed form). The sum accumulates in
              // f64 (rows.h SumF64's order) and rounds to C; the max takes the first NaN, like
              // Max.
              C* row = s.data() + i * tk;
              const int64_t len = VisibleKeys(causal, i, tk);
              for (int64_t j = 0; j < len; ++j) row[j] *= cscale;
              const C max = RowMax(row, len);
              // exp over whole vectors: the masked keys up to the next multiple of 16 (within
              // the row) are set to -inf, whose exp is 0, rather than taking the tail path.
              const int64_t padded = std::min(tk, (len + 15) / 16 * 16);
              for (int64_t j = 0; j < len; ++j) row[j] -= max;
              std::fill(row + len, row + padded, -std::numeric_limits<C>::infinity());
              ExpRow(row, row, padded);
              const C sum = static_cast<C>(RowSumF64(row, len));
              for (int64_t j = 0; j < len; ++j) row[j] /= sum;
              RoundRow<T>(row, len);
              std::fill(row + len, row + keys, C(0));
              st[i] = max + std::log(sum);
            }
            // out[b, h] rows [i0, i1) = p [i0:i1, 0:keys] @ v [0:keys, d].
            if (d > 0) {
              Gemm<C>(false, false, i1 - i0, d, keys, s.data() + i0 * tk, tk, vh, ldv,
                      dst + i0 * ldo, ldo);
            }
          });
          if (d > 0) StoreHeadResult<T>(dst, out, b, h);
        }
      });
}

template <typename T>
void AttentionBackwardImpl(const RawTensor& grad_q, const RawTensor& grad_k,
                           const RawTensor& grad_v, const RawTensor& grad_out, const RawTensor& q,
                           const RawTensor& k, const RawTensor& v, const RawTensor& out,
                           const RawTensor& stats, bool causal, double scale) {
  using C = ComputeType<T>;
  const int64_t nb = q.size(0), nh = q.size(1), tq = q.size(2), tk = k.size(2), d = q.size(3);
  const int64_t nkv = k.size(1), rep = nh / nkv;  // rep query heads per key/value head
  const C cscale = static_cast<C>(scale);
  // Per-head scratch, in C: q, grad_out, out [tq, d]; k, v [tk, d]; the scores s, then p
  // rounded to T, and dp, then ds rounded to T, [tq, tk]; the products (f16/bf16 only).
  const C* stats_base = stats.data<C>();
  // One item per key/value head, its query heads in order. With rep > 1 each query head's
  // grad_k and grad_v (computed in C) are rounded to T, as the repeated key/value heads' gradients
  // are, and summed in f64 in head order, then rounded once: the Sum that reduces a repeat's
  // gradient (tensor/cpu/reduce.cc), so the bits of attention over repeated heads.
  ParallelFor(
      nb * nkv, RowsPerThread(rep * tq * tk * std::max<int64_t>(d, 1)),
      [&](int64_t begin, int64_t end) {
        ScratchVector<C> q_scratch, k_scratch, v_scratch, go_scratch, o_scratch, p(tq * tk),
            ds(tq * tk), gq_scratch, gk_scratch, gv_scratch;
        std::vector<double> sum_k, sum_v;
        if (rep > 1) {
          gk_scratch.resize(static_cast<size_t>(tk * d));
          gv_scratch.resize(static_cast<size_t>(tk * d));
        }
        for (int64_t item = begin; item < end; ++item) {
          const int64_t b = item / nkv, kvh = item % nkv;
          int64_t ldk = 0, ldv = 0;
          const C* kh = HeadOperand<T>(k, b, kvh, k_scratch, &ldk);
          const C* vh = HeadOperand<T>(v, b, kvh, v_scratch, &ldv);
          if (rep > 1) {
            sum_k.assign(static_cast<size_t>(tk * d), 0.0);
            sum_v.assign(static_cast<size_t>(tk * d), 0.0);
          }
          for (int64_t r = 0; r < rep; ++r) {
            const int64_t h = kvh * rep + r, head = b * nh + h;
            int64_t ldq = 0, ldgo = 0, ldo = 0, ldgq = 0, ldgk = d, ldgv = d;
            const C* qh = HeadOperand<T>(q, b, h, q_scratch, &ldq);
            const C* goh = HeadOperand<T>(grad_out, b, h, go_scratch, &ldgo);
            const C* oh = HeadOperand<T>(out, b, h, o_scratch, &ldo);
            C* gq = HeadResult<T>(grad_q, b, h, gq_scratch, &ldgq);
            C* gk = rep > 1 ? gk_scratch.data() : HeadResult<T>(grad_k, b, kvh, gk_scratch, &ldgk);
            C* gv = rep > 1 ? gv_scratch.data() : HeadResult<T>(grad_v, b, kvh, gv_scratch, &ldgv);
            const C* st = stats_base + head * tq;
            ForEachQueryBlock(causal, tq, tk, [&](int64_t i0, int64_t i1, int64_t keys) {
              const int64_t rows = i1 - i0;
              Scores(qh + i0 * ldq, ldq, kh, ldk, rows, keys, d, p.data() + i0 * tk, tk);
              // dp [rows, keys] = grad_out [rows, d] @ v [keys, d]^T.
              Scores(goh + i0 * ldgo, ldgo, vh, ldv, rows, keys, d, ds.data() + i0 * tk, tk);
              for (int64_t i = i0; i < i1; ++i) {
                // One row: delta = sum_d grad_out * out (f64 sum of C products, rounded to C,
                // like Sum(Mul)), p = exp(scale s - stats), ds = p (dp - delta) scale; p and ds
                // rounded to T for the products; masked keys have p = ds = 0.
                const C* gorow = goh + i * ldgo;
                const C* orow = oh + i * ldo;
                const C delta = static_cast<C>(RowSumProductsF64(gorow, orow, d));
                C* prow = p.data() + i * tk;
                C* dsrow = ds.data() + i * tk;
                const int64_t len = VisibleKeys(causal, i, tk);
                // exp over whole vectors, the masked keys up to the next multiple of 16 -inf.
                const int64_t padded = std::min(tk, (len + 15) / 16 * 16);
                for (int64_t j = 0; j < len; ++j) prow[j] = prow[j] * cscale - st[i];
                std::fill(prow + len, prow + padded, -std::numeric_limits<C>::infinity());
                ExpRow(prow, prow, padded);
                for (int64_t j = 0; j < len; ++j) dsrow[j] = prow[j] * (dsrow[j] - delta) * cscale;
                RoundRow<T>(prow, len);
                RoundRow<T>(dsrow, len);
                std::fill(prow + len, prow + keys, C(0));
                std::fill(dsrow + len, dsrow + keys, C(0));
              }
              // grad_v [keys, d] (+)= p^T @ grad_out; grad_q rows [i0, i1) = ds @ k; grad_k
              // [keys, d] (+)= ds^T @ q (the transposes through GEMM's flags). A later block
              // adds to the keys an earlier one wrote and writes the keys it adds; one block
              // (all but causal attention) writes everything at once.
              const bool first = i0 == 0;
              const int64_t seen = first ? 0 : i0;  // keys written by the blocks before
              auto key_rows = [&](auto product, C* result, int64_t ld) {
                if (seen > 0) product(0, seen, result, ld, /*accumulate=*/true);
                product(seen, keys, result + seen * ld, ld, /*accumulate=*/false);
              };
              if (d == 0) return;
              key_rows(
                  [&](int64_t j0, int64_t j1, C* r, int64_t ld, bool acc) {
                    Gemm<C>(/*ta=*/true, false, j1 - j0, d, rows, p.data() + i0 * tk + j0, tk,
                            goh + i0 * ldgo, ldgo, r, ld, acc);
                  },
                  gv, ldgv);
              Gemm<C>(false, false, rows, d, keys, ds.data() + i0 * tk, tk, kh, ldk, gq + i0 * ldgq,
                      ldgq);
              key_rows(
                  [&](int64_t j0, int64_t j1, C* r, int64_t ld, bool acc) {
                    Gemm<C>(/*ta=*/true, false, j1 - j0, d, rows, ds.data() + i0 * tk + j0, tk,
                            qh + i0 * ldq, ldq, r, ld, acc);
                  },
                  gk, ldgk);
            });
            StoreHeadResult<T>(gq, grad_q, b, h);
            if (rep == 1) {
              StoreHeadResult<T>(gv, grad_v, b, kvh);
              StoreHeadResult<T>(gk, grad_k, b, kvh);
            } else {
              RoundRow<T>(gk, tk * d);
              RoundRow<T>(gv, tk * d);
              for (int64_t i = 0; i < tk * d; ++i) {
                sum_k[static_cast<size_t>(i)] += static_cast<double>(gk[i]);
                sum_v[static_cast<size_t>(i)] += static_cast<double>(gv[i]);
              }
            }
          }
          if (rep > 1) {
            StoreSummedHead<T>(sum_k, grad_k, b, kvh);
            StoreSummedHead<T>(sum_v, grad_v, b, kvh);
          }
        }
      });
}

}  // namespace

KernelStatus ScaledDotProductAttention(const RawTensor& out, const RawTensor& stats,
                                       const RawTensor& q, const RawTensor& k, const RawTensor& v,
                                       bool causal, double scale) {
  VisitFloating("scaled_dot_product_attention", q.dtype(), [&](auto tag) {
    AttentionImpl<decltype(tag)>(out, stats, q, k, v, causal, scale);
  });
  return KernelStatus::kDone;
}

KernelStatus ScaledDotProductAttentionBackward(const RawTensor& grad_q, const RawTensor& grad_k,
                                               const RawTensor& grad_v, const RawTensor& grad_out,
                                               const RawTensor& q, const RawTensor& k,
                                               const RawTensor& v, const RawTensor& out,
                                               const RawTensor& stats, bool causal, double scale) {
  VisitFloating("scaled_dot_product_attention_backward", q.dtype(), [&](auto tag) {
    AttentionBackwardImpl<decltype(tag)>(grad_q, grad_k, grad_v, grad_out, q, k, v, out, stats,
                                         causal, scale);
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
