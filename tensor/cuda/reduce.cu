// Row reductions (SumRows, MaxRows) and the non-finite check / in-place scaling of mixed
// precision (AnyNonFinite, ScaleInPlace) on CUDA, with the semantics of tensor/cpu/reduce.cc and
// tensor/cpu/nn.cc.
//
// Rows are reduced by one warp each when short and one block each when long, with warp shuffles
// and a shared-memory step between warps. When there are too few rows to fill the GPU (a full
// reduction is one row), each row is cut into chunks reduced by separate blocks, and a second
// launch reduces the chunk results: deterministic (no atomics), so a sum gives the same bits on
// every run.
//
// SumRows accumulates f16/bf16/f32/f64 in f64 and rounds once, as the CPU does (an f64 add is
// cheap next to the memory traffic on the GPUs tapegrad targets); the order of the additions
// differs from the CPU's sequential loop, so f64 sums may differ in the last bits and, very
// rarely, an f32/f16/bf16 result by one ulp. Integers and bool sum exactly to i64 (wrapping).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/tensor_args.cuh"

namespace tg::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

int SmCount(int device) {
  static std::atomic<int> cache[64];
  if (device >= 0 && device < 64) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < 64) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

// The rows of a contiguous [rows, row_len] input, each cut into `chunks` segments of `chunk`
// columns (the last may be shorter or empty). A segment is reduced by one group of threads: a
// warp when segments are short, else the whole block.
struct Segments {
  int64_t rows;
  int64_t row_len;
  int64_t chunks;
  int64_t chunk;
  bool warp_mode;

  int64_t count() const { return rows * chunks; }
};

// Warp-per-segment pays off below this length; longer segments get a block.
constexpr int64_t kWarpMaxLen = 512;
// Splitting rows never makes chunks shorter than this.
constexpr int64_t kMinChunk = 4096;

Segments MakeSegments(int64_t rows, int64_t row_len, int device) {
  Segments s{rows, row_len, 1, row_len, false};
  // About 4 blocks per SM; only worth a second launch when rows are few and long.
  const int64_t target = 4 * static_cast<int64_t>(SmCount(device));
  if (rows < target && row_len >= 2 * kMinChunk) {
    s.chunks = std::min((target + rows - 1) / rows, (row_len + kMinChunk - 1) / kMinChunk);
    s.chunk = (row_len + s.chunks - 1) / s.chunks;
  }
  s.warp_mode = s.chunk <= kWarpMaxLen;
  return s;
}

int BlocksForSegments(const Segments& s) {
  const int64_t groups_per_block = s.warp_mode ? kThreads / 32 : 1;
  const int64_t blocks = (s.count() + groups_per_block - 1) / groups_per_block;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 20));  // loops beyond
}

// Which group of the block this thread belongs to, and its rank and width there.
struct Group {
  int index, count, rank, width;
};

__device__ __forceinline__ Group ThisGroup(bool warp_mode) {
  if (warp_mode) {
    return {static_cast<int>(threadIdx.x / 32), static_cast<int>(blockDim.x / 32),
            static_cast<int>(threadIdx.x % 32), 32};
  }
  return {0, 1, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
}

// ---- SumRows -----------------------------------------------------------------------------------

// f64 for every floating type; the integers wrap modulo 2^64 like the CPU's uint64_t.
template <typename T>
using SumAcc =
    std::conditional_t<std::is_floating_point_v<DeviceCompute<T>>, double, unsigned long long>;

template <typename Acc, typename In>
__device__ __forceinline__ Acc ToAcc(In v) {
  if constexpr (std::is_same_v<In, Acc>) {
    return v;
  } else {
    return static_cast<Acc>(ToCompute(v));  // i64 -> u64 is modulo 2^64; bool -> 0/1
  }
}

template <typename Out, typename Acc>
__device__ __forceinline__ Out FromAcc(Acc v) {
  if constexpr (std::is_same_v<Out, Acc>) {
    return v;
  } else if constexpr (std::is_same_v<Acc, double>) {
    return ConvertTo<Out>(v);  // one rounding (through round-to-odd f32 for f16/bf16)
  } else {
    return static_cast<Out>(v);
  }
}

// The sum of v over the group, valid in its rank-0 thread. Block mode goes through `shared`
// (32 slots) and synchronises the block, so every thread of the block must call it.
template <typename Acc>
__device__ __forceinline__ Acc GroupSum(Acc v, bool warp_mode, Acc* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFullMask, v, offset);
  if (warp_mode) return v;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : Acc(0);
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFullMask, v, offset);
  }
  __syncthreads();  // `shared` is reused by the next segment
  return v;
}

// out[s] = sum of segment s of x.
template <typename In, typename Acc, typename Out>
__global__ void __launch_bounds__(kThreads) SumSegmentsKernel(const In* x, Segments seg, Out* out) {
  __shared__ Acc shared[32];
  const Group g = ThisGroup(seg.warp_mode);
  const int64_t count = seg.rows * seg.chunks;
  // The loop bound is the same for the whole block, so GroupSum's barriers are reached by all.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * g.count; first < count;
       first += static_cast<int64_t>(gridDim.x) * g.count) {
    const int64_t s = first + g.index;
    Acc acc = 0;
    if (s < count) {
      int64_t c;
      const int64_t row = DivMod(s, seg.chunks, &c);
      const int64_t end = std::min(seg.row_len, (c + 1) * seg.chunk);
      const In* p = x + row * seg.row_len;
#pragma unroll 4
      for (int64_t i = c * seg.chunk + g.rank; i < end; i += g.width) acc += ToAcc<Acc>(p[i]);
    }
    acc = GroupSum(acc, seg.warp_mode, shared);
    if (g.rank == 0 && s < count) out[s] = FromAcc<Out>(acc);
  }
}

template <typename In, typename Acc, typename Out>
void LaunchSum(const In* x, const Segments& seg, Out* out, cudaStream_t stream) {
  SumSegmentsKernel<In, Acc, Out><<<BlocksForSegments(seg), kThreads, 0, stream>>>(x, seg, out);
  TG_CUDA_CHECK_LAUNCH("sum");
}

// ---- MaxRows -----------------------------------------------------------------------------------

// The key MaxRows compares: the compute type, with bool as an integer.
template <typename T>
using MaxKey = std::conditional_t<std::is_same_v<T, bool>, int64_t, DeviceCompute<T>>;

// Whether candidate (bv, bi) beats (av, ai) under the CPU's rule: the first NaN wins; otherwise
// the largest value, and the first index among equal values. An index < 0 is no candidate. This
// is a total order on (value, index), so any reduction tree gives the sequential loop's answer.
template <typename K>
__device__ __forceinline__ bool Beats(K bv, int64_t bi, K av, int64_t ai) {
  if (bi < 0) return false;
  if (ai < 0) return true;
  if constexpr (std::is_floating_point_v<K>) {
    const bool a_nan = av != av, b_nan = bv != bv;
    if (a_nan || b_nan) return b_nan && (!a_nan || bi < ai);
  }
  if (bv != av) return bv > av;
  return bi < ai;
}

template <typename K>
__device__ __forceinline__ void WarpBest(K& v, int64_t& i) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const K ov = __shfl_down_sync(kFullMask, v, offset);
    const int64_t oi =
        static_cast<int64_t>(__shfl_down_sync(kFullMask, static_cast<long long>(i), offset));
    if (Beats(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// The group's best candidate, valid in its rank-0 thread (same barrier rule as GroupSum).
template <typename K>
__device__ __forceinline__ void GroupBest(K& v, int64_t& i, bool warp_mode, K* shared_v,
                                          int64_t* shared_i) {
  WarpBest(v, i);
  if (warp_mode) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    shared_v[warp] = v;
    shared_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    const bool live = lane < static_cast<int>(blockDim.x / 32);
    v = live ? shared_v[lane] : K(0);
    i = live ? shared_i[lane] : -1;
    WarpBest(v, i);
  }
  __syncthreads();
}

// The column of the maximum of each segment of x [rows, row_len]. Without `candidates` a
// segment's elements are its columns; with them, segment s is row s (seg.row_len is then the
// number of candidates per row, x_len the row length of x) and its elements are the columns
// candidates[s * seg.row_len + j] found by a first pass (< 0: an empty chunk). Writes the column
// to best[s] when `best` is given, else the row's value (the element itself, bit for bit) and
// index to values/indices (either may be null).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MaxSegmentsKernel(const T* x, int64_t x_len, Segments seg, const int64_t* candidates,
                      int64_t* best, T* values, int64_t* indices) {
  using K = MaxKey<T>;
  __shared__ K shared_v[32];
  __shared__ int64_t shared_i[32];
  const Group g = ThisGroup(seg.warp_mode);
  const int64_t count = seg.rows * seg.chunks;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * g.count; first < count;
       first += static_cast<int64_t>(gridDim.x) * g.count) {
    const int64_t s = first + g.index;
    K v = K(0);
    int64_t index = -1;
    int64_t row = 0;
    if (s < count) {
      int64_t c;
      row = DivMod(s, seg.chunks, &c);
      const int64_t end = std::min(seg.row_len, (c + 1) * seg.chunk);
      const T* p = x + row * x_len;
      for (int64_t j = c * seg.chunk + g.rank; j < end; j += g.width) {
        const int64_t col = candidates != nullptr ? candidates[row * seg.row_len + j] : j;
        if (col < 0) continue;
        const K e = static_cast<K>(ToCompute(p[col]));
        if (Beats(e, col, v, index)) {
          v = e;
          index = col;
        }
      }
    }
    GroupBest(v, index, seg.warp_mode, shared_v, shared_i);
    if (g.rank == 0 && s < count) {
      if (best != nullptr) {
        best[s] = index;
      } else {
        if (values != nullptr) values[row] = x[row * x_len + index];
        if (indices != nullptr) indices[row] = index;
      }
    }
  }
}

// ---- Non-finite check and scaling --------------------------------------------------------------

// Multiplies each element by `scale` when `write`, and records in *found (when given) whether
// any element was inf or NaN before scaling (one write per block that saw one).
template <typename T>
struct ScaleOp {
  DeviceCompute<T> scale;
  bool write;
  int* found;

  __device__ __forceinline__ bool Apply(T& x) const {
    const DeviceCompute<T> v = ToCompute(x);
    if (write) x = ConvertTo<T>(v * scale);
    return !isfinite(v);
  }
  __device__ __forceinline__ void Report(bool bad) const {
    if (found != nullptr && __syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
  }
};

template <int kVec, typename T>
__global__ void __launch_bounds__(kThreads) ScaleContiguousKernel(int64_t n, T* p, ScaleOp<T> op) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / kVec;
  bool bad = false;
  for (int64_t v = first; v < vectors; v += step) {
    Vec<T, kVec> x = reinterpret_cast<const Vec<T, kVec>*>(p)[v];
#pragma unroll
    for (int k = 0; k < kVec; ++k) bad |= op.Apply(x.v[k]);
    if (op.write) reinterpret_cast<Vec<T, kVec>*>(p)[v] = x;
  }
  for (int64_t i = vectors * kVec + first; i < n; i += step) {
    T x = p[i];
    bad |= op.Apply(x);
    if (op.write) p[i] = x;
  }
  op.Report(bad);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ScaleStridedKernel(int64_t n, StridedArgs<1> args, ScaleOp<T> op) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t off[1];
    args.Offsets(i, off);
    T* p = reinterpret_cast<T*>(args.base[0] + off[0]);
    T x = *p;
    bad |= op.Apply(x);
    if (op.write) *p = x;
  }
  op.Report(bad);
}

// Scales t by `scale` (when write) and checks it for inf/NaN (when check) in one pass. Returns
// whether a non-finite element was found; checking waits for the device (a 4-byte copy back).
bool ScaleOrCheck(const char* op, const RawTensor& t, double scale, bool write, bool check) {
  return VisitDeviceFloating(op, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (t.numel() == 0) return false;
    const DeviceGuard guard(t.device().index);
    const cudaStream_t stream = StreamOf(t);
    RawTensor flag;
    int* found = nullptr;
    if (check) {
      flag = RawTensor::Empty({1}, kI32, t.device());
      found = static_cast<int*>(flag.raw_data());
      TG_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(int), stream));
    }
    // The scale rounds to the compute type on the host, as on the CPU.
    const ScaleOp<T> scale_op{static_cast<DeviceCompute<T>>(scale), write, found};
    T* p = static_cast<T*>(t.raw_data());
    constexpr int kVec = VecWidth<T>();
    if (t.is_contiguous() && IsAligned(p, sizeof(T) * kVec)) {
      const int64_t n = t.numel();
      ScaleContiguousKernel<kVec, T>
          <<<BlocksFor((n + kVec - 1) / kVec, kThreads), kThreads, 0, stream>>>(n, p, scale_op);
      TG_CUDA_CHECK_LAUNCH(op);
    } else {
      ForEachStridedSlice<1>(
          t.shape(), {static_cast<char*>(t.raw_data())}, {BroadcastByteStrides(t, t.shape())},
          [&](const StridedArgs<1>& args, int64_t count) {
            ScaleStridedKernel<T>
                <<<BlocksFor(count, kThreads), kThreads, 0, stream>>>(count, args, scale_op);
            TG_CUDA_CHECK_LAUNCH(op);
          });
    }
    if (!check) return false;
    int host = 0;
    TG_CUDA_CHECK(cudaMemcpyAsync(&host, found, sizeof(int), cudaMemcpyDeviceToHost, stream));
    SynchronizeStream(stream);
    return host != 0;
  });
}

}  // namespace

void SumRows(const RawTensor& out, const RawTensor& strided) {
  // The segmented kernels read contiguous rows.
  const RawTensor x = strided.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0) return;
  const DeviceGuard guard(x.device().index);
  const cudaStream_t stream = StreamOf(out);
  const Segments seg = MakeSegments(rows, n, x.device().index);
  VisitDevice(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = SumAcc<T>;
    // Floating x: out in x's dtype (rounded once) or f64 (the sum itself); ints sum to i64.
    auto run = [&](auto out_tag) {
      using Out = decltype(out_tag);
      const T* in = static_cast<const T*>(x.raw_data());
      Out* o = static_cast<Out*>(out.raw_data());
      if (seg.chunks == 1) {
        LaunchSum<T, Acc, Out>(in, seg, o, stream);
        return;
      }
      // Chunk sums in the accumulator type (8 bytes either way), then one sum per row. The
      // scratch goes back to the caching allocator at the end of this scope, which is safe: the
      // allocator hands it out again only to work ordered after these kernels on this stream.
      const RawTensor partial = RawTensor::Empty({seg.count()}, kI64, x.device());
      Acc* p = static_cast<Acc*>(partial.raw_data());
      LaunchSum<T, Acc, Acc>(in, seg, p, stream);
      const Segments second = MakeSegments(rows, seg.chunks, x.device().index);
      LaunchSum<Acc, Acc, Out>(p, second, o, stream);
    };
    if constexpr (std::is_same_v<Acc, double>) {
      if (out.dtype() == kF64) {
        run(double{});
      } else {
        run(T{});
      }
    } else {
      run(int64_t{});
    }
  });
}

void MaxRows(const RawTensor& values, const RawTensor& indices, const RawTensor& x) {
  const int64_t rows = x.size(0), n = x.size(1);
  if (rows == 0) return;
  TG_CHECK(n > 0, "max: rows of length 0 have no maximum (shape ", ShapeToString(x.shape()), ")");
  const DeviceGuard guard(x.device().index);
  const cudaStream_t stream = StreamOf(x);
  const Segments seg = MakeSegments(rows, n, x.device().index);
  VisitDevice(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(x.raw_data());
    T* vo = values.defined() ? static_cast<T*>(values.raw_data()) : nullptr;
    int64_t* io = indices.defined() ? static_cast<int64_t*>(indices.raw_data()) : nullptr;
    if (seg.chunks == 1) {
      MaxSegmentsKernel<T>
          <<<BlocksForSegments(seg), kThreads, 0, stream>>>(in, n, seg, nullptr, nullptr, vo, io);
      TG_CUDA_CHECK_LAUNCH("max");
      return;
    }
    // The best column of each chunk, then the best of those per row (same scratch rule as
    // SumRows).
    const RawTensor best = RawTensor::Empty({seg.count()}, kI64, x.device());
    int64_t* b = static_cast<int64_t*>(best.raw_data());
    MaxSegmentsKernel<T>
        <<<BlocksForSegments(seg), kThreads, 0, stream>>>(in, n, seg, nullptr, b, nullptr, nullptr);
    TG_CUDA_CHECK_LAUNCH("max");
    const Segments second = MakeSegments(rows, seg.chunks, x.device().index);
    MaxSegmentsKernel<T>
        <<<BlocksForSegments(second), kThreads, 0, stream>>>(in, n, second, b, nullptr, vo, io);
    TG_CUDA_CHECK_LAUNCH("max");
  });
}

bool AnyNonFinite(const RawTensor& t) {
  return ScaleOrCheck("non_finite_check", t, 1.0, /*write=*/false, /*check=*/true);
}

bool ScaleInPlace(const RawTensor& t, double scale, bool check_finite) {
  // Threads would race on an element that an expanded view (stride 0) addresses twice.
  for (int64_t d = 0; d < t.dim(); ++d) {
    TG_CHECK(t.strides()[d] != 0 || t.shape()[d] <= 1, "mul_scalar_: the tensor of shape ",
             ShapeToString(t.shape()),
             " is an expanded view (stride 0); writing to it is ambiguous");
  }
  return ScaleOrCheck("mul_scalar_", t, scale, /*write=*/true, check_finite);
}

}  // namespace tg::cuda
