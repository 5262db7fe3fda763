// The multi-tensor kernels of tensor/cuda/amp_kernels.h.
//
// Multi-tensor apply: a list of tensors is cut into chunks of kChunkSize elements and one thread
// block works on one chunk. A launch carries a ChunkTable in its kernel arguments (pointers,
// sizes and the first block of each tensor; no device buffer, so no host-to-device copy before
// the launch); a block finds its tensor by binary search over the first-block column. A list
// longer than one table holds is split over several launches. Kernel arguments are limited to
// 4 KB, so the table size depends on how many pointers each tensor needs (its depth).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "tensor/cuda/amp_kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace tg::cuda {
namespace {

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
__device__ ChunkRef Locate(const ChunkTable<kDepth>& table) {
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

// Calls fn(T{}) with the device storage type of a floating dtype.
template <typename Fn>
void VisitDeviceType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(float{});
    case DType::kF64:
      return fn(double{});
    case DType::kF16:
      return fn(__half{});
    case DType::kBF16:
      return fn(__nv_bfloat16{});
    default:
      throw Error(absl::StrCat("amp kernels: unsupported dtype ", DTypeName(dtype)));
  }
}

constexpr DType kFloatingTypes[] = {kF32, kF64, kF16, kBF16};

// ---- Validation ------------------------------------------------------------------------------

// Checks that every tensor is defined, contiguous, floating and on one CUDA device (and, for an
// in-place op, listed once); returns that device. `what` names the list in messages.
Device CheckList(const char* op, const char* what, const std::vector<Tensor>& tensors,
                 bool in_place) {
  TG_CHECK(!tensors.empty(), op, ": ", what, " is empty");
  std::unordered_set<const void*> seen;
  Device device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
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
void CheckScalar(const char* op, const char* what, const Tensor& t, Device device,
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
void ForEachDTypeGroup(const std::vector<Tensor>& tensors, Fn&& fn) {
  for (DType dtype : kFloatingTypes) {
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> numel;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      ptrs.push_back({t.raw_data()});
      numel.push_back(t.numel());
    }
    if (ptrs.empty()) continue;
    VisitDeviceType(dtype, [&](auto tag) { fn(tag, ptrs, numel); });
  }
}

// ---- Non-finite check and unscale ------------------------------------------------------------

template <typename T, bool kScale>
__global__ void __launch_bounds__(kThreads)
    NonFiniteCheckKernel(const __grid_constant__ ChunkTable<1> table, float* found_inf,
                         const float* inv_scale) {
  using C = Compute<T>;
  const ChunkRef c = Locate(table);
  T* p = static_cast<T*>(table.ptr[0][c.tensor]) + c.begin;
  const C s = kScale ? static_cast<C>(*inv_scale) : C(1);
  bool bad = false;
#pragma unroll 4
  for (int i = threadIdx.x; i < c.n; i += kThreads) {
    const C v = Load(p + i);
    bad |= !isfinite(v);  // checked before scaling: v * inv_scale may overflow or flush
    if constexpr (kScale) Store(p + i, Mul(v, s));
  }
  // One write per block; several blocks writing the same 1 is a benign race (as in PyTorch).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

void RunNonFiniteCheck(const char* op, const std::vector<Tensor>& tensors, const Tensor& found_inf,
                       const Tensor* inv_scale) {
  if (tensors.empty()) return;
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/inv_scale != nullptr);
  CheckScalar(op, "found_inf", found_inf, device);
  if (inv_scale != nullptr) CheckScalar(op, "inv_scale", *inv_scale, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  float* found = static_cast<float*>(found_inf.raw_data());
  const float* inv =
      inv_scale != nullptr ? static_cast<const float*>(inv_scale->raw_data()) : nullptr;
  ForEachDTypeGroup(tensors, [&](auto tag, const auto& ptrs, const auto& numel) {
    using T = decltype(tag);
    ForEachChunkTable<1>(op, ptrs, numel, [&](const ChunkTable<1>& table, int blocks, int) {
      if (inv != nullptr) {
        NonFiniteCheckKernel<T, true><<<blocks, kThreads, 0, stream>>>(table, found, inv);
      } else {
        NonFiniteCheckKernel<T, false><<<blocks, kThreads, 0, stream>>>(table, found, inv);
      }
      TG_CUDA_CHECK_LAUNCH("NonFiniteCheckKernel");
    });
  });
}

// ---- Loss scale ------------------------------------------------------------------------------

// The update itself is UpdateLossScale (tensor/loss_scale_update.h), the host's own function.

// What the host facade derives from the scale: the f32 loss multiplier and the f32 of 1 / scale
// computed in double (MixedPrecisionOptimizer: Tensor::Scalar(1.0 / scale, kF32)).
__device__ void WriteScales(const LossScaleState& s, float* scale_out, float* inv_scale_out) {
  if (scale_out != nullptr) *scale_out = __double2float_rn(s.scale);
  if (inv_scale_out != nullptr) *inv_scale_out = __double2float_rn(__ddiv_rn(1.0, s.scale));
}

// One thread: the update is a handful of scalar operations; the point is that it needs no host.
__global__ void UpdateScaleKernel(LossScaleState* state, const float* found_inf, float* scale_out,
                                  float* inv_scale_out) {
  LossScaleState s = *state;
  UpdateLossScale(&s, found_inf != nullptr && *found_inf != 0.0f);
  *state = s;
  WriteScales(s, scale_out, inv_scale_out);
}

__global__ void WriteScaleKernel(const LossScaleState* state, float* scale_out,
                                 float* inv_scale_out) {
  WriteScales(*state, scale_out, inv_scale_out);
}

void CheckState(const char* op, const Tensor& state) {
  TG_CHECK(state.defined(), op, ": the scaler state is an undefined tensor");
  TG_CHECK(state.device().is_cuda() && state.dtype() == kU8 && state.is_contiguous() &&
               state.numel() == static_cast<int64_t>(sizeof(LossScaleState)),
           op, ": expected the scaler state of UploadScalerState (contiguous u8 [",
           sizeof(LossScaleState), "] on a CUDA device), got ", DTypeName(state.dtype()), " ",
           ShapeToString(state.shape()), " on ", state.device().ToString());
}

// A one-element f32 output on the state's device, or null when undefined.
float* OptionalScalarOut(const char* op, const char* what, const Tensor& t, Device device) {
  if (!t.defined()) return nullptr;
  CheckScalar(op, what, t, device);
  return static_cast<float*>(t.raw_data());
}

// ---- AdamW -----------------------------------------------------------------------------------

// Per-launch arguments. The f32 scalars are the CPU loop's LoopScalars, rounded on the host from
// the same doubles; with device_step, step_size and bias_correction2_sqrt are recomputed per
// block from lr, beta1, beta2 and *step.
struct AdamWArgs {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size,
      bias_correction2_sqrt;
  bool apply_decay;
  double lr, beta1_d, beta2_d;
  const double* step;  // device step count (updates done so far), or null
  const float* inv_scale;
  const float* found_inf;
};

// The pointer rows of AdamW's table.
enum AdamWRow { kGrad, kMaster, kExpAvg, kExpAvgSq, kMaxExpAvgSq, kModel, kAdamWDepth };

template <typename G, typename M, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    AdamWKernel(const __grid_constant__ ChunkTable<kAdamWDepth> table, const AdamWArgs a) {
  if (a.found_inf != nullptr && *a.found_inf != 0.0f) return;  // the skipped step
  float step_size = a.step_size;
  float bias_correction2_sqrt = a.bias_correction2_sqrt;
  if (a.step != nullptr) {
    // HostScalars (optim/adam.cc) in double, once per block, rounded once to f32.
    __shared__ float shared[2];
    if (threadIdx.x == 0) {
      const double t = *a.step + 1;
      const double bias_correction1 = 1 - pow(a.beta1_d, t);
      const double bias_correction2 = 1 - pow(a.beta2_d, t);
      shared[0] = __double2float_rn(__ddiv_rn(a.lr, bias_correction1));
      shared[1] = __double2float_rn(__dsqrt_rn(bias_correction2));
    }
    __syncthreads();
    step_size = shared[0];
    bias_correction2_sqrt = shared[1];
  }
  const ChunkRef c = Locate(table);
  const G* g = static_cast<const G*>(table.ptr[kGrad][c.tensor]) + c.begin;
  float* p = static_cast<float*>(table.ptr[kMaster][c.tensor]) + c.begin;
  float* m = static_cast<float*>(table.ptr[kExpAvg][c.tensor]) + c.begin;
  float* v = static_cast<float*>(table.ptr[kExpAvgSq][c.tensor]) + c.begin;
  float* vmax =
      kAmsgrad ? static_cast<float*>(table.ptr[kMaxExpAvgSq][c.tensor]) + c.begin : nullptr;
  M* model = static_cast<M*>(table.ptr[kModel][c.tensor]);
  if (model != nullptr) model += c.begin;
  const float inv_scale = a.inv_scale != nullptr ? *a.inv_scale : 1.0f;
#pragma unroll 2
  for (int i = threadIdx.x; i < c.n; i += kThreads) {
    float gv = Load(g + i);
    if (a.inv_scale != nullptr) gv = __fmul_rn(gv, inv_scale);  // the master grad's unscale
    float pv = p[i];
    if (a.apply_decay) pv = __fmul_rn(pv, a.decay);
    const float mv = __fadd_rn(__fmul_rn(m[i], a.beta1), __fmul_rn(gv, a.one_minus_beta1));
    m[i] = mv;
    float vv = __fadd_rn(__fmul_rn(v[i], a.beta2), __fmul_rn(__fmul_rn(gv, a.one_minus_beta2), gv));
    v[i] = vv;
    if constexpr (kAmsgrad) {
      const float x = vmax[i];  // maximum(vmax, v) as the CPU's Maximum kernel: NaN wins
      vv = isnan(x) ? x : isnan(vv) ? vv : (x > vv ? x : vv);
      vmax[i] = vv;
    }
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), bias_correction2_sqrt), a.eps);
    const float updated = __fsub_rn(pv, __fdiv_rn(__fmul_rn(mv, step_size), denom));
    p[i] = updated;
    if (model != nullptr) Store(model + i, updated);
  }
}

__global__ void AdvanceStepKernel(double* step, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.0f) *step += 1;
}

// Calls fn(G{}, M{}) for the device types of a gradient dtype (f32, f16, bf16) and a model
// dtype (f32, f16, bf16).
template <typename Fn>
void VisitAdamWTypes(DType grad, DType model, Fn&& fn) {
  VisitDeviceType(grad, [&](auto g) {
    VisitDeviceType(model, [&](auto m) {
      using G = decltype(g);
      using M = decltype(m);
      if constexpr (std::is_same_v<G, double> || std::is_same_v<M, double>) {
        throw Error("FusedAdamW: f64 gradients and parameters are not supported");
      } else {
        fn(g, m);
      }
    });
  });
}

// ---- Gradient norm ---------------------------------------------------------------------------

__device__ __forceinline__ double Combine(double acc, double x, bool inf_norm) {
  if (!inf_norm) return acc + x;
  return (x > acc || x != x) ? x : acc;  // max that keeps a NaN once it appears
}

// The combined value of every thread's `x`, valid in thread 0 (blockDim.x a multiple of 32).
__device__ double BlockReduce(double x, bool inf_norm) {
  __shared__ double warp_results[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    x = Combine(x, __shfl_down_sync(0xffffffffu, x, offset), inf_norm);
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < static_cast<int>(blockDim.x / 32) ? warp_results[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2) {
      x = Combine(x, __shfl_down_sync(0xffffffffu, x, offset), inf_norm);
    }
  }
  return x;
}

template <typename T, bool kInfNorm>
__global__ void __launch_bounds__(kThreads)
    NormPartialKernel(const __grid_constant__ ChunkTable<1> table, double* partials,
                      int first_block) {
  const ChunkRef c = Locate(table);
  const T* x = static_cast<const T*>(table.ptr[0][c.tensor]) + c.begin;
  // Max |x| (NaN once one is seen; exact in the element's own compute type), or the sum of
  // squares in double as clip_grad_norm sums them: an f32 square overflows from |x| ~ 1.8e19 on,
  // where the CPU's double sum (and so its decision to clip) stays finite. The kernel is bound
  // by memory bandwidth, so the f64 FMAs cost nothing measurable on sm_90.
  using C = std::conditional_t<kInfNorm, Compute<T>, double>;
  C acc = 0;
#pragma unroll 4
  for (int i = threadIdx.x; i < c.n; i += kThreads) {
    const C v = Load(x + i);
    if constexpr (kInfNorm) {
      const C a = fabs(v);
      acc = (a > acc || a != a) ? a : acc;
    } else {
      acc = fma(v, v, acc);
    }
  }
  const double block = BlockReduce(static_cast<double>(acc), kInfNorm);
  if (threadIdx.x == 0) partials[first_block + blockIdx.x] = block;
}

constexpr int kFinalThreads = 1024;

__global__ void __launch_bounds__(kFinalThreads)
    NormFinalKernel(const double* partials, int n, bool inf_norm, float* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += kFinalThreads) acc = Combine(acc, partials[i], inf_norm);
  acc = BlockReduce(acc, inf_norm);
  if (threadIdx.x == 0) *out = __double2float_rn(inf_norm ? acc : sqrt(acc));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    ClipKernel(const __grid_constant__ ChunkTable<1> table, const float* norm, double max_norm) {
  using C = Compute<T>;
  const double total = *norm;
  if (!isfinite(total)) return;  // clip_grad_norm leaves the grads alone
  const double clip_coef = __ddiv_rn(max_norm, __dadd_rn(total, 1e-6));
  if (!(clip_coef < 1)) return;
  const C coef = static_cast<C>(clip_coef);
  const ChunkRef c = Locate(table);
  T* p = static_cast<T*>(table.ptr[0][c.tensor]) + c.begin;
#pragma unroll 4
  for (int i = threadIdx.x; i < c.n; i += kThreads) Store(p + i, Mul(Load(p + i), coef));
}

}  // namespace

KernelStatus NonFiniteCheckAndUnscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                                      const Tensor& inv_scale) {
  RunNonFiniteCheck("non_finite_check_and_unscale", tensors, found_inf, &inv_scale);
  return KernelStatus::kDone;
}

void NonFiniteCheck(const std::vector<Tensor>& tensors, const Tensor& found_inf) {
  RunNonFiniteCheck("non_finite_check", tensors, found_inf, nullptr);
}

Tensor UploadScalerState(const LossScaleState& state, Device device) {
  TG_CHECK(device.is_cuda(), "UploadScalerState: expected a CUDA device, got ", device.ToString());
  DeviceGuard guard(device.index);
  Tensor t = Tensor::Empty({static_cast<int64_t>(sizeof(LossScaleState))}, kU8, device);
  // From pageable memory the call returns once `state` has been staged, so it may go away.
  TG_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), &state, sizeof(state), cudaMemcpyHostToDevice,
                                CurrentStream(device.index)));
  return t;
}

LossScaleState DownloadScalerState(const Tensor& state) {
  CheckState("DownloadScalerState", state);
  DeviceGuard guard(state.device().index);
  cudaStream_t stream = CurrentStream(state.device().index);
  LossScaleState s;
  TG_CUDA_CHECK(cudaMemcpyAsync(&s, state.raw_data(), sizeof(s), cudaMemcpyDeviceToHost, stream));
  TG_CUDA_CHECK(cudaStreamSynchronize(stream));
  return s;
}

void UpdateScaleOnDevice(const Tensor& state, const Tensor& found_inf, const Tensor& scale_out,
                         const Tensor& inv_scale_out) {
  const char* op = "UpdateScaleOnDevice";
  CheckState(op, state);
  const Device device = state.device();
  const float* found = nullptr;
  if (found_inf.defined()) {
    CheckScalar(op, "found_inf", found_inf, device);
    found = static_cast<const float*>(found_inf.raw_data());
  }
  float* scale = OptionalScalarOut(op, "scale_out", scale_out, device);
  float* inv = OptionalScalarOut(op, "inv_scale_out", inv_scale_out, device);
  DeviceGuard guard(device.index);
  UpdateScaleKernel<<<1, 1, 0, CurrentStream(device.index)>>>(
      static_cast<LossScaleState*>(state.raw_data()), found, scale, inv);
  TG_CUDA_CHECK_LAUNCH("UpdateScaleKernel");
}

void WriteScaleOnDevice(const Tensor& state, const Tensor& scale_out, const Tensor& inv_scale_out) {
  const char* op = "WriteScaleOnDevice";
  CheckState(op, state);
  const Device device = state.device();
  float* scale = OptionalScalarOut(op, "scale_out", scale_out, device);
  float* inv = OptionalScalarOut(op, "inv_scale_out", inv_scale_out, device);
  DeviceGuard guard(device.index);
  WriteScaleKernel<<<1, 1, 0, CurrentStream(device.index)>>>(
      static_cast<const LossScaleState*>(state.raw_data()), scale, inv);
  TG_CUDA_CHECK_LAUNCH("WriteScaleKernel");
}

void FusedAdamW(const AdamWTensorLists& lists, const FusedAdamWOptions& o) {
  const char* op = "FusedAdamW";
  const size_t n = lists.masters.size();
  if (n == 0) return;
  auto check_length = [&](const std::vector<Tensor>& list, const char* what) {
    TG_CHECK(list.size() == n, op, ": ", what, " has ", list.size(), " tensors, masters has ", n);
  };
  check_length(lists.grads, "grads");
  check_length(lists.exp_avgs, "exp_avgs");
  check_length(lists.exp_avg_sqs, "exp_avg_sqs");
  if (o.amsgrad) check_length(lists.max_exp_avg_sqs, "max_exp_avg_sqs (amsgrad)");
  if (!lists.model_params.empty()) check_length(lists.model_params, "model_params");
  TG_CHECK(o.lr >= 0 && o.eps >= 0 && o.weight_decay >= 0 && o.beta1 >= 0 && o.beta1 < 1 &&
               o.beta2 >= 0 && o.beta2 < 1,
           op, ": invalid options lr ", o.lr, ", betas (", o.beta1, ", ", o.beta2, "), eps ", o.eps,
           ", weight_decay ", o.weight_decay);

  const Device device = CheckList(op, "masters", lists.masters, /*in_place=*/true);
  CheckList(op, "grads", lists.grads, /*in_place=*/false);
  CheckList(op, "exp_avgs", lists.exp_avgs, /*in_place=*/true);
  CheckList(op, "exp_avg_sqs", lists.exp_avg_sqs, /*in_place=*/true);
  if (o.amsgrad) CheckList(op, "max_exp_avg_sqs", lists.max_exp_avg_sqs, /*in_place=*/true);
  std::vector<Tensor> models;
  for (const Tensor& t : lists.model_params) {
    if (t.defined()) models.push_back(t);
  }
  if (!models.empty()) CheckList(op, "model_params", models, /*in_place=*/true);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& master = lists.masters[i];
    auto same = [&](const Tensor& t, const char* what, bool f32) {
      TG_CHECK(t.device() == device, op, ": ", what, "[", i, "] is on ", t.device().ToString(),
               ", masters on ", device.ToString());
      TG_CHECK(t.shape() == master.shape(), op, ": ", what, "[", i, "] has shape ",
               ShapeToString(t.shape()), ", its master ", ShapeToString(master.shape()));
      TG_CHECK(!f32 || t.dtype() == kF32, op, ": ", what, "[", i, "] is ", DTypeName(t.dtype()),
               "; expected f32");
      TG_CHECK(f32 || t.dtype() != kF64, op, ": ", what, "[", i,
               "] is f64; expected f32, f16 or bf16");
    };
    same(master, "masters", true);
    same(lists.grads[i], "grads", false);
    same(lists.exp_avgs[i], "exp_avgs", true);
    same(lists.exp_avg_sqs[i], "exp_avg_sqs", true);
    if (o.amsgrad) same(lists.max_exp_avg_sqs[i], "max_exp_avg_sqs", true);
    if (!lists.model_params.empty() && lists.model_params[i].defined()) {
      same(lists.model_params[i], "model_params", false);
    }
  }

  AdamWArgs a{};
  // optim/adam.cc's HostScalars and LoopScalars: doubles, each rounded once to f32.
  a.decay = static_cast<float>(1 - o.lr * o.weight_decay);
  a.apply_decay = o.weight_decay != 0;
  a.beta1 = static_cast<float>(o.beta1);
  a.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  a.beta2 = static_cast<float>(o.beta2);
  a.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  a.eps = static_cast<float>(o.eps);
  a.lr = o.lr;
  a.beta1_d = o.beta1;
  a.beta2_d = o.beta2;
  if (o.device_step.defined()) {
    CheckScalar(op, "device_step", o.device_step, device, kF64);
    a.step = static_cast<const double*>(o.device_step.raw_data());
  } else {
    TG_CHECK(o.step >= 1, op, ": step must be >= 1 (the update's step number), got ", o.step);
    const double step = static_cast<double>(o.step);
    a.step_size = static_cast<float>(o.lr / (1 - std::pow(o.beta1, step)));
    a.bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, step)));
  }
  if (o.inv_scale.defined()) {
    CheckScalar(op, "inv_scale", o.inv_scale, device);
    a.inv_scale = static_cast<const float*>(o.inv_scale.raw_data());
  }
  if (o.found_inf.defined()) {
    CheckScalar(op, "found_inf", o.found_inf, device);
    a.found_inf = static_cast<const float*>(o.found_inf.raw_data());
  }

  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  // One group of launches per (grad dtype, model dtype); parameters whose master is the model
  // parameter go with an f32 model and a null model pointer.
  for (DType grad_dtype : {kF32, kF16, kBF16}) {
    for (DType model_dtype : {kF32, kF16, kBF16}) {
      std::vector<std::array<void*, kAdamWDepth>> ptrs;
      std::vector<int64_t> numel;
      for (size_t i = 0; i < n; ++i) {
        const Tensor* model = !lists.model_params.empty() && lists.model_params[i].defined()
                                  ? &lists.model_params[i]
                                  : nullptr;
        if (lists.grads[i].dtype() != grad_dtype ||
            (model != nullptr ? model->dtype() : kF32) != model_dtype) {
          continue;
        }
        std::array<void*, kAdamWDepth> row{};
        row[kGrad] = lists.grads[i].raw_data();
        row[kMaster] = lists.masters[i].raw_data();
        row[kExpAvg] = lists.exp_avgs[i].raw_data();
        row[kExpAvgSq] = lists.exp_avg_sqs[i].raw_data();
        row[kMaxExpAvgSq] = o.amsgrad ? lists.max_exp_avg_sqs[i].raw_data() : nullptr;
        row[kModel] = model != nullptr ? model->raw_data() : nullptr;
        ptrs.push_back(row);
        numel.push_back(lists.masters[i].numel());
      }
      if (ptrs.empty()) continue;
      VisitAdamWTypes(grad_dtype, model_dtype, [&](auto g, auto m) {
        using G = decltype(g);
        using M = decltype(m);
        ForEachChunkTable<kAdamWDepth>(
            op, ptrs, numel, [&](const ChunkTable<kAdamWDepth>& table, int blocks, int) {
              if (o.amsgrad) {
                AdamWKernel<G, M, true><<<blocks, kThreads, 0, stream>>>(table, a);
              } else {
                AdamWKernel<G, M, false><<<blocks, kThreads, 0, stream>>>(table, a);
              }
              TG_CUDA_CHECK_LAUNCH("AdamWKernel");
            });
      });
    }
  }
  if (a.step != nullptr) {
    // After every block has read the count (same stream: the launches above finish first).
    AdvanceStepKernel<<<1, 1, 0, stream>>>(static_cast<double*>(o.device_step.raw_data()),
                                           a.found_inf);
    TG_CUDA_CHECK_LAUNCH("AdvanceStepKernel");
  }
}

Tensor GlobalGradNorm(const std::vector<Tensor>& tensors, double norm_type) {
  const char* op = "GlobalGradNorm";
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  TG_CHECK(inf_norm || norm_type == 2, op, ": norm_type must be 2 or inf, got ", norm_type);
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/false);
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  int64_t blocks = 0;
  for (const Tensor& t : tensors) blocks += (t.numel() + kChunkSize - 1) / kChunkSize;
  // Freed when this returns: the caching allocator hands it out again only to work ordered
  // after the kernels below on this stream (the usual stream-ordered reuse).
  Tensor partials = Tensor::Empty({std::max<int64_t>(blocks, 1)}, kF64, device);
  Tensor norm = Tensor::Empty({}, kF32, device);
  double* partial = partials.data<double>();
  int64_t offset = 0;  // partials written by earlier dtype groups
  ForEachDTypeGroup(tensors, [&](auto tag, const auto& ptrs, const auto& numel) {
    using T = decltype(tag);
    int64_t group_blocks = 0;
    ForEachChunkTable<1>(op, ptrs, numel,
                         [&](const ChunkTable<1>& table, int launch_blocks, int first_block) {
                           double* out = partial + offset;
                           if (inf_norm) {
                             NormPartialKernel<T, true>
                                 <<<launch_blocks, kThreads, 0, stream>>>(table, out, first_block);
                           } else {
                             NormPartialKernel<T, false>
                                 <<<launch_blocks, kThreads, 0, stream>>>(table, out, first_block);
                           }
                           TG_CUDA_CHECK_LAUNCH("NormPartialKernel");
                           group_blocks = first_block + launch_blocks;
                         });
    offset += group_blocks;
  });
  TG_CHECK(offset <= INT_MAX, op, ": too many chunks");
  NormFinalKernel<<<1, kFinalThreads, 0, stream>>>(partial, static_cast<int>(offset), inf_norm,
                                                   norm.data<float>());
  TG_CUDA_CHECK_LAUNCH("NormFinalKernel");
  return norm;
}

void ClipByNorm(const std::vector<Tensor>& tensors, const Tensor& total_norm, double max_norm) {
  const char* op = "ClipByNorm";
  TG_CHECK(max_norm >= 0, op, ": max_norm must be >= 0, got ", max_norm);
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/true);
  CheckScalar(op, "total_norm", total_norm, device);
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  const float* norm = static_cast<const float*>(total_norm.raw_data());
  ForEachDTypeGroup(tensors, [&](auto tag, const auto& ptrs, const auto& numel) {
    using T = decltype(tag);
    ForEachChunkTable<1>(op, ptrs, numel, [&](const ChunkTable<1>& table, int blocks, int) {
      ClipKernel<T><<<blocks, kThreads, 0, stream>>>(table, norm, max_norm);
      TG_CUDA_CHECK_LAUNCH("ClipKernel");
    });
  });
}

Tensor ClipGradNorm(const std::vector<Tensor>& tensors, double max_norm, double norm_type) {
  Tensor norm = GlobalGradNorm(tensors, norm_type);
  ClipByNorm(tensors, norm, max_norm);
  return norm;
}

}  // namespace tg::cuda
