// The FP8 ops of tensor/ops.h: validation, contiguous copies and dispatch to the kernel list's
// Fp8Amax, Fp8Scale, Fp8Cast and Fp8Gemm of the inputs' device.
//
// x is [..., cols], taken as the matrix [rows = product of the leading dims, cols]; a 0-d x is
// refused (it has no cols: reshape it to [1] or [1, 1]). An empty x (a zero dim) has an empty
// grid (Fp8GridOf: 0 tile rows or 0 tile cols), so its amax and its scale are empty tensors and
// its cast is an empty tensor: no kernel runs. Nothing here reads a device value on the host.
#include <cmath>
#include <string>

#include "tensor/kernel_table.h"
#include "tensor/op_list.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace tg {

using ops_internal::CheckDefined;
using ops_internal::CommonDevice;

namespace {

// The matrix view [rows, cols] of x, contiguous, after x's checks: defined, not 0-d, and an
// f32, bf16 or f16 tensor.
RawTensor XMatrix(const char* op, const RawTensor& x) {
  CheckDefined(op, x, "x");
  TG_CHECK(x.dtype() != kF64, op,
           ": x is f64: FP8 casts take f32, bf16 or f16 (cast f64 to f32 first)");
  TG_CHECK(x.dtype() == kF32 || x.dtype() == kBF16 || x.dtype() == kF16, op, ": x is ",
           DTypeName(x.dtype()), ": FP8 casts take f32, bf16 or f16");
  TG_CHECK(x.dim() >= 1, op, ": expected x [..., cols], got a 0-d tensor");
  const int64_t rows = NumElements(Shape(x.shape().begin(), x.shape().end() - 1));
  return x.reshape({rows, x.size(-1)}).contiguous();
}

// A tiling's grid of [rows, cols] as a shape.
Shape GridShape(int64_t rows, int64_t cols, Fp8Tiling tiling) {
  const Fp8Tile grid = Fp8GridOf(rows, cols, tiling);
  return {grid.rows, grid.cols};
}

// t (named `what`) is an f32 grid of `shape`, the `tiling` grid of `of` ("x [4, 300]"), on
// `device`; returns it contiguous.
RawTensor CheckGrid(const char* op, const RawTensor& t, const char* what, const Shape& shape,
                    Fp8Tiling tiling, const std::string& of, Device device) {
  CheckDefined(op, t, what);
  TG_CHECK(t.dtype() == kF32, op, ": ", what, " must be f32, got ", DTypeName(t.dtype()));
  TG_CHECK(t.shape() == shape, op, ": ", what, " of shape ", ShapeToString(t.shape()),
           " does not match the ", Fp8TilingName(tiling), " grid ", ShapeToString(shape), " of ",
           of);
  TG_CHECK(t.device() == device, op, ": expected all tensors on one device, got ",
           device.ToString(), " and ", t.device().ToString());
  return t.contiguous();
}

std::string Described(const char* name, const RawTensor& t) {
  return std::string(name) + " " + ShapeToString(t.shape());
}

}  // namespace

RawTensor Fp8Amax(const RawTensor& x_in, Fp8Tiling tiling) {
  const char* op = OpTorchName(OpId::kFp8Amax);
  const RawTensor x = XMatrix(op, x_in);
  const Shape grid = GridShape(x.size(0), x.size(1), tiling);
  RawTensor amax = RawTensor::Empty(grid, kF32, x.device());
  if (x.numel() > 0) KernelsFor(x.device()).Fp8Amax(amax, x, tiling);
  return amax;
}

Fp8Scales Fp8ScaleFromAmax(const RawTensor& amax_in, const Fp8ScaleOptions& options) {
  const char* op = OpTorchName(OpId::kFp8ScaleFromAmax);
  CheckDefined(op, amax_in, "amax");
  TG_CHECK(amax_in.dtype() == kF32, op, ": amax must be f32, got ", DTypeName(amax_in.dtype()));
  TG_CHECK(std::isfinite(options.fp8_max) && options.fp8_max > 0.0f, op,
           ": fp8_max must be finite and > 0, got ", options.fp8_max);
  TG_CHECK(std::isfinite(options.value_for_inf) && options.value_for_inf > 0.0f, op,
           ": value_for_inf must be finite and > 0, got ", options.value_for_inf);
  TG_CHECK(std::isfinite(options.amax_epsilon) && options.amax_epsilon >= 0.0f, op,
           ": amax_epsilon must be finite and >= 0, got ", options.amax_epsilon);
  const RawTensor amax = amax_in.contiguous();
  Fp8Scales r;
  r.scale = RawTensor::Empty(amax.shape(), kF32, amax.device());
  r.scale_inv = RawTensor::Empty(amax.shape(), kF32, amax.device());
  if (amax.numel() > 0) KernelsFor(amax.device()).Fp8Scale(r.scale, r.scale_inv, amax, options);
  return r;
}

Fp8CastResult Fp8Cast(const RawTensor& x_in, const RawTensor& scale_in, Fp8Tiling tiling,
                      DType dtype, bool transpose, bool amax) {
  const char* op = OpTorchName(OpId::kFp8Cast);
  const RawTensor x = XMatrix(op, x_in);
  TG_CHECK(IsFloat8(dtype), op, ": dtype ", DTypeName(dtype),
           " is not an FP8 dtype (f8e4m3 or f8e5m2)");
  const int64_t rows = x.size(0), cols = x.size(1);
  const Shape grid = GridShape(rows, cols, tiling);
  const RawTensor scale =
      CheckGrid(op, scale_in, "scale", grid, tiling, Described("x", x_in), x.device());
  Fp8CastResult r;
  r.data = RawTensor::Empty({rows, cols}, dtype, x.device());
  if (transpose) r.data_t = RawTensor::Empty({cols, rows}, dtype, x.device());
  if (amax) r.amax = RawTensor::Empty(grid, kF32, x.device());
  if (x.numel() > 0) {
    KernelsFor(x.device()).Fp8Cast(r.data, r.data_t, r.amax, x, scale, tiling);
  }
  return r;
}

RawTensor Fp8Gemm(const RawTensor& a_in, const RawTensor& a_scale_inv_in, Fp8Tiling a_tiling,
                  const RawTensor& b_in, const RawTensor& b_scale_inv_in, Fp8Tiling b_tiling,
                  const RawTensor& bias_in, DType out_dtype) {
  const char* op = OpTorchName(OpId::kFp8Gemm);
  CheckDefined(op, a_in, "a");
  CheckDefined(op, b_in, "b");
  const Device device = CommonDevice(op, {&a_in, &b_in});
  TG_CHECK(a_in.dim() == 2, op, ": a must be 2-D [m, k], got ", ShapeToString(a_in.shape()));
  TG_CHECK(b_in.dim() == 2, op, ": b must be 2-D [n, k], got ", ShapeToString(b_in.shape()));
  TG_CHECK(IsFloat8(a_in.dtype()), op, ": a is ", DTypeName(a_in.dtype()),
           ": expected an FP8 dtype (f8e4m3 or f8e5m2)");
  TG_CHECK(IsFloat8(b_in.dtype()), op, ": b is ", DTypeName(b_in.dtype()),
           ": expected an FP8 dtype (f8e4m3 or f8e5m2)");
  TG_CHECK(a_in.dtype() == kF8E4M3 || b_in.dtype() == kF8E4M3, op,
           ": a and b are both f8e5m2: FP8 GEMMs take e4m3 x e4m3, e4m3 x e5m2 or e5m2 x e4m3");
  const int64_t m = a_in.size(0), k = a_in.size(1), n = b_in.size(0);
  TG_CHECK(b_in.size(1) == k, op, ": a [m, k] and b [n, k] differ in k: a ",
           ShapeToString(a_in.shape()), ", b ", ShapeToString(b_in.shape()));
  TG_CHECK(k > 0, op, ": k is 0 (a ", ShapeToString(a_in.shape()), ", b ",
           ShapeToString(b_in.shape()), "): an FP8 GEMM needs k > 0");
  TG_CHECK((a_tiling == Fp8Tiling::kTensor) == (b_tiling == Fp8Tiling::kTensor), op,
           ": the tilings of a (", Fp8TilingName(a_tiling), ") and b (", Fp8TilingName(b_tiling),
           ") disagree along k: both must be tensor, or both block tilings (1x128, 128x128)");
  TG_CHECK(out_dtype == kF32 || out_dtype == kBF16 || out_dtype == kF16, op, ": out_dtype is ",
           DTypeName(out_dtype), ": expected f32, bf16 or f16");
  const RawTensor a_scale_inv =
      CheckGrid(op, a_scale_inv_in, "a_scale_inv", GridShape(m, k, a_tiling), a_tiling,
                Described("a", a_in), device);
  const RawTensor b_scale_inv =
      CheckGrid(op, b_scale_inv_in, "b_scale_inv", GridShape(n, k, b_tiling), b_tiling,
                Described("b", b_in), device);
  RawTensor bias;
  if (bias_in.defined()) {
    CommonDevice(op, {&a_in, &bias_in});
    TG_CHECK(bias_in.shape() == Shape{n}, op, ": bias of shape ", ShapeToString(bias_in.shape()),
             " does not match n = ", n, " (expected [", n, "])");
    TG_CHECK(bias_in.dtype() == out_dtype, op, ": bias is ", DTypeName(bias_in.dtype()),
             ", out_dtype is ", DTypeName(out_dtype), ": they must match");
    bias = bias_in.contiguous();
  }
  RawTensor out = RawTensor::Empty({m, n}, out_dtype, device);
  if (m > 0 && n > 0) {
    KernelsFor(device).Fp8Gemm(out, a_in.contiguous(), a_scale_inv, a_tiling, b_in.contiguous(),
                               b_scale_inv, b_tiling, bias);
  }
  return out;
}

}  // namespace tg
