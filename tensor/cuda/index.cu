// CUDA indexing kernels (tensor/cuda/kernels.h): gather, scatter_add, index_select, index_add
// along one dim, with the contracts of tensor/cpu/index.cc. Also the per-device index error
// record that every index-reading kernel of //tensor/cuda:nn reports into
// (tensor/cuda/index_errors.h).
//
// One thread per element of the iteration shape (index's for gather / scatter_add, out's for
// index_select, src's for index_add), grid-stride; offsets come from the sizes and element
// strides of up to kMaxIndexDims dims. gather / index_select copy element bits (one kernel per
// element size, whatever the dtype).
//
// scatter_add / index_add accumulate with atomicAdd. Floating outputs accumulate in f64, as the
// CPU does: f64 directly into the output, f32/f16/bf16 into an f64 copy of the output that is
// rounded back once at the end. So repeated indices cost one rounding per output element, and
// the order in which the atomics land only changes the f64 sum's last bits, which the final
// rounding to f32/f16/bf16 almost always hides (f64 outputs may differ in the last bit between
// runs). Integer outputs wrap like the CPU's: i32 and i64 add in place (two's complement atomics
// are order independent), u8 accumulates in a u32 copy and is narrowed modulo 256.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/index_errors.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_common.cuh"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace nn_detail {
namespace {

struct DeviceSink {
  IndexErrorRecord* host = nullptr;    // mapped pinned memory, as the host addresses it
  IndexErrorRecord* mapped = nullptr;  // the same memory as kernels address it
  int* claim = nullptr;                // device memory
};

std::mutex sinks_mu;
std::vector<DeviceSink>& Sinks() {
  static auto* sinks = new std::vector<DeviceSink>();
  return *sinks;
}

// The sink of `device` if it was ever allocated (nothing to report otherwise).
DeviceSink FindSink(int device) {
  std::lock_guard<std::mutex> lock(sinks_mu);
  std::vector<DeviceSink>& sinks = Sinks();
  return device < static_cast<int>(sinks.size()) ? sinks[device] : DeviceSink{};
}

std::string IndexErrorMessage(const IndexErrorRecord& r, int device) {
  std::string m;
  auto position = [&] {
    return r.ndim > 0 ? ShapeToString(std::vector<int64_t>(r.pos, r.pos + r.ndim))
                      : absl::StrCat(r.position);
  };
  auto dim_range = [&] {
    return absl::StrCat(" is out of range for dim ", r.dim, " of size ", r.size);
  };
  switch (static_cast<IndexOp>(r.op)) {
    case IndexOp::kEmbedding:
    case IndexOp::kEmbeddingBackward:
      m = absl::StrCat(
          r.op == static_cast<int32_t>(IndexOp::kEmbedding) ? "embedding" : "embedding_backward",
          ": index ", r.value, " at position ", r.position, " is out of range for ", r.size,
          " rows");
      break;
    case IndexOp::kCrossEntropy:
    case IndexOp::kCrossEntropyBackward:
    case IndexOp::kSoftmaxCrossEntropyFused: {
      const char* op = r.op == static_cast<int32_t>(IndexOp::kCrossEntropy) ? "cross_entropy"
                       : r.op == static_cast<int32_t>(IndexOp::kCrossEntropyBackward)
                           ? "cross_entropy_backward"
                           : "softmax_cross_entropy_fused";
      m = absl::StrCat(op, ": target ", r.value, " at position ", r.position,
                       " is out of range for ", r.size, " classes");
      break;
    }
    case IndexOp::kGather:
      m = absl::StrCat("gather: index ", r.value, " at position ", position(), dim_range());
      break;
    case IndexOp::kScatterAdd:
      m = absl::StrCat("scatter_add: index ", r.value, " at position ", position(), dim_range());
      break;
    case IndexOp::kIndexSelect:
      m = absl::StrCat("index_select: index ", r.value, " at position ", position(), dim_range());
      break;
    case IndexOp::kIndexAdd:
      m = absl::StrCat("index_add: index ", r.value, " at position ", position(), dim_range());
      break;
    case IndexOp::kMaxPool2dBackward:
      m = absl::StrCat("max_pool2d_backward: index ", r.value, " at position ", r.position,
                       " is out of range for an input plane of ", r.size, " x ", r.size2,
                       " elements");
      break;
    default:
      m = absl::StrCat("index ", r.value, " out of range (unknown op ", r.op, ")");
  }
  return absl::StrCat(m, " (on cuda:", device, ")");
}

}  // namespace

IndexErrorSink IndexErrorSinkFor(int device) {
  std::lock_guard<std::mutex> lock(sinks_mu);
  std::vector<DeviceSink>& sinks = Sinks();
  if (device >= static_cast<int>(sinks.size())) sinks.resize(device + 1);
  DeviceSink& s = sinks[device];
  if (s.host == nullptr) {
    // Allocated once per device and kept for the life of the process (a few hundred bytes).
    DeviceGuard guard(device);
    void* host = nullptr;
    TG_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexErrorRecord),
                                cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, sizeof(IndexErrorRecord));
    void* claim = nullptr;
    TG_CUDA_CHECK(cudaMalloc(&claim, sizeof(int)));
    // cudaMemset on device memory returns before it completes, on the legacy default stream,
    // which does not order work on non-blocking streams (tg::cuda::Stream): wait for it, or a
    // kernel on such a stream could claim the word first and have its claim wiped (or see
    // cudaMalloc's garbage and never record). Once per device and process.
    TG_CUDA_CHECK(cudaMemset(claim, 0, sizeof(int)));
    SynchronizeStream(nullptr);
    void* mapped = nullptr;
    TG_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, host, 0));
    s.host = static_cast<IndexErrorRecord*>(host);
    s.mapped = static_cast<IndexErrorRecord*>(mapped);
    s.claim = static_cast<int*>(claim);
  }
  return {s.claim, s.mapped};
}

void ThrowIfIndexError(int device) {
  const DeviceSink s = FindSink(device);
  if (s.host == nullptr) return;
  if (*static_cast<volatile int32_t*>(&s.host->ready) == 0) return;
  IndexErrorRecord copy;
  std::memcpy(&copy, s.host, sizeof(copy));
  // Clear for the next error: the record now, the claim word in stream order, so that kernels
  // enqueued after this point can record again.
  *static_cast<volatile int32_t*>(&s.host->ready) = 0;
  DeviceGuard guard(device);
  TG_CUDA_CHECK(cudaMemsetAsync(s.claim, 0, sizeof(int), CurrentStream(device)));
  throw Error(IndexErrorMessage(copy, device));
}

}  // namespace nn_detail

void CheckIndexErrors(int device) {
  if (device < 0) device = CurrentDevice();
  DeviceGuard guard(device);
  SynchronizeStream(CurrentStream(device));
  nn_detail::ThrowIfIndexError(device);
}

namespace {

using namespace nn_detail;  // NOLINT(build/namespaces): this target's own helpers

// Iteration shape and the element strides of the two tensors an indexing kernel addresses:
// `indexed` (whose dim `dim` is chosen by the index) and `other` (addressed at the position
// itself). Passed by value as a kernel argument.
struct Geometry {
  int32_t ndim;
  int32_t dim;
  int64_t numel;
  int64_t size;  // size of `dim` in the indexed tensor: indices must lie in [0, size)
  int64_t shape[kMaxIndexDims];
  int64_t indexed_strides[kMaxIndexDims];
  int64_t other_strides[kMaxIndexDims];
};

Geometry MakeGeometry(const char* op, const Shape& shape, const Shape& indexed_strides,
                      const Shape& other_strides, int64_t dim, int64_t size) {
  TG_CHECK(static_cast<int>(shape.size()) <= kMaxIndexDims, op, ": the CUDA kernel takes at most ",
           kMaxIndexDims, " dims, got ", shape.size());
  Geometry g{};
  g.ndim = static_cast<int32_t>(shape.size());
  g.dim = static_cast<int32_t>(dim);
  g.numel = NumElements(shape);
  g.size = size;
  for (int d = 0; d < g.ndim; ++d) {
    g.shape[d] = shape[d];
    g.indexed_strides[d] = indexed_strides[d];
    g.other_strides[d] = other_strides.empty() ? 0 : other_strides[d];
  }
  return g;
}

// Splits flat index i of the iteration shape into pos[], returning the offset in the indexed
// tensor without dim `dim` and the offset in the other tensor.
__device__ __forceinline__ void Decompose(const Geometry& g, int64_t i, int64_t* pos,
                                          int64_t* indexed_off, int64_t* other_off) {
  int64_t a = 0, b = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    int64_t p;
    i = DivMod(i, g.shape[d], &p);
    pos[d] = p;
    if (d != g.dim) a += p * g.indexed_strides[d];
    b += p * g.other_strides[d];
  }
  *indexed_off = a;
  *other_off = b;
}

// out[i] = x[position i with dim replaced by the index]; out is contiguous in the iteration
// shape. per_element: the index of element i is idx[i] (gather); else idx[pos[dim]]
// (index_select).
template <typename E>
__global__ void CopyIndexedKernel(E* out, const E* x, const int64_t* idx, Geometry g,
                                  bool per_element, IndexOp op, IndexErrorSink sink) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t pos[kMaxIndexDims];
    int64_t x_off, unused;
    Decompose(g, i, pos, &x_off, &unused);
    const int64_t k = per_element ? i : pos[g.dim];
    const int64_t j = idx[k];
    if (j < 0 || j >= g.size) {
      RecordIndexError(sink, op, j, k, g.dim, g.size, 0, per_element ? g.ndim : 0, pos);
      out[i] = E{};
      continue;
    }
    out[i] = x[x_off + j * g.indexed_strides[g.dim]];
  }
}

// Accumulator of scatter kernels for storage type S (see the file comment), and whether it
// needs a scratch copy of the output.
template <typename S>
struct Accum {
  using type = double;  // f32, f16, bf16
  static constexpr bool kScratch = true;
};
template <>
struct Accum<double> {
  using type = double;
  static constexpr bool kScratch = false;
};
template <>
struct Accum<int32_t> {
  using type = int;
  static constexpr bool kScratch = false;
};
template <>
struct Accum<int64_t> {
  using type = unsigned long long;
  static constexpr bool kScratch = false;
};
template <>
struct Accum<uint8_t> {
  using type = unsigned int;
  static constexpr bool kScratch = true;
};

// Storage value -> accumulator (u8 -> u32, i64 -> u64 two's complement, floats -> f64).
template <typename A, typename S>
__device__ __forceinline__ A Widen(S v) {
  if constexpr (std::is_floating_point_v<A>) {
    return ConvertTo<A>(v);
  } else {
    return static_cast<A>(v);
  }
}

// Accumulator -> storage: one rounding from f64 (tg::Convert), integers modulo 2^bits.
template <typename S, typename A>
__device__ __forceinline__ S Narrow(A v) {
  return ConvertTo<S>(v);
}

template <typename S, typename A>
__global__ void WidenKernel(A* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = Widen<A>(src[i]);
  }
}

template <typename S, typename A>
__global__ void NarrowKernel(S* dst, const A* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = Narrow<S>(src[i]);
  }
}

// acc[position with dim replaced by the index] += src[position]; acc is contiguous in the
// output's shape (its strides are `indexed_strides`), src strided (`other_strides`).
template <typename S, typename A>
__global__ void AddIndexedKernel(A* acc, const S* src, const int64_t* idx, Geometry g,
                                 bool per_element, IndexOp op, IndexErrorSink sink) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t pos[kMaxIndexDims];
    int64_t out_off, src_off;
    Decompose(g, i, pos, &out_off, &src_off);
    const int64_t k = per_element ? i : pos[g.dim];
    const int64_t j = idx[k];
    if (j < 0 || j >= g.size) {
      RecordIndexError(sink, op, j, k, g.dim, g.size, 0, per_element ? g.ndim : 0, pos);
      continue;
    }
    atomicAdd(acc + out_off + j * g.indexed_strides[g.dim], Widen<A>(src[src_off]));
  }
}

constexpr int kBlockThreads = 256;

void LaunchCopyIndexed(const RawTensor& out, const RawTensor& x, const RawTensor& index, const Geometry& g,
                       bool per_element, IndexOp op, int device) {
  if (g.numel == 0) return;
  const cudaStream_t stream = CurrentStream(device);
  const IndexErrorSink sink = IndexErrorSinkFor(device);
  const int blocks = BlocksFor(g.numel, kBlockThreads);
  const int64_t* idx = index.data<int64_t>();
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    CopyIndexedKernel<E><<<blocks, kBlockThreads, 0, stream>>>(static_cast<E*>(out.raw_data()),
                                                               static_cast<const E*>(x.raw_data()),
                                                               idx, g, per_element, op, sink);
  };
  switch (x.element_size()) {
    case 1:
      launch(uint8_t{});
      break;
    case 2:
      launch(uint16_t{});
      break;
    case 4:
      launch(uint32_t{});
      break;
    default:
      launch(uint64_t{});
  }
  TG_CUDA_CHECK_LAUNCH("CopyIndexedKernel");
}

void LaunchAddIndexed(const char* op_name, const RawTensor& out, const RawTensor& src,
                      const RawTensor& index, const Geometry& g, bool per_element, IndexOp op,
                      int device) {
  if (g.numel == 0) return;
  const cudaStream_t stream = CurrentStream(device);
  const IndexErrorSink sink = IndexErrorSinkFor(device);
  const int64_t* idx = index.data<int64_t>();
  VisitDevice(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    if constexpr (std::is_same_v<S, bool>) {
      throw Error(absl::StrCat(op_name, ": not defined for bool tensors; cast them first"));
    } else {
      using A = typename Accum<S>::type;
      auto* o = static_cast<S*>(out.raw_data());
      const auto* s = static_cast<const S*>(src.raw_data());
      const int64_t n = out.numel();
      RawTensor scratch;
      A* acc = reinterpret_cast<A*>(o);
      if constexpr (Accum<S>::kScratch) {
        scratch =
            RawTensor::Empty({std::max<int64_t>(n, 1)}, sizeof(A) == 8 ? kF64 : kI32, out.device());
        acc = static_cast<A*>(scratch.raw_data());
        // An empty output still runs the add kernel below: its indices are all out of range.
        if (n > 0)
          WidenKernel<S, A><<<BlocksFor(n, kBlockThreads), kBlockThreads, 0, stream>>>(acc, o, n);
        TG_CUDA_CHECK_LAUNCH("WidenKernel");
      }
      AddIndexedKernel<S, A><<<BlocksFor(g.numel, kBlockThreads), kBlockThreads, 0, stream>>>(
          acc, s, idx, g, per_element, op, sink);
      TG_CUDA_CHECK_LAUNCH("AddIndexedKernel");
      if constexpr (Accum<S>::kScratch) {
        if (n > 0)
          NarrowKernel<S, A><<<BlocksFor(n, kBlockThreads), kBlockThreads, 0, stream>>>(o, acc, n);
        TG_CUDA_CHECK_LAUNCH("NarrowKernel");
      }
    }
  });
}

}  // namespace

void Gather(const RawTensor& out, const RawTensor& x, const RawTensor& index, int64_t dim) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  const Geometry g = MakeGeometry("gather", index.shape(), x.strides(), {}, dim, x.size(dim));
  LaunchCopyIndexed(out, x, index, g, /*per_element=*/true, IndexOp::kGather, device);
}

void ScatterAdd(const RawTensor& out, const RawTensor& index, const RawTensor& src, int64_t dim) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  const Geometry g = MakeGeometry("scatter_add", index.shape(), ContiguousStrides(out.shape()),
                                  src.strides(), dim, out.size(dim));
  LaunchAddIndexed("scatter_add", out, src, index, g, /*per_element=*/true, IndexOp::kScatterAdd,
                   device);
}

void IndexSelect(const RawTensor& out, const RawTensor& x, const RawTensor& index, int64_t dim) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  const Geometry g = MakeGeometry("index_select", out.shape(), x.strides(), {}, dim, x.size(dim));
  LaunchCopyIndexed(out, x, index, g, /*per_element=*/false, IndexOp::kIndexSelect, device);
}

void IndexAdd(const RawTensor& out, const RawTensor& index, const RawTensor& src, int64_t dim) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  ThrowIfIndexError(device);
  const Geometry g = MakeGeometry("index_add", src.shape(), ContiguousStrides(out.shape()),
                                  src.strides(), dim, out.size(dim));
  LaunchAddIndexed("index_add", out, src, index, g, /*per_element=*/false, IndexOp::kIndexAdd,
                   device);
}

}  // namespace tg::cuda
