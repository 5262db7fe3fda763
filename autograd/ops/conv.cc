// Differentiable conv2d and max_pool2d (NCHW, tensor/ops.h).
//
// The first-order backward of conv2d runs the fused tensor kernel (one pass over the batch for
// all the gradients needed). When the backward itself is recorded (create_graph), the input and
// weight gradients are built from two recorded ops instead, each the adjoint of conv2d in one
// argument, so derivatives of every order exist:
//   grad_input(g, w)  = conv2d_x^T g   -> d/dg: conv2d(gg, w),   d/dw: grad_weight(g, x = gg)
//   grad_weight(g, x) = conv2d_w^T g   -> d/dg: conv2d(x, gg),   d/dx: grad_input(g, w = gg)
// max_pool2d saves its argmax indices; its gradient scatters into them, and the gradient of that
// scatter is a gather at the same indices.
#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/autocast_inputs.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

Tensor Wrap(const RawTensor& t) { return t.defined() ? Tensor(t) : Tensor(); }

Tensor Conv2dGradWeight(const Tensor& g, const Tensor& x, const Shape& weight_shape,
                        Conv2dParams p);

// The input gradient of conv2d for output gradient g and weight w; `x` supplies the input's
// shape and dtype only.
Tensor Conv2dGradInput(const Tensor& g, const Tensor& w, const RawTensor& x, Conv2dParams p) {
  const RawTensor gx = tg::Conv2dBackward(g.data(), x, w.data(), p, /*need_input=*/true,
                                          /*need_weight=*/false, /*need_bias=*/false)
                           .grad_input;
  return Record("Conv2dGradInputBackward", gx, {g, w}, {g, w},
                [p](const BackwardContext& ctx) -> VariableList {
                  const Tensor& gg = ctx.grads[0];  // x's shape
                  const Tensor& g = ctx.saved[0];
                  const Tensor& w = ctx.saved[1];
                  Tensor dg, dw;
                  if (ctx.needs(0)) dg = Conv2d(gg, w, Tensor(), p);
                  if (ctx.needs(1)) dw = Conv2dGradWeight(g, gg, w.shape(), p);
                  return {dg, dw};
                });
}

// The weight gradient of conv2d for output gradient g and input x.
Tensor Conv2dGradWeight(const Tensor& g, const Tensor& x, const Shape& weight_shape,
                        Conv2dParams p) {
  // Only the weight's shape and dtype are read: a broadcast zero stands in for it.
  const RawTensor w_like =
      RawTensor::Zeros({1, 1, 1, 1}, x.dtype(), x.data().device()).expand(weight_shape);
  const RawTensor gw = tg::Conv2dBackward(g.data(), x.data(), w_like, p, /*need_input=*/false,
                                          /*need_weight=*/true, /*need_bias=*/false)
                           .grad_weight;
  return Record("Conv2dGradWeightBackward", gw, {g, x}, {g, x},
                [p](const BackwardContext& ctx) -> VariableList {
                  const Tensor& gg = ctx.grads[0];  // the weight's shape
                  const Tensor& g = ctx.saved[0];
                  const Tensor& x = ctx.saved[1];
                  Tensor dg, dx;
                  if (ctx.needs(0)) dg = Conv2d(x, gg, Tensor(), p);
                  if (ctx.needs(1)) dx = Conv2dGradInput(g, gg, x.data(), p);
                  return {dg, dx};
                });
}

// The input gradient of max_pool2d: g scattered (added) at the saved indices.
Tensor MaxPool2dGradInput(const Tensor& g, const RawTensor& indices, const Shape& input_shape) {
  return Record(
      "MaxPool2dGradInputBackward", tg::MaxPool2dBackward(g.data(), indices, input_shape), {g},
      {Tensor(indices)}, [input_shape](const BackwardContext& ctx) -> VariableList {
        // The adjoint of the scatter: gather the incoming gradient at the same indices.
        const RawTensor& idx = ctx.saved[0].data();
        const int64_t n = idx.size(0), c = idx.size(1);
        const Tensor flat = Reshape(ctx.grads[0], {n, c, input_shape[2] * input_shape[3]});
        const Tensor picked = Gather(flat, 2, idx.reshape({n, c, idx.size(2) * idx.size(3)}));
        return {Reshape(picked, idx.shape())};
      });
}

}  // namespace

Tensor Conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dParams p) {
  if (const auto in = AutocastInputs(OpId::kConv2d, x, weight, bias)) {
    return Conv2d(in[0], in[1], in[2], p);
  }
  const RawTensor out = Dispatch<OpId::kConv2d>(
      [&] {
        return tg::Conv2d(x.data(), weight.data(), bias.defined() ? bias.data() : RawTensor(), p);
      },
      x, weight, bias);
  return Record(OpNodeName(OpId::kConv2d), out, {x, weight, bias}, {x, weight},
                [p](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  const Tensor& x = ctx.saved[0];
                  const Tensor& w = ctx.saved[1];
                  if (!GradMode::is_enabled()) {
                    Conv2dGrads r = tg::Conv2dBackward(g.data(), x.data(), w.data(), p,
                                                       ctx.needs(0), ctx.needs(1), ctx.needs(2));
                    return {Wrap(r.grad_input), Wrap(r.grad_weight), Wrap(r.grad_bias)};
                  }
                  Tensor gx, gw, gb;
                  if (ctx.needs(0)) gx = Conv2dGradInput(g, w, x.data(), p);
                  if (ctx.needs(1)) gw = Conv2dGradWeight(g, x, w.shape(), p);
                  if (ctx.needs(2)) gb = Cast(Sum(g, {0, 2, 3}), g.dtype());
                  return {gx, gw, gb};
                });
}

Tensor MaxPool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> padding) {
  const MaxPool2dResult r = Dispatch<OpId::kMaxPool2d>(
      [&] { return tg::MaxPool2d(x.data(), kernel, stride, padding); }, x);
  const Shape input_shape = x.shape();
  return Record(OpNodeName(OpId::kMaxPool2d), r.output, {x}, {Tensor(r.indices)},
                [input_shape](const BackwardContext& ctx) -> VariableList {
                  return {MaxPool2dGradInput(ctx.grads[0], ctx.saved[0].data(), input_shape)};
                });
}

}  // namespace tg
