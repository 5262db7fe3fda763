// tg::cuda::Conv2d and Conv2dBackward (contracts in tensor/cuda/kernels.h) through cuDNN 9's
// backend graph API.
//
// Each of the three convolutions (forward, backward data, backward filter) is a one-operation
// graph over NCHW tensors with the padding on both sides of each dim and cross-correlation (what
// deep learning calls convolution). Data are f32, f64, f16 or bf16; f16/bf16 accumulate in f32
// and f64 in f64. The execution plan is cached per (kind, dtype, every size of Window2d, pointer
// alignment, TF32 setting, device) and per thread (each thread has its own cuDNN handle, and a
// plan is built on one), so the heuristics run once per layer shape and thread.
//
// Engine choice: cuDNN's heuristics order engines by expected speed; we take the first
// deterministic one that applies (a non-deterministic one only when none does), never one that
// down-converts inputs or accumulates in reduced precision, no FFT or Winograd engine, and for
// f32 no tensor-core (TF32) engine unless the thread allows TF32 (tensor/cuda/blas.h). The
// results then obey the same element-wise error bound as a direct (im2col + GEMM) convolution
// with f32 accumulation, which is what tests/tensor/cuda/cudnn_test.cc checks against the CPU;
// the transform engines are rarely the fastest on Hopper for the layer shapes tapegrad trains.
//
// The legacy cudnnConvolutionForward/Backward* calls still exist in cuDNN 9 but are deprecated;
// the graph API is the supported path.
//
// Bias. The bias add and its gradient are GEMMs through cuBLASLt (tensor/cuda/blas.h) against a
// cached vector of ones: out[n] += bias [O, 1] @ ones [1, L] for every image in one batched
// rank-1 update, and grad_bias = ones [1, N] @ (grad_out[n] [O, L] @ ones [L, 1]) with the
// per-image sums kept in f32 (f64 for f64), rounded once into grad_bias.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensor/cuda/blas.h"
#include "tensor/cuda/cudnn_plan.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace tg::cuda {
namespace {

enum class ConvKind { kForward, kBackwardData, kBackwardFilter };

// Unique ids of the graph tensors (any distinct values work).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

cudnnDataType_t DnnType(const char* op, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kF64:
      return CUDNN_DATA_DOUBLE;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw Error(
          absl::StrCat(op, ": expected f32, f64, f16 or bf16 for cuDNN, got ", DTypeName(dtype)));
  }
}

// The alignment (power of two, at most 16 bytes) cuDNN may assume for a pointer.
int64_t Alignment(const void* p) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(p) | 16;
  return static_cast<int64_t>(bits & (~bits + 1));
}

std::vector<int64_t> Contiguous(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) s[i] = s[i + 1] * std::max<int64_t>(dims[i + 1], 1);
  return s;
}

std::string Describe(const char* op, DType dtype, const Window2d& g) {
  return absl::StrCat(op, ": input [", g.n, ", ", g.c, ", ", g.h, ", ", g.w, "], weight [", g.o,
                      ", ", g.c, ", ", g.kh, ", ", g.kw, "] (", DTypeName(dtype), "), stride [",
                      g.sh, ", ", g.sw, "], padding [", g.ph, ", ", g.pw, "], dilation [", g.dh,
                      ", ", g.dw, "]");
}

// The cached plan of one convolution. x, w, y are the pointers of the three tensors (their
// alignment is part of the problem).
std::shared_ptr<const dnn::Plan> ConvPlan(const char* op, ConvKind kind, DType dtype,
                                          const Window2d& g, int device, const void* x,
                                          const void* w, const void* y) {
  const bool tf32 = dtype == kF32 && Tf32Allowed();
  std::vector<int64_t> key = {device,
                              static_cast<int64_t>(kind),
                              static_cast<int64_t>(dtype),
                              tf32,
                              Alignment(x),
                              Alignment(w),
                              Alignment(y)};
  key.insert(key.end(),
             {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw});
  // Per thread: a plan is built on (and belongs with) this thread's cuDNN handle.
  thread_local std::map<std::vector<int64_t>, std::shared_ptr<const dnn::Plan>> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;

  const cudnnDataType_t type = DnnType(op, dtype);
  const cudnnDataType_t compute = dtype == kF64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const std::vector<int64_t> x_dims = {g.n, g.c, g.h, g.w}, w_dims = {g.o, g.c, g.kh, g.kw},
                             y_dims = {g.n, g.o, g.oh, g.ow};
  dnn::Graph graph;
  const dnn::Descriptor& xd =
      graph.RawTensor({kUidX, type, x_dims, Contiguous(x_dims), false, false, Alignment(x)});
  const dnn::Descriptor& wd =
      graph.RawTensor({kUidW, type, w_dims, Contiguous(w_dims), false, false, Alignment(w)});
  const dnn::Descriptor& yd =
      graph.RawTensor({kUidY, type, y_dims, Contiguous(y_dims), false, false, Alignment(y)});

  dnn::Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv.SetDataType(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, compute)
      .Set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .SetInt64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2)
      .SetInt64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, {g.dh, g.dw})
      .SetInt64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {g.sh, g.sw})
      .SetInt64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {g.ph, g.pw})
      .SetInt64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {g.ph, g.pw});
  conv.Finalize("convolution descriptor");
  const dnn::Descriptor& cd = graph.Keep(std::move(conv));

  // alpha = 1, beta = 0: the result overwrites its output. The scalars have the compute type.
  auto set_scalars = [&](dnn::Descriptor& o, cudnnBackendAttributeName_t alpha,
                         cudnnBackendAttributeName_t beta) {
    if (compute == CUDNN_DATA_DOUBLE) {
      o.SetDouble(alpha, 1.0).SetDouble(beta, 0.0);
    } else {
      o.SetFloat(alpha, 1.0f).SetFloat(beta, 0.0f);
    }
  };
  switch (kind) {
    case ConvKind::kForward: {
      dnn::Descriptor o(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
      o.SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, xd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, wd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, yd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cd);
      set_scalars(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA);
      o.Finalize("convolution forward");
      graph.AddOp(std::move(o));
      break;
    }
    case ConvKind::kBackwardData: {
      dnn::Descriptor o(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
      o.SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, xd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, wd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, yd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, cd);
      set_scalars(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA);
      o.Finalize("convolution backward data");
      graph.AddOp(std::move(o));
      break;
    }
    case ConvKind::kBackwardFilter: {
      dnn::Descriptor o(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
      o.SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, xd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, wd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, yd)
          .SetDesc(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, cd);
      set_scalars(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA);
      o.Finalize("convolution backward filter");
      graph.AddOp(std::move(o));
      break;
    }
  }

  dnn::PlanOptions options;
  options.exclude_tensor_core = dtype == kF32 && !tf32;
  options.exclude_transforms = true;
  std::string why;
  std::shared_ptr<const dnn::Plan> plan =
      dnn::BuildPlan(CudnnHandle(device), std::move(graph), options, &why);
  TG_CHECK(plan != nullptr, Describe(op, dtype, g), ": cuDNN cannot run this convolution: ", why);
  return cache.emplace(key, std::move(plan)).first->second;
}

// Runs one convolution: x/dx, w/dw, y/dy are the tensors of the graph's X, W and Y.
void RunConv(const char* op, ConvKind kind, DType dtype, const Window2d& g, int device, void* x,
             void* w, void* y) {
  std::shared_ptr<const dnn::Plan> plan = ConvPlan(op, kind, dtype, g, device, x, w, y);
  void* workspace = plan->workspace_bytes() > 0
                        ? Workspace(static_cast<size_t>(plan->workspace_bytes()), device)
                        : nullptr;
  plan->Execute(CudnnHandle(device), {kUidX, kUidW, kUidY}, {x, w, y}, workspace);
}

// out [N, O, L] += bias [O] broadcast over images and positions.
void AddBias(const RawTensor& out, const RawTensor& bias, const Window2d& g, int device) {
  AllowTf32Scope exact(false);  // the bias is added in full f32 also under a TF32 scope
  const int64_t L = g.oh * g.ow;
  const RawTensor ones =
      OnesVector(L, out.dtype(), device).view({1, L}).unsqueeze(0).expand({g.n, 1, L});
  MatmulEx(out.view({g.n, g.o, L}), bias.view({g.o, 1}).unsqueeze(0).expand({g.n, g.o, 1}), false,
           ones, false, Epilogue::kNone, RawTensor(), RawTensor(), 1.0f, 1.0f);
}

// grad_bias [O] = the sum of grad_out [N, O, L] over images and positions.
void BiasGrad(const RawTensor& grad_bias, const RawTensor& grad_out, const Window2d& g,
              int device) {
  AllowTf32Scope exact(false);  // sums of f32 values, not of their TF32 roundings
  const int64_t L = g.oh * g.ow;
  const DType dtype = grad_out.dtype();
  const DType acc = dtype == kF64 ? kF64 : kF32;
  const Device dev = Device::Cuda(device);
  // Per image: sums [N, O, 1] (acc) = grad_out[n] [O, L] @ ones [L, 1].
  const RawTensor sums = RawTensor::Empty({g.n, g.o, 1}, acc, dev);
  MatmulEx(sums, grad_out.view({g.n, g.o, L}), false,
           OnesVector(L, dtype, device).view({L, 1}).unsqueeze(0).expand({g.n, L, 1}), false,
           Epilogue::kNone, RawTensor(), RawTensor());
  // Over images: [1, O] = ones [1, N] @ sums [N, O], in the accumulator type.
  const RawTensor total = acc == dtype ? grad_bias : RawTensor::Empty({g.o}, acc, dev);
  MatmulEx(total.view({1, g.o}), OnesVector(g.n, acc, device).view({1, g.n}), false,
           sums.view({g.n, g.o}), false, Epilogue::kNone, RawTensor(), RawTensor());
  if (acc != dtype) grad_bias.copy_(total);
}

void CheckCuda(const char* op, const RawTensor& t, const char* what, Device device, DType dtype) {
  if (!t.defined()) return;
  TG_CHECK(t.device() == device, op, ": ", what, " is on ", t.device().ToString(), ", expected ",
           device.ToString());
  TG_CHECK(t.dtype() == dtype, op, ": ", what, " is ", DTypeName(t.dtype()), ", expected ",
           DTypeName(dtype));
  TG_CHECK(t.is_contiguous(), op, ": ", what, " ", ShapeToString(t.shape()), " must be contiguous");
}

}  // namespace

void Conv2d(const RawTensor& out, const RawTensor& x, const RawTensor& weight,
            const RawTensor& bias, const Window2d& g) {
  const char* op = "conv2d";
  TG_CHECK(out.device().is_cuda(), op, ": out is on ", out.device().ToString(),
           ", expected a CUDA device");
  const DType dtype = out.dtype();
  CheckCuda(op, out, "out", out.device(), dtype);
  CheckCuda(op, x, "input", out.device(), dtype);
  CheckCuda(op, weight, "weight", out.device(), dtype);
  CheckCuda(op, bias, "bias", out.device(), dtype);
  DnnType(op, dtype);
  if (out.numel() == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  if (g.c == 0) {
    out.zero_();  // no input channels: the output is the bias (cuDNN has no empty convolution)
  } else {
    RunConv(op, ConvKind::kForward, dtype, g, device, x.raw_data(), weight.raw_data(),
            out.raw_data());
  }
  if (bias.defined()) AddBias(out, bias, g, device);
}

void Conv2dBackward(const RawTensor& grad_input, const RawTensor& grad_weight,
                    const RawTensor& grad_bias, const RawTensor& grad_out, const RawTensor& x,
                    const RawTensor& weight, const Window2d& g) {
  const char* op = "conv2d_backward";
  TG_CHECK(grad_out.device().is_cuda(), op, ": the gradient is on ", grad_out.device().ToString(),
           ", expected a CUDA device");
  const DType dtype = grad_out.dtype();
  const Device dev = grad_out.device();
  CheckCuda(op, grad_out, "the gradient", dev, dtype);
  CheckCuda(op, grad_input, "grad_input", dev, dtype);
  CheckCuda(op, grad_weight, "grad_weight", dev, dtype);
  CheckCuda(op, grad_bias, "grad_bias", dev, dtype);
  CheckCuda(op, x, "input", dev, dtype);
  CheckCuda(op, weight, "weight", dev, dtype);
  TG_CHECK(!grad_weight.defined() || x.defined(), op, ": grad_weight needs the input");
  TG_CHECK(!grad_input.defined() || weight.defined(), op, ": grad_input needs the weight");
  DnnType(op, dtype);
  const int device = dev.index;
  DeviceGuard guard(device);
  if (grad_out.numel() == 0 || g.c == 0) {
    // Nothing flows back (no images, output channels or positions), or nothing to flow into.
    for (const RawTensor* t : {&grad_input, &grad_weight, &grad_bias}) {
      if (t->defined() && t->numel() > 0) t->zero_();
    }
    if (g.c == 0 && grad_bias.defined() && grad_out.numel() > 0) {
      BiasGrad(grad_bias, grad_out, g, device);
    }
    return;
  }
  if (grad_input.defined()) {
    RunConv(op, ConvKind::kBackwardData, dtype, g, device, grad_input.raw_data(), weight.raw_data(),
            grad_out.raw_data());
  }
  if (grad_weight.defined()) {
    RunConv(op, ConvKind::kBackwardFilter, dtype, g, device, x.raw_data(), grad_weight.raw_data(),
            grad_out.raw_data());
  }
  if (grad_bias.defined()) BiasGrad(grad_bias, grad_out, g, device);
}

}  // namespace tg::cuda
