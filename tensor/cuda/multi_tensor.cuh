// Multi-tensor apply, shared by the list kernels of tensor/cuda (amp_kernels.cu: non-finite
// check and unscale; optimizer_kernels.cu: Adam, the global norm and clipping). Included by .cu
// files only.
//
// A list of tensors is cut into chunks of kChunkSize elements and one thread block works on one
// chunk. A launch carries a ChunkTable in its kernel arguments (pointers, sizes and the first
// block of each tensor; no device buffer, so no host-to-device copy before the launch); a block
// finds its tensor by binary search over the first-block column. A list longer than one table
// holds is split over several launches. Kernel arguments are limited to 4 KB, so the table size
// depends on how many pointers each tensor needs (its depth).
#ifndef TAPEGRAD_TENSOR_CUDA_MULTI_TENSOR_CUH_
#define TAPEGRAD_TENSOR_CUDA_MULTI_TENSOR_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensor/error.h"
#include "tensor/tensor.h"

namespace tg::cuda {

constexpr int64_t kChunkSize = 65536;
constexpr int kThreads = 512;
// Bytes of a launch's ChunkTable: the rest of the 4 KB of kernel arguments is left for scalars.
constexpr int kTableBytes = 3072;

template <int kDepth>
struct ChunkTable {
  static constexpr int kMaxTensors =
      kTableBytes / static_cast<int>(kDepth * sizeof(void*) + sizeof(int64_t) + sizeof(int32_t));
  void* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t first_block[kMaxTensors];  // blocks first_block[t] .. first_block[t+1]-1 are tensor t's
  int32_t count;
};
static_assert(sizeof(ChunkTable<6>) <= kTableBytes + 8);

// The chunk that block blockIdx.x works on.
struct ChunkRef {
  int tensor;
  int64_t begin;  // first element of the chunk
  int n;          // elements in the chunk
};

template <int kDepth>
__device__ __forceinline__ ChunkRef Locate(const ChunkTable<kDepth>& table) {
  const int block = static_cast<int>(blockIdx.x);
  int lo = 0;
  int hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  ChunkRef c;
  c.tensor = lo;
  c.begin = static_cast<int64_t>(block - table.first_block[lo]) * kChunkSize;
  c.n = static_cast<int>(min(kChunkSize, table.numel[lo] - c.begin));
  return c;
}

// Fills ChunkTables from `ptrs` (one row of kDepth pointers per tensor) and calls
// launch(table, blocks, first_block) for each full table and the last one; first_block counts
// the blocks of the earlier launches (the norm's partials are indexed by it). Empty tensors
// take no block.
template <int kDepth, typename Launch>
void ForEachChunkTable(const char* op, const std::vector<std::array<void*, kDepth>>& ptrs,
                       const std::vector<int64_t>& numel, Launch&& launch) {
  ChunkTable<kDepth> table;
  table.count = 0;
  int64_t blocks = 0;  // in the table being filled
  int64_t launched = 0;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (numel[i] == 0) continue;
    const int64_t chunks = (numel[i] + kChunkSize - 1) / kChunkSize;
    TG_CHECK(launched + blocks + chunks < INT_MAX, op, ": ", numel[i],
             " elements is more than one call handles");
    if (table.count == ChunkTable<kDepth>::kMaxTensors) {
      launch(table, static_cast<int>(blocks), static_cast<int>(launched));
      launched += blocks;
      blocks = 0;
      table.count = 0;
    }
    for (int d = 0; d < kDepth; ++d) table.ptr[d][table.count] = ptrs[i][d];
    table.numel[table.count] = numel[i];
    table.first_block[table.count] = static_cast<int32_t>(blocks);
    ++table.count;
    blocks += chunks;
  }
  if (table.count > 0) launch(table, static_cast<int>(blocks), static_cast<int>(launched));
}

// ---- Element access: storage type T, computed in Compute<T> (f32, or f64 for f64) ------------

template <typename T>
using Compute = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ double Load(const double* p) { return *p; }
__device__ __forceinline__ float Load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(double* p, double v) { *p = v; }
__device__ __forceinline__ void Store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
// One correctly rounded product, never fused with a neighbouring add.
__device__ __forceinline__ float Mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double Mul(double a, double b) { return __dmul_rn(a, b); }

// Calls fn(T{}) with the device storage type of a floating dtype (the one dtype switch,
// tg::VisitDTypeAs); others throw "multi-tensor kernels: expected a floating dtype ...".
struct MultiTensorStorageTypes {
  using F16 = __half;
  using BF16 = __nv_bfloat16;
};
template <typename Fn>
void VisitDeviceType(DType dtype, Fn&& fn) {
  VisitDTypeAs<MultiTensorStorageTypes, DTypeSet::kFloating>("multi-tensor kernels", dtype,
                                                             std::forward<Fn>(fn));
}

constexpr DType kFloatingTypes[] = {kF32, kF64, kF16, kBF16};

// ---- Validation ------------------------------------------------------------------------------

// Checks that every tensor is defined, contiguous, floating and on one CUDA device (and, for an
// in-place op, listed once); returns that device. `what` names the list in messages.
inline Device CheckList(const char* op, const char* what, const std::vector<RawTensor>& tensors,
                        bool in_place) {
  TG_CHECK(!tensors.empty(), op, ": ", what, " is empty");
  std::unordered_set<const void*> seen;
  Device device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RawTensor& t = tensors[i];
    TG_CHECK(t.defined(), op, ": ", what, "[", i, "] is an undefined tensor");
    if (i == 0) device = t.device();
    TG_CHECK(t.device().is_cuda(), op, ": ", what, "[", i, "] is on ", t.device().ToString(),
             "; expected a CUDA tensor");
    TG_CHECK(t.device() == device, op, ": expected all tensors on one device, got ",
             device.ToString(), " and ", t.device().ToString(), " (", what, "[", i, "])");
    TG_CHECK(IsFloating(t.dtype()), op, ": ", what, "[", i, "] has dtype ", DTypeName(t.dtype()),
             "; expected f32, f64, f16 or bf16");
    TG_CHECK(t.is_contiguous(), op, ": ", what, "[", i, "] of shape ", ShapeToString(t.shape()),
             " is not contiguous");
    if (in_place && t.numel() > 0) {
      TG_CHECK(seen.insert(t.raw_data()).second, op, ": ", what, "[", i,
               "] is listed twice; an in-place op would update it twice");
    }
  }
  return device;
}

// A one-element tensor of `dtype` on `device` (`what` names it in messages).
inline void CheckScalar(const char* op, const char* what, const RawTensor& t, Device device,
                        DType dtype = kF32) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
  TG_CHECK(t.numel() == 1 && t.dtype() == dtype, op, ": ", what, " must be a one-element ",
           DTypeName(dtype), " tensor, got ", DTypeName(t.dtype()), " ", ShapeToString(t.shape()));
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(), "; expected ",
           device.ToString());
}

// Calls fn(T{}, ptrs, numel) once per floating dtype present in `tensors`, with the tensors of
// that dtype as depth-1 rows.
template <typename Fn>
void ForEachDTypeGroup(const std::vector<RawTensor>& tensors, Fn&& fn) {
  for (DType dtype : kFloatingTypes) {
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> numel;
    for (const RawTensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      ptrs.push_back({t.raw_data()});
      numel.push_back(t.numel());
    }
    if (ptrs.empty()) continue;
    VisitDeviceType(dtype, [&](auto tag) { fn(tag, ptrs, numel); });
  }
}

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_MULTI_TENSOR_CUH_
