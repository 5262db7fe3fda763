// Differentiable ops on Tensors. Each runs the tensor op of the same name (tensor/ops.h)
// and, when grad mode is on and an input requires grad, records a node whose backward is made
// of these same ops, so create_graph gives higher-order gradients. Broadcasting inputs get
// their gradients summed back to their own shapes. Every op here has its entry in the op list
// (tensor/op_list.inc: its node name "<Op>Backward" and its autocast policy, and the recipe for
// adding an op). Under autocast (autograd/autocast.h) matmul, bmm, linear, conv2d and attention
// cast their inputs to the autocast dtype, and softmax, log_softmax, layer_norm, cross_entropy,
// exp, log, pow, sum and mean cast theirs to f32, as their list entries say.
//
//   tg::Tensor y = tg::Matmul(x, w) + b;          // b broadcast over rows
//   tg::Tensor loss = tg::Mean(tg::Mul(y, y));
//   loss.backward();                                 // b.grad() has b's shape
#ifndef TAPEGRAD_AUTOGRAD_OPS_H_
#define TAPEGRAD_AUTOGRAD_OPS_H_

#include <array>
#include <vector>

#include "autograd/variable.h"
#include "tensor/ops.h"

namespace tg {

// ---- Elementwise ----
Tensor Add(const Tensor& a, const Tensor& b);
Tensor Sub(const Tensor& a, const Tensor& b);
Tensor Mul(const Tensor& a, const Tensor& b);
Tensor Div(const Tensor& a, const Tensor& b);
Tensor Pow(const Tensor& a, const Tensor& b);
Tensor Pow(const Tensor& x, double exponent);
Tensor AddScalar(const Tensor& x, double s);
Tensor MulScalar(const Tensor& x, double s);
Tensor Neg(const Tensor& x);
Tensor Exp(const Tensor& x);
Tensor Log(const Tensor& x);
Tensor Sqrt(const Tensor& x);
Tensor Tanh(const Tensor& x);
Tensor Sigmoid(const Tensor& x);
// x * sigmoid(x) (SiLU, "swish"); gradient s (1 + x (1 - s)) with s = sigmoid(x), differentiable.
Tensor Silu(const Tensor& x);
Tensor Relu(const Tensor& x);
// ReLU's gradient from its output y: grad where y > 0, 0 where y <= 0 (PyTorch's
// threshold_backward), in one pass; differentiable in grad (its own gradient is the same mask).
Tensor ReluBackward(const Tensor& grad, const Tensor& y);
Tensor Gelu(const Tensor& x);
Tensor GeluTanh(const Tensor& x);
Tensor Abs(const Tensor& x);
Tensor Erf(const Tensor& x);
// cond is a plain (non-differentiable) bool tensor.
Tensor Where(const RawTensor& cond, const Tensor& a, const Tensor& b);
// Cast to `dtype`; the backward casts the gradient back to the input's dtype.
Tensor Cast(const Tensor& x, DType dtype);

// ---- Reductions ----
Tensor Sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor Mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max over one dim; the gradient flows to the (first) arg-max.
Tensor Max(const Tensor& x, int64_t dim, bool keepdim = false);
// Sums `x` over broadcast dims so that it has `shape` (the adjoint of Expand).
Tensor SumTo(const Tensor& x, const Shape& shape);

// ---- Linear algebra ----
Tensor Matmul(const Tensor& a, const Tensor& b);
Tensor Bmm(const Tensor& a, const Tensor& b);
// PyTorch's linear: x [..., in] times weight [out, in] transposed, plus bias [out] (optional).
// On the CPU a Matmul and an Add; for CUDA tensors the fused op below with Activation::kNone.
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// act(x W^T + b) as one fused op (tensor/ops.h Linear / LinearBackward): on CUDA one cuBLASLt
// product with the bias (+ tanh-GELU) epilogue forward, and dGELU + bias-gradient epilogues
// backward; on the CPU one GEMM and one bias (+ GELU) pass per row, rounded once
// (tensor/cpu/fused_linear.cc). The pre-activation is saved for the GELU's backward. Autocast:
// like linear.
Tensor Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);

// ---- Views and shape ops ----
Tensor Reshape(const Tensor& x, const Shape& shape);
Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor Permute(const Tensor& x, const Shape& dims);
Tensor Expand(const Tensor& x, const Shape& shape);
Tensor Slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor Select(const Tensor& x, int64_t dim, int64_t index);
// torch.narrow: Slice(x, dim, start, start + length); start may be negative.
Tensor Narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor Unsqueeze(const Tensor& x, int64_t dim);
Tensor Squeeze(const Tensor& x, int64_t dim);
Tensor Cat(const VariableList& xs, int64_t dim);
Tensor Stack(const VariableList& xs, int64_t dim);
VariableList Split(const Tensor& x, int64_t split_size, int64_t dim);
// out[i][j] = x[i][index[i][j]] along `dim` (torch.gather); index is i64/i32 of x's rank.
Tensor Gather(const Tensor& x, int64_t dim, const RawTensor& index);
// Rows of x [n, ...] selected by a 1-D index (torch.index_select on dim 0).
Tensor IndexSelect(const Tensor& x, const RawTensor& index);

// ---- Neural-network ops ----
Tensor Softmax(const Tensor& x);
Tensor LogSoftmax(const Tensor& x);
// weight/bias may be undefined.
Tensor LayerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// transformers' LlamaRMSNorm over the last dim (tensor/ops.h LlamaRmsNorm): weight * round_x(h *
// rsqrt(mean(h^2) + eps)) with h = x in f32 (f64 for f64), in promote(weight, x)'s dtype; one
// kernel forward and backward where the device has it. Differentiable in x and weight, to any
// order.
Tensor LlamaRmsNorm(const Tensor& x, const Tensor& weight, double eps);
// Rotary embeddings in rotate_half layout (tensor/ops.h RotaryEmbedding): x [..., T, d] times the
// constant tables cos, sin [T, d] of x's dtype and device; differentiable in x, to any order.
Tensor RotaryEmbedding(const Tensor& x, const RawTensor& cos, const RawTensor& sin);
// SwiGLU's gated product silu(gate) * up (tensor/ops.h Swiglu: the bits of Silu then Mul, one
// pass forward and one backward where the device has the kernels); mixed dtypes promote.
Tensor Swiglu(const Tensor& gate, const Tensor& up);
Tensor Embedding(const Tensor& weight, const RawTensor& indices);
Tensor CrossEntropy(const Tensor& logits, const RawTensor& targets, int64_t ignore_index = -100,
                    Reduction reduction = Reduction::kMean);
// The same loss computed together with d loss / d logits in one pass (tensor/ops.h
// CrossEntropyWithGrad: on CUDA one kernel, no host synchronisation), which the node keeps
// instead of the logits; the backward scales it by the loss gradient. First order only: a
// create_graph backward through it throws (use CrossEntropy). Autocast: like cross_entropy.
Tensor FusedCrossEntropy(const Tensor& logits, const RawTensor& targets,
                         int64_t ignore_index = -100, Reduction reduction = Reduction::kMean);
// softmax(scale * q k^T + causal mask) v over heads q [B, H, Tq, D], k and v [B, Hkv, Tk, D]
// with Hkv dividing H (grouped-query attention, no repeated copies on the CPU)
// (tensor/ops.h ScaledDotProductAttention): on CUDA cuDNN's fused flash attention where the
// tensors qualify; the backward recomputes the probabilities from the saved log-sum-exps.
// Autocast: a low-precision op like matmul. No dropout on the probabilities.
Tensor ScaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                 double scale);
// 2-D convolution over x [N, C, H, W] with weight [O, C, kh, kw] and bias [O] (optional), and
// max pooling (tensor/ops.h has the shapes and PyTorch's output-size rule). Under autocast
// conv2d is a kLowPrecision op like linear (x, weight and bias are cast; the f32 weight's cast is
// cached); max_pool2d keeps its input's dtype. The gradient of max_pool2d goes to the selected
// element of each window. Both backwards are differentiable again (create_graph).
Tensor Conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Conv2dParams p = {});
Tensor MaxPool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                 std::array<int64_t, 2> padding = {0, 0});
class Generator;
// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor Dropout(const Tensor& x, double p, Generator& gen, bool training = true);

// ---- In place (bump the version counter; PyTorch's rules: not on a leaf that requires grad,
// nor on a view of one, while grad mode is on). On a view (Tensor::is_view) the base's history
// is rewritten (PyTorch's CopySlices: docs/semantics.md, "Views") ----
const Tensor& AddInPlace(const Tensor& self, const Tensor& other);
const Tensor& MulInPlace(const Tensor& self, const Tensor& other);
const Tensor& MulScalarInPlace(const Tensor& self, double s);
const Tensor& ReluInPlace(const Tensor& self);
// self.copy_(src): src broadcasts to self's shape and is converted to self's dtype.
const Tensor& CopyInPlace(const Tensor& self, const Tensor& src);
// self.fill_(value) (zero_() is FillInPlace(self, 0)).
const Tensor& FillInPlace(const Tensor& self, double value);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return Add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return Sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return Mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return Div(a, b); }
inline Tensor operator-(const Tensor& x) { return Neg(x); }
// With a number on either side (autograd/ops/methods.cc): the number kept in the compute
// precision, the result in the tensor's dtype.
Tensor operator+(const Tensor& x, double s);
Tensor operator+(double s, const Tensor& x);
Tensor operator-(const Tensor& x, double s);
Tensor operator-(double s, const Tensor& x);
Tensor operator*(const Tensor& x, double s);
Tensor operator*(double s, const Tensor& x);
Tensor operator/(const Tensor& x, double s);
Tensor operator/(double s, const Tensor& x);
// Comparisons: bool tensors without history, as libtorch's.
inline Tensor operator==(const Tensor& a, const Tensor& b) { return a.eq(b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return a.ne(b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return a.lt(b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return a.le(b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return a.gt(b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return a.ge(b); }
inline Tensor operator==(const Tensor& a, double b) { return a.eq(b); }
inline Tensor operator!=(const Tensor& a, double b) { return a.ne(b); }
inline Tensor operator<(const Tensor& a, double b) { return a.lt(b); }
inline Tensor operator<=(const Tensor& a, double b) { return a.le(b); }
inline Tensor operator>(const Tensor& a, double b) { return a.gt(b); }
inline Tensor operator>=(const Tensor& a, double b) { return a.ge(b); }

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_OPS_H_
