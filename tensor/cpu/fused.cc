// The fused entries of the kernel list (tensor/kernel_list.inc) on the CPU that work row by row:
// the non-finite check + unscale, the layer-norm backward, add + layer norm and softmax +
// cross-entropy. Linear is in fused_linear.cc and attention in fused_attention.cc. Each is one
// pass per row in the compute type (f32 for f16/bf16/f32, f64 for f64) with each output rounded
// once; add + layer norm and softmax + cross-entropy reuse the row routines of the plain kernels
// (rows.h), so their results are bit-identical to the composition of those kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/cpu/convert_rows.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/loss_scale_update.h"

namespace tg::cpu {

KernelStatus NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors,
                                      const RawTensor& found_inf, const RawTensor& inv_scale) {
  const double inv = inv_scale.item();
  bool found = false;
  for (const RawTensor& t : tensors) found = ScaleInPlace(t, inv, true) || found;
  if (found) found_inf.fill_(1);
  return KernelStatus::kDone;
}

// Per row r, in C: xhat = (x - mean) * rstd, dxhat = grad_out * weight, then
// grad_input = rstd * ((dxhat - mean(dxhat)) - xhat * mean(dxhat * xhat)); the two row means are
// f64 sums (rows.h's SumF64) divided by n and rounded to C. grad_weight and grad_bias accumulate
// grad_out * xhat and grad_out in f64 per column, rows in order (deterministic, independent of
// any blocking), and round once at the end.
KernelStatus LayerNormBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                               const RawTensor& grad_bias, const RawTensor& grad_out,
                               const RawTensor& x, const RawTensor& mean, const RawTensor& rstd,
                               const RawTensor& weight) {
  const int64_t rows = x.size(0), n = x.size(1);
  VisitFloating("layer_norm_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* xs = x.data<T>();
    const T* go = grad_out.data<T>();
    const C* mu = mean.data<C>();
    const C* rs = rstd.data<C>();
    T* gi = grad_input.data<T>();
    const bool params = grad_weight.defined();
    std::vector<double> gw_acc(params ? n : 0, 0.0), gb_acc(params ? n : 0, 0.0);
    std::vector<C> w(weight.defined() ? n : 0);  // weight [n] in C, widened once
    for (int64_t i = 0; i < static_cast<int64_t>(w.size()); ++i) {
      w[i] = static_cast<C>(Widen(weight.data<T>()[i]));
    }
    // grad_input: rows in parallel, each with its own scratch.
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      std::vector<C> xhat(n), dxhat(n), gi_row(n);  // one row
      for (int64_t r = begin; r < end; ++r) {
        const C* xr = RowAs<C>(xs + r * n, n, xhat.data());
        const C* gr = RowAs<C>(go + r * n, n, dxhat.data());
        for (int64_t i = 0; i < n; ++i) xhat[i] = (xr[i] - mu[r]) * rs[r];
        if (w.empty()) {
          for (int64_t i = 0; i < n; ++i) dxhat[i] = gr[i];
        } else {
          for (int64_t i = 0; i < n; ++i) dxhat[i] = gr[i] * w[i];
        }
        const double sum_dxhat = RowSumF64(dxhat.data(), n);
        const double sum_dxhat_xhat = RowSumProductsF64(dxhat.data(), xhat.data(), n);
        const C mean_dxhat = static_cast<C>(sum_dxhat / static_cast<double>(n));
        const C mean_dxhat_xhat = static_cast<C>(sum_dxhat_xhat / static_cast<double>(n));
        C* out = gi_row.data();
        if constexpr (std::is_same_v<T, C>) out = gi + r * n;  // straight into grad_input
        for (int64_t i = 0; i < n; ++i) {
          out[i] = rs[r] * ((dxhat[i] - mean_dxhat) - xhat[i] * mean_dxhat_xhat);
        }
        if constexpr (!std::is_same_v<T, C>) StoreRow(out, n, gi + r * n, 1);
      }
    });
    // grad_weight and grad_bias: columns in parallel, each summed over the rows in order.
    if (params) {
      ParallelFor(n, std::max<int64_t>(16, RowsPerThread(rows)), [&](int64_t begin, int64_t end) {
        if constexpr (std::is_same_v<T, float>) {  // the same sums, as vectors
          LayerNormParamGradsF32(xs + begin, go + begin, rows, n, end - begin, mu, rs,
                                 gw_acc.data() + begin, gb_acc.data() + begin);
          return;
        }
        for (int64_t r = 0; r < rows; ++r) {
          const T* xrow = xs + r * n;
          const T* grow = go + r * n;
          for (int64_t i = begin; i < end; ++i) {
            const C g = static_cast<C>(Widen(grow[i]));
            const C xh = (static_cast<C>(Widen(xrow[i])) - mu[r]) * rs[r];
            gw_acc[i] += static_cast<double>(g * xh);
            gb_acc[i] += static_cast<double>(g);
          }
        }
      });
    }
    if (params) {
      T* gw = grad_weight.data<T>();
      T* gb = grad_bias.data<T>();
      for (int64_t i = 0; i < n; ++i) {
        gw[i] = Convert<T>(gw_acc[i]);
        gb[i] = Convert<T>(gb_acc[i]);
      }
    }
  });
  return KernelStatus::kDone;
}

// LlamaRMSNorm per row (kernel_list.inc's arithmetic): the row widened to C, the sum of squares
// in f64 (SumF64's order), rstd = 1 / sqrt(sum / n + eps) rounded to C; normed = round_T(h *
// rstd), out = round_T(w * normed). Rows in parallel, each row's arithmetic on one thread.
KernelStatus LlamaRmsNorm(const RawTensor& out, const RawTensor& rstd, const RawTensor& x,
                          const RawTensor& weight, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  VisitFloating("llama_rms_norm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* xs = x.data<T>();
    const T* ws = weight.data<T>();
    T* o = out.data<T>();
    C* rs = rstd.data<C>();
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      std::vector<C> buffer(n), w(n);
      for (int64_t i = 0; i < n; ++i) w[i] = static_cast<C>(Widen(ws[i]));
      for (int64_t r = begin; r < end; ++r) {
        const C* h = RowAs<C>(xs + r * n, n, buffer.data());
        // The squares' f64 sum in SumF64's order (for float the vectorised form: its bits).
        double ss;
        if constexpr (std::is_same_v<C, float>) {
          ss = SumSquaredDeviationsF64(h, n, 0.0);
        } else {
          ss = SumF64(n, [&](int64_t i) { return h[i] * h[i]; });
        }
        const C inv = static_cast<C>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
        rs[r] = inv;
        T* orow = o + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const C normed = static_cast<C>(Widen(Convert<T>(h[i] * inv)));
          orow[i] = Convert<T>(w[i] * normed);
        }
      }
    });
  });
  return KernelStatus::kDone;
}

// Its backward, in C per row: dn = g * w, dot = sum(dn * h) / n (f64 products and sum, rounded
// to C), s = rstd^3 * dot, grad_input = round_T(rstd * dn - h * s); grad_weight per column, the
// rows in order in f64 (the same bits at any thread count), rounded once.
KernelStatus LlamaRmsNormBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                                  const RawTensor& grad_out, const RawTensor& x,
                                  const RawTensor& rstd, const RawTensor& weight) {
  const int64_t rows = x.size(0), n = x.size(1);
  VisitFloating("llama_rms_norm_backward", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* xs = x.data<T>();
    const T* go = grad_out.data<T>();
    const T* ws = weight.data<T>();
    const C* rs = rstd.data<C>();
    T* gi = grad_input.data<T>();
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      std::vector<C> hbuf(n), gbuf(n), w(n), dn(n);
      for (int64_t i = 0; i < n; ++i) w[i] = static_cast<C>(Widen(ws[i]));
      for (int64_t r = begin; r < end; ++r) {
        const C* h = RowAs<C>(xs + r * n, n, hbuf.data());
        const C* g = RowAs<C>(go + r * n, n, gbuf.data());
        for (int64_t i = 0; i < n; ++i) dn[i] = g[i] * w[i];
        const double dot64 = SumF64(
            n, [&](int64_t i) { return static_cast<double>(dn[i]) * static_cast<double>(h[i]); });
        const C inv = rs[r];
        const C s = ((inv * inv) * inv) * static_cast<C>(dot64 / static_cast<double>(n));
        T* row = gi + r * n;
        for (int64_t i = 0; i < n; ++i) row[i] = Convert<T>(inv * dn[i] - h[i] * s);
      }
    });
    if (!grad_weight.defined()) return;
    T* gw = grad_weight.data<T>();
    ParallelFor(n, 16, [&](int64_t c0, int64_t c1) {
      std::vector<double> acc(c1 - c0, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const C inv = rs[r];
        for (int64_t c = c0; c < c1; ++c) {
          const C h = static_cast<C>(Widen(xs[r * n + c]));
          const C normed = static_cast<C>(Widen(Convert<T>(h * inv)));
          acc[c - c0] += static_cast<double>(Widen(go[r * n + c])) * static_cast<double>(normed);
        }
      }
      for (int64_t c = c0; c < c1; ++c) gw[c] = Convert<T>(acc[c - c0]);
    });
  });
  return KernelStatus::kDone;
}

// SwiGLU forward and backward in blocks of kSwigluBlock elements of the compute type, each value
// rounded to T where the composed ops (Silu, Sigmoid and the elementwise Mul/AddScalar whose
// passes these are) round it: the same bits, silu and sigmoid through activation.h's rows as the
// Unary kernel's. The conversions go through the vectorised row conversions (convert_rows.h); f32
// runs vec_math.h's SwigluF32 and SwigluGradF32, the same operations in vectors (one exp for
// the gradient's silu and sigmoid).
constexpr int64_t kSwigluBlock = 256;

KernelStatus Swiglu(const RawTensor& out, const RawTensor& gate, const RawTensor& up) {
  VisitFloating("swiglu", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    T* o = out.data<T>();
    ParallelFor(out.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        SwigluF32(g + begin, u + begin, o + begin, end - begin);  // the same operations
        return;
      }
      C gb[kSwigluBlock], ub[kSwigluBlock], s[kSwigluBlock];
      for (int64_t i = begin; i < end; i += kSwigluBlock) {
        const int64_t len = std::min(kSwigluBlock, end - i);
        const C* uw = RowAs<C>(u + i, len, ub);
        // f32 and f64 write their output directly.
        C* y = std::is_same_v<T, C> ? reinterpret_cast<C*>(o + i) : s;
        SiluRow(RowAs<C>(g + i, len, gb), y, len);
        RoundRow<T>(y, len);
        for (int64_t j = 0; j < len; ++j) y[j] *= uw[j];
        if constexpr (!std::is_same_v<T, C>) StoreRow(s, len, o + i, 1);
      }
    });
  });
  return KernelStatus::kDone;
}

KernelStatus SwigluBackward(const RawTensor& grad_gate, const RawTensor& grad_up,
                            const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up) {
  VisitFloating("swiglu_backward", gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    const T* dy = grad_out.data<T>();
    T* gg = grad_gate.data<T>();
    T* gu = grad_up.data<T>();
    ParallelFor(gate.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        SwigluGradF32(g + begin, u + begin, dy + begin, gg + begin, gu + begin, end - begin);
        return;
      }
      C xb[kSwigluBlock], db[kSwigluBlock], w[kSwigluBlock], s[kSwigluBlock], t[kSwigluBlock];
      for (int64_t i = begin; i < end; i += kSwigluBlock) {
        const int64_t len = std::min(kSwigluBlock, end - i);
        const C* x = RowAs<C>(g + i, len, xb);
        const C* d = RowAs<C>(dy + i, len, db);
        LoadRow(u + i, 1, len, w);
        // grad_up = dy * round(silu(g)).
        SiluRow(x, t, len);
        RoundRow<T>(t, len);
        for (int64_t j = 0; j < len; ++j) t[j] = d[j] * t[j];
        StoreRow(t, len, gu + i, 1);
        // grad_gate = round(dy * u) * round(s * round(round(g * round(1 - s)) + 1)).
        SigmoidRow(x, s, len);
        RoundRow<T>(s, len);
        for (int64_t j = 0; j < len; ++j) t[j] = -s[j] + C(1);
        RoundRow<T>(t, len);
        for (int64_t j = 0; j < len; ++j) t[j] = x[j] * t[j];
        RoundRow<T>(t, len);
        for (int64_t j = 0; j < len; ++j) t[j] = t[j] + C(1);
        RoundRow<T>(t, len);
        for (int64_t j = 0; j < len; ++j) t[j] = s[j] * t[j];
        RoundRow<T>(t, len);
        for (int64_t j = 0; j < len; ++j) w[j] = d[j] * w[j];
        RoundRow<T>(w, len);
        for (int64_t j = 0; j < len; ++j) t[j] = w[j] * t[j];
        StoreRow(t, len, gg + i, 1);
      }
    });
  });
  return KernelStatus::kDone;
}

// Rotary embedding per row of d values at position t: the products and the sum rounded to T as
// Mul, Mul and Add round them (so the composed ops' bits). Rows in parallel; x's rows found
// through its strides (a unit last stride).
KernelStatus RotaryEmbedding(const RawTensor& out, const RawTensor& x, const RawTensor& cos,
                             const RawTensor& sin) {
  const int64_t rank = x.dim(), t_len = x.size(-2), d = x.size(-1), h = d / 2;
  const int64_t rows = out.size(0) * t_len;
  VisitFloating("rotary_embedding", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* xs = x.data<T>();
    const T* cs = cos.data<T>();
    const T* sn = sin.data<T>();
    T* o = out.data<T>();
    auto round = [](C v) { return static_cast<C>(Widen(Convert<T>(v))); };
    ParallelFor(rows, RowsPerThread(d), [&](int64_t begin, int64_t end) {
      // The index of row `begin` over x's leading dimensions (the last of them is t), then
      // counted up row by row.
      std::vector<int64_t> index(static_cast<size_t>(rank - 1));
      for (int64_t k = rank - 2, rest = begin; k >= 0; --k) {
        index[k] = rest % x.size(k);
        rest /= x.size(k);
      }
      for (int64_t r = begin; r < end; ++r) {
        int64_t offset = 0;
        for (int64_t k = 0; k < rank - 1; ++k) offset += index[k] * x.strides()[k];
        const int64_t t = index[rank - 2];
        const T* xr = xs + offset;
        const T* cr = cs + t * d;
        const T* sr = sn + t * d;
        T* orow = o + r * d;
        // x cos + rotate_half(x) sin, rotate_half(x)[i] = -x[i + h] below h, x[i - h] above.
        auto element = [&](int64_t i, C rot) {
          const C a = round(static_cast<C>(Widen(xr[i])) * static_cast<C>(Widen(cr[i])));
          const C b = round(rot * static_cast<C>(Widen(sr[i])));
          orow[i] = Convert<T>(a + b);
        };
        for (int64_t i = 0; i < h; ++i) element(i, -static_cast<C>(Widen(xr[i + h])));
        for (int64_t i = h; i < d; ++i) element(i, static_cast<C>(Widen(xr[i - h])));
        for (int64_t k = rank - 2; k >= 0; --k) {
          if (++index[k] < x.size(k)) break;
          index[k] = 0;
        }
      }
    });
  });
  return KernelStatus::kDone;
}

KernelStatus RotaryEmbeddingBackward(const RawTensor& grad_input, const RawTensor& grad_out,
                                     const RawTensor& cos, const RawTensor& sin) {
  const int64_t t_len = grad_out.size(1), d = grad_out.size(2), h = d / 2;
  const int64_t rows = grad_out.size(0) * t_len;
  VisitFloating("rotary_embedding_backward", grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* gs = grad_out.data<T>();
    const T* cs = cos.data<T>();
    const T* sn = sin.data<T>();
    T* o = grad_input.data<T>();
    auto round = [](C v) { return static_cast<C>(Widen(Convert<T>(v))); };
    ParallelFor(rows, RowsPerThread(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t t = r % t_len;
        const T* gr = gs + r * d;
        const T* cr = cs + t * d;
        const T* sr = sn + t * d;
        T* orow = o + r * d;
        // g cos + (g sin) moved back through rotate_half: + at i < h from i + h, - at i >= h
        // from i - h.
        auto element = [&](int64_t i, int64_t j, bool plus) {
          const C a = round(static_cast<C>(Widen(gr[i])) * static_cast<C>(Widen(cr[i])));
          const C gs_j = round(static_cast<C>(Widen(gr[j])) * static_cast<C>(Widen(sr[j])));
          orow[i] = Convert<T>(a + (plus ? gs_j : -gs_j));
        };
        for (int64_t i = 0; i < h; ++i) element(i, i + h, true);
        for (int64_t i = h; i < d; ++i) element(i, i - h, false);
      }
    });
  });
  return KernelStatus::kDone;
}

// Per row: residual = round(a + b), then LayerNormRow on the rounded residual -- the same
// arithmetic as Add followed by the LayerNorm kernel, in one pass over a and b.
KernelStatus AddLayerNorm(const RawTensor& residual, const RawTensor& out, const RawTensor& mean,
                          const RawTensor& rstd, const RawTensor& a, const RawTensor& b,
                          const RawTensor& weight, const RawTensor& bias, double eps) {
  const int64_t rows = a.size(0), n = a.size(1);
  VisitFloating("add_layer_norm", a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* as = a.data<T>();
    const T* bs = b.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* bi = bias.defined() ? bias.data<T>() : nullptr;
    T* res = residual.data<T>();
    T* o = out.data<T>();
    C* mo = mean.data<C>();
    C* ro = rstd.data<C>();
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* rrow = res + r * n;
        for (int64_t i = 0; i < n; ++i) {
          rrow[i] = Convert<T>(static_cast<C>(Widen(as[r * n + i])) +
                               static_cast<C>(Widen(bs[r * n + i])));
        }
        LayerNormRow(rrow, n, w, bi, eps, o + r * n, mo + r, ro + r);
      }
    });
  });
  return KernelStatus::kDone;
}

// Per row: one RowLogSumExp gives both the loss and the gradient row, with the arithmetic of
// the CrossEntropy and CrossEntropyBackward kernels (bit-identical results) and their error
// text for a target out of range; ignore_index rows give 0 loss and a 0 gradient row.
KernelStatus SoftmaxCrossEntropy(const RawTensor& losses, const RawTensor& grad_logits,
                                 const RawTensor& logits, const RawTensor& targets,
                                 const RawTensor& row_scale, int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  const double* scale = row_scale.data<double>();
  VisitFloating("cross_entropy", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* in = logits.data<T>();
    T* lo = losses.data<T>();
    T* g = grad_logits.data<T>();
    // Rows in parallel; a bad target throws on its block's thread, and ParallelFor rethrows the
    // first block's error: the first bad row, as the serial loop would.
    ParallelFor(rows, RowsPerThread(classes), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* grow = g + r * classes;
        if (t[r] == ignore_index) {
          lo[r] = Convert<T>(C(0));
          std::fill(grow, grow + classes, Convert<T>(C(0)));
          continue;
        }
        CheckTarget("cross_entropy", t[r], r, classes);
        const T* row = in + r * classes;
        C shift, log_sum;
        RowLogSumExp<C>(row, classes, &shift, &log_sum);
        lo[r] = Convert<T>(CrossEntropyRowLoss<C>(row, t[r], shift, log_sum));
        CrossEntropyGradRow<C>(row, classes, t[r], shift, log_sum, static_cast<C>(scale[r]), grow);
      }
    });
  });
  return KernelStatus::kDone;
}

// The host's own state machine on the state's bytes (the CPU reads found_inf directly).
KernelStatus LossScaleStep(const RawTensor& state, const RawTensor& found_inf, bool update,
                           const RawTensor& scale_out, const RawTensor& inv_scale_out) {
  auto* s = static_cast<LossScaleState*>(state.raw_data());
  if (update) UpdateLossScale(s, found_inf.defined() && found_inf.item() != 0);
  LossScaleOutputs(
      *s, scale_out.defined() ? static_cast<float*>(scale_out.raw_data()) : nullptr,
      inv_scale_out.defined() ? static_cast<float*>(inv_scale_out.raw_data()) : nullptr);
  return KernelStatus::kDone;
}

}  // namespace tg::cpu
