// The tensor ops: non-differentiable kernels, one dispatch point per op keyed by device (each op
// named in the op list, tensor/op_list.inc; its kernels in the kernel list,
// tensor/kernel_list.inc). CPU kernels live in tensor/cpu; the CUDA backend implements the same
// list. Every op validates shapes, dtypes and devices first and throws tg::Error naming the op and
// the offending values. Binary ops broadcast (numpy rules) and promote dtypes (PromoteTypes);
// f16/bf16 compute in f32 and round the result, so an overflowing f16 result is inf exactly as on a
// GPU.
//
//   tg::RawTensor logits = tg::Matmul(x, w);                  // [batch, vocab]
//   tg::RawTensor loss = tg::CrossEntropy(logits, targets);   // 0-d, mean over non-ignored rows
//   tg::RawTensor p = tg::Softmax(logits);                    // over the last dim
#ifndef TAPEGRAD_TENSOR_OPS_H_
#define TAPEGRAD_TENSOR_OPS_H_

#include <array>
#include <vector>

#include "tensor/fp8_scale.h"
#include "tensor/generator.h"
#include "tensor/loss_scale_update.h"
#include "tensor/op_kinds.h"
#include "tensor/optimizer_kernels.h"
#include "tensor/tensor.h"

namespace tg {

// ---- Elementwise, with broadcasting -----------------------------------------------------------
RawTensor Binary(BinaryOp op, const RawTensor& a, const RawTensor& b);
// Result dtype kBool.
RawTensor Compare(CompareOp op, const RawTensor& a, const RawTensor& b);
RawTensor Unary(UnaryOp op, const RawTensor& x);
// op(x, scalar) with the scalar kept in the compute precision (f32 for f16/bf16, like PyTorch);
// the result keeps x's dtype.
RawTensor BinaryScalar(BinaryOp op, const RawTensor& x, double scalar);

inline RawTensor Add(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kAdd, a, b);
}
inline RawTensor Sub(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kSub, a, b);
}
inline RawTensor Mul(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kMul, a, b);
}
// True division; integer inputs are rejected (cast them first).
inline RawTensor Div(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kDiv, a, b);
}
inline RawTensor Pow(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kPow, a, b);
}
inline RawTensor Pow(const RawTensor& a, double exponent) {
  return BinaryScalar(BinaryOp::kPow, a, exponent);
}
// Elementwise max/min; NaN in either input gives NaN (torch.maximum/minimum).
inline RawTensor Maximum(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kMaximum, a, b);
}
inline RawTensor Minimum(const RawTensor& a, const RawTensor& b) {
  return Binary(BinaryOp::kMinimum, a, b);
}
// ReLU's gradient from its output y: grad where y > 0 (or NaN), 0 where y <= 0. One pass.
inline RawTensor ReluBackward(const RawTensor& grad, const RawTensor& y) {
  return Binary(BinaryOp::kReluBackward, grad, y);
}
// grad * GeluTanh'(x) in one pass (f32 for f16/bf16, rounded once).
inline RawTensor GeluTanhBackward(const RawTensor& grad, const RawTensor& x) {
  return Binary(BinaryOp::kGeluTanhBackward, grad, x);
}
inline RawTensor AddScalar(const RawTensor& x, double s) {
  return BinaryScalar(BinaryOp::kAdd, x, s);
}
inline RawTensor MulScalar(const RawTensor& x, double s) {
  return BinaryScalar(BinaryOp::kMul, x, s);
}

inline RawTensor Neg(const RawTensor& x) { return Unary(UnaryOp::kNeg, x); }
inline RawTensor Abs(const RawTensor& x) { return Unary(UnaryOp::kAbs, x); }
inline RawTensor Exp(const RawTensor& x) { return Unary(UnaryOp::kExp, x); }
inline RawTensor Log(const RawTensor& x) { return Unary(UnaryOp::kLog, x); }
inline RawTensor Sqrt(const RawTensor& x) { return Unary(UnaryOp::kSqrt, x); }
inline RawTensor Tanh(const RawTensor& x) { return Unary(UnaryOp::kTanh, x); }
inline RawTensor Sigmoid(const RawTensor& x) { return Unary(UnaryOp::kSigmoid, x); }
inline RawTensor Silu(const RawTensor& x) { return Unary(UnaryOp::kSilu, x); }
inline RawTensor Relu(const RawTensor& x) { return Unary(UnaryOp::kRelu, x); }
// gelu(x) = x/2 (1 + erf(x/sqrt 2)); the tanh approximation (GPT-2's) is
// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline RawTensor Gelu(const RawTensor& x) { return Unary(UnaryOp::kGelu, x); }
inline RawTensor GeluTanh(const RawTensor& x) { return Unary(UnaryOp::kGeluTanh, x); }
inline RawTensor Erf(const RawTensor& x) { return Unary(UnaryOp::kErf, x); }

inline RawTensor Eq(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kEq, a, b);
}
inline RawTensor Ne(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kNe, a, b);
}
inline RawTensor Lt(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kLt, a, b);
}
inline RawTensor Le(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kLe, a, b);
}
inline RawTensor Gt(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kGt, a, b);
}
inline RawTensor Ge(const RawTensor& a, const RawTensor& b) {
  return Compare(CompareOp::kGe, a, b);
}

// cond ? a : b, broadcasting all three; cond is bool (or u8, nonzero = true).
RawTensor Where(const RawTensor& cond, const RawTensor& a, const RawTensor& b);

// Dropout's keep mask on `device`: 0 where the element is dropped, 1 where it is kept, in
// `dtype` (floating), with element i (row-major) decided by the generator's i-th next draw:
// dropped iff gen.NextUniform() < p. The draws are made where the mask lives (a CUDA kernel
// computes the generator's Philox stream itself; nothing is uploaded) and the generator
// advances by numel draws, so CPU and CUDA masks are equal for the same generator state.
// p in [0, 1).
RawTensor DropoutMask(const Shape& shape, double p, Generator& gen, DType dtype, Device device);

// ---- Reductions -------------------------------------------------------------------------------
// Floating inputs accumulate in f64 and round once; integer and bool inputs sum to i64.
// An empty `dims` reduces every dim.
RawTensor Sum(const RawTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Floating inputs only.
RawTensor Mean(const RawTensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Max over one dim (NaN wins, like torch.max); throws on an empty dim.
RawTensor Max(const RawTensor& x, int64_t dim, bool keepdim = false);
// Index (i64) of the first maximum over one dim; a NaN counts as the maximum.
RawTensor Argmax(const RawTensor& x, int64_t dim, bool keepdim = false);

// ---- Linear algebra ---------------------------------------------------------------------------
// a [..., m, k] @ b [..., k, n] -> [..., m, n]; batch dims broadcast; 2-D @ 2-D is a GEMM.
// f32/f64 go to OpenBLAS (transposed views are passed as transposes, not copied); f16/bf16
// multiply in oneDNN (f32 sums) where the CPU does bf16 natively (AVX-512 BF16, AMX), else
// convert to f32 and multiply there; either way each result is rounded once.
RawTensor Matmul(const RawTensor& a, const RawTensor& b);
// Strict batched matmul: a [b, m, k], b [b, k, n].
RawTensor Bmm(const RawTensor& a, const RawTensor& b);

// ---- Neural-network kernels (over the last dim) ------------------------------------------------
// exp(x - max) / sum exp(x - max), computed in f32 (f64 for f64) and rounded to x's dtype.
RawTensor Softmax(const RawTensor& x);
RawTensor LogSoftmax(const RawTensor& x);

struct LayerNormResult {
  RawTensor output;  // x's shape and dtype
  RawTensor mean;    // [x.shape[:-1]] f32 (f64 for f64 input), saved for the backward
  RawTensor rstd;    // [x.shape[:-1]] 1/sqrt(var + eps), biased variance
};
// Normalises over the last dim; weight and bias ([last dim], either may be undefined) scale and
// shift.
LayerNormResult LayerNorm(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                          double eps = 1e-5);

// weight [vocab, dim], indices i32/i64 of any shape -> [indices.shape..., dim].
RawTensor Embedding(const RawTensor& weight, const RawTensor& indices);
// The gradient of Embedding: grad [indices.shape..., dim] scatter-added into zeros
// [num_rows, dim] (accumulated in f32/f64, rounded once).
RawTensor EmbeddingBackward(const RawTensor& grad, const RawTensor& indices, int64_t num_rows);

// logits [N, C], targets [N] i32/i64 in [0, C) or == ignore_index. Mean averages over the
// rows that are not ignored (NaN when all are ignored, as in PyTorch). kNone gives [N] with
// zeros at ignored rows. Result in logits' dtype, computed in f32/f64.
RawTensor CrossEntropy(const RawTensor& logits, const RawTensor& targets,
                       int64_t ignore_index = -100, Reduction reduction = Reduction::kMean);
// d loss / d logits for CrossEntropy with the gradient of the (reduced) loss `grad_loss`
// (0-d for kMean/kSum, [N] for kNone): (softmax - onehot) * grad, zero rows where ignored.
RawTensor CrossEntropyBackward(const RawTensor& logits, const RawTensor& targets,
                               const RawTensor& grad_loss, int64_t ignore_index = -100,
                               Reduction reduction = Reduction::kMean);

// ---- Convolution and pooling over [N, C, H, W] (tensor/cpu/conv.cc) ----------------------------
// PyTorch semantics (torch.nn.functional.conv2d with groups = 1, max_pool2d with dilation 1 and
// ceil_mode = false). Pairs are {height, width}. Each output size is
//   floor((in + 2 * padding - dilation * (kernel - 1) - 1) / stride) + 1,
// and must be at least 1 (a kernel larger than the padded input is an error). Only 4-D (batched)
// inputs are accepted. f32/f64 compute natively; f16/bf16 sum in f32 and round each result once.
struct Conv2dParams {
  std::array<int64_t, 2> stride = {1, 1};    // positive
  std::array<int64_t, 2> padding = {0, 0};   // zeros on both sides, non-negative
  std::array<int64_t, 2> dilation = {1, 1};  // positive
};
// Cross-correlation: x [N, C, H, W], weight [O, C, kh, kw], bias [O] or undefined, all of one
// floating dtype -> [N, O, Ho, Wo]. On the CPU, oneDNN's convolution for f32 and bf16 (f16 on f32
// copies) where it has a fast implementation for the shape; f64 and the rest: im2col + OpenBLAS
// GEMMs (one per chunk of images, or per image when C*kh*kw is small).
RawTensor Conv2d(const RawTensor& x, const RawTensor& weight, const RawTensor& bias = RawTensor(),
                 Conv2dParams p = {});
struct Conv2dGrads {
  RawTensor grad_input;   // x's shape; undefined unless need_input
  RawTensor grad_weight;  // weight's shape; undefined unless need_weight
  RawTensor grad_bias;    // [O]; undefined unless need_bias
};
// The gradients of Conv2d(x, weight, bias, p) for grad_out [N, O, Ho, Wo] (x's dtype). Only the
// shapes and dtypes of x and weight are used, except that grad_weight reads x's values and
// grad_input reads weight's. grad_input is a transposed convolution (oneDNN's backward-data, or
// col2im of weight^T @ grad_out), grad_weight sums grad_out against the patches of x over the
// batch (oneDNN's backward-weights, or grad_out @ im2col(x)^T), grad_bias sums grad_out over
// N, Ho, Wo (in f64, rounded once).
Conv2dGrads Conv2dBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           Conv2dParams p, bool need_input = true, bool need_weight = true,
                           bool need_bias = true);

struct MaxPool2dResult {
  RawTensor output;   // [N, C, Ho, Wo], x's dtype
  RawTensor indices;  // [N, C, Ho, Wo] i64: the flat index h * W + w of the max in its H x W plane
};
// Max over each window of x [N, C, H, W] (floating). Padding counts as -inf (it is never
// selected) and must be at most half the kernel, as in PyTorch. Ties pick the first maximum in
// row-major window order; a NaN is always selected (the last NaN of the window, as PyTorch's
// CPU kernel does).
MaxPool2dResult MaxPool2d(const RawTensor& x, std::array<int64_t, 2> kernel,
                          std::array<int64_t, 2> stride, std::array<int64_t, 2> padding = {0, 0});
// grad_out [N, C, Ho, Wo] scatter-added at `indices` (i64, grad_out's shape) into zeros of
// input_shape [N, C, H, W] (accumulated in f32/f64 and rounded once).
RawTensor MaxPool2dBackward(const RawTensor& grad_out, const RawTensor& indices,
                            const Shape& input_shape);

// ---- Indexing along one dim (PyTorch semantics) ------------------------------------------------
// Indices are i32/i64 and must lie in [0, size of `dim`) (negative indices are rejected, as in
// torch.gather). Scatter ops accumulate repeated indices (in f64 for floating dtypes, rounding
// each output element once) and return a new tensor; bool tensors are rejected.
//
// torch.gather: for dim 1, out[i][j][k] = x[i][index[i][j][k]][k]. index has x's rank and
// index.size(d) <= x.size(d) for d != dim; the result has index's shape and x's dtype.
RawTensor Gather(const RawTensor& x, int64_t dim, const RawTensor& index);
// torch.scatter_add: a copy of self with, for dim 1, src[i][j][k] added at
// [i][index[i][j][k]][k]. index, self and src have one rank; index.size(d) <= src.size(d) for
// every d and <= self.size(d) for d != dim; src has self's dtype. The adjoint of Gather.
RawTensor ScatterAdd(const RawTensor& self, int64_t dim, const RawTensor& index,
                     const RawTensor& src);
// torch.index_select: the slices index[0], index[1], ... of `dim`; index is 1-D (or 0-d, one
// index). The result is x's shape with index.numel() at dim.
RawTensor IndexSelect(const RawTensor& x, int64_t dim, const RawTensor& index);
// torch.index_add: a copy of self with slice i of src added at slice index[i] of `dim`; src has
// self's dtype and shape except index.numel() at dim. The adjoint of IndexSelect.
RawTensor IndexAdd(const RawTensor& self, int64_t dim, const RawTensor& index,
                   const RawTensor& src);

// ---- Lists of tensors (mixed precision) -------------------------------------------------------
// Whether any element of any floating tensor is inf or NaN; integer tensors are skipped (a
// host-side answer: on the CPU it is free; the CUDA backend's version of this synchronises).
bool AnyNonFinite(const std::vector<RawTensor>& tensors);
// t *= scale for each tensor, in place (computed in f32/f64, rounded to each tensor's dtype).
void MulScalarInPlace(const std::vector<RawTensor>& tensors, double scale);
// PyTorch's _amp_foreach_non_finite_check_and_unscale_: multiplies every tensor by inv_scale
// (0-d f32) in place and sets found_inf (0-d f32) to 1 if any element was inf/NaN before
// scaling; found_inf is never reset to 0 here, so it accumulates across calls.
void NonFiniteCheckAndUnscale(const std::vector<RawTensor>& tensors, const RawTensor& found_inf,
                              const RawTensor& inv_scale);

// The loss scaler's state machine (tensor/loss_scale_update.h) kept with the tensors, so that a
// training step on a device never reads it back:
//   RawTensor state = LossScaleStateTensor(scaler.state(), device);   // u8 bytes of the POD
//   StepLossScale(state, found_inf, scale, inv_scale);             // every step
//   scaler.load_state(ReadLossScaleState(state));                  // logs, checkpoints
// StepLossScale runs UpdateLossScale(state, found_inf != 0) where the state lives (found_inf: a
// one-element f32, or undefined for a clean step), then writes scale and inv_scale (one-element
// f32 each, or undefined) as LossScaleOutputs does; WriteLossScale writes them without updating.
RawTensor LossScaleStateTensor(const LossScaleState& state, Device device);
// Waits for the device (a host read).
LossScaleState ReadLossScaleState(const RawTensor& state);
void StepLossScale(const RawTensor& state, const RawTensor& found_inf, const RawTensor& scale,
                   const RawTensor& inv_scale);
void WriteLossScale(const RawTensor& state, const RawTensor& scale, const RawTensor& inv_scale);

// ---- FP8 (tensor/ops_fp8.cc) ------------------------------------------------------------------
// The casts and the GEMM of FP8 training (amp/fp8.h drives them with the scaling recipes of
// amp/fp8_recipe.h). x is [..., cols] of f32, bf16 or f16 on any device, taken as the matrix
// [rows = product of the leading dims, cols]; scales and amaxes are f32 grids of `tiling`'s tiles
// (tensor/fp8_scale.h) on x's device. Nothing here reads a value on the host.

// The tiles' amaxes of x (largest |x|, NaN skipped): f32 [grid rows, grid cols].
RawTensor Fp8Amax(const RawTensor& x, Fp8Tiling tiling);

struct Fp8Scales {
  RawTensor scale;      // multiplies x before the cast
  RawTensor scale_inv;  // 1 / scale: dequantizes (what Fp8Gemm takes)
};
// TE's scale rule (Fp8ScaleFromAmax) applied to every element of the f32 tensor amax; throws
// tg::Error for options outside their domain (fp8_max and value_for_inf finite and > 0,
// amax_epsilon finite and >= 0).
Fp8Scales Fp8ScaleFromAmax(const RawTensor& amax, const Fp8ScaleOptions& options);

struct Fp8CastResult {
  RawTensor data;    // [rows, cols] of dtype (f8e4m3 or f8e5m2)
  RawTensor data_t;  // [cols, rows], data transposed; undefined unless asked for
  RawTensor amax;    // the tiles' amaxes of x (as Fp8Amax); undefined unless asked for
};
// Casts x * scale (scale: `tiling`'s grid for x) to `dtype` in one pass (saturating, rounding
// to nearest even), with the transpose and the amax when asked for.
Fp8CastResult Fp8Cast(const RawTensor& x, const RawTensor& scale, Fp8Tiling tiling, DType dtype,
                      bool transpose = false, bool amax = false);

// out [m, n] (out_dtype: f32, bf16 or f16) = dequantized a [m, k] @ dequantized b [n, k]^T
// (+ bias [n] of out_dtype, or undefined), accumulated in f32 and rounded once: the kernel
// list's Fp8Gemm has the exact rule. a and b are 2-D FP8 (not both f8e5m2) on one device with
// their scale_inv grids of a_tiling and b_tiling.
RawTensor Fp8Gemm(const RawTensor& a, const RawTensor& a_scale_inv, Fp8Tiling a_tiling,
                  const RawTensor& b, const RawTensor& b_scale_inv, Fp8Tiling b_tiling,
                  const RawTensor& bias, DType out_dtype);

// ---- Fused ops -------------------------------------------------------------------------------
// Compositions of the ops above that a training step runs often enough to fuse, each an entry of
// the kernel list (tensor/kernel_list.inc) that every device implements: on CUDA a few library calls
// or kernels (cuBLASLt epilogues, cuDNN fused attention, one-pass loss and norm kernels), on the
// CPU one-pass loops around the GEMM, computed in f32 (f64 for f64) and rounded once per output.
// Where a device has no kernel for a case it declines, and the op runs the composition
// (tensor/composed.h); all agree to within rounding order.


struct LinearResult {
  RawTensor output;          // [..., out], x's dtype
  RawTensor pre_activation;  // x W^T + b (output's shape and dtype), saved for the backward;
                             // undefined for Activation::kNone
};
// output = act(x @ weight^T + bias) for x [..., in], weight [out, in] and bias [out] (or
// undefined), all of one floating dtype and device. The product and bias add accumulate in f32
// (f64 for f64); the activation reads the unrounded pre-activation, and each output rounds once.
// On CUDA pre_activation may be a view with padded rows (cuBLASLt wants the GELU input's row
// stride to be a multiple of 8): hand it back to LinearBackward as it is.
LinearResult Linear(const RawTensor& x, const RawTensor& weight, const RawTensor& bias,
                    Activation act = Activation::kNone);

struct LinearGrads {
  RawTensor grad_input;   // x's shape; undefined unless need_input
  RawTensor grad_weight;  // [out, in]; undefined unless need_weight
  RawTensor grad_bias;    // [out]; undefined unless need_bias
};
// The gradients of Linear(x, weight, bias, act) for grad_out (output's shape and dtype), with
// pre_activation from the forward (ignored for kNone). g = grad_out * act'(pre_activation) is
// computed in f32/f64 and rounded to the dtype once (as the CUDA epilogue stores it); then
// grad_input = g @ weight, grad_weight = g^T @ x over all leading dims, and grad_bias = the sum
// of g over all leading dims (accumulated in f32 or wider).
LinearGrads LinearBackward(const RawTensor& grad_out, const RawTensor& x, const RawTensor& weight,
                           const RawTensor& pre_activation, Activation act, bool need_input = true,
                           bool need_weight = true, bool need_bias = true);

struct AttentionResult {
  RawTensor output;  // [B, H, Tq, D], q's dtype
  RawTensor stats;   // [B, H, Tq] f32 (f64 for f64): each query's log-sum-exp of its scaled, masked
                     // scores, saved for the backward
};
// softmax(scale * q @ k^T + mask) @ v for heads q [B, H, Tq, D], k and v [B, Hkv, Tk, D] of one
// floating dtype and device, Hkv dividing H (grouped-query attention: key/value head j serves
// query heads j * H/Hkv .. (j + 1) * H/Hkv - 1, the bits of repeating them); the mask is -inf above
// the diagonal when causal (which needs Tq == Tk). Scores and softmax are computed in f32 (f64 for
// f64), and the probabilities are rounded to the input dtype before they multiply v, as flash
// attention does. On CUDA it runs cuDNN's fused kernel when the tensors qualify (f16/bf16, head
// size a multiple of 8 up to 128, aligned strides); on the CPU a fused kernel per (batch, head)
// with the same rounding points (tensor/cpu/fused_attention.cc); any case a device's kernel
// declines runs the one composed form of the ops above (tensor/composed.h). The output is laid out
// as the device's backend prefers (DevicePreferences::attention_layout of tensor/kernel_table.h).
AttentionResult ScaledDotProductAttention(const RawTensor& q, const RawTensor& k,
                                          const RawTensor& v, bool causal, double scale);

struct AttentionGrads {
  RawTensor grad_q, grad_k, grad_v;  // q's, k's and v's shapes and dtype
};
// The gradients of ScaledDotProductAttention for grad_out (output's shape and dtype), from the
// forward's inputs, output and stats, with its causal and scale. The probabilities are
// recomputed from the stats, p = exp(s - stats); with delta = sum_d grad_out * output,
// grad_v = p^T @ grad_out, ds = p * (grad_out @ v^T - delta) * scale, grad_q = ds @ k and
// grad_k = ds^T @ q (p and ds rounded to the input dtype before their products).
AttentionGrads ScaledDotProductAttentionBackward(const RawTensor& grad_out, const RawTensor& q,
                                                 const RawTensor& k, const RawTensor& v,
                                                 const RawTensor& output, const RawTensor& stats,
                                                 bool causal, double scale);

struct LayerNormGrads {
  RawTensor grad_input;   // x's shape and dtype
  RawTensor grad_weight;  // [last dim]; undefined unless need_weight_bias
  RawTensor grad_bias;    // [last dim]; undefined unless need_weight_bias
};
// The gradients of LayerNorm from its saved statistics (LayerNormResult::mean and rstd), with
// xhat = (x - mean) * rstd and dxhat = grad_out * weight (grad_out when weight is undefined):
//   grad_input  = rstd * (dxhat - mean_n(dxhat) - xhat * mean_n(dxhat * xhat))
//   grad_weight = sum of grad_out * xhat over all leading dims
//   grad_bias   = sum of grad_out over all leading dims
// computed in f32 (f64 for f64) and rounded once. grad_out has x's shape and dtype; weight is
// [last dim] of x's dtype or undefined. The gradients of weight and bias are returned whenever
// need_weight_bias, even if the forward had no weight or bias.
LayerNormGrads LayerNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                 const RawTensor& mean, const RawTensor& rstd,
                                 const RawTensor& weight, bool need_weight_bias = true);

// transformers' LlamaRMSNorm over the last dim of x (any floating dtype): h = x in the compute
// dtype (f32; f64 for f64), rstd = 1 / sqrt(mean(h^2) + eps), output = weight * round_x(h * rstd)
// in promote(weight, x)'s dtype (a bf16 model rounds the normalised value and the product apart, as
// transformers does; f32 weights under autocast give f32). weight [n] floating, eps > 0 finite.
// One pass per row where the device has the kernel (weight of x's dtype), else the composed ops.
struct LlamaRmsNormResult {
  RawTensor output;  // x's shape
  RawTensor rstd;    // x's shape without the last dim, the compute dtype
};
LlamaRmsNormResult LlamaRmsNorm(const RawTensor& x, const RawTensor& weight, double eps);
struct LlamaRmsNormGrads {
  RawTensor grad_input;   // x's shape and dtype
  RawTensor grad_weight;  // weight's shape and dtype; undefined unless need_weight
};
// The gradients of LlamaRmsNorm from its saved rstd (the normalised value's rounding passes the
// gradient through, as a cast does): dn = grad_out * weight, grad_input = rstd * dn - h * rstd^3
// * mean(dn * h), grad_weight = the sum over rows of grad_out * round_x(h * rstd). grad_out has
// the output's shape and dtype.
LlamaRmsNormGrads LlamaRmsNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                       const RawTensor& rstd, const RawTensor& weight,
                                       bool need_weight = true);

// Rotary embeddings in transformers' rotate_half layout: x [..., T, d] (floating, d even) times
// cos, sin [T, d] (x's dtype and device): out = x * cos + rotate_half(x) * sin with
// rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]), each product and the sum rounded to x's dtype
// (the three tensor ops' bits), contiguous. One pass where the device has the kernel.
RawTensor RotaryEmbedding(const RawTensor& x, const RawTensor& cos, const RawTensor& sin);
// Its gradient for grad_out (x's shape and dtype): grad_out * cos - rotate_half(grad_out * sin),
// rounded as the tensor ops' backward rounds it.
RawTensor RotaryEmbeddingBackward(const RawTensor& grad_out, const RawTensor& cos,
                                  const RawTensor& sin);

// SwiGLU's gated product silu(gate) * up (Llama's MLP: down(silu(gate(x)) * up(x))) with the bits
// of Mul(Silu(gate), up), in one pass where the device has the kernel. gate and up floating of one
// shape and device; mixed dtypes promote (as Mul's).
RawTensor Swiglu(const RawTensor& gate, const RawTensor& up);
struct SwigluGrads {
  RawTensor grad_gate;  // gate's shape and dtype
  RawTensor grad_up;    // up's shape and dtype
};
// Its gradients for grad_out (the output's shape), with the bits of Mul's and Silu's backward
// formulas (autograd/ops/elementwise.cc), in one pass where the device has the kernel.
SwigluGrads SwigluBackward(const RawTensor& grad_out, const RawTensor& gate, const RawTensor& up);

struct AddLayerNormResult {
  RawTensor residual;    // a + b, rounded to their dtype
  LayerNormResult norm;  // LayerNorm(residual, weight, bias, eps)
};
// residual = a + b, then LayerNorm of it, in one pass where the device has the kernel: the
// residual-stream update and pre-norm of a transformer block. a and b share a shape and a
// floating dtype; weight, bias and eps as for LayerNorm.
AddLayerNormResult AddLayerNorm(const RawTensor& a, const RawTensor& b, const RawTensor& weight,
                                const RawTensor& bias, double eps);

struct CrossEntropyResult {
  RawTensor loss;         // CrossEntropy(logits, targets, ignore_index, reduction)
  RawTensor grad_logits;  // [N, C], logits' dtype
};
// The loss and d(grad_scale * loss)/d(logits) in one call: for kMean and kSum the gradient of
// the reduced loss, for kNone that of the sum of the per-row losses (every row's loss gradient
// is grad_scale). Equal to CrossEntropy followed by CrossEntropyBackward with grad_loss =
// grad_scale, reading each row of logits once for both, with no host synchronisation (the
// mean's row count stays on the device).
CrossEntropyResult CrossEntropyWithGrad(const RawTensor& logits, const RawTensor& targets,
                                        int64_t ignore_index = -100,
                                        Reduction reduction = Reduction::kMean,
                                        double grad_scale = 1.0);

// ---- Optimizer multi-tensor ops (tensor/optimizer_kernels.h) ----
// One pass per parameter over a list of the parameters of one device, with the arithmetic,
// rounding and order of the kernel list's contracts (tensor/kernel_list.inc: FusedAdam, FusedSgd,
// GlobalGradNorm, ClipByNorm); where the device's kernel declines a case (CUDA: L2 decay, f64 or
// f16/bf16 parameters without f32 masters, SGD, strided tensors) the composed form
// (tensor/composed.h) runs instead, bit-identical: Adam's reads inv_scale, found_inf and
// device_step on the host; SGD's decides found_inf and momentum_buffers_valid on the device
// (Where), so it waits for nothing. Each throws tg::Error naming the op for lists of different lengths, tensors on
// different devices, mismatched shapes, non-floating or wrong state dtypes, or invalid options.

// Adam / AdamW over every parameter of `lists` (an empty list does nothing).
void FusedAdam(const AdamTensorLists& lists, const FusedAdamOptions& options);
// SGD with momentum, dampening, Nesterov and L2 weight decay over every parameter of `lists`.
void FusedSgd(const SgdTensorLists& lists, const FusedSgdOptions& options);
// The joint norm (norm_type > 0, or infinity) of every element of the non-empty list `tensors`
// (floating, one device) as a new 0-d tensor of `dtype` (f64 or f32) on their device, summed in
// f64; NaN anywhere gives NaN. No host wait on a device.
RawTensor GlobalGradNorm(const std::vector<RawTensor>& tensors, double norm_type,
                         DType dtype = kF64);
// a + alpha * b rounded once (a fused multiply-add), as PyTorch's CPU `add(a, b, alpha=...)`:
// a and b floating, of one device and shape, b of a's dtype or a narrower one that promotes to
// it (widened exactly, as torch adds a bf16 tensor to an f32 one); the result has a's. (The CPU
// and CUDA have the fused kernel; on a device without it the composed form rounds twice.)
RawTensor AddScaled(const RawTensor& a, const RawTensor& b, double alpha);
// PyTorch's CPU addcmul, self + value * t1 * t2 as fma(round(value * t1), t2, self) in the
// compute dtype (f16/bf16: in f32, rounded once at the end): three floating tensors of one dtype,
// device and shape; the result has theirs.
RawTensor Addcmul(const RawTensor& self, const RawTensor& t1, const RawTensor& t2, double value);
// PyTorch's lerp, a + w (b - a) for |w| < 0.5, else b - (b - a) (1 - w), in the compute dtype
// (f16/bf16 widened, rounded once at the end) with w rounded to it, b - a rounded, and the rest
// one fused multiply-add (torch's CPU kernel); a and b floating, of one dtype, device and shape,
// weight finite.
RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight);
// Lerp(a, b, weight).to(dtype) for a floating dtype, in one pass where the device can (the CPU,
// from f32 or f64 to a narrower dtype: one rounding of the f32 or f64 value).
RawTensor Lerp(const RawTensor& a, const RawTensor& b, double weight, DType dtype);
// torch's in-place forms, self.add_(b, alpha=alpha) and self.lerp_(end, weight): AddScaled and
// Lerp written into self (the same bits), in one pass where self is contiguous and the other
// input does not partly overlap it, else through a new tensor copied in. With self_scale != 1,
// self.mul_(self_scale).add_(b, alpha=alpha): self scaled as MulScalarInPlace scales it first,
// in the same pass where the device can (the CPU, for f32 and f64).
void AddScaledInPlace(const RawTensor& self, const RawTensor& b, double alpha,
                      double self_scale = 1);
void LerpInPlace(const RawTensor& self, const RawTensor& end, double weight);
// Muon's Newton-Schulz orthogonalisation (torch.optim.Muon's, optim/muon.h) of every matrix of x
// [batch, m, n] (floating, not FP8; m <= n: a tall matrix arrives transposed) in x's dtype, as
// the kernel list's NewtonSchulz computes it: the matrices of one shape go through the iteration
// together. Returns a new contiguous tensor of x's shape and dtype. Throws tg::Error naming the
// op for another rank, a tall matrix, a dtype it does not take, ns_steps outside 0..99 or a
// non-finite coefficient or eps.
RawTensor NewtonSchulz(const RawTensor& x, double a, double b, double c, int64_t ns_steps,
                       double eps);
// Multiplies every tensor in place by clip_coef = max_norm / (total_norm + 1e-6) (double, rounded
// to each tensor's compute dtype) when total_norm (0-d f64 or f32 on the tensors' device) is
// finite and clip_coef < 1; otherwise changes nothing. The decision is taken where the norm lives.
void ClipByNorm(const std::vector<RawTensor>& tensors, const RawTensor& total_norm,
                double max_norm);

// Operators for readable formulas.
inline RawTensor operator+(const RawTensor& a, const RawTensor& b) { return Add(a, b); }
inline RawTensor operator-(const RawTensor& a, const RawTensor& b) { return Sub(a, b); }
inline RawTensor operator*(const RawTensor& a, const RawTensor& b) { return Mul(a, b); }
inline RawTensor operator/(const RawTensor& a, const RawTensor& b) { return Div(a, b); }
inline RawTensor operator-(const RawTensor& x) { return Neg(x); }

}  // namespace tg

#endif  // TAPEGRAD_TENSOR_OPS_H_
