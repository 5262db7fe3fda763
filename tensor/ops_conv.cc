// The window ops of tensor/ops.h: 2-D convolution and max pooling, forward and backward, with
// PyTorch's output-size formula.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensor/composed.h"
#include "tensor/kernel_table.h"
#include "tensor/ops.h"
#include "tensor/ops_internal.h"

namespace tg {

using ops_internal::CheckDefined;
using ops_internal::CheckFloating;
using ops_internal::CommonDevice;
using ops_internal::Declined;
using ops_internal::IndicesI64;

namespace {

// One spatial size of a window op (PyTorch's formula), or an error when the (dilated) kernel
// spans more than the padded input. Computed in 128 bits: no overflow for any int64 parameters.
int64_t WindowOutSize(int64_t in, int64_t kernel, int64_t stride, int64_t padding,
                      int64_t dilation) {
  const __int128 padded = static_cast<__int128>(in) + 2 * static_cast<__int128>(padding);
  const __int128 span = static_cast<__int128>(dilation) * (kernel - 1) + 1;
  if (padded < span) return 0;
  const __int128 out = (padded - span) / stride + 1;
  return out > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max()
                                                   : static_cast<int64_t>(out);
}

std::string Pair(const std::array<int64_t, 2>& v) { return ShapeToString(v); }

// Positive (or non-negative) {height, width} parameters of a window op.
void CheckPair(const char* op, const char* what, const std::array<int64_t, 2>& v, int64_t min) {
  TG_CHECK(v[0] >= min && v[1] >= min, op, ": ", what, " must be ",
           min > 0 ? "positive" : "non-negative", ", got ", Pair(v));
}

// Validates the input [N, C, H, W] and the window of a conv/pool op and fills the sizes (o, kh,
// kw and, for pooling, dilation 1 are set by the caller first).
void FillWindow(const char* op, const RawTensor& x, const std::array<int64_t, 2>& stride,
                const std::array<int64_t, 2>& padding, const std::array<int64_t, 2>& dilation,
                const std::string& kernel_owner, Window2d* g) {
  CheckPair(op, "stride", stride, 1);
  CheckPair(op, "padding", padding, 0);
  CheckPair(op, "dilation", dilation, 1);
  g->n = x.size(0);
  g->c = x.size(1);
  g->h = x.size(2);
  g->w = x.size(3);
  g->sh = stride[0];
  g->sw = stride[1];
  g->ph = padding[0];
  g->pw = padding[1];
  g->dh = dilation[0];
  g->dw = dilation[1];
  g->oh = WindowOutSize(g->h, g->kh, g->sh, g->ph, g->dh);
  g->ow = WindowOutSize(g->w, g->kw, g->sw, g->pw, g->dw);
  TG_CHECK(g->oh > 0 && g->ow > 0, op, ": ", kernel_owner, " is larger than the padded input (",
           "input ", ShapeToString(x.shape()), ", padding ", Pair(padding),
           dilation[0] == 1 && dilation[1] == 1 ? "" : absl::StrCat(", dilation ", Pair(dilation)),
           ")");
}

Window2d ConvWindow(const char* op, const RawTensor& x, const RawTensor& weight,
                    const RawTensor& bias, const Conv2dParams& p) {
  CheckDefined(op, x, "the input");
  CheckDefined(op, weight, "the weight");
  CommonDevice(op, {&x, &weight});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W], got shape ", ShapeToString(x.shape()));
  TG_CHECK(weight.dim() == 4, op, ": expected weight [O, C, kh, kw], got shape ",
           ShapeToString(weight.shape()));
  TG_CHECK(weight.dtype() == x.dtype(), op, ": weight dtype ", DTypeName(weight.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  TG_CHECK(weight.size(1) == x.size(1), op, ": input ", ShapeToString(x.shape()), " has ",
           x.size(1), " channels but weight ", ShapeToString(weight.shape()), " expects ",
           weight.size(1));
  TG_CHECK(weight.size(2) > 0 && weight.size(3) > 0, op, ": weight ", ShapeToString(weight.shape()),
           " has an empty kernel");
  if (bias.defined()) {
    CommonDevice(op, {&x, &bias});
    TG_CHECK(bias.shape() == Shape{weight.size(0)}, op, ": bias of shape ",
             ShapeToString(bias.shape()), " does not match weight ", ShapeToString(weight.shape()),
             " (expected [", weight.size(0), "])");
    TG_CHECK(bias.dtype() == x.dtype(), op, ": bias dtype ", DTypeName(bias.dtype()),
             " differs from input dtype ", DTypeName(x.dtype()));
  }
  Window2d g;
  g.o = weight.size(0);
  g.kh = weight.size(2);
  g.kw = weight.size(3);
  FillWindow(
      op, x, p.stride, p.padding, p.dilation,
      absl::StrCat("weight ", ShapeToString(weight.shape()), " (kernel [", g.kh, ", ", g.kw, "])"),
      &g);
  return g;
}

}  // namespace

RawTensor Conv2d(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                 Conv2dParams p) {
  const Window2d g = ConvWindow("conv2d", x, weight, bias, p);
  RawTensor out = RawTensor::Empty({g.n, g.o, g.oh, g.ow}, x.dtype(), x.device());
  KernelsFor(x.device())
      .Conv2d(out, x.contiguous(), weight.contiguous(),
              bias.defined() ? bias.contiguous() : RawTensor(), g);
  return out;
}

Conv2dGrads Conv2dBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           Conv2dParams p, bool need_input, bool need_weight, bool need_bias) {
  const char* op = "conv2d_backward";
  const Window2d g = ConvWindow(op, x, weight, RawTensor(), p);
  CheckDefined(op, grad_out, "the gradient");
  CommonDevice(op, {&x, &grad_out});
  const Shape out_shape = {g.n, g.o, g.oh, g.ow};
  TG_CHECK(grad_out.shape() == out_shape, op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " does not match the output shape ",
           ShapeToString(out_shape), " of input ", ShapeToString(x.shape()), " and weight ",
           ShapeToString(weight.shape()));
  TG_CHECK(grad_out.dtype() == x.dtype(), op, ": gradient dtype ", DTypeName(grad_out.dtype()),
           " differs from input dtype ", DTypeName(x.dtype()));
  Conv2dGrads r;
  const Device device = x.device();
  if (need_input) r.grad_input = RawTensor::Empty(x.shape(), x.dtype(), device);
  if (need_weight) r.grad_weight = RawTensor::Empty(weight.shape(), x.dtype(), device);
  if (need_bias) r.grad_bias = RawTensor::Empty({g.o}, x.dtype(), device);
  if (need_input || need_weight || need_bias) {
    KernelsFor(device).Conv2dBackward(r.grad_input, r.grad_weight, r.grad_bias,
                                      grad_out.contiguous(),
                                      need_weight ? x.contiguous() : RawTensor(),
                                      need_input ? weight.contiguous() : RawTensor(), g);
  }
  return r;
}

MaxPool2dResult MaxPool2d(const RawTensor& x, std::array<int64_t, 2> kernel,
                          std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  const char* op = "max_pool2d";
  CheckDefined(op, x, "the input");
  const Device device = CommonDevice(op, {&x});
  CheckFloating(op, x.dtype());
  TG_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W], got shape ", ShapeToString(x.shape()));
  CheckPair(op, "kernel size", kernel, 1);
  CheckPair(op, "padding", padding, 0);
  // PyTorch's rule; it also guarantees that every window holds at least one input element.
  TG_CHECK(padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2, op, ": padding ",
           Pair(padding), " must be at most half the kernel size ", Pair(kernel));
  Window2d g;
  g.o = x.size(1);
  g.kh = kernel[0];
  g.kw = kernel[1];
  FillWindow(op, x, stride, padding, {1, 1}, absl::StrCat("kernel ", Pair(kernel)), &g);
  MaxPool2dResult r{RawTensor::Empty({g.n, g.c, g.oh, g.ow}, x.dtype(), device),
                    RawTensor::Empty({g.n, g.c, g.oh, g.ow}, kI64, device)};
  KernelsFor(device).MaxPool2d(r.output, r.indices, x.contiguous(), g);
  return r;
}

RawTensor MaxPool2dBackward(const RawTensor& grad_out, const RawTensor& indices,
                            const Shape& input_shape) {
  const char* op = "max_pool2d_backward";
  CheckDefined(op, grad_out, "the gradient");
  CheckDefined(op, indices, "the indices");
  const Device device = CommonDevice(op, {&grad_out, &indices});
  CheckFloating(op, grad_out.dtype());
  TG_CHECK(indices.dtype() == kI64, op, ": expected i64 indices, got ", DTypeName(indices.dtype()));
  TG_CHECK(grad_out.dim() == 4 && indices.shape() == grad_out.shape(), op, ": gradient of shape ",
           ShapeToString(grad_out.shape()), " and indices of shape ",
           ShapeToString(indices.shape()), " must be one [N, C, Ho, Wo] shape");
  TG_CHECK(input_shape.size() == 4 && input_shape[0] == grad_out.size(0) &&
               input_shape[1] == grad_out.size(1),
           op, ": input shape ", ShapeToString(input_shape), " does not match gradient of shape ",
           ShapeToString(grad_out.shape()), " (expected [", grad_out.size(0), ", ",
           grad_out.size(1), ", H, W])");
  RawTensor out = RawTensor::Empty(input_shape, grad_out.dtype(), device);
  KernelsFor(device).MaxPool2dBackward(out, grad_out.contiguous(), indices.contiguous());
  return out;
}

}  // namespace tg
