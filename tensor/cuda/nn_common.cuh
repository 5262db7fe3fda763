// Device helpers shared by the row kernels (nn.cu, nn_fused.cu), the indexing kernels (index.cu)
// and max pooling (pool.cu): 128-bit row loads and stores with a scalar head, warp and block
// reductions, the online softmax and the layer-norm statistics, the device-side index error
// record, and the launch plan of row kernels.
//
// Private to //tensor/cuda:nn. Dtype dispatch (VisitDeviceFloating) and the conversions
// (ToCompute / ConvertTo, bit-exact with the CPU's) come from tensor_args.cuh.
#ifndef TAPEGRAD_TENSOR_CUDA_NN_COMMON_CUH_
#define TAPEGRAD_TENSOR_CUDA_NN_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/tensor_args.cuh"

namespace tg::cuda::nn_detail {

// ---- Types ----------------------------------------------------------------------------------

// The compute type of a floating storage type: f32 for f16/bf16/f32, f64 for f64 (tensor_args.cuh
// converts with ToCompute / ConvertTo, bit-exact with the CPU's conversions).
template <typename T>
using Acc = DeviceCompute<T>;

__device__ __forceinline__ float DevExp(float v) { return expf(v); }
__device__ __forceinline__ double DevExp(double v) { return exp(v); }
__device__ __forceinline__ float DevLog(float v) { return logf(v); }
__device__ __forceinline__ double DevLog(double v) { return log(v); }

template <typename C>
__device__ __forceinline__ C Infinity() {
  return static_cast<C>(INFINITY);
}

// ---- 128-bit row access -----------------------------------------------------------------------

// Elements per 128-bit access: 8 for f16/bf16, 4 for f32, 2 for f64.
template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
struct alignas(16) VecOf {
  T v[kVec<T>];
};

template <typename T>
__device__ __forceinline__ bool Aligned16(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Loads W consecutive elements at p into compute values: W / kVec 128-bit loads when W is a
// multiple of the vector width and p is 16-byte aligned (one for a row piece of T; two for the
// f32 partial sums that go with an 8-wide f16/bf16 piece), element loads otherwise (so any
// pointer is safe).
template <int W, typename T>
__device__ __forceinline__ void LoadN(const T* p, Acc<T> (&out)[W]) {
  if constexpr (W % kVec<T> == 0) {
    if (Aligned16(p)) {
#pragma unroll
      for (int j = 0; j < W / kVec<T>; ++j) {
        const VecOf<T> v = reinterpret_cast<const VecOf<T>*>(p)[j];
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) out[j * kVec<T> + k] = ToCompute(v.v[k]);
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) out[k] = ToCompute(p[k]);
}

// Like LoadN for a vector with element stride `stride` (1: contiguous, vectorised when aligned).
template <int W, typename T>
__device__ __forceinline__ void LoadStrided(const T* p, int64_t stride, Acc<T> (&out)[W]) {
  if (stride == 1) {
    LoadN<W>(p, out);
    return;
  }
#pragma unroll
  for (int k = 0; k < W; ++k) out[k] = ToCompute(p[k * stride]);
}

// Stores W values (of the compute type, or f64 for sums kept in f64) at p, each converted to T
// once; vectorised like LoadN.
template <int W, typename T, typename A>
__device__ __forceinline__ void StoreN(T* p, const A (&in)[W]) {
  if constexpr (W % kVec<T> == 0) {
    if (Aligned16(p)) {
#pragma unroll
      for (int j = 0; j < W / kVec<T>; ++j) {
        VecOf<T> v;
#pragma unroll
        for (int k = 0; k < kVec<T>; ++k) v.v[k] = ConvertTo<T>(in[j * kVec<T> + k]);
        reinterpret_cast<VecOf<T>*>(p)[j] = v;
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) p[k] = ConvertTo<T>(in[k]);
}

// Elements before the first 16-byte boundary of `row` (at most n): the scalar head of a row, so
// that the rest of it can be read in aligned 128-bit pieces even when the row length is not a
// multiple of the vector width (a 50257-wide vocabulary, say).
template <typename T>
__device__ __forceinline__ int64_t RowHead(const T* row, int64_t n) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  if (addr % sizeof(T) != 0) return n;  // never for tensor storage; stays correct regardless
  const int64_t misaligned = static_cast<int64_t>((addr & 15u) / sizeof(T));
  const int64_t head = misaligned == 0 ? 0 : kVec<T> - misaligned;
  return head < n ? head : n;
}

// Calls fn(i, std::integral_constant<int, W>) for pieces [i, i + W) that cover [0, n) once:
// scalar pieces before `head` and after the last whole vector, kVec-wide pieces in between. Thread
// `tid` of `nthreads` takes every nthreads-th piece of each part, so the element -> thread map
// depends only on (n, head): passes over the same row with the same head touch the same
// elements from the same thread, which lets a kernel re-read what it wrote without a barrier.
template <typename T, typename Fn>
__device__ __forceinline__ void ForRow(int64_t n, int64_t head, int tid, int nthreads, Fn&& fn) {
  constexpr int V = kVec<T>;
  for (int64_t i = tid; i < head; i += nthreads) fn(i, std::integral_constant<int, 1>{});
  const int64_t nvec = (n - head) / V;
  for (int64_t v = tid; v < nvec; v += nthreads) {
    fn(head + v * V, std::integral_constant<int, V>{});
  }
  for (int64_t i = head + nvec * V + tid; i < n; i += nthreads) {
    fn(i, std::integral_constant<int, 1>{});
  }
}

// ---- Reductions -------------------------------------------------------------------------------

template <typename V>
__device__ __forceinline__ V ShuffleXor(V v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

template <typename V, typename Op>
__device__ __forceinline__ V WarpAllReduce(V v, Op op) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) v = op(v, ShuffleXor(v, mask));
  return v;
}

// All-reduce over a row group: one warp (kWarp) or the whole block (blockDim.x a multiple of
// 32). `smem` holds 32 values; the leading barrier makes back-to-back calls safe. Every thread
// of the group gets the result.
template <bool kWarp, typename V, typename Op>
__device__ __forceinline__ V GroupAllReduce(V v, Op op, V identity, V* smem) {
  v = WarpAllReduce(v, op);
  if constexpr (kWarp) {
    return v;
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = lane < static_cast<int>(blockDim.x / 32) ? smem[lane] : identity;
    return WarpAllReduce(v, op);
  }
}

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};

// How a kernel's threads map onto rows: one warp per row (kWarp; blockDim.x / 32 rows per block)
// or one block per row; both loop over rows with a grid stride.
template <bool kWarp>
struct RowGroup {
  __device__ __forceinline__ int64_t first() const {
    return kWarp ? static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32
                 : static_cast<int64_t>(blockIdx.x);
  }
  __device__ __forceinline__ int64_t stride() const {
    return kWarp ? static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)
                 : static_cast<int64_t>(gridDim.x);
  }
  __device__ __forceinline__ int tid() const {
    return kWarp ? static_cast<int>(threadIdx.x % 32) : static_cast<int>(threadIdx.x);
  }
  __device__ __forceinline__ int size() const { return kWarp ? 32 : static_cast<int>(blockDim.x); }
  // Orders a group's global-memory writes before its later reads by other threads of the group.
  __device__ __forceinline__ void Sync() const {
    if constexpr (kWarp) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
};

// ---- Online softmax statistics ----------------------------------------------------------------

// max and sum(exp(x - max)) of a row, built one element at a time and merged across threads,
// with the CPU kernel's special cases (tensor/cpu/nn.cc RowLogSumExp): a NaN anywhere makes the
// row NaN; an all -inf row gives NaN outputs; a +inf max shifts by 0 and gives log_sum = +inf.
template <typename C>
struct SoftmaxStats {
  C max;  // NaN once a NaN was seen
  C sum;  // sum of exp(x - max); meaningless while max is +-inf

  __device__ __forceinline__ static SoftmaxStats Identity() { return {-Infinity<C>(), C(0)}; }

  __device__ __forceinline__ void Add(C x) {
    if (isnan(x) || isnan(max)) {
      max = x + max;  // NaN, sticky
    } else if (x > max) {
      sum = sum * DevExp(max - x) + C(1);  // max = -inf: 0 * 0 + 1
      max = x;
    } else if (x > -Infinity<C>()) {
      sum += DevExp(x - max);
    }
  }

  __device__ __forceinline__ static SoftmaxStats Merge(SoftmaxStats a, SoftmaxStats b) {
    if (isnan(a.max) || isnan(b.max)) return {a.max + b.max, C(0)};
    if (a.max == -Infinity<C>()) return b;
    if (b.max == -Infinity<C>()) return a;
    const C m = a.max > b.max ? a.max : b.max;
    if (m == Infinity<C>()) return {m, C(0)};
    return {m, a.sum * DevExp(a.max - m) + b.sum * DevExp(b.max - m)};
  }

  // The CPU's (shift, log_sum): outputs are x - shift - log_sum.
  __device__ __forceinline__ void Finalize(C* shift, C* log_sum) const {
    if (isnan(max)) {
      *shift = max;
      *log_sum = max;
    } else if (isinf(max)) {
      *shift = C(0);
      *log_sum = max;  // -inf: log(0) (all -inf row -> NaN outputs); +inf: log(inf)
    } else {
      *shift = max;
      *log_sum = DevLog(sum);
    }
  }
};

template <typename C>
__device__ __forceinline__ SoftmaxStats<C> ShuffleXor(SoftmaxStats<C> s, int mask) {
  return {__shfl_xor_sync(0xffffffffu, s.max, mask), __shfl_xor_sync(0xffffffffu, s.sum, mask)};
}

struct StatsMergeOp {
  template <typename S>
  __device__ __forceinline__ S operator()(S a, S b) const {
    return S::Merge(a, b);
  }
};

// Statistics of a row of n elements held by a group (threads tid of nthreads), reduced over the
// group; every thread of the group gets them.
template <bool kWarp, typename T>
__device__ __forceinline__ SoftmaxStats<Acc<T>> RowStats(const T* row, int64_t n, int64_t head,
                                                         const RowGroup<kWarp>& g,
                                                         SoftmaxStats<Acc<T>>* smem) {
  using C = Acc<T>;
  SoftmaxStats<C> s = SoftmaxStats<C>::Identity();
  ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    C v[W];
    LoadN<W>(row + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) s.Add(v[k]);
  });
  return GroupAllReduce<kWarp>(s, StatsMergeOp{}, SoftmaxStats<C>::Identity(), smem);
}

// ---- Layer-norm statistics -----------------------------------------------------------------

// mean and rstd = 1 / sqrt(var + eps) (biased variance) of a row, as the CPU kernel computes
// them: sums in f64 in two passes (the mean, then the squared deviations from it, which does not
// cancel for rows with a large mean the way E[x^2] - E[x]^2 does), rounded to the compute type
// at the end. f64 accumulation costs nothing measurable in a bandwidth-bound kernel and keeps
// mean and rstd within an ulp of the CPU's even for rows like 1000 + noise; eps (1e-5) is added
// in f64 as well, where it is exact. Every thread of the group gets both.
template <bool kWarp, typename T>
__device__ __forceinline__ void RowMeanRstd(const T* row, int64_t n, int64_t head,
                                            const RowGroup<kWarp>& g, double eps, double* smem,
                                            Acc<T>* mean, Acc<T>* rstd) {
  double sum = 0;
  ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    Acc<T> v[W];
    LoadN<W>(row + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += static_cast<double>(v[k]);
  });
  const double mu = GroupAllReduce<kWarp>(sum, SumOp{}, 0.0, smem) / static_cast<double>(n);
  double sq = 0;
  ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    Acc<T> v[W];
    LoadN<W>(row + i, v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const double d = static_cast<double>(v[k]) - mu;
      sq += d * d;
    }
  });
  sq = GroupAllReduce<kWarp>(sq, SumOp{}, 0.0, smem);
  *mean = static_cast<Acc<T>>(mu);
  *rstd = static_cast<Acc<T>>(1.0 / sqrt(sq / static_cast<double>(n) + eps));
}

// Layer norm of one row (shared by LayerNorm and AddLayerNorm): the statistics of `row`
// (written to mean[r] / rstd[r] by thread 0), then out = (x - mean) * rstd * w + b per element,
// w and b optional (null) and strided.
template <bool kWarp, typename T>
__device__ __forceinline__ void LayerNormRow(const T* row, T* orow, int64_t n, int64_t head,
                                             const RowGroup<kWarp>& g, double eps, double* smem,
                                             Acc<T>* mean_r, Acc<T>* rstd_r, const T* w,
                                             int64_t w_stride, const T* b, int64_t b_stride) {
  using C = Acc<T>;
  C mu, rs;
  RowMeanRstd<kWarp>(row, n, head, g, eps, smem, &mu, &rs);
  if (g.tid() == 0) {
    *mean_r = mu;
    *rstd_r = rs;
  }
  ForRow<T>(n, head, g.tid(), g.size(), [&](int64_t i, auto width) {
    constexpr int W = decltype(width)::value;
    C v[W], wv[W], bv[W];
    LoadN<W>(row + i, v);
    if (w != nullptr) LoadStrided<W>(w + i * w_stride, w_stride, wv);
    if (b != nullptr) LoadStrided<W>(b + i * b_stride, b_stride, bv);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      C y = (v[k] - mu) * rs;
      if (w != nullptr) y *= wv[k];
      if (b != nullptr) y += bv[k];
      v[k] = y;
    }
    StoreN<W>(orow + i, v);
  });
}

// ---- Index errors -----------------------------------------------------------------------------

// The ops whose index errors a record can describe (the messages are the CPU kernels').
enum class IndexOp : int32_t {
  kEmbedding = 1,
  kEmbeddingBackward,
  kCrossEntropy,
  kCrossEntropyBackward,
  kSoftmaxCrossEntropyFused,
  kGather,
  kScatterAdd,
  kIndexSelect,
  kIndexAdd,
  kMaxPool2dBackward,
};

inline constexpr int kMaxIndexDims = 8;

// The first index error on a device since the host last looked, in mapped pinned host memory:
// kernels write it directly (only on error), the host reads it without a copy or a sync.
struct IndexErrorRecord {
  int32_t ready;  // 1 once the fields below are written (the host polls this)
  int32_t op;     // IndexOp
  int32_t ndim;   // entries of pos[] (0: `position` is a flat position)
  int64_t value;  // the bad index or target
  int64_t position;
  int64_t dim;
  int64_t size;   // the size of `dim` (rows, classes, H for max pooling)
  int64_t size2;  // W for max pooling
  int64_t pos[kMaxIndexDims];
};

// What a kernel needs to report an index error: a claim word in device memory (so that exactly
// one failing thread writes the record; atomics on mapped host memory are not guaranteed to be
// atomic) and the record. Passed by value to kernels.
struct IndexErrorSink {
  int* claim;
  IndexErrorRecord* record;
};

// Records an index error unless one is already recorded; kernels then skip the element.
__device__ __forceinline__ void RecordIndexError(IndexErrorSink sink, IndexOp op, int64_t value,
                                                 int64_t position, int64_t dim, int64_t size,
                                                 int64_t size2 = 0, int ndim = 0,
                                                 const int64_t* pos = nullptr) {
  if (atomicCAS(sink.claim, 0, 1) != 0) return;
  IndexErrorRecord* rec = sink.record;
  rec->op = static_cast<int32_t>(op);
  rec->value = value;
  rec->position = position;
  rec->dim = dim;
  rec->size = size;
  rec->size2 = size2;
  rec->ndim = ndim;
  for (int d = 0; d < ndim && d < kMaxIndexDims; ++d) rec->pos[d] = pos[d];
  __threadfence_system();  // the fields reach the host before `ready`
  *static_cast<volatile int32_t*>(&rec->ready) = 1;
}

// Host side (index.cu). The sink of `device`, allocated on first use.
IndexErrorSink IndexErrorSinkFor(int device);
// Throws the recorded error of `device`, if any, and clears it (stream-ordered); never waits.
void ThrowIfIndexError(int device);

// ---- Host launch helpers -----------------------------------------------------------------------

// Rows up to this length get one warp each (at most 32 elements per lane).
inline constexpr int64_t kWarpRowMax = 1024;
inline constexpr int kRowsPerWarpBlock = 4;
inline constexpr int64_t kMaxGrid = int64_t{1} << 30;

struct RowPlan {
  bool warp;
  int threads;
  unsigned blocks;
};

// The launch of a row kernel over rows x n: 4 warps of one row each per block for short rows,
// else one block per row with about four 128-bit pieces per thread (128..1024 threads). At most
// max_blocks blocks (the kernels loop over rows with a grid stride).
template <typename T>
RowPlan PlanRows(int64_t rows, int64_t n, int64_t max_blocks = kMaxGrid) {
  if (n <= kWarpRowMax) {
    const int64_t blocks = (rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock;
    return {true, 32 * kRowsPerWarpBlock, static_cast<unsigned>(std::min(blocks, max_blocks))};
  }
  const int64_t pieces = (n + kVec<T> - 1) / kVec<T>;
  const int64_t threads = std::clamp<int64_t>((pieces / 4 + 31) / 32 * 32, 128, 1024);
  return {false, static_cast<int>(threads), static_cast<unsigned>(std::min(rows, max_blocks))};
}

// Calls launch(std::bool_constant<kWarp>{}, plan) for `plan`.
template <typename Launch>
void LaunchRows(const RowPlan& plan, Launch&& launch) {
  if (plan.warp) {
    launch(std::true_type{}, plan);
  } else {
    launch(std::false_type{}, plan);
  }
}

// Number of multiprocessors of `device` (cached; nn.cu).
int MultiProcessorCount(int device);

}  // namespace tg::cuda::nn_detail

#endif  // TAPEGRAD_TENSOR_CUDA_NN_COMMON_CUH_
