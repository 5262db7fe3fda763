// Differentiable elementwise ops. Backward formulas are written with the differentiable ops
// themselves, so they record when create_graph is on.
#include <cmath>

#include "autograd/dispatch_mode.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/ops/autocast_inputs.h"
#include "tensor/op_list.h"

namespace tg {
namespace {

// The gradient of a broadcast input: summed back to the input's shape.
Tensor Reduce(const Tensor& g, const Tensor& input) { return SumTo(g, input.shape()); }

// A 0-d constant of x's dtype on x's device (binary ops take no implicit device transfers).
RawTensor ScalarTensor(double v, const RawTensor& like) {
  return RawTensor::Full({}, v, like.dtype(), like.device());
}

Tensor ScalarLike(const Tensor& x, double v) { return Tensor(ScalarTensor(v, x.data())); }

}  // namespace

Tensor Add(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  return Record(
      OpNodeName(OpId::kAdd),
      Dispatch<OpId::kAdd>([&] { return tg::Add(a.data(), b.data()); }, a, b), {a, b}, {},
      [sa, sb](const BackwardContext& ctx) -> VariableList {
        const Tensor& g = ctx.grads[0];
        return {ctx.needs(0) ? SumTo(g, sa) : Tensor(), ctx.needs(1) ? SumTo(g, sb) : Tensor()};
      });
}

Tensor Sub(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  return Record(OpNodeName(OpId::kSub),
                Dispatch<OpId::kSub>([&] { return tg::Sub(a.data(), b.data()); }, a, b), {a, b}, {},
                [sa, sb](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  return {ctx.needs(0) ? SumTo(g, sa) : Tensor(),
                          ctx.needs(1) ? SumTo(Neg(g), sb) : Tensor()};
                });
}

// The shape of forward input i, from the node its gradient goes to (valid when ctx.needs(i)):
// for an operand the node did not save.
const Shape& InputShape(const BackwardContext& ctx, size_t i) {
  const Edge& e = ctx.edges[i];
  return e.fn->input_metadata()[e.input_nr].shape;
}

// As PyTorch's derivatives.yaml: each operand is saved only when the other one's gradient needs
// it, so an in-place write into an operand nothing needs does not break the backward (the
// differential oracle found the difference: tools/semantics).
Tensor Mul(const Tensor& a, const Tensor& b) {
  return Record(OpNodeName(OpId::kMul),
                Dispatch<OpId::kMul>([&] { return tg::Mul(a.data(), b.data()); }, a, b), {a, b},
                {b.requires_grad() ? a : Tensor(), a.requires_grad() ? b : Tensor()},
                [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  const Tensor& a = ctx.saved[0];
                  const Tensor& b = ctx.saved[1];
                  return {ctx.needs(0) ? SumTo(Mul(g, b), InputShape(ctx, 0)) : Tensor(),
                          ctx.needs(1) ? SumTo(Mul(g, a), InputShape(ctx, 1)) : Tensor()};
                });
}

Tensor Div(const Tensor& a, const Tensor& b) {
  // b is needed by both gradients; a only by b's (PyTorch's derivatives.yaml).
  return Record(OpNodeName(OpId::kDiv),
                Dispatch<OpId::kDiv>([&] { return tg::Div(a.data(), b.data()); }, a, b), {a, b},
                {b.requires_grad() ? a : Tensor(), b},
                [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  const Tensor& a = ctx.saved[0];
                  const Tensor& b = ctx.saved[1];
                  // d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
                  return {ctx.needs(0) ? SumTo(Div(g, b), InputShape(ctx, 0)) : Tensor(),
                          ctx.needs(1) ? Reduce(Neg(Div(Mul(g, a), Mul(b, b))), b) : Tensor()};
                });
}

Tensor Pow(const Tensor& a, const Tensor& b) {
  if (const auto in = AutocastInputs(OpId::kPow, a, b)) return Pow(in[0], in[1]);
  return Record(OpNodeName(OpId::kPow),
                Dispatch<OpId::kPow>([&] { return tg::Pow(a.data(), b.data()); }, a, b), {a, b},
                {a, b}, [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  const Tensor& a = ctx.saved[0];
                  const Tensor& b = ctx.saved[1];
                  // d/da = b a^(b-1); d/db = a^b log a (0 where a == 0, as in PyTorch)
                  Tensor ga, gb;
                  if (ctx.needs(0))
                    ga = Reduce(Mul(g, Mul(b, Pow(a, Sub(b, ScalarLike(b, 1))))), a);
                  if (ctx.needs(1)) {
                    const RawTensor zero = tg::Eq(a.data(), ScalarTensor(0, a.data()));
                    Tensor term = Mul(Pow(a, b), Log(a));
                    term = Where(zero, Tensor(ScalarTensor(0, term.data())), term);
                    gb = Reduce(Mul(g, term), b);
                  }
                  return {ga, gb};
                });
}

Tensor Pow(const Tensor& x, double exponent) {
  if (const auto in = AutocastInputs(OpId::kPow, x)) return Pow(in[0], exponent);
  return Record("PowScalarBackward",
                Dispatch<OpId::kPow>([&] { return tg::Pow(x.data(), exponent); }, x), {x}, {x},
                [exponent](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  if (exponent == 0) return {MulScalar(ctx.grads[0], 0)};
                  return {Mul(ctx.grads[0], MulScalar(Pow(x, exponent - 1), exponent))};
                });
}

Tensor AddScalar(const Tensor& x, double s) {
  return Record(OpNodeName(OpId::kAddScalar),
                Dispatch<OpId::kAddScalar>([&] { return tg::AddScalar(x.data(), s); }, x), {x}, {},
                [](const BackwardContext& ctx) -> VariableList { return {ctx.grads[0]}; });
}

Tensor MulScalar(const Tensor& x, double s) {
  return Record(
      OpNodeName(OpId::kMulScalar),
      Dispatch<OpId::kMulScalar>([&] { return tg::MulScalar(x.data(), s); }, x), {x}, {},
      [s](const BackwardContext& ctx) -> VariableList { return {MulScalar(ctx.grads[0], s)}; });
}

Tensor Neg(const Tensor& x) {
  return Record(OpNodeName(OpId::kNeg), Dispatch<OpId::kNeg>([&] { return tg::Neg(x.data()); }, x),
                {x}, {},
                [](const BackwardContext& ctx) -> VariableList { return {Neg(ctx.grads[0])}; });
}

Tensor Exp(const Tensor& x) {
  if (const auto in = AutocastInputs(OpId::kExp, x)) return Exp(in[0]);
  return Record(
      OpNodeName(OpId::kExp), Dispatch<OpId::kExp>([&] { return tg::Exp(x.data()); }, x), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        return {Mul(ctx.grads[0], ctx.saved[0])};  // saved[0] is the result
      },
      /*save_output=*/true);
}

Tensor Log(const Tensor& x) {
  if (const auto in = AutocastInputs(OpId::kLog, x)) return Log(in[0]);
  return Record(
      OpNodeName(OpId::kLog), Dispatch<OpId::kLog>([&] { return tg::Log(x.data()); }, x), {x}, {x},
      [](const BackwardContext& ctx) -> VariableList { return {Div(ctx.grads[0], ctx.saved[0])}; });
}

Tensor Sqrt(const Tensor& x) {
  return Record(
      OpNodeName(OpId::kSqrt), Dispatch<OpId::kSqrt>([&] { return tg::Sqrt(x.data()); }, x), {x},
      {},
      [](const BackwardContext& ctx) -> VariableList {
        // d sqrt(x) = 1 / (2 sqrt(x))
        return {Div(ctx.grads[0], MulScalar(ctx.saved[0], 2))};
      },
      /*save_output=*/true);
}

Tensor Tanh(const Tensor& x) {
  return Record(
      OpNodeName(OpId::kTanh), Dispatch<OpId::kTanh>([&] { return tg::Tanh(x.data()); }, x), {x},
      {},
      [](const BackwardContext& ctx) -> VariableList {
        const Tensor& y = ctx.saved[0];
        return {Mul(ctx.grads[0], AddScalar(Neg(Mul(y, y)), 1))};  // 1 - y^2
      },
      /*save_output=*/true);
}

Tensor Sigmoid(const Tensor& x) {
  return Record(
      OpNodeName(OpId::kSigmoid),
      Dispatch<OpId::kSigmoid>([&] { return tg::Sigmoid(x.data()); }, x), {x}, {},
      [](const BackwardContext& ctx) -> VariableList {
        const Tensor& y = ctx.saved[0];
        return {Mul(ctx.grads[0], Mul(y, AddScalar(Neg(y), 1)))};  // y (1 - y)
      },
      /*save_output=*/true);
}

Tensor Silu(const Tensor& x) {
  return Record(OpNodeName(OpId::kSilu),
                Dispatch<OpId::kSilu>([&] { return tg::Silu(x.data()); }, x), {x}, {x},
                [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  const Tensor s = Sigmoid(x);
                  // d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s))
                  return {Mul(ctx.grads[0], Mul(s, AddScalar(Mul(x, AddScalar(Neg(s), 1)), 1)))};
                });
}

Tensor Relu(const Tensor& x) {
  return Record(
      OpNodeName(OpId::kRelu), Dispatch<OpId::kRelu>([&] { return tg::Relu(x.data()); }, x), {x},
      {},
      [](const BackwardContext& ctx) -> VariableList {
        return {ReluBackward(ctx.grads[0], ctx.saved[0])};
      },
      /*save_output=*/true);
}

Tensor ReluBackward(const Tensor& grad, const Tensor& y) {
  return Record(OpNodeName(OpId::kReluBackward),
                Dispatch<OpId::kReluBackward>(
                    [&] { return tg::ReluBackward(grad.data(), y.data()); }, grad, y),
                {grad}, {y}, [](const BackwardContext& ctx) -> VariableList {
                  return {ReluBackward(ctx.grads[0], ctx.saved[0])};
                });
}

Tensor Erf(const Tensor& x) {
  return Record(OpNodeName(OpId::kErf), Dispatch<OpId::kErf>([&] { return tg::Erf(x.data()); }, x),
                {x}, {x}, [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  const double k2OverSqrtPi = 1.1283791670955126;
                  return {Mul(ctx.grads[0], MulScalar(Exp(Neg(Mul(x, x))), k2OverSqrtPi))};
                });
}

Tensor Gelu(const Tensor& x) {
  return Record(OpNodeName(OpId::kGelu),
                Dispatch<OpId::kGelu>([&] { return tg::Gelu(x.data()); }, x), {x}, {x},
                [](const BackwardContext& ctx) -> VariableList {
                  // d/dx x Phi(x) = Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2
                  const Tensor& x = ctx.saved[0];
                  const double kInvSqrt2 = 0.7071067811865476, kInvSqrt2Pi = 0.3989422804014327;
                  Tensor cdf = MulScalar(AddScalar(Erf(MulScalar(x, kInvSqrt2)), 1), 0.5);
                  Tensor pdf = MulScalar(Exp(MulScalar(Mul(x, x), -0.5)), kInvSqrt2Pi);
                  return {Mul(ctx.grads[0], Add(cdf, Mul(x, pdf)))};
                });
}

Tensor GeluTanh(const Tensor& x) {
  return Record(OpNodeName(OpId::kGeluTanh),
                Dispatch<OpId::kGeluTanh>([&] { return tg::GeluTanh(x.data()); }, x), {x}, {x},
                [](const BackwardContext& ctx) -> VariableList {
                  const Tensor& x = ctx.saved[0];
                  // One pass in the compute dtype (tensor/elementwise_formulas.h has the
                  // formula), rounded once; recorded (create_graph), the same formula with
                  // differentiable ops:
                  if (!GradMode::is_enabled()) {
                    return {Tensor(tg::GeluTanhBackward(ctx.grads[0].data(), x.data()))};
                  }
                  // y = x/2 (1 + tanh u), u = k (x + c x^3):
                  // dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) k (1 + 3 c x^2)
                  const double k = 0.7978845608028654, c = 0.044715;
                  Tensor x2 = Mul(x, x);
                  Tensor t = Tanh(MulScalar(Add(x, MulScalar(Mul(x2, x), c)), k));
                  Tensor left = MulScalar(AddScalar(t, 1), 0.5);
                  Tensor du = MulScalar(AddScalar(MulScalar(x2, 3 * c), 1), k);
                  Tensor right = Mul(MulScalar(x, 0.5), Mul(AddScalar(Neg(Mul(t, t)), 1), du));
                  return {Mul(ctx.grads[0], Add(left, right))};
                });
}

Tensor Abs(const Tensor& x) {
  return Record(OpNodeName(OpId::kAbs), Dispatch<OpId::kAbs>([&] { return tg::Abs(x.data()); }, x),
                {x}, {x}, [](const BackwardContext& ctx) -> VariableList {
                  // sign(x), 0 at 0 (as in PyTorch)
                  const RawTensor& x = ctx.saved[0].data();
                  const RawTensor zero = ScalarTensor(0, x);
                  const RawTensor sign =
                      tg::Sub(tg::Gt(x, zero).to(x.dtype()), tg::Lt(x, zero).to(x.dtype()));
                  return {Mul(ctx.grads[0], Tensor(sign))};
                });
}

Tensor Where(const RawTensor& cond, const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  return Record(OpNodeName(OpId::kWhere),
                Dispatch<OpId::kWhere>([&] { return tg::Where(cond, a.data(), b.data()); },
                                       Tensor(cond), a, b),
                {a, b}, {Tensor(cond)}, [sa, sb](const BackwardContext& ctx) -> VariableList {
                  const Tensor& g = ctx.grads[0];
                  const RawTensor& c = ctx.saved[0].data();
                  const Tensor zero(ScalarTensor(0, g.data()));
                  return {ctx.needs(0) ? SumTo(Where(c, g, zero), sa) : Tensor(),
                          ctx.needs(1) ? SumTo(Where(c, zero, g), sb) : Tensor()};
                });
}

Tensor Cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  if (!IsFloating(dtype)) return Tensor(x.data().to(dtype));  // integers carry no gradient
  const DType from = x.dtype();
  return Record(
      OpNodeName(OpId::kCast), Dispatch<OpId::kCast>([&] { return x.data().to(dtype); }, x), {x},
      {},
      [from](const BackwardContext& ctx) -> VariableList { return {Cast(ctx.grads[0], from)}; });
}

}  // namespace tg
