// The fused kernels of tensor/cuda/nn_fused.h, and the kernel list's LlamaRmsNorm and
// RotaryEmbedding (with their backwards) on CUDA. They share the row machinery of nn.cu
// (tensor/cuda/nn_common.cuh): one warp per row up to 1024 elements, one block per row beyond,
// 128-bit loads after a scalar head, statistics in f32 (f64 for f64).
//
// Kernels that may write a buffer they also read (grad_logits == logits, residual_out == a)
// never mark pointers __restrict__ (which would allow the non-coherent read-only cache), and
// each thread only re-reads elements it wrote itself: ForRow maps elements to threads the same
// way in every pass over a row.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_common.cuh"
#include "tensor/cuda/nn_fused.h"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace {

using namespace nn_detail;  // NOLINT(build/namespaces): this target's own helpers

// ---- Validation -------------------------------------------------------------------------------

// Checks that `t` is defined, contiguous, on `device` (a CUDA device), of `shape` and `dtype`.
void CheckTensor(const char* op, const char* what, const RawTensor& t, const Device& device,
                 const Shape& shape, DType dtype) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(), ", expected ",
           device.ToString());
  TG_CHECK(t.shape() == shape, op, ": ", what, " has shape ", ShapeToString(t.shape()),
           ", expected ", ShapeToString(shape));
  TG_CHECK(t.dtype() == dtype, op, ": ", what, " has dtype ", DTypeName(t.dtype()), ", expected ",
           DTypeName(dtype));
  TG_CHECK(t.is_contiguous(), op, ": ", what, " must be contiguous");
}

// The CUDA device of the defining tensor `t` ([rows, n], floating), checked.
Device RowsDevice(const char* op, const char* what, const RawTensor& t) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
  TG_CHECK(t.device().is_cuda(), op, ": ", what, " is on ", t.device().ToString(),
           ", expected a CUDA device");
  TG_CHECK(t.dim() == 2, op, ": expected ", what, " [rows, n], got shape ",
           ShapeToString(t.shape()));
  TG_CHECK(IsFloating(t.dtype()), op, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           DTypeName(t.dtype()));
  return t.device();
}

// An output may be one of the inputs (the very same elements) or separate from it, but not an
// overlapping view: the kernels rely on each element being read before it is overwritten by the
// same thread.
void CheckAliasing(const char* op, const char* out_name, const RawTensor& out, const char* in_name,
                   const RawTensor& in) {
  TG_CHECK(!out.shares_storage(in) || out.raw_data() == in.raw_data(), op, ": ", out_name,
           " must be ", in_name, " itself or not share memory with it");
}

DType StatDType(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// ---- Softmax cross-entropy --------------------------------------------------------------------

__global__ void CountNotIgnoredKernel(unsigned long long* counted, const int64_t* targets,
                                      int64_t rows, int64_t ignore_index) {
  unsigned long long local = 0;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    local += targets[r] != ignore_index;
  }
  local = WarpAllReduce(local, SumOp{});
  if (threadIdx.x % 32 == 0 && local != 0) atomicAdd(counted, local);
}

template <typename T, bool kWarp>
__global__ void SoftmaxCrossEntropyFusedKernel(T* losses, T* grad, const T* logits,
                                               const int64_t* targets, const double* row_scale,
                                               const unsigned long long* counted, int64_t rows,
                                               int64_t classes, int64_t ignore_index,
                                               IndexErrorSink sink) {
  using C = Acc<T>;
  __shared__ SoftmaxStats<C> smem[32];
  const RowGroup<kWarp> g{};
  // The mean's gradient, 1 / count, in f64 and rounded once like the CPU's row_scale.
  const double mean_scale = row_scale == nullptr ? 1.0 / static_cast<double>(*counted) : 0.0;
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int64_t t = targets[r];
    const T* row = logits + r * classes;
    T* grow = grad + r * classes;
    const int64_t head = RowHead(row, classes);
    const bool bad = t != ignore_index && (t < 0 || t >= classes);
    if (t == ignore_index || bad) {
      if (g.tid() == 0) {
        if (bad) RecordIndexError(sink, IndexOp::kSoftmaxCrossEntropyFused, t, r, 0, classes);
        if (losses != nullptr) losses[r] = ConvertTo<T>(bad ? static_cast<C>(NAN) : C(0));
      }
      ForRow<T>(classes, head, g.tid(), g.size(), [&](int64_t i, auto width) {
        constexpr int W = decltype(width)::value;
        C z[W];
#pragma unroll
        for (int k = 0; k < W; ++k) z[k] = C(0);
        StoreN<W>(grow + i, z);
      });
      continue;
    }
    // x[t] is read before the statistics' reduction and every write below comes after it, so
    // an in-place gradient cannot overwrite it first.
    const C target_logit = g.tid() == 0 ? ToCompute(row[t]) : C(0);
    C shift, log_sum;
    RowStats<kWarp>(row, classes, head, g, smem).Finalize(&shift, &log_sum);
    g.Sync();
    if (g.tid() == 0 && losses != nullptr) {
      losses[r] = ConvertTo<T>(log_sum - (target_logit - shift));
    }
    const C s = static_cast<C>(row_scale != nullptr ? row_scale[r] : mean_scale);
    ForRow<T>(classes, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C v[W];
      LoadN<W>(row + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const C p = DevExp(v[k] - shift - log_sum);
        v[k] = (p - (i + k == t ? C(1) : C(0))) * s;
      }
      StoreN<W>(grow + i, v);
    });
  }
}

// ---- LayerNorm backward -----------------------------------------------------------------------

// grad_x per row, plus this row group's running sums of grad_out * xhat and grad_out into its own
// slice of `partial` ([groups, 2, n], zeroed by the caller), which no other group touches.
template <typename T, bool kWarp>
__global__ void LayerNormBackwardKernel(T* grad_x, Acc<T>* partial, const T* grad_out, const T* x,
                                        const Acc<T>* mean, const Acc<T>* rstd, const T* w,
                                        int64_t w_stride, int64_t rows, int64_t n) {
  using C = Acc<T>;
  __shared__ C smem[32];
  const RowGroup<kWarp> g{};
  C* part_w = partial != nullptr ? partial + g.first() * 2 * n : nullptr;
  C* part_b = part_w != nullptr ? part_w + n : nullptr;
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const T* xrow = x + r * n;
    const T* grow = grad_out + r * n;
    const int64_t head = RowHead(xrow, n);
    const C mu = mean[r], rs = rstd[r];
    C sum_dxhat = 0, sum_dxhat_xhat = 0;
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C xv[W], gv[W], wv[W];
      LoadN<W>(xrow + i, xv);
      LoadN<W>(grow + i, gv);
      if (w != nullptr) LoadStrided<W>(w + i * w_stride, w_stride, wv);
      C pw[W], pb[W];
      if (part_w != nullptr) {
        LoadN<W>(part_w + i, pw);
        LoadN<W>(part_b + i, pb);
      } else {
#pragma unroll
        for (int k = 0; k < W; ++k) pw[k] = pb[k] = C(0);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const C xhat = (xv[k] - mu) * rs;
        const C dxhat = w != nullptr ? gv[k] * wv[k] : gv[k];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        pw[k] += gv[k] * xhat;
        pb[k] += gv[k];
      }
      if (part_w != nullptr) {
        StoreN<W>(part_w + i, pw);
        StoreN<W>(part_b + i, pb);
      }
    });
    if (grad_x != nullptr) {
      const C m1 = GroupAllReduce<kWarp>(sum_dxhat, SumOp{}, C(0), smem) / static_cast<C>(n);
      const C m2 = GroupAllReduce<kWarp>(sum_dxhat_xhat, SumOp{}, C(0), smem) / static_cast<C>(n);
      T* dxrow = grad_x + r * n;
      ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
        constexpr int W = decltype(width)::value;
        C xv[W], gv[W], wv[W];
        LoadN<W>(xrow + i, xv);
        LoadN<W>(grow + i, gv);
        if (w != nullptr) LoadStrided<W>(w + i * w_stride, w_stride, wv);
#pragma unroll
        for (int k = 0; k < W; ++k) {
          const C xhat = (xv[k] - mu) * rs;
          const C dxhat = w != nullptr ? gv[k] * wv[k] : gv[k];
          xv[k] = rs * ((dxhat - m1) - xhat * m2);
        }
        StoreN<W>(dxrow + i, xv);
      });
    }
    // The next row's head may map a partial element to another thread of the group.
    g.Sync();
  }
}

constexpr int kParamCols = 32;   // columns per block of the parameter-gradient reduction
constexpr int kParamLanes = 16;  // partial rows summed in parallel per column

// grad_weight[j] / grad_bias[j] = the sums of the groups' partials, in a fixed order: lane y sums
// groups y, y + 16, ...; then lane 0 adds the 16 lane sums in order. Deterministic.
template <typename T>
__global__ void LayerNormParamGradKernel(T* grad_weight, T* grad_bias, const Acc<T>* partial,
                                         int64_t groups, int64_t n) {
  using C = Acc<T>;
  __shared__ C sums[2][kParamLanes][kParamCols];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kParamCols + threadIdx.x;
  C sw = 0, sb = 0;
  if (j < n) {
    for (int64_t p = threadIdx.y; p < groups; p += kParamLanes) {
      sw += partial[p * 2 * n + j];
      sb += partial[p * 2 * n + n + j];
    }
  }
  sums[0][threadIdx.y][threadIdx.x] = sw;
  sums[1][threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
  C tw = 0, tb = 0;
#pragma unroll
  for (int y = 0; y < kParamLanes; ++y) {
    tw += sums[0][y][threadIdx.x];
    tb += sums[1][y][threadIdx.x];
  }
  if (grad_weight != nullptr) grad_weight[j] = ConvertTo<T>(tw);
  if (grad_bias != nullptr) grad_bias[j] = ConvertTo<T>(tb);
}

// ---- Add + LayerNorm --------------------------------------------------------------------------

template <typename T, bool kWarp>
__global__ void AddLayerNormKernel(T* residual, T* out, Acc<T>* mean, Acc<T>* rstd, const T* a,
                                   const T* b, const T* w, int64_t w_stride, const T* bias,
                                   int64_t bias_stride, int64_t rows, int64_t n, double eps) {
  using C = Acc<T>;
  __shared__ double smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    T* rrow = residual + r * n;
    const T* arow = a + r * n;
    const T* brow = b + r * n;
    T* orow = out + r * n;
    // The residual's head: the passes below re-read residual elements written by this thread.
    const int64_t head = RowHead(rrow, n);
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C av[W], bv[W];
      LoadN<W>(arow + i, av);
      LoadN<W>(brow + i, bv);
#pragma unroll
      for (int k = 0; k < W; ++k) av[k] = av[k] + bv[k];
      StoreN<W>(rrow + i, av);  // rounded once, to what tg::Add would return
    });
    LayerNormRow<kWarp>(static_cast<const T*>(rrow), orow, n, head, g, eps, smem, &mean[r],
                        &rstd[r], w, w_stride, bias, bias_stride);
  }
}

// ---- LlamaRMSNorm -----------------------------------------------------------------------------

// The CPU kernel's arithmetic (tensor/cpu/fused.cc) per row: the squares summed in f64 (in the
// group's order, so the sum agrees with the CPU's to f64 rounding before rstd's one rounding to
// C), rstd = 1 / sqrt(sum / n + eps) in double, out = round(w * round(h * rstd)).
template <typename T, bool kWarp>
__global__ void LlamaRmsNormKernel(T* out, Acc<T>* rstd, const T* x, const T* w, int64_t rows,
                                   int64_t n, double eps) {
  using C = Acc<T>;
  __shared__ double smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const T* row = x + r * n;
    const int64_t head = RowHead(row, n);
    double ss = 0;
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C v[W];
      LoadN<W>(row + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) ss += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    });
    ss = GroupAllReduce<kWarp>(ss, SumOp{}, 0.0, smem);
    const C inv = static_cast<C>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
    if (g.tid() == 0) rstd[r] = inv;
    T* orow = out + r * n;
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C v[W], wv[W];
      LoadN<W>(row + i, v);
      LoadStrided<W>(w + i, 1, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = wv[k] * ToCompute(ConvertTo<T>(v[k] * inv));
      StoreN<W>(orow + i, v);
    });
  }
}

// grad_input per row, as the CPU kernel: dn = g w, dot = sum(dn h) in f64 (then / n, rounded to
// C), s = rstd^3 dot, grad_input = round(rstd dn - h s).
template <typename T, bool kWarp>
__global__ void LlamaRmsNormBackwardKernel(T* grad_input, const T* grad_out, const T* x,
                                           const Acc<T>* rstd, const T* w, int64_t rows,
                                           int64_t n) {
  using C = Acc<T>;
  __shared__ double smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const T* xrow = x + r * n;
    const T* grow = grad_out + r * n;
    const int64_t head = RowHead(xrow, n);
    double dot = 0;
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C hv[W], gv[W], wv[W];
      LoadN<W>(xrow + i, hv);
      LoadN<W>(grow + i, gv);
      LoadStrided<W>(w + i, 1, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        dot += static_cast<double>(gv[k] * wv[k]) * static_cast<double>(hv[k]);
      }
    });
    dot = GroupAllReduce<kWarp>(dot, SumOp{}, 0.0, smem);
    const C inv = rstd[r];
    const C s = ((inv * inv) * inv) * static_cast<C>(dot / static_cast<double>(n));
    T* orow = grad_input + r * n;
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C hv[W], gv[W], wv[W];
      LoadN<W>(xrow + i, hv);
      LoadN<W>(grow + i, gv);
      LoadStrided<W>(w + i, 1, wv);
#pragma unroll
      for (int k = 0; k < W; ++k) hv[k] = inv * (gv[k] * wv[k]) - hv[k] * s;
      StoreN<W>(orow + i, hv);
    });
    // The next row's head may map an element to another thread of the group.
    g.Sync();
  }
}

// grad_weight[j] = round(sum over the rows, in order, of grad_out * round(h * rstd)) in f64: one
// thread per column walking the rows in the CPU kernel's order (so its bits), the loads of
// consecutive columns coalesced across a warp.
template <typename T>
__global__ void LlamaRmsNormWeightGradKernel(T* grad_weight, const T* grad_out, const T* x,
                                             const Acc<T>* rstd, int64_t rows, int64_t n) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  double acc = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const Acc<T> normed = ToCompute(ConvertTo<T>(ToCompute(x[r * n + j]) * rstd[r]));
    acc += static_cast<double>(ToCompute(grad_out[r * n + j])) * static_cast<double>(normed);
  }
  grad_weight[j] = ConvertTo<T>(acc);
}

// ---- Rotary embedding -------------------------------------------------------------------------

// The leading dims of x [..., T, d] (all but the last): sizes and element strides, for the rows'
// offsets (x may be a strided view with a unit last stride).
constexpr int kRotaryMaxDims = 8;
struct RotaryRows {
  int dims;
  int64_t size[kRotaryMaxDims];
  int64_t stride[kRotaryMaxDims];
};

// One thread per output element, with the CPU kernel's roundings: out = round(round(x cos) +
// round(rot sin)), rot = (-x[h:], x[:h]).
template <typename T>
__global__ void RotaryEmbeddingKernel(T* out, const T* x, const T* cos, const T* sin,
                                      RotaryRows rows, int64_t count, int64_t t_len, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d, t = r % t_len;
    int64_t offset = 0, rest = r;
    for (int k = rows.dims - 1; k >= 0; --k) {
      offset += (rest % rows.size[k]) * rows.stride[k];
      rest /= rows.size[k];
    }
    const T* xr = x + offset;
    const Acc<T> rot = i < h ? -ToCompute(xr[i + h]) : ToCompute(xr[i - h]);
    const Acc<T> a = ToCompute(ConvertTo<T>(ToCompute(xr[i]) * ToCompute(cos[t * d + i])));
    const Acc<T> b = ToCompute(ConvertTo<T>(rot * ToCompute(sin[t * d + i])));
    out[e] = ConvertTo<T>(a + b);
  }
}

// Its backward on a contiguous grad_out [lead, T, d]: round(round(g cos) +- round(g_j sin_j)),
// (g sin) moved back through rotate_half: + at i < h from i + h, - at i >= h from i - h.
template <typename T>
__global__ void RotaryEmbeddingBackwardKernel(T* grad_input, const T* grad_out, const T* cos,
                                              const T* sin, int64_t count, int64_t t_len,
                                              int64_t d) {
  const int64_t h = d / 2;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / d, i = e % d, t = r % t_len;
    const T* gr = grad_out + r * d;
    const Acc<T> a = ToCompute(ConvertTo<T>(ToCompute(gr[i]) * ToCompute(cos[t * d + i])));
    const int64_t j = i < h ? i + h : i - h;
    const Acc<T> gs = ToCompute(ConvertTo<T>(ToCompute(gr[j]) * ToCompute(sin[t * d + j])));
    grad_input[e] = ConvertTo<T>(a + (i < h ? gs : -gs));
  }
}

constexpr int kElementThreads = 256;

unsigned ElementBlocks(int64_t count) {
  return static_cast<unsigned>(
      std::min<int64_t>((count + kElementThreads - 1) / kElementThreads, int64_t{1} << 20));
}

}  // namespace

void SoftmaxCrossEntropyFused(const RawTensor& losses, const RawTensor& grad_logits, const RawTensor& logits,
                              const RawTensor& targets, const RawTensor& row_scale,
                              int64_t ignore_index) {
  const char* op = "softmax_cross_entropy_fused";
  const Device device = RowsDevice(op, "logits", logits);
  const int64_t rows = logits.size(0), classes = logits.size(1);
  CheckTensor(op, "logits", logits, device, logits.shape(), logits.dtype());
  CheckTensor(op, "grad_logits", grad_logits, device, logits.shape(), logits.dtype());
  CheckTensor(op, "targets", targets, device, {rows}, kI64);
  if (losses.defined()) CheckTensor(op, "losses", losses, device, {rows}, logits.dtype());
  if (row_scale.defined()) CheckTensor(op, "row_scale", row_scale, device, {rows}, kF64);
  CheckAliasing(op, "grad_logits", grad_logits, "logits", logits);
  if (losses.defined()) {
    TG_CHECK(!losses.shares_storage(logits) && !losses.shares_storage(grad_logits), op,
             ": losses must not share memory with logits or grad_logits");
  }
  DeviceGuard guard(device.index);
  ThrowIfIndexError(device.index);
  if (rows == 0) return;
  const cudaStream_t stream = CurrentStream(device.index);
  const IndexErrorSink sink = IndexErrorSinkFor(device.index);
  const int64_t* t = targets.data<int64_t>();
  RawTensor counted;
  unsigned long long* counted_ptr = nullptr;
  if (!row_scale.defined()) {
    counted = RawTensor::Empty({1}, kI64, device);
    counted_ptr = static_cast<unsigned long long*>(counted.raw_data());
    TG_CUDA_CHECK(cudaMemsetAsync(counted_ptr, 0, sizeof(unsigned long long), stream));
    CountNotIgnoredKernel<<<BlocksFor(rows, 256), 256, 0, stream>>>(counted_ptr, t, rows,
                                                                    ignore_index);
    TG_CUDA_CHECK_LAUNCH("CountNotIgnoredKernel");
  }
  VisitDeviceFloating(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* lo = losses.defined() ? static_cast<T*>(losses.raw_data()) : nullptr;
    auto* gr = static_cast<T*>(grad_logits.raw_data());
    const auto* in = static_cast<const T*>(logits.raw_data());
    const double* s = row_scale.defined() ? row_scale.data<double>() : nullptr;
    LaunchRows(PlanRows<T>(rows, classes), [&](auto warp, const RowPlan& plan) {
      SoftmaxCrossEntropyFusedKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(lo, gr, in, t, s, counted_ptr, rows, classes,
                                                     ignore_index, sink);
    });
    TG_CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyFusedKernel");
  });
}

KernelStatus LayerNormBackward(const RawTensor& grad_x, const RawTensor& grad_weight,
                               const RawTensor& grad_bias, const RawTensor& grad_out, const RawTensor& x,
                               const RawTensor& mean, const RawTensor& rstd, const RawTensor& weight) {
  const char* op = "layer_norm_backward";
  const Device device = RowsDevice(op, "x", x);
  const int64_t rows = x.size(0), n = x.size(1);
  const DType dtype = x.dtype();
  CheckTensor(op, "x", x, device, x.shape(), dtype);
  CheckTensor(op, "grad_out", grad_out, device, x.shape(), dtype);
  CheckTensor(op, "mean", mean, device, {rows}, StatDType(dtype));
  CheckTensor(op, "rstd", rstd, device, {rows}, StatDType(dtype));
  if (weight.defined()) CheckTensor(op, "weight", weight, device, {n}, dtype);
  if (grad_x.defined()) CheckTensor(op, "grad_x", grad_x, device, x.shape(), dtype);
  if (grad_weight.defined()) CheckTensor(op, "grad_weight", grad_weight, device, {n}, dtype);
  if (grad_bias.defined()) CheckTensor(op, "grad_bias", grad_bias, device, {n}, dtype);
  if (grad_x.defined()) {
    CheckAliasing(op, "grad_x", grad_x, "x", x);
    CheckAliasing(op, "grad_x", grad_x, "grad_out", grad_out);
  }
  const bool params = grad_weight.defined() || grad_bias.defined();
  if (n == 0 || (!grad_x.defined() && !params)) return KernelStatus::kDone;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = CurrentStream(device.index);
  VisitDeviceFloating(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    T* gw = grad_weight.defined() ? static_cast<T*>(grad_weight.raw_data()) : nullptr;
    T* gb = grad_bias.defined() ? static_cast<T*>(grad_bias.raw_data()) : nullptr;
    if (rows == 0) {  // empty sums
      if (gw != nullptr) TG_CUDA_CHECK(cudaMemsetAsync(gw, 0, n * sizeof(T), stream));
      if (gb != nullptr) TG_CUDA_CHECK(cudaMemsetAsync(gb, 0, n * sizeof(T), stream));
      return;
    }
    // Two resident blocks per multiprocessor bound the number of row groups and so the size of
    // the partial sums ([groups, 2, n]) and the work of the final reduction.
    const RowPlan plan =
        PlanRows<T>(rows, n, 2 * static_cast<int64_t>(MultiProcessorCount(device.index)));
    const int64_t groups = static_cast<int64_t>(plan.blocks) * (plan.warp ? plan.threads / 32 : 1);
    RawTensor partial;
    C* part = nullptr;
    if (params) {
      partial = RawTensor::Empty({groups * 2 * n}, StatDType(dtype), device);
      part = static_cast<C*>(partial.raw_data());
      TG_CUDA_CHECK(cudaMemsetAsync(part, 0, groups * 2 * n * sizeof(C), stream));
    }
    T* gx = grad_x.defined() ? static_cast<T*>(grad_x.raw_data()) : nullptr;
    const auto* go = static_cast<const T*>(grad_out.raw_data());
    const auto* xp = static_cast<const T*>(x.raw_data());
    const auto* m = static_cast<const C*>(mean.raw_data());
    const auto* rs = static_cast<const C*>(rstd.raw_data());
    const T* w = weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr;
    LaunchRows(plan, [&](auto warp, const RowPlan& p) {
      LayerNormBackwardKernel<T, decltype(warp)::value>
          <<<p.blocks, p.threads, 0, stream>>>(gx, part, go, xp, m, rs, w, 1, rows, n);
    });
    TG_CUDA_CHECK_LAUNCH("LayerNormBackwardKernel");
    if (params) {
      const unsigned blocks = static_cast<unsigned>((n + kParamCols - 1) / kParamCols);
      LayerNormParamGradKernel<T>
          <<<blocks, dim3(kParamCols, kParamLanes), 0, stream>>>(gw, gb, part, groups, n);
      TG_CUDA_CHECK_LAUNCH("LayerNormParamGradKernel");
    }
  });
  return KernelStatus::kDone;
}

KernelStatus AddLayerNorm(const RawTensor& residual_out, const RawTensor& ln_out, const RawTensor& mean,
                          const RawTensor& rstd, const RawTensor& a, const RawTensor& b,
                          const RawTensor& weight, const RawTensor& bias, double eps) {
  const char* op = "add_layer_norm";
  const Device device = RowsDevice(op, "a", a);
  const int64_t rows = a.size(0), n = a.size(1);
  const DType dtype = a.dtype();
  CheckTensor(op, "a", a, device, a.shape(), dtype);
  CheckTensor(op, "b", b, device, a.shape(), dtype);
  CheckTensor(op, "residual_out", residual_out, device, a.shape(), dtype);
  CheckTensor(op, "ln_out", ln_out, device, a.shape(), dtype);
  CheckTensor(op, "mean", mean, device, {rows}, StatDType(dtype));
  CheckTensor(op, "rstd", rstd, device, {rows}, StatDType(dtype));
  if (weight.defined()) CheckTensor(op, "weight", weight, device, {n}, dtype);
  if (bias.defined()) CheckTensor(op, "bias", bias, device, {n}, dtype);
  TG_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  CheckAliasing(op, "residual_out", residual_out, "a", a);
  CheckAliasing(op, "residual_out", residual_out, "b", b);
  TG_CHECK(!ln_out.shares_storage(a) && !ln_out.shares_storage(b) &&
               !ln_out.shares_storage(residual_out),
           op, ": ln_out must not share memory with a, b or residual_out");
  if (rows == 0) return KernelStatus::kDone;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = CurrentStream(device.index);
  VisitDeviceFloating(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    auto* res = static_cast<T*>(residual_out.raw_data());
    auto* o = static_cast<T*>(ln_out.raw_data());
    auto* m = static_cast<C*>(mean.raw_data());
    auto* rs = static_cast<C*>(rstd.raw_data());
    const auto* ap = static_cast<const T*>(a.raw_data());
    const auto* bp = static_cast<const T*>(b.raw_data());
    const T* w = weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr;
    const T* bi = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
    LaunchRows(PlanRows<T>(rows, n), [&](auto warp, const RowPlan& plan) {
      AddLayerNormKernel<T, decltype(warp)::value><<<plan.blocks, plan.threads, 0, stream>>>(
          res, o, m, rs, ap, bp, w, 1, bi, 1, rows, n, eps);
    });
    TG_CUDA_CHECK_LAUNCH("AddLayerNormKernel");
  });
  return KernelStatus::kDone;
}

KernelStatus LlamaRmsNorm(const RawTensor& out, const RawTensor& rstd, const RawTensor& x,
                          const RawTensor& weight, double eps) {
  const char* op = "llama_rms_norm";
  const Device device = RowsDevice(op, "x", x);
  const int64_t rows = x.size(0), n = x.size(1);
  const DType dtype = x.dtype();
  CheckTensor(op, "x", x, device, x.shape(), dtype);
  CheckTensor(op, "weight", weight, device, {n}, dtype);
  CheckTensor(op, "out", out, device, x.shape(), dtype);
  CheckTensor(op, "rstd", rstd, device, {rows}, StatDType(dtype));
  if (rows == 0) return KernelStatus::kDone;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = CurrentStream(device.index);
  VisitDeviceFloating(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    auto* o = static_cast<T*>(out.raw_data());
    auto* rs = static_cast<C*>(rstd.raw_data());
    const auto* xp = static_cast<const T*>(x.raw_data());
    const auto* w = static_cast<const T*>(weight.raw_data());
    LaunchRows(PlanRows<T>(rows, n), [&](auto warp, const RowPlan& plan) {
      LlamaRmsNormKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(o, rs, xp, w, rows, n, eps);
    });
    TG_CUDA_CHECK_LAUNCH("LlamaRmsNormKernel");
  });
  return KernelStatus::kDone;
}

KernelStatus LlamaRmsNormBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                                  const RawTensor& grad_out, const RawTensor& x,
                                  const RawTensor& rstd, const RawTensor& weight) {
  const char* op = "llama_rms_norm_backward";
  const Device device = RowsDevice(op, "x", x);
  const int64_t rows = x.size(0), n = x.size(1);
  const DType dtype = x.dtype();
  CheckTensor(op, "x", x, device, x.shape(), dtype);
  CheckTensor(op, "grad_out", grad_out, device, x.shape(), dtype);
  CheckTensor(op, "rstd", rstd, device, {rows}, StatDType(dtype));
  CheckTensor(op, "weight", weight, device, {n}, dtype);
  CheckTensor(op, "grad_input", grad_input, device, x.shape(), dtype);
  if (grad_weight.defined()) CheckTensor(op, "grad_weight", grad_weight, device, {n}, dtype);
  CheckAliasing(op, "grad_input", grad_input, "x", x);
  CheckAliasing(op, "grad_input", grad_input, "grad_out", grad_out);
  if (n == 0) return KernelStatus::kDone;
  DeviceGuard guard(device.index);
  const cudaStream_t stream = CurrentStream(device.index);
  VisitDeviceFloating(op, dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    auto* gi = static_cast<T*>(grad_input.raw_data());
    const auto* go = static_cast<const T*>(grad_out.raw_data());
    const auto* xp = static_cast<const T*>(x.raw_data());
    const auto* rs = static_cast<const C*>(rstd.raw_data());
    const auto* w = static_cast<const T*>(weight.raw_data());
    // The weight gradient reads x and grad_out first: grad_input may be one of them.
    if (grad_weight.defined()) {
      LlamaRmsNormWeightGradKernel<T><<<ElementBlocks(n), kElementThreads, 0, stream>>>(
          static_cast<T*>(grad_weight.raw_data()), go, xp, rs, rows, n);
      TG_CUDA_CHECK_LAUNCH("LlamaRmsNormWeightGradKernel");
    }
    if (rows == 0) return;
    LaunchRows(PlanRows<T>(rows, n), [&](auto warp, const RowPlan& plan) {
      LlamaRmsNormBackwardKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(gi, go, xp, rs, w, rows, n);
    });
    TG_CUDA_CHECK_LAUNCH("LlamaRmsNormBackwardKernel");
  });
  return KernelStatus::kDone;
}

KernelStatus RotaryEmbedding(const RawTensor& out, const RawTensor& x, const RawTensor& cos,
                             const RawTensor& sin) {
  const char* op = "rotary_embedding";
  const int64_t rank = x.dim();
  if (rank - 1 > kRotaryMaxDims) return KernelStatus::kNoKernel;  // the composed ops run
  const int64_t t_len = x.size(-2), d = x.size(-1), count = out.numel();
  if (count == 0) return KernelStatus::kDone;
  RotaryRows rows{};
  rows.dims = static_cast<int>(rank - 1);
  for (int64_t k = 0; k < rank - 1; ++k) {
    rows.size[k] = x.size(k);
    rows.stride[k] = x.strides()[static_cast<size_t>(k)];
  }
  const int device = out.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = CurrentStream(device);
  VisitDeviceFloating(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    RotaryEmbeddingKernel<T><<<ElementBlocks(count), kElementThreads, 0, stream>>>(
        static_cast<T*>(out.raw_data()), static_cast<const T*>(x.raw_data()),
        static_cast<const T*>(cos.raw_data()), static_cast<const T*>(sin.raw_data()), rows, count,
        t_len, d);
    TG_CUDA_CHECK_LAUNCH("RotaryEmbeddingKernel");
  });
  return KernelStatus::kDone;
}

KernelStatus RotaryEmbeddingBackward(const RawTensor& grad_input, const RawTensor& grad_out,
                                     const RawTensor& cos, const RawTensor& sin) {
  const char* op = "rotary_embedding_backward";
  const int64_t t_len = grad_out.size(1), d = grad_out.size(2), count = grad_out.numel();
  if (count == 0) return KernelStatus::kDone;
  const int device = grad_out.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = CurrentStream(device);
  VisitDeviceFloating(op, grad_out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    RotaryEmbeddingBackwardKernel<T><<<ElementBlocks(count), kElementThreads, 0, stream>>>(
        static_cast<T*>(grad_input.raw_data()), static_cast<const T*>(grad_out.raw_data()),
        static_cast<const T*>(cos.raw_data()), static_cast<const T*>(sin.raw_data()), count, t_len,
        d);
    TG_CUDA_CHECK_LAUNCH("RotaryEmbeddingBackwardKernel");
  });
  return KernelStatus::kDone;
}

}  // namespace tg::cuda
