// Neural-network kernels over the last dim: softmax, layer norm, embedding, cross-entropy; and
// dropout masks.
// f16/bf16/f32 compute in f32 (f64 for f64) and round each output once.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/convert.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/philox.h"

namespace tg::cpu {

void Softmax(const RawTensor& out, const RawTensor& x, bool log) {
  const int64_t rows = x.size(0), n = x.size(1);
  VisitFloating("softmax", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* o = out.data<T>();
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = in + r * n;
        C shift, log_sum;
        RowLogSumExp<C>(row, n, &shift, &log_sum);
        C z[kRowBlock];
        for (int64_t i = 0; i < n; i += kRowBlock) {
          const int64_t len = std::min(kRowBlock, n - i);
          for (int64_t j = 0; j < len; ++j)
            z[j] = static_cast<C>(Widen(row[i + j])) - shift - log_sum;
          if (!log) ExpRow(z, z, len);
          for (int64_t j = 0; j < len; ++j) o[r * n + i + j] = Convert<T>(z[j]);
        }
      }
    });
  });
}

void LayerNorm(const RawTensor& out, const RawTensor& mean, const RawTensor& rstd,
               const RawTensor& x, const RawTensor& weight, const RawTensor& bias, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  VisitFloating("layer_norm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const RawTensor wc = weight.defined() ? weight.contiguous() : RawTensor();
    const RawTensor bc = bias.defined() ? bias.contiguous() : RawTensor();
    const T* w = wc.defined() ? wc.data<T>() : nullptr;
    const T* b = bc.defined() ? bc.data<T>() : nullptr;
    T* o = out.data<T>();
    C* mo = mean.data<C>();
    C* ro = rstd.data<C>();
    ParallelFor(rows, RowsPerThread(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        LayerNormRow(in + r * n, n, w, b, eps, o + r * n, mo + r, ro + r);
      }
    });
  });
}

void Embedding(const RawTensor& out, const RawTensor& weight, const RawTensor& indices) {
  const int64_t count = indices.numel(), rows = weight.size(0), dim = weight.size(1);
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TG_CHECK(idx[i] >= 0 && idx[i] < rows, "embedding: index ", idx[i], " at position ", i,
             " is out of range for ", rows, " rows");
  }
  const RawTensor w = weight.contiguous();
  const size_t row_bytes = static_cast<size_t>(dim) * w.element_size();
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * row_bytes, src + idx[i] * row_bytes, row_bytes);
  }
}

void EmbeddingBackward(const RawTensor& out, const RawTensor& grad, const RawTensor& indices) {
  const int64_t count = indices.numel(), rows = out.size(0), dim = out.size(1);
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TG_CHECK(idx[i] >= 0 && idx[i] < rows, "embedding_backward: index ", idx[i], " at position ", i,
             " is out of range for ", rows, " rows");
  }
  VisitFloating("embedding_backward", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = grad.data<T>();
    std::vector<double> acc(static_cast<size_t>(rows * dim), 0.0);
    for (int64_t i = 0; i < count; ++i) {
      double* dst = acc.data() + idx[i] * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += static_cast<double>(Widen(g[i * dim + j]));
    }
    T* o = out.data<T>();
    for (int64_t i = 0; i < rows * dim; ++i) o[i] = Convert<T>(acc[i]);
  });
}

int64_t CrossEntropy(const RawTensor& losses, const RawTensor& logits, const RawTensor& targets,
                     int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  int64_t counted = 0;
  VisitFloating("cross_entropy", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* in = logits.data<T>();
    T* o = losses.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      if (t[r] == ignore_index) {
        o[r] = Convert<T>(C(0));
        continue;
      }
      CheckTarget("cross_entropy", t[r], r, classes);
      C shift, log_sum;
      RowLogSumExp<C>(in + r * classes, classes, &shift, &log_sum);
      o[r] = Convert<T>(CrossEntropyRowLoss<C>(in + r * classes, t[r], shift, log_sum));
      ++counted;
    }
  });
  return counted;
}

void CrossEntropyBackward(const RawTensor& grad_logits, const RawTensor& logits,
                          const RawTensor& targets, const RawTensor& row_scale,
                          int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int64_t* t = targets.data<int64_t>();
  const double* scale = row_scale.data<double>();
  VisitFloating("cross_entropy_backward", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const T* in = logits.data<T>();
    T* g = grad_logits.data<T>();
    ParallelFor(rows, RowsPerThread(classes), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        T* grow = g + r * classes;
        if (t[r] == ignore_index) {
          std::fill(grow, grow + classes, Convert<T>(C(0)));
          continue;
        }
        CheckTarget("cross_entropy_backward", t[r], r, classes);
        const T* row = in + r * classes;
        C shift, log_sum;
        RowLogSumExp<C>(row, classes, &shift, &log_sum);
        CrossEntropyGradRow<C>(row, classes, t[r], shift, log_sum, static_cast<C>(scale[r]), grow);
      }
    });
  });
}

void DropoutMask(const RawTensor& out, uint64_t seed, uint64_t offset, double p) {
  const uint32_t threshold = DropoutThreshold(p);
  const uint64_t n = static_cast<uint64_t>(out.numel());
  VisitFloating("dropout", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T zero = Convert<T>(0.0), one = Convert<T>(1.0);
    // One Philox block per four draws (Generator::NextU32 recomputes the block for each).
    for (uint64_t i = 0; i < n;) {
      const uint64_t draw = offset + i;
      const PhiloxBlock block = Philox4x32(draw / 4, seed);
      for (uint64_t w = draw % 4; w < 4 && i < n; ++w, ++i) {
        o[i] = DropoutKeeps(block.v[w], threshold) ? one : zero;
      }
    }
  });
}

bool AnyNonFinite(const RawTensor& t) {
  bool found = false;
  VisitFloating("non_finite_check", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const RawTensor c = t.contiguous();
    const T* p = c.data<T>();
    for (int64_t i = 0; i < c.numel() && !found; ++i) found = !std::isfinite(Widen(p[i]));
  });
  return found;
}

bool ScaleInPlace(const RawTensor& t, double scale, bool check_finite) {
  std::atomic<bool> found{false};  // OR-ed: the same answer whatever the thread split
  VisitFloating("mul_scalar_", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C s = static_cast<C>(scale);
    auto scale_range = [&](T* p, int64_t n) {
      if constexpr (std::is_same_v<T, float>) {
        // Highway (the -O2 build vectorizes neither loop below): the same products.
        if (ScaleF32(p, n, s, check_finite)) found = true;
      } else if (!check_finite) {
        for (int64_t i = 0; i < n; ++i) p[i] = Convert<T>(Widen(p[i]) * s);
      } else {
        // v * 0 is NaN exactly when v is inf or NaN: a local flag, not a branch per element.
        bool bad = false;
        for (int64_t i = 0; i < n; ++i) {
          const C v = Widen(p[i]);
          const C z = v * C(0);
          bad |= z != z;
          p[i] = Convert<T>(v * s);
        }
        if (bad) found = true;
      }
    };
    auto scale_all = [&](T* p, int64_t n) {
      ParallelFor(n, int64_t{1} << 15,
                  [&](int64_t begin, int64_t end) { scale_range(p + begin, end - begin); });
    };
    if (t.is_contiguous()) {
      scale_all(t.data<T>(), t.numel());
    } else {
      // A non-contiguous view: scale through a contiguous copy and write it back.
      RawTensor c = t.clone();
      scale_all(c.data<T>(), c.numel());
      t.copy_(c);
    }
  });
  return found;
}

}  // namespace tg::cpu
