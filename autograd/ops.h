// Differentiable ops on Variables. Each runs the tensor op of the same name (tensor/ops.h)
// and, when grad mode is on and an input requires grad, records a node whose backward is made
// of these same ops, so create_graph gives higher-order gradients. Broadcasting inputs get
// their gradients summed back to their own shapes. Every op here has its entry in the op list
// (tensor/op_list.inc: its node name "<Op>Backward" and its autocast policy, and the recipe for
// adding an op). Under autocast (autograd/autocast.h) matmul, bmm, linear, conv2d and attention
// cast their inputs to the autocast dtype, and softmax, log_softmax, layer_norm, cross_entropy,
// exp, log, pow, sum and mean cast theirs to f32, as their list entries say.
//
//   tg::Variable y = tg::Matmul(x, w) + b;          // b broadcast over rows
//   tg::Variable loss = tg::Mean(tg::Mul(y, y));
//   loss.backward();                                 // b.grad() has b's shape
#ifndef TAPEGRAD_AUTOGRAD_OPS_H_
#define TAPEGRAD_AUTOGRAD_OPS_H_

#include <array>
#include <vector>

#include "autograd/fp8.h"
#include "autograd/variable.h"
#include "tensor/ops.h"

namespace tg {

// ---- Elementwise ----
Variable Add(const Variable& a, const Variable& b);
Variable Sub(const Variable& a, const Variable& b);
Variable Mul(const Variable& a, const Variable& b);
Variable Div(const Variable& a, const Variable& b);
Variable Pow(const Variable& a, const Variable& b);
Variable Pow(const Variable& x, double exponent);
Variable AddScalar(const Variable& x, double s);
Variable MulScalar(const Variable& x, double s);
Variable Neg(const Variable& x);
Variable Exp(const Variable& x);
Variable Log(const Variable& x);
Variable Sqrt(const Variable& x);
Variable Tanh(const Variable& x);
Variable Sigmoid(const Variable& x);
// x * sigmoid(x) (SiLU, "swish"); gradient s (1 + x (1 - s)) with s = sigmoid(x), differentiable.
Variable Silu(const Variable& x);
Variable Relu(const Variable& x);
// ReLU's gradient from its output y: grad where y > 0, 0 where y <= 0 (PyTorch's
// threshold_backward), in one pass; differentiable in grad (its own gradient is the same mask).
Variable ReluBackward(const Variable& grad, const Variable& y);
Variable Gelu(const Variable& x);
Variable GeluTanh(const Variable& x);
Variable Abs(const Variable& x);
Variable Erf(const Variable& x);
// cond is a plain (non-differentiable) bool tensor.
Variable Where(const Tensor& cond, const Variable& a, const Variable& b);
// Cast to `dtype`; the backward casts the gradient back to the input's dtype.
Variable Cast(const Variable& x, DType dtype);

// ---- Reductions ----
Variable Sum(const Variable& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Variable Mean(const Variable& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max over one dim; the gradient flows to the (first) arg-max.
Variable Max(const Variable& x, int64_t dim, bool keepdim = false);
// Sums `x` over broadcast dims so that it has `shape` (the adjoint of Expand).
Variable SumTo(const Variable& x, const Shape& shape);

// ---- Linear algebra ----
Variable Matmul(const Variable& a, const Variable& b);
Variable Bmm(const Variable& a, const Variable& b);
// PyTorch's linear: x [..., in] times weight [out, in] transposed, plus bias [out] (optional).
// On the CPU a Matmul and an Add; for CUDA tensors the fused op below with Activation::kNone.
Variable Linear(const Variable& x, const Variable& weight, const Variable& bias = Variable());
// act(x W^T + b) as one fused op (tensor/ops.h Linear / LinearBackward): on CUDA one cuBLASLt
// product with the bias (+ tanh-GELU) epilogue forward, and dGELU + bias-gradient epilogues
// backward; on the CPU one GEMM and one bias (+ GELU) pass per row, rounded once
// (tensor/cpu/fused_linear.cc). The pre-activation is saved for the GELU's backward. Autocast:
// like linear.
Variable Linear(const Variable& x, const Variable& weight, const Variable& bias, Activation act);

// Linear with FP8 GEMMs (autograd/ops/fp8_linear.cc has the formulas): the forward and both
// backward GEMMs read FP8 operands cast by `quantizers` (autograd/fp8.h; the recipes of
// amp/fp8.h make them) and accumulate in f32; the output has the dtype autocast gives Linear
// (x's dtype without autocast), the gradients their inputs' dtypes. f32, bf16 or f16 tensors.
// Linear runs it by itself for the weights of an installed FP8 scope (the op list's
// Fp8Policy::kGemm); call it directly to choose the quantizers yourself. With act = kGeluTanh the
// GELU is applied to the GEMM's output and its derivative taken in one pass in the backward (as
// Linear's fused epilogue). No second derivative.
Variable Fp8Linear(const Variable& x, const Variable& weight, const Variable& bias,
                   const Fp8LinearQuantizers& quantizers, Activation act = Activation::kNone);

// ---- Views and shape ops ----
Variable Reshape(const Variable& x, const Shape& shape);
Variable Transpose(const Variable& x, int64_t dim0, int64_t dim1);
Variable Permute(const Variable& x, const Shape& dims);
Variable Expand(const Variable& x, const Shape& shape);
Variable Slice(const Variable& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Variable Select(const Variable& x, int64_t dim, int64_t index);
// torch.narrow: Slice(x, dim, start, start + length); start may be negative.
Variable Narrow(const Variable& x, int64_t dim, int64_t start, int64_t length);
Variable Unsqueeze(const Variable& x, int64_t dim);
Variable Squeeze(const Variable& x, int64_t dim);
Variable Cat(const VariableList& xs, int64_t dim);
Variable Stack(const VariableList& xs, int64_t dim);
VariableList Split(const Variable& x, int64_t split_size, int64_t dim);
// out[i][j] = x[i][index[i][j]] along `dim` (torch.gather); index is i64/i32 of x's rank.
Variable Gather(const Variable& x, int64_t dim, const Tensor& index);
// Rows of x [n, ...] selected by a 1-D index (torch.index_select on dim 0).
Variable IndexSelect(const Variable& x, const Tensor& index);

// ---- Neural-network ops ----
Variable Softmax(const Variable& x);
Variable LogSoftmax(const Variable& x);
// weight/bias may be undefined.
Variable LayerNorm(const Variable& x, const Variable& weight, const Variable& bias,
                   double eps = 1e-5);
Variable Embedding(const Variable& weight, const Tensor& indices);
Variable CrossEntropy(const Variable& logits, const Tensor& targets, int64_t ignore_index = -100,
                      Reduction reduction = Reduction::kMean);
// The same loss computed together with d loss / d logits in one pass (tensor/ops.h
// CrossEntropyWithGrad: on CUDA one kernel, no host synchronisation), which the node keeps
// instead of the logits; the backward scales it by the loss gradient. First order only: a
// create_graph backward through it throws (use CrossEntropy). Autocast: like cross_entropy.
Variable FusedCrossEntropy(const Variable& logits, const Tensor& targets,
                           int64_t ignore_index = -100, Reduction reduction = Reduction::kMean);
// softmax(scale * q k^T + causal mask) v over heads q [B, H, Tq, D], k and v [B, H, Tk, D]
// (tensor/ops.h ScaledDotProductAttention): on CUDA cuDNN's fused flash attention where the
// tensors qualify; the backward recomputes the probabilities from the saved log-sum-exps.
// Autocast: a low-precision op like matmul. No dropout on the probabilities.
Variable ScaledDotProductAttention(const Variable& q, const Variable& k, const Variable& v,
                                   bool causal, double scale);
// 2-D convolution over x [N, C, H, W] with weight [O, C, kh, kw] and bias [O] (optional), and
// max pooling (tensor/ops.h has the shapes and PyTorch's output-size rule). Under autocast
// conv2d is a kLowPrecision op like linear (x, weight and bias are cast; the f32 weight's cast is
// cached); max_pool2d keeps its input's dtype. The gradient of max_pool2d goes to the selected
// element of each window. Both backwards are differentiable again (create_graph).
Variable Conv2d(const Variable& x, const Variable& weight, const Variable& bias = Variable(),
                Conv2dParams p = {});
Variable MaxPool2d(const Variable& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                   std::array<int64_t, 2> padding = {0, 0});
class Generator;
// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training.
Variable Dropout(const Variable& x, double p, Generator& gen, bool training = true);

// ---- In place (bump the version counter; PyTorch's rules: not on a leaf that requires grad,
// nor on a view of one, while grad mode is on). On a view (Variable::is_view) the base's history
// is rewritten (PyTorch's CopySlices: docs/semantics.md, "Views") ----
const Variable& AddInPlace(const Variable& self, const Variable& other);
const Variable& MulInPlace(const Variable& self, const Variable& other);
const Variable& MulScalarInPlace(const Variable& self, double s);
const Variable& ReluInPlace(const Variable& self);
// self.copy_(src): src broadcasts to self's shape and is converted to self's dtype.
const Variable& CopyInPlace(const Variable& self, const Variable& src);
// self.fill_(value) (zero_() is FillInPlace(self, 0)).
const Variable& FillInPlace(const Variable& self, double value);

inline Variable operator+(const Variable& a, const Variable& b) { return Add(a, b); }
inline Variable operator-(const Variable& a, const Variable& b) { return Sub(a, b); }
inline Variable operator*(const Variable& a, const Variable& b) { return Mul(a, b); }
inline Variable operator/(const Variable& a, const Variable& b) { return Div(a, b); }
inline Variable operator-(const Variable& x) { return Neg(x); }

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_H_
