// The optimizer entries of the kernel list on CUDA (tensor/kernel_list.inc: FusedAdam, FusedSgd,
// GlobalGradNorm, ClipByNorm; declared in tensor/cuda/kernels.h), as multi-tensor kernels
// (multi_tensor.cuh): each takes the whole list and does its work in one launch (or a few, for
// very long lists) over 64K-element chunks, without synchronising the host; the values the
// decisions depend on (found_inf, inv_scale, the device step count, the norm) are read on the
// device.
//
// - FusedAdam: f32 parameters (an f32 model, or f32 master weights whose f32/f16/bf16 model copies
//   are written in the same pass) with f32/f16/bf16 gradients, no or decoupled weight decay, all
//   tensors contiguous; declines (kNoKernel) L2 decay, f64 and f16/bf16 parameters and strided
//   tensors. Each arithmetic step is one correctly rounded IEEE operation (__fmul_rn, __fadd_rn,
//   __fdiv_rn, __fsqrt_rn, and __fmaf_rn where the kernel list writes fma) in the kernel list's
//   order, so the result equals the CPU kernel bit for
//   bit. With device_step, the bias corrections are computed on the device in double; CUDA's
//   double pow is not correctly rounded (2 ulp documented; glibc's is within 1), so step_size and
//   sqrt(1 - beta2^t) equal the host's f32 scalars unless a double lands within those few ulps of
//   an f32 rounding boundary (about one case in 2^27), and then differ by 1 f32 ulp.
// - FusedSgd: no kernel (declines every case; the composed ops run on the device and decide
//   found_inf and momentum_buffers_valid there with Where: no host wait).
// - GlobalGradNorm: the 2-norm (squares summed in f64 per thread, block and final reduction,
//   then the square root) and the inf norm (exact) of contiguous tensors; other norm types and
//   strided tensors are declined. The 2-norm's summation order differs from the CPU's list order,
//   so the two agree to f64 rounding, not bit for bit.
// - ClipByNorm: contiguous tensors (strided ones are declined).
// Tensors listed twice in an in-place list throw tg::Error, as do lists on several devices.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/multi_tensor.cuh"
#include "tensor/cuda/runtime.h"
#include "tensor/optimizer_kernels.h"
#include "tensor/error.h"

namespace tg::cuda {
namespace {

bool AllContiguous(const std::vector<RawTensor>& tensors) {
  for (const RawTensor& t : tensors) {
    if (t.defined() && !t.is_contiguous()) return false;
  }
  return true;
}

// ---- Adam -------------------------------------------------------------------------------------

// Per-launch arguments. The f32 scalars are the CPU kernel's (FusedAdamOptions::ScalarsAt,
// tensor/optimizer_kernels.h), rounded on the host from the same doubles; with device_step,
// step_size and bias_correction2_sqrt are recomputed per block from lr, beta1, beta2 and *step.
struct AdamWArgs {
  float decay, lerp_weight, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
  bool apply_decay, lerp_from_end;  // the first moment's lerp as the CPU's (AdamScalars)
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
    // The host's bias corrections in double, once per block, rounded once to f32.
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
    const float mv = __fmaf_rn(a.lerp_weight, __fsub_rn(gv, m[i]), a.lerp_from_end ? gv : m[i]);
    m[i] = mv;
    float vv = __fmaf_rn(__fmul_rn(gv, a.one_minus_beta2), gv, __fmul_rn(v[i], a.beta2));
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
        throw Error("FusedAdam: f64 gradients and model parameters are declined before this");
      } else {
        fn(g, m);
      }
    });
  });
}


// Whether the Adam kernel does this update (see the file comment); the rest is composed.
bool Handles(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  if (o.decay == WeightDecay::kL2) return false;
  for (const RawTensor& p : lists.params) {
    if (p.dtype() != kF32) return false;
  }
  for (const RawTensor& g : lists.grads) {
    if (g.dtype() == kF64) return false;
  }
  for (const RawTensor& m : lists.model_params) {
    if (m.defined() && m.dtype() == kF64) return false;
  }
  return AllContiguous(lists.params) && AllContiguous(lists.grads) &&
         AllContiguous(lists.exp_avgs) && AllContiguous(lists.exp_avg_sqs) &&
         AllContiguous(lists.max_exp_avg_sqs) && AllContiguous(lists.model_params);
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

template <typename Out>
__global__ void __launch_bounds__(kFinalThreads)
    NormFinalKernel(const double* partials, int n, bool inf_norm, Out* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += kFinalThreads) acc = Combine(acc, partials[i], inf_norm);
  acc = BlockReduce(acc, inf_norm);
  if (threadIdx.x == 0) {
    const double total = inf_norm ? acc : sqrt(acc);
    if constexpr (std::is_same_v<Out, float>) {
      *out = __double2float_rn(total);
    } else {
      *out = total;
    }
  }
}

template <typename T, typename N>
__global__ void __launch_bounds__(kThreads)
    ClipKernel(const __grid_constant__ ChunkTable<1> table, const N* norm, double max_norm) {
  using C = Compute<T>;
  double clip_coef = 1;
  if (!ClipCoefficient(static_cast<double>(*norm), max_norm, &clip_coef)) return;
  const C coef = static_cast<C>(clip_coef);
  const ChunkRef c = Locate(table);
  T* p = static_cast<T*>(table.ptr[0][c.tensor]) + c.begin;
#pragma unroll 4
  for (int i = threadIdx.x; i < c.n; i += kThreads) Store(p + i, Mul(Load(p + i), coef));
}

}  // namespace

KernelStatus FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& o) {
  const char* op = "FusedAdam";
  const size_t n = lists.params.size();
  if (n == 0) return KernelStatus::kDone;
  if (!Handles(lists, o)) return KernelStatus::kNoKernel;
  auto check_length = [&](const std::vector<RawTensor>& list, const char* what) {
    TG_CHECK(list.size() == n, op, ": ", what, " has ", list.size(), " tensors, params has ", n);
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

  const Device device = CheckList(op, "params", lists.params, /*in_place=*/true);
  CheckList(op, "grads", lists.grads, /*in_place=*/false);
  CheckList(op, "exp_avgs", lists.exp_avgs, /*in_place=*/true);
  CheckList(op, "exp_avg_sqs", lists.exp_avg_sqs, /*in_place=*/true);
  if (o.amsgrad) CheckList(op, "max_exp_avg_sqs", lists.max_exp_avg_sqs, /*in_place=*/true);
  std::vector<RawTensor> models;
  for (const RawTensor& t : lists.model_params) {
    if (t.defined()) models.push_back(t);
  }
  if (!models.empty()) CheckList(op, "model_params", models, /*in_place=*/true);
  for (size_t i = 0; i < n; ++i) {
    const RawTensor& master = lists.params[i];  // f32 (Handles)
    auto same = [&](const RawTensor& t, const char* what, bool f32) {
      TG_CHECK(t.device() == device, op, ": ", what, "[", i, "] is on ", t.device().ToString(),
               ", params on ", device.ToString());
      TG_CHECK(t.shape() == master.shape(), op, ": ", what, "[", i, "] has shape ",
               ShapeToString(t.shape()), ", its master ", ShapeToString(master.shape()));
      TG_CHECK(!f32 || t.dtype() == kF32, op, ": ", what, "[", i, "] is ", DTypeName(t.dtype()),
               "; expected f32");
      TG_CHECK(f32 || t.dtype() != kF64, op, ": ", what, "[", i,
               "] is f64; expected f32, f16 or bf16");
    };
    same(master, "params", true);
    same(lists.grads[i], "grads", false);
    same(lists.exp_avgs[i], "exp_avgs", true);
    same(lists.exp_avg_sqs[i], "exp_avg_sqs", true);
    if (o.amsgrad) same(lists.max_exp_avg_sqs[i], "max_exp_avg_sqs", true);
    if (!lists.model_params.empty() && lists.model_params[i].defined()) {
      same(lists.model_params[i], "model_params", false);
    }
  }

  AdamWArgs a{};
  // The CPU kernel's scalars: doubles, each rounded once to f32.
  a.decay = static_cast<float>(o.DecayFactor());
  a.apply_decay = o.decay == WeightDecay::kDecoupled;
  const float w = static_cast<float>(1 - o.beta1);
  a.lerp_from_end = !(std::abs(w) < 0.5f);
  a.lerp_weight = a.lerp_from_end ? -(1.0f - w) : w;
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
    const AdamStepScalars scalars = o.ScalarsAt(static_cast<double>(o.step));
    a.step_size = static_cast<float>(scalars.step_size);
    a.bias_correction2_sqrt = static_cast<float>(scalars.bias_correction2_sqrt);
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
        const RawTensor* model = !lists.model_params.empty() && lists.model_params[i].defined()
                                  ? &lists.model_params[i]
                                  : nullptr;
        if (lists.grads[i].dtype() != grad_dtype ||
            (model != nullptr ? model->dtype() : kF32) != model_dtype) {
          continue;
        }
        std::array<void*, kAdamWDepth> row{};
        row[kGrad] = lists.grads[i].raw_data();
        row[kMaster] = lists.params[i].raw_data();
        row[kExpAvg] = lists.exp_avgs[i].raw_data();
        row[kExpAvgSq] = lists.exp_avg_sqs[i].raw_data();
        row[kMaxExpAvgSq] = o.amsgrad ? lists.max_exp_avg_sqs[i].raw_data() : nullptr;
        row[kModel] = model != nullptr ? model->raw_data() : nullptr;
        ptrs.push_back(row);
        numel.push_back(lists.params[i].numel());
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
  return KernelStatus::kDone;
}

KernelStatus FusedSgd(const SgdTensorLists&, const FusedSgdOptions&) {
  return KernelStatus::kNoKernel;
}

KernelStatus GlobalGradNorm(const RawTensor& norm, const std::vector<RawTensor>& tensors,
                            double norm_type) {
  const char* op = "GlobalGradNorm";
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  if ((!inf_norm && norm_type != 2) || !AllContiguous(tensors)) return KernelStatus::kNoKernel;
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/false);
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  int64_t blocks = 0;
  for (const RawTensor& t : tensors) blocks += (t.numel() + kChunkSize - 1) / kChunkSize;
  // Freed when this returns: the caching allocator hands it out again only to work ordered
  // after the kernels below on this stream (the usual stream-ordered reuse).
  RawTensor partials = RawTensor::Empty({std::max<int64_t>(blocks, 1)}, kF64, device);
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
  CheckScalar(op, "norm", norm, device, norm.dtype());
  if (norm.dtype() == kF64) {
    NormFinalKernel<<<1, kFinalThreads, 0, stream>>>(partial, static_cast<int>(offset), inf_norm,
                                                     norm.data<double>());
  } else {
    NormFinalKernel<<<1, kFinalThreads, 0, stream>>>(partial, static_cast<int>(offset), inf_norm,
                                                     norm.data<float>());
  }
  TG_CUDA_CHECK_LAUNCH("NormFinalKernel");
  return KernelStatus::kDone;
}

KernelStatus ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                        double max_norm) {
  const char* op = "ClipByNorm";
  if (!AllContiguous(tensors)) return KernelStatus::kNoKernel;
  const Device device = CheckList(op, "tensors", tensors, /*in_place=*/true);
  CheckScalar(op, "total_norm", total_norm, device, total_norm.dtype());
  DeviceGuard guard(device.index);
  cudaStream_t stream = CurrentStream(device.index);
  auto clip = [&](const auto* norm) {
    using N = std::remove_const_t<std::remove_pointer_t<decltype(norm)>>;
    ForEachDTypeGroup(tensors, [&](auto tag, const auto& ptrs, const auto& numel) {
      using T = decltype(tag);
      ForEachChunkTable<1>(op, ptrs, numel, [&](const ChunkTable<1>& table, int blocks, int) {
        ClipKernel<T, N><<<blocks, kThreads, 0, stream>>>(table, norm, max_norm);
        TG_CUDA_CHECK_LAUNCH("ClipKernel");
      });
    });
  };
  if (total_norm.dtype() == kF64) {
    clip(static_cast<const double*>(total_norm.raw_data()));
  } else {
    clip(static_cast<const float*>(total_norm.raw_data()));
  }
  return KernelStatus::kDone;
}

}  // namespace tg::cuda
