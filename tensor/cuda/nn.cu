// CUDA kernels over the last dim (tensor/cuda/kernels.h): softmax / log_softmax, layer norm,
// embedding and its backward, cross-entropy and its backward. Contracts are those of
// tensor/cpu/kernels.h; the special cases (NaN / inf rows, ignored targets) follow
// tensor/cpu/nn.cc.
//
// Row kernels: a row of n elements is handled by one warp when n <= kWarpRowMax (4 rows per
// 128-thread block) and by one block otherwise (128..1024 threads, by n). Each thread reads its
// share of the row with 128-bit loads after a scalar head that reaches the first 16-byte
// boundary, so rows of any length (50257) stay vectorised. f16/bf16 compute in f32, f64 in f64.
// Softmax statistics are built online (running max and rescaled sum, merged across threads), so
// a row is read once for the statistics and once for the output; the second read is served by
// L1/L2 for the row sizes these ops see.
//
// Embedding backward is deterministic: the indices are sorted with their positions (CUB's stable
// radix sort over the bits that the row count needs), and one thread block per distinct row sums
// that row's gradient rows in position order in f64 registers and writes the row once, rounded
// to the dtype: the CPU kernel's additions in the CPU's order, so the result is bitwise the CPU's
// (and the same on every run). No atomics; a token that occurs k times costs one block k row
// reads.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <mutex>
#include <vector>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_common.cuh"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace nn_detail {

int MultiProcessorCount(int device) {
  static std::mutex mu;
  static std::vector<int> counts;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(counts.size())) counts.resize(device + 1, 0);
  if (counts[device] == 0) {
    TG_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  }
  return counts[device];
}

}  // namespace nn_detail

namespace {

using namespace nn_detail;  // NOLINT(build/namespaces): this file's own helpers

// ---- Softmax ----------------------------------------------------------------------------------

template <typename T, bool kWarp>
__global__ void SoftmaxKernel(T* out, const T* x, int64_t rows, int64_t n, bool log) {
  using C = Acc<T>;
  __shared__ SoftmaxStats<C> smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const T* row = x + r * n;
    T* orow = out + r * n;
    const int64_t head = RowHead(row, n);
    C shift, log_sum;
    RowStats<kWarp>(row, n, head, g, smem).Finalize(&shift, &log_sum);
    ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
      constexpr int W = decltype(width)::value;
      C v[W];
      LoadN<W>(row + i, v);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const C z = v[k] - shift - log_sum;
        v[k] = log ? z : DevExp(z);
      }
      StoreN<W>(orow + i, v);
    });
  }
}

// ---- LayerNorm --------------------------------------------------------------------------------

template <typename T, bool kWarp>
__global__ void LayerNormKernel(T* out, Acc<T>* mean, Acc<T>* rstd, const T* x, const T* w,
                                int64_t w_stride, const T* b, int64_t b_stride, int64_t rows,
                                int64_t n, double eps) {
  __shared__ double smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const T* row = x + r * n;
    T* orow = out + r * n;
    LayerNormRow<kWarp>(row, orow, n, RowHead(row, n), g, eps, smem, &mean[r], &rstd[r], w,
                        w_stride, b, b_stride);
  }
}

// ---- Embedding --------------------------------------------------------------------------------

// Copies weight row idx[i] to out row i, one block per index, threads over the row. E is the
// element's bits (1, 2, 4, 8 bytes: a copy does not care about the dtype), or uint4 when rows
// are contiguous and 16-byte aligned (dim and strides counted in E units).
template <typename E>
__global__ void EmbeddingKernel(E* out, const E* w, int64_t w_stride0, int64_t w_stride1,
                                const int64_t* idx, int64_t count, int64_t rows, int64_t dim,
                                IndexErrorSink rec) {
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const int64_t j = idx[i];
    E* orow = out + i * dim;
    if (j < 0 || j >= rows) {
      if (threadIdx.x == 0) RecordIndexError(rec, IndexOp::kEmbedding, j, i, 0, rows);
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) orow[c] = E{};
      continue;
    }
    const E* wrow = w + j * w_stride0;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) orow[c] = wrow[c * w_stride1];
  }
}

template <typename E>
void LaunchEmbedding(const RawTensor& out, const RawTensor& weight, const RawTensor& indices,
                     IndexErrorSink rec, cudaStream_t stream) {
  const int64_t count = indices.numel(), rows = weight.size(0), dim = weight.size(1);
  const int64_t es = static_cast<int64_t>(sizeof(E));
  const auto* w = static_cast<const char*>(weight.raw_data());
  auto* o = static_cast<char*>(out.raw_data());
  const int64_t* idx = indices.data<int64_t>();
  const unsigned blocks = static_cast<unsigned>(std::min(count, kMaxGrid));
  const bool vectorised =
      weight.strides()[1] == 1 && (dim * es) % 16 == 0 && (weight.strides()[0] * es) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(o) % 16 == 0;
  if (vectorised) {
    const int64_t chunks = dim * es / 16;
    const int threads = static_cast<int>(std::clamp<int64_t>((chunks + 31) / 32 * 32, 32, 256));
    EmbeddingKernel<uint4><<<blocks, threads, 0, stream>>>(
        reinterpret_cast<uint4*>(o), reinterpret_cast<const uint4*>(w),
        weight.strides()[0] * es / 16, 1, idx, count, rows, chunks, rec);
  } else {
    const int threads = static_cast<int>(std::clamp<int64_t>((dim + 31) / 32 * 32, 32, 256));
    EmbeddingKernel<E><<<blocks, threads, 0, stream>>>(
        reinterpret_cast<E*>(o), reinterpret_cast<const E*>(w), weight.strides()[0],
        weight.strides()[1], idx, count, rows, dim, rec);
  }
  TG_CUDA_CHECK_LAUNCH("EmbeddingKernel");
}

// Sort keys of the embedding backward: the row (an out-of-range index gets the key `rows`,
// sorted last and skipped) and the position.
__global__ void EmbeddingKeysKernel(int32_t* keys, int32_t* positions, const int64_t* idx,
                                    int64_t count, int64_t rows, IndexErrorSink rec) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx[i];
    if (j < 0 || j >= rows) {
      RecordIndexError(rec, IndexOp::kEmbeddingBackward, j, i, 0, rows);
      keys[i] = static_cast<int32_t>(rows);
    } else {
      keys[i] = static_cast<int32_t>(j);
    }
    positions[i] = static_cast<int32_t>(i);
  }
}

// One block per run of equal sorted keys (blocks at other positions return at once): sums the
// gradient rows of the run in position order and writes the output row once. Threads cover W
// columns each (W = the vector width when rows are 16-byte aligned); grid.y tiles wide rows.
template <typename T, int W>
__global__ void EmbeddingSegmentSumKernel(T* out, const T* grad, const int32_t* keys,
                                          const int32_t* positions, int64_t count, int64_t dim,
                                          int32_t invalid_key) {
  using C = Acc<T>;
  __shared__ int64_t segment_end;
  const int64_t col = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  for (int64_t k = blockIdx.x; k < count; k += gridDim.x) {
    const int32_t key = keys[k];
    if (key == invalid_key || (k > 0 && keys[k - 1] == key)) continue;  // uniform per block
    if (threadIdx.x < 32) {
      // The end of the run, 32 keys per step: the first lane whose key differs.
      const int lane = threadIdx.x;
      for (int64_t base = k;; base += 32) {
        const int64_t q = base + lane;
        const unsigned differs = __ballot_sync(0xffffffffu, q >= count || keys[q] != key);
        if (differs != 0) {
          if (lane == 0) segment_end = base + __ffs(differs) - 1;
          break;
        }
      }
    }
    __syncthreads();
    const int64_t end = segment_end;
    __syncthreads();  // segment_end is rewritten for the next run
    if (col >= dim) continue;
    // f64 sums in position order, rounded once: the CPU kernel's arithmetic exactly.
    double acc[W];
#pragma unroll
    for (int c = 0; c < W; ++c) acc[c] = 0.0;
#pragma unroll 4
    for (int64_t p = k; p < end; ++p) {
      C v[W];
      LoadN<W>(grad + static_cast<int64_t>(positions[p]) * dim + col, v);
#pragma unroll
      for (int c = 0; c < W; ++c) acc[c] += static_cast<double>(v[c]);
    }
    StoreN<W>(out + static_cast<int64_t>(key) * dim + col, acc);
  }
}

// ---- Cross-entropy ----------------------------------------------------------------------------

template <typename T, bool kWarp>
__global__ void CrossEntropyKernel(T* losses, const T* logits, const int64_t* targets, int64_t rows,
                                   int64_t classes, int64_t ignore_index,
                                   unsigned long long* counted, IndexErrorSink rec) {
  using C = Acc<T>;
  __shared__ SoftmaxStats<C> smem[32];
  const RowGroup<kWarp> g{};
  unsigned long long local = 0;
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int64_t t = targets[r];
    if (t == ignore_index) {
      if (g.tid() == 0) losses[r] = ConvertTo<T>(C(0));
      continue;
    }
    if (t < 0 || t >= classes) {
      if (g.tid() == 0) {
        RecordIndexError(rec, IndexOp::kCrossEntropy, t, r, 0, classes);
        losses[r] = ConvertTo<T>(static_cast<C>(NAN));
      }
      continue;
    }
    const T* row = logits + r * classes;
    C shift, log_sum;
    RowStats<kWarp>(row, classes, RowHead(row, classes), g, smem).Finalize(&shift, &log_sum);
    if (g.tid() == 0) {
      // -log_softmax[t] = log_sum - (x[t] - shift), in the CPU's order.
      losses[r] = ConvertTo<T>(log_sum - (ToCompute(row[t]) - shift));
      ++local;
    }
  }
  if (local != 0) atomicAdd(counted, local);
}

template <typename T, bool kWarp>
__global__ void CrossEntropyBackwardKernel(T* grad, const T* logits, const int64_t* targets,
                                           const double* row_scale, int64_t rows, int64_t classes,
                                           int64_t ignore_index, IndexErrorSink rec) {
  using C = Acc<T>;
  __shared__ SoftmaxStats<C> smem[32];
  const RowGroup<kWarp> g{};
  for (int64_t r = g.first(); r < rows; r += g.stride()) {
    const int64_t t = targets[r];
    const T* row = logits + r * classes;
    T* grow = grad + r * classes;
    const int64_t head = RowHead(row, classes);
    const bool bad = t != ignore_index && (t < 0 || t >= classes);
    if (bad && g.tid() == 0) {
      RecordIndexError(rec, IndexOp::kCrossEntropyBackward, t, r, 0, classes);
    }
    if (t == ignore_index || bad) {
      ForRow<T>(classes, head, g.tid(), g.size(), [&](int64_t i, auto width) {
        constexpr int W = decltype(width)::value;
        C z[W];
#pragma unroll
        for (int k = 0; k < W; ++k) z[k] = C(0);
        StoreN<W>(grow + i, z);
      });
      continue;
    }
    C shift, log_sum;
    RowStats<kWarp>(row, classes, head, g, smem).Finalize(&shift, &log_sum);
    const C s = static_cast<C>(row_scale[r]);
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

int DeviceOf(const RawTensor& t) { return t.device().index; }

}  // namespace

void Softmax(const RawTensor& out, const RawTensor& x, bool log) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0 || n == 0) return;
  const int device = DeviceOf(out);
  DeviceGuard guard(device);
  const cudaStream_t stream = CurrentStream(device);
  VisitDeviceFloating(log ? "log_softmax" : "softmax", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<T*>(out.raw_data());
    const auto* in = static_cast<const T*>(x.raw_data());
    LaunchRows(PlanRows<T>(rows, n), [&](auto warp, const RowPlan& plan) {
      SoftmaxKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(o, in, rows, n, log);
    });
    TG_CUDA_CHECK_LAUNCH("SoftmaxKernel");
  });
}

void LayerNorm(const RawTensor& out, const RawTensor& mean, const RawTensor& rstd, const RawTensor& x,
               const RawTensor& weight, const RawTensor& bias, double eps) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0) return;
  const int device = DeviceOf(out);
  DeviceGuard guard(device);
  const cudaStream_t stream = CurrentStream(device);
  VisitDeviceFloating("layer_norm", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = Acc<T>;
    auto* o = static_cast<T*>(out.raw_data());
    const auto* in = static_cast<const T*>(x.raw_data());
    const T* w = weight.defined() ? static_cast<const T*>(weight.raw_data()) : nullptr;
    const T* b = bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr;
    const int64_t ws = weight.defined() ? weight.strides()[0] : 1;
    const int64_t bs = bias.defined() ? bias.strides()[0] : 1;
    auto* m = static_cast<C*>(mean.raw_data());
    auto* rs = static_cast<C*>(rstd.raw_data());
    LaunchRows(PlanRows<T>(rows, n), [&](auto warp, const RowPlan& plan) {
      LayerNormKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(o, m, rs, in, w, ws, b, bs, rows, n, eps);
    });
    TG_CUDA_CHECK_LAUNCH("LayerNormKernel");
  });
}

void Embedding(const RawTensor& out, const RawTensor& weight, const RawTensor& indices) {
  const int device = DeviceOf(out);
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  if (indices.numel() == 0 || weight.size(1) == 0) return;
  const cudaStream_t stream = CurrentStream(device);
  IndexErrorSink rec = IndexErrorSinkFor(device);
  switch (weight.element_size()) {
    case 1:
      return LaunchEmbedding<uint8_t>(out, weight, indices, rec, stream);
    case 2:
      return LaunchEmbedding<uint16_t>(out, weight, indices, rec, stream);
    case 4:
      return LaunchEmbedding<uint32_t>(out, weight, indices, rec, stream);
    default:
      return LaunchEmbedding<uint64_t>(out, weight, indices, rec, stream);
  }
}

void EmbeddingBackward(const RawTensor& out, const RawTensor& grad, const RawTensor& indices) {
  const int64_t count = indices.numel(), rows = out.size(0), dim = out.size(1);
  const int device = DeviceOf(out);
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  if (count == 0 || dim == 0) return;
  // Keys and positions are sorted as i32 (half the radix passes of i64).
  TG_CHECK(count < INT32_MAX && rows < INT32_MAX,
           "embedding_backward: the CUDA kernel takes fewer "
           "than 2^31 indices and rows, got ",
           count, " indices and ", rows, " rows");
  const cudaStream_t stream = CurrentStream(device);
  IndexErrorSink rec = IndexErrorSinkFor(device);
  const RawTensor scratch = RawTensor::Empty({4 * count}, kI32, out.device());
  int32_t* keys = scratch.data<int32_t>();
  int32_t* positions = keys + count;
  int32_t* sorted_keys = keys + 2 * count;
  int32_t* sorted_positions = keys + 3 * count;
  const int threads = 256;
  EmbeddingKeysKernel<<<BlocksFor(count, threads), threads, 0, stream>>>(
      keys, positions, indices.data<int64_t>(), count, rows, rec);
  TG_CUDA_CHECK_LAUNCH("EmbeddingKeysKernel");
  // Sort only the bits that keys in [0, rows] use (rows is the invalid-index key).
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= rows) ++end_bit;
  size_t temp_bytes = 0;
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, positions,
                                                sorted_positions, static_cast<int>(count), 0,
                                                end_bit, stream));
  const RawTensor temp =
      RawTensor::Empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, kU8, out.device());
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys, sorted_keys,
                                                positions, sorted_positions,
                                                static_cast<int>(count), 0, end_bit, stream));
  VisitDeviceFloating("embedding_backward", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<T*>(out.raw_data());
    const auto* g = static_cast<const T*>(grad.raw_data());
    const bool vectorised = dim % kVec<T> == 0 && reinterpret_cast<uintptr_t>(o) % 16 == 0 &&
                            reinterpret_cast<uintptr_t>(g) % 16 == 0;
    const int width = vectorised ? kVec<T> : 1;
    const int64_t lanes = (dim + width - 1) / width;
    const int block = static_cast<int>(std::clamp<int64_t>((lanes + 31) / 32 * 32, 32, 256));
    const int64_t tiles = (lanes + block - 1) / block;
    TG_CHECK(tiles <= 65535, "embedding_backward: rows of ", dim, " elements are too wide");
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(count, kMaxGrid)),
                    static_cast<unsigned>(tiles));
    const auto invalid = static_cast<int32_t>(rows);
    if (vectorised) {
      EmbeddingSegmentSumKernel<T, kVec<T>>
          <<<grid, block, 0, stream>>>(o, g, sorted_keys, sorted_positions, count, dim, invalid);
    } else {
      EmbeddingSegmentSumKernel<T, 1>
          <<<grid, block, 0, stream>>>(o, g, sorted_keys, sorted_positions, count, dim, invalid);
    }
    TG_CUDA_CHECK_LAUNCH("EmbeddingSegmentSumKernel");
  });
}

int64_t CrossEntropy(const RawTensor& losses, const RawTensor& logits, const RawTensor& targets,
                     int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int device = DeviceOf(losses);
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  if (rows == 0) return 0;
  const cudaStream_t stream = CurrentStream(device);
  IndexErrorSink rec = IndexErrorSinkFor(device);
  const RawTensor counted = RawTensor::Empty({1}, kI64, losses.device());
  auto* counted_ptr = static_cast<unsigned long long*>(counted.raw_data());
  TG_CUDA_CHECK(cudaMemsetAsync(counted_ptr, 0, sizeof(unsigned long long), stream));
  VisitDeviceFloating("cross_entropy", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto* o = static_cast<T*>(losses.raw_data());
    const auto* in = static_cast<const T*>(logits.raw_data());
    const int64_t* t = targets.data<int64_t>();
    LaunchRows(PlanRows<T>(rows, classes), [&](auto warp, const RowPlan& plan) {
      CrossEntropyKernel<T, decltype(warp)::value><<<plan.blocks, plan.threads, 0, stream>>>(
          o, in, t, rows, classes, ignore_index, counted_ptr, rec);
    });
    TG_CUDA_CHECK_LAUNCH("CrossEntropyKernel");
  });
  // The count is the one result the host needs (the mean's divisor, computed on the host by the
  // dispatch): one 8-byte copy and a wait for the stream. The wait also makes this call report
  // its own bad targets exactly, like the CPU kernel.
  unsigned long long host_count = 0;
  TG_CUDA_CHECK(cudaMemcpyAsync(&host_count, counted_ptr, sizeof(host_count),
                                cudaMemcpyDeviceToHost, stream));
  SynchronizeStream(stream);
  ThrowIfIndexError(device);
  return static_cast<int64_t>(host_count);
}

void CrossEntropyBackward(const RawTensor& grad_logits, const RawTensor& logits, const RawTensor& targets,
                          const RawTensor& row_scale, int64_t ignore_index) {
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const int device = DeviceOf(grad_logits);
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  if (rows == 0 || classes == 0) return;
  const cudaStream_t stream = CurrentStream(device);
  IndexErrorSink rec = IndexErrorSinkFor(device);
  VisitDeviceFloating("cross_entropy_backward", logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto* gr = static_cast<T*>(grad_logits.raw_data());
    const auto* in = static_cast<const T*>(logits.raw_data());
    const int64_t* t = targets.data<int64_t>();
    const double* s = row_scale.data<double>();
    LaunchRows(PlanRows<T>(rows, classes), [&](auto warp, const RowPlan& plan) {
      CrossEntropyBackwardKernel<T, decltype(warp)::value>
          <<<plan.blocks, plan.threads, 0, stream>>>(gr, in, t, s, rows, classes, ignore_index,
                                                     rec);
    });
    TG_CUDA_CHECK_LAUNCH("CrossEntropyBackwardKernel");
  });
}

}  // namespace tg::cuda
