// Fp8Amax, Fp8Scale and Fp8Cast of the kernel list on CUDA, and the small kernels of Fp8Gemm
// (tensor/cuda/fp8.h). Results equal the CPU kernels bit for bit: the amax is a max (exact in any
// order), the scale rule is Fp8ScaleFromAmax itself (tensor/fp8_scale.h, compiled for the device)
// with an IEEE division for scale_inv, and the cast is one f32 multiply followed by
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...), which tensor/float8.h's kSatFinite equals.
//
// One kernel does the cast, its transpose and the tiles' amaxes (and, with no outputs but the
// amax, Fp8Amax): a block of 256 threads takes a chunk of 32 rows x 128 columns, which lies inside
// one 128-column tile group and one 128-row block, so that
//   - 1x128: each warp reduces whole rows (4 per warp) and writes each row's tile;
//   - 128x128 and per-tensor: the block reduces its chunk and combines it into the tile's amax
//     with atomicMax on the float's bits (non-negative floats order as their bits; the amax grid
//     is zeroed first on the same stream, so no host sync).
// The transposed output goes through a shared-memory tile of the chunk's FP8 bytes.
// --fmad=false (BUILD) keeps the device code free of contractions, as in :elementwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/cuda/fp8.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/tensor_args.cuh"
#include "tensor/error.h"
#include "tensor/fp8_scale.h"

namespace tg::cuda {
namespace {

constexpr int kChunkRows = 32;
constexpr int kChunkCols = 128;  // = kFp8BlockSize
constexpr int kCastThreads = 256;
constexpr int kWarps = kCastThreads / 32;
constexpr int kRowsPerWarp = kChunkRows / kWarps;
static_assert(kChunkCols == kFp8BlockSize, "a chunk spans one tile column");
static_assert(kFp8BlockSize % kChunkRows == 0, "a chunk lies inside one 128-row block");
static_assert(kChunkRows == 32, "the transpose writes one chunk row per lane");

struct CastArgs {
  int64_t rows, cols;
  int64_t grid_cols;   // columns of the scale / amax grid
  int tiling;          // Fp8Tiling
  int format;          // __nv_fp8_interpretation_t
  const float* scale;  // null: no cast (Fp8Amax)
  uint8_t* out;        // [rows, cols], or null
  uint8_t* out_t;      // [cols, rows], or null
  float* amax;         // the grid (zeroed before the launch), or null
};

// The grid cell of element (r, chunk column gc) under `tiling`.
__device__ __forceinline__ int64_t TileIndex(int tiling, int64_t r, int64_t gc, int64_t grid_cols) {
  if (tiling == static_cast<int>(Fp8Tiling::kTensor)) return 0;
  if (tiling == static_cast<int>(Fp8Tiling::k1x128)) return r * grid_cols + gc;
  return (r / kFp8BlockSize) * grid_cols + gc;
}

// Non-negative, non-NaN v: the float order is the order of the bits.
__device__ __forceinline__ void AtomicMaxNonNegative(float* p, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(p), __float_as_uint(v));
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kCastThreads) Fp8CastKernel(const T* __restrict__ x, CastArgs a) {
  __shared__ uint8_t tile[kChunkRows][kChunkCols + 4];
  __shared__ float warp_max[kWarps];
  const int64_t col_chunks = (a.cols + kChunkCols - 1) / kChunkCols;
  const int64_t chunk = blockIdx.x;
  const int64_t gc = chunk % col_chunks;
  const int64_t c0 = gc * kChunkCols;
  const int64_t r0 = (chunk / col_chunks) * kChunkRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool per_row = a.tiling == static_cast<int>(Fp8Tiling::k1x128);
  const auto format = static_cast<__nv_fp8_interpretation_t>(a.format);
  float block_max = 0.0f;
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int rl = warp * kRowsPerWarp + i;
    const int64_t r = r0 + rl;
    const bool row_in = r < a.rows;
    float row_max = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunkCols / 32; ++j) {
      const int cl = lane + 32 * j;
      const int64_t c = c0 + cl;
      uint8_t q = 0;
      if (row_in && c < a.cols) {
        const float v = ToCompute(x[r * a.cols + c]);
        row_max = fmaxf(row_max, fabsf(v));  // fmaxf skips a NaN
        if (a.scale != nullptr) {
          const float s = a.scale[TileIndex(a.tiling, r, gc, a.grid_cols)];
          q = __nv_cvt_float_to_fp8(v * s, __NV_SATFINITE, format);
          if (a.out != nullptr) a.out[r * a.cols + c] = q;
        }
      }
      if (a.out_t != nullptr) tile[rl][cl] = q;
    }
    if (a.amax != nullptr) {
      row_max = WarpMax(row_max);
      if (per_row) {
        if (lane == 0 && row_in) AtomicMaxNonNegative(&a.amax[r * a.grid_cols + gc], row_max);
      } else {
        block_max = fmaxf(block_max, row_max);
      }
    }
  }
  if (a.amax != nullptr && !per_row) {  // uniform over the block
    if (lane == 0) warp_max[warp] = block_max;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = warp_max[0];
      for (int w = 1; w < kWarps; ++w) m = fmaxf(m, warp_max[w]);
      AtomicMaxNonNegative(&a.amax[TileIndex(a.tiling, r0, gc, a.grid_cols)], m);
    }
  }
  if (a.out_t != nullptr) {  // uniform over the block
    __syncthreads();
    // Warp w writes out_t's rows c0 + w, c0 + w + 8, ...: 32 consecutive bytes each (one per
    // lane, lane = the chunk's row), read down a column of the tile (its stride of 132 bytes
    // spreads the lanes over the banks).
    const int64_t r = r0 + lane;
    for (int cl = warp; cl < kChunkCols; cl += kWarps) {
      const int64_t c = c0 + cl;
      if (c < a.cols && r < a.rows) a.out_t[c * a.rows + r] = tile[lane][cl];
    }
  }
}

__global__ void Fp8ScaleKernel(float* scale, float* scale_inv, const float* amax, int64_t n,
                               Fp8ScaleOptions options) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float s = Fp8ScaleFromAmax(amax[i], options);
    scale[i] = s;
    scale_inv[i] = __fdiv_rn(1.0f, s);  // IEEE division: inf for a zero scale
  }
}

// ---- Argument checks ---------------------------------------------------------------------------

void CheckF32Grid(const char* op, const char* what, const RawTensor& t, const Fp8Tile& grid,
                  const RawTensor& x) {
  TG_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
  TG_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().ToString(),
           " but x is on ", x.device().ToString());
  TG_CHECK(t.dtype() == kF32 && t.is_contiguous() && t.numel() == grid.rows * grid.cols, op, ": ",
           what, " must be a contiguous f32 grid of ", grid.rows, " x ", grid.cols,
           " elements, got ", DTypeName(t.dtype()), " ", ShapeToString(t.shape()));
}

struct Matrix {
  int64_t rows, cols;
};

// x is [..., cols] (the kernel list says [rows, cols]; a caller may pass its tensor unflattened):
// the matrix [product of the leading dims, cols].
Matrix CheckInput(const char* op, const RawTensor& x) {
  TG_CHECK(x.defined(), op, ": x is an undefined tensor");
  TG_CHECK(x.device().is_cuda(), op, ": x is on ", x.device().ToString(),
           ", expected a CUDA device");
  TG_CHECK(x.dtype() == kF32 || x.dtype() == kBF16 || x.dtype() == kF16, op,
           ": x must be f32, bf16 or f16, got ", DTypeName(x.dtype()));
  TG_CHECK(x.dim() >= 1 && x.is_contiguous(), op,
           ": x must be contiguous with at least one dim, got ", ShapeToString(x.shape()),
           " with strides ", ShapeToString(x.strides()));
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return {rows, x.size(-1)};
}

void LaunchCast(const char* op, const RawTensor& x, const CastArgs& args) {
  const int64_t chunks =
      ((args.rows + kChunkRows - 1) / kChunkRows) * ((args.cols + kChunkCols - 1) / kChunkCols);
  if (chunks == 0) return;
  TG_CHECK(chunks <= INT32_MAX, op, ": ", ShapeToString(x.shape()), " is too large");
  const cudaStream_t stream = StreamOf(x);
  VisitDeviceFloating(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error("unreachable");  // checked above
    } else {
      Fp8CastKernel<T><<<static_cast<unsigned>(chunks), kCastThreads, 0, stream>>>(
          static_cast<const T*>(x.raw_data()), args);
      TG_CUDA_CHECK_LAUNCH("Fp8CastKernel");
    }
  });
}

}  // namespace

void Fp8Amax(const RawTensor& amax, const RawTensor& x, Fp8Tiling tiling) {
  const char* op = "fp8_amax";
  const Matrix mx = CheckInput(op, x);
  const Fp8Tile grid = Fp8GridOf(mx.rows, mx.cols, tiling);
  CheckF32Grid(op, "amax", amax, grid, x);
  DeviceGuard guard(x.device().index);
  if (amax.numel() == 0) return;
  TG_CUDA_CHECK(cudaMemsetAsync(amax.raw_data(), 0, amax.numel() * sizeof(float), StreamOf(x)));
  CastArgs args{mx.rows,
                mx.cols,
                grid.cols,
                static_cast<int>(tiling),
                __NV_E4M3,
                nullptr,
                nullptr,
                nullptr,
                static_cast<float*>(amax.raw_data())};
  LaunchCast(op, x, args);
}

void Fp8Scale(const RawTensor& scale, const RawTensor& scale_inv, const RawTensor& amax,
              const Fp8ScaleOptions& options) {
  const char* op = "fp8_scale";
  TG_CHECK(amax.defined() && scale.defined() && scale_inv.defined(), op,
           ": scale, scale_inv and amax must be defined");
  TG_CHECK(amax.device().is_cuda(), op, ": amax is on ", amax.device().ToString(),
           ", expected a CUDA device");
  for (const RawTensor* t : {&scale, &scale_inv, &amax}) {
    TG_CHECK(t->device() == amax.device() && t->dtype() == kF32 && t->is_contiguous() &&
                 t->shape() == amax.shape(),
             op,
             ": scale, scale_inv and amax must be contiguous f32 tensors of one shape on one "
             "device, got ",
             DTypeName(t->dtype()), " ", ShapeToString(t->shape()), " on ", t->device().ToString(),
             " for amax ", ShapeToString(amax.shape()));
  }
  const int64_t n = amax.numel();
  if (n == 0) return;
  DeviceGuard guard(amax.device().index);
  Fp8ScaleKernel<<<BlocksFor(n), 256, 0, StreamOf(amax)>>>(
      static_cast<float*>(scale.raw_data()), static_cast<float*>(scale_inv.raw_data()),
      static_cast<const float*>(amax.raw_data()), n, options);
  TG_CUDA_CHECK_LAUNCH("Fp8ScaleKernel");
}

void Fp8Cast(const RawTensor& out, const RawTensor& out_t, const RawTensor& amax, const RawTensor& x,
             const RawTensor& scale, Fp8Tiling tiling) {
  const char* op = "fp8_cast";
  const Matrix mx = CheckInput(op, x);
  const Fp8Tile grid = Fp8GridOf(mx.rows, mx.cols, tiling);
  CheckF32Grid(op, "scale", scale, grid, x);
  TG_CHECK(out.defined(), op, ": out is an undefined tensor");
  TG_CHECK(out.dtype() == kF8E4M3 || out.dtype() == kF8E5M2, op,
           ": out must be f8e4m3 or f8e5m2, got ", DTypeName(out.dtype()));
  TG_CHECK(out.device() == x.device() && out.is_contiguous() && out.numel() == mx.rows * mx.cols,
           op, ": out must be a contiguous [", mx.rows, ", ", mx.cols, "] on ",
           x.device().ToString(), ", got ", ShapeToString(out.shape()), " on ",
           out.device().ToString());
  if (out_t.defined()) {
    TG_CHECK(out_t.dtype() == out.dtype() && out_t.device() == x.device() &&
                 out_t.is_contiguous() && out_t.dim() == 2 && out_t.size(0) == mx.cols &&
                 out_t.size(1) == mx.rows,
             op, ": out_t must be a contiguous ", DTypeName(out.dtype()), " [", mx.cols, ", ",
             mx.rows, "] on ", x.device().ToString(), ", got ", DTypeName(out_t.dtype()), " ",
             ShapeToString(out_t.shape()), " on ", out_t.device().ToString());
  }
  if (amax.defined()) CheckF32Grid(op, "amax", amax, grid, x);
  DeviceGuard guard(x.device().index);
  if (amax.defined() && amax.numel() > 0) {
    TG_CUDA_CHECK(cudaMemsetAsync(amax.raw_data(), 0, amax.numel() * sizeof(float), StreamOf(x)));
  }
  CastArgs args{mx.rows,
                mx.cols,
                grid.cols,
                static_cast<int>(tiling),
                out.dtype() == kF8E4M3 ? __NV_E4M3 : __NV_E5M2,
                static_cast<const float*>(scale.raw_data()),
                static_cast<uint8_t*>(out.raw_data()),
                out_t.defined() ? static_cast<uint8_t*>(out_t.raw_data()) : nullptr,
                amax.defined() ? static_cast<float*>(amax.raw_data()) : nullptr};
  LaunchCast(op, x, args);
}

// ---- Fp8Gemm's helpers -------------------------------------------------------------------------

namespace {

__global__ void ScalesForCublasLtKernel(float* dst, const float* src, int64_t rows, int64_t slices,
                                        int64_t dst_ld, bool transpose) {
  const int64_t n = rows * slices;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t r = i / slices, s = i % slices;
    dst[transpose ? s * rows + r : r * dst_ld + s] = src[i];
  }
}

struct ScaleGrid {
  const float* p;
  int tiling;
  int64_t cols;  // slices of k (the grid's columns)
};

__device__ __forceinline__ float ScaleAt(const ScaleGrid& g, int64_t row, int64_t slice) {
  if (g.tiling == static_cast<int>(Fp8Tiling::kTensor)) return g.p[0];
  if (g.tiling == static_cast<int>(Fp8Tiling::k1x128)) return g.p[row * g.cols + slice];
  return g.p[(row / kFp8BlockSize) * g.cols + slice];
}

__global__ void AccumulateSliceKernel(float* acc, const float* partial, int64_t m, int64_t n,
                                      ScaleGrid a, ScaleGrid b, int64_t slice, bool first) {
  const int64_t total = m * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    const int64_t row = i / n, col = i % n;
    const float s = __fmul_rn(ScaleAt(a, row, slice), ScaleAt(b, col, slice));
    const float v = __fmul_rn(partial[i], s);
    acc[i] = first ? v : __fadd_rn(acc[i], v);
  }
}

template <typename Out>
__global__ void FinishKernel(Out* out, const float* acc, const Out* bias, int64_t m, int64_t n) {
  const int64_t total = m * n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    float v = acc[i];
    if (bias != nullptr) v = __fadd_rn(v, ToCompute(bias[i % n]));
    out[i] = ConvertTo<Out>(v);
  }
}

ScaleGrid GridOf(const RawTensor& t, Fp8Tiling tiling) {
  return {static_cast<const float*>(t.raw_data()), static_cast<int>(tiling),
          tiling == Fp8Tiling::kTensor ? 1 : t.size(-1)};
}

}  // namespace

RawTensor Fp8ScalesForCublasLt(const RawTensor& src, Fp8Tiling tiling) {
  TG_CHECK(
      tiling != Fp8Tiling::kTensor && src.dim() == 2 && src.dtype() == kF32 && src.is_contiguous(),
      "fp8_gemm: block scales must be a contiguous f32 grid, got ", DTypeName(src.dtype()), " ",
      ShapeToString(src.shape()));
  const int64_t rows = src.size(0), slices = src.size(1);
  const bool transpose = tiling == Fp8Tiling::k1x128;
  const int64_t ld = transpose ? rows : (slices + 3) / 4 * 4;
  DeviceGuard guard(src.device().index);
  RawTensor dst = transpose ? RawTensor::Empty({slices, rows}, kF32, src.device())
                         : RawTensor::Zeros({rows, ld}, kF32, src.device());
  if (rows * slices == 0) return dst;
  ScalesForCublasLtKernel<<<BlocksFor(rows * slices), 256, 0, StreamOf(src)>>>(
      static_cast<float*>(dst.raw_data()), static_cast<const float*>(src.raw_data()), rows, slices,
      ld, transpose);
  TG_CUDA_CHECK_LAUNCH("ScalesForCublasLtKernel");
  return dst;
}

void Fp8AccumulateSlice(const RawTensor& acc, const RawTensor& partial, const RawTensor& a_scale_inv,
                        Fp8Tiling a_tiling, const RawTensor& b_scale_inv, Fp8Tiling b_tiling,
                        int64_t slice, bool first) {
  const int64_t m = acc.size(0), n = acc.size(1);
  if (m * n == 0) return;
  DeviceGuard guard(acc.device().index);
  AccumulateSliceKernel<<<BlocksFor(m * n), 256, 0, StreamOf(acc)>>>(
      static_cast<float*>(acc.raw_data()), static_cast<const float*>(partial.raw_data()), m, n,
      GridOf(a_scale_inv, a_tiling), GridOf(b_scale_inv, b_tiling), slice, first);
  TG_CUDA_CHECK_LAUNCH("AccumulateSliceKernel");
}

void FinishFp8Gemm(const RawTensor& out, const RawTensor& acc, const RawTensor& bias) {
  const int64_t m = out.size(0), n = out.size(1);
  if (m * n == 0) return;
  DeviceGuard guard(out.device().index);
  const cudaStream_t stream = StreamOf(out);
  VisitDeviceFloating("fp8_gemm", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, double>) {
      throw Error("fp8_gemm: out must be f32, bf16 or f16, got f64");
    } else {
      FinishKernel<T><<<BlocksFor(m * n), 256, 0, stream>>>(
          static_cast<T*>(out.raw_data()), static_cast<const float*>(acc.raw_data()),
          bias.defined() ? static_cast<const T*>(bias.raw_data()) : nullptr, m, n);
      TG_CUDA_CHECK_LAUNCH("FinishKernel");
    }
  });
}

}  // namespace tg::cuda
