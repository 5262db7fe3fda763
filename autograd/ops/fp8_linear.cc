// Linear with FP8 GEMMs (the op list's Fp8Policy::kGemm for Linear; autograd/fp8.h): the forward
// GEMM and both backward GEMMs read FP8 operands cast by the layer's quantizers, accumulate in f32
// and write the output and gradients in their usual dtypes, as Transformer Engine's te.Linear does:
//
//   forward   y  [m, n] = act(Fp8Gemm(x_q [m, k], W_q [n, k]) + b)   (out: the autocast dtype,
//                                                                      else x's dtype)
//   backward  g = grad_y * act'(pre) in one pass (GeluTanhBackward; grad_y without act)
//             dx [m, k] = Fp8Gemm(g_q [m, n], W_q^T [k, n])          (x's dtype)
//             dW [n, k] = Fp8Gemm(g_q^T [n, m], x_q^T [k, m])        (W's dtype: the master's)
//             db [n]    = the column sums of g, in b's dtype (f32 for an f32 master)
//
// The input and weight are cast once in the forward, both ways when the backward will need the
// transposed operands (saved in FP8: a quarter of an f32 activation's memory); the output
// gradient is cast in the backward. The gradient is the straight-through one (the quantization's
// own derivative, zero almost everywhere, is not taken), so the op has no second derivative.
#include "autograd/ops/fp8_linear.h"

#include <memory>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/fp8.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/op_list.h"
#include "tensor/ops.h"

namespace tg {
namespace {

constexpr const char* kOp = "linear (FP8)";

Tensor Wrap(const RawTensor& t) { return t.defined() ? Tensor(t) : Tensor(); }

RawTensor Gemm(const Fp8Operand& a, const Fp8Operand& b, const RawTensor& bias, DType out_dtype) {
  return tg::Fp8Gemm(a.data, a.scale_inv, a.tiling, b.data, b.scale_inv, b.tiling, bias, out_dtype);
}

}  // namespace

Tensor Fp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const Fp8LinearQuantizers& quantizers, Activation act) {
  TG_CHECK(quantizers.input && quantizers.weight && quantizers.grad_output, kOp,
           ": every quantizer (input, weight, grad_output) must be set");
  TG_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(x.dim() - 1) == weight.size(1), kOp,
           ": expected x [..., in] and weight [out, in], got ", ShapeToString(x.shape()), " and ",
           ShapeToString(weight.shape()));
  TG_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), kOp,
           ": expected bias [", weight.size(0), "], got ", ShapeToString(bias.shape()));
  for (const Tensor* v : {&x, &weight, &bias}) {
    if (!v->defined()) continue;
    const DType d = v->dtype();
    TG_CHECK(d == kF32 || d == kBF16 || d == kF16, kOp,
             ": expected f32, bf16 or f16 tensors (FP8 GEMMs have no f64 form), got ",
             DTypeName(d));
  }
  const int64_t n = weight.size(0), k = weight.size(1);
  TG_CHECK(k > 0, kOp, ": in_features is 0");
  const int64_t m = x.numel() / k;
  // The output takes the dtype autocast gives a Linear (bf16/f16 inside a guard), else x's.
  const DType out_dtype = amp::AutocastTargetDType(CastPolicy::kLowPrecision, x.dtype());
  const bool recording = ShouldRecord({bias, x, weight});
  const bool need_dgrad = recording && x.requires_grad();
  const bool need_wgrad = recording && weight.requires_grad();

  const Fp8Quantized xq = quantizers.input->Quantize(x.data().reshape({m, k}).contiguous(),
                                                     /*rowwise=*/true, need_wgrad);
  const Fp8Quantized wq =
      quantizers.weight->Quantize(weight.data().contiguous(), /*rowwise=*/true, need_dgrad);
  const RawTensor b = bias.defined() ? bias.data().to(out_dtype) : RawTensor();
  Shape out_shape = x.shape();
  out_shape.back() = n;
  const RawTensor pre = Gemm(xq.rowwise, wq.rowwise, b, out_dtype).view(out_shape);
  const bool gelu = act == Activation::kGeluTanh;
  const RawTensor y = gelu ? tg::GeluTanh(pre) : pre;

  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = weight.dtype();
  const DType b_dtype = bias.defined() ? bias.dtype() : kF32;
  const Fp8Tiling x_tiling = xq.columnwise.tiling, w_tiling = wq.columnwise.tiling;
  // Edges in Linear's order (bias, input, weight): the same bucket order for DDP and ZeRO.
  return Record(
      OpNodeName(OpId::kLinear), y, {bias, x, weight},
      {Wrap(xq.columnwise.data), Wrap(xq.columnwise.scale_inv), Wrap(wq.columnwise.data),
       Wrap(wq.columnwise.scale_inv), gelu ? Tensor(pre) : Tensor()},
      [grad_quantizer = quantizers.grad_output, x_shape, x_dtype, w_dtype, b_dtype, x_tiling,
       w_tiling, m, n](const BackwardContext& ctx) -> VariableList {
        TG_CHECK(!GradMode::is_enabled(), kOp,
                 ": no second derivative (the FP8 GEMMs take the straight-through gradient); "
                 "run backward without create_graph");
        const bool needs_bias = ctx.needs(0), needs_x = ctx.needs(1), needs_w = ctx.needs(2);
        RawTensor g = ctx.grads[0].data();
        if (ctx.saved[4].defined()) g = tg::GeluTanhBackward(g, ctx.saved[4].data());
        g = g.reshape({m, n}).contiguous();
        Tensor gb, gx, gw;
        if (needs_x || needs_w) {
          const Fp8Quantized gq = grad_quantizer->Quantize(g, needs_x, needs_w);
          if (needs_x) {
            const Fp8Operand wt{ctx.saved[2].data(), ctx.saved[3].data(), w_tiling};
            gx = Tensor(Gemm(gq.rowwise, wt, RawTensor(), x_dtype).view(x_shape));
          }
          if (needs_w) {
            const Fp8Operand xt{ctx.saved[0].data(), ctx.saved[1].data(), x_tiling};
            gw = Tensor(Gemm(gq.columnwise, xt, RawTensor(), w_dtype));
          }
        }
        if (needs_bias) gb = Tensor(tg::Sum(g.to(b_dtype), {0}));
        return {gb, gx, gw};
      });
}

std::optional<Tensor> MaybeFp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                     Activation act) {
  if constexpr (Fp8PolicyOf(OpId::kLinear) != Fp8Policy::kGemm) return std::nullopt;
  Fp8Scope* scope = CurrentFp8Scope();
  if (scope == nullptr) return std::nullopt;
  const std::optional<Fp8LinearQuantizers> quantizers = scope->LinearQuantizers(weight);
  if (!quantizers) return std::nullopt;
  return Fp8Linear(x, weight, bias, *quantizers, act);
}

}  // namespace tg
