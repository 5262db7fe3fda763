// CPU kernels behind the dispatch in tensor/ops.cc. Inputs arrive validated: shapes broadcast to
// the output, dtypes already promoted, outputs allocated by the caller. Kernels only loop;
// checks that need the data (index ranges) are theirs and throw tg::Error like the dispatch.
#ifndef TAPEGRAD_TENSOR_CPU_KERNELS_H_
#define TAPEGRAD_TENSOR_CPU_KERNELS_H_

#include <vector>

#include "tensor/op_kinds.h"
#include "tensor/tensor.h"

namespace tg::cpu {

// out = op(a, b); a and b have out's dtype and broadcast to out's shape.
void Binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void BinaryScalar(BinaryOp op, const Tensor& out, const Tensor& x, double scalar);
// out (bool) = op(a, b); a and b share a dtype.
void Compare(CompareOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void Unary(UnaryOp op, const Tensor& out, const Tensor& x);
void Where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);

// Row reductions: x is contiguous [rows, n]; out is contiguous [rows].
void SumRows(const Tensor& out, const Tensor& x);
void MaxRows(const Tensor& values, const Tensor& indices,
             const Tensor& x);  // either may be undefined

// out [batch..., m, n] contiguous = a [batch..., m, k] @ b [batch..., k, n] (any strides,
// batch dims equal to out's, stride 0 allowed for broadcast batch dims).
void Matmul(const Tensor& out, const Tensor& a, const Tensor& b);

// x, out contiguous [rows, n].
void Softmax(const Tensor& out, const Tensor& x, bool log);
// x, out contiguous [rows, n]; mean, rstd contiguous [rows]; weight/bias [n] or undefined.
void LayerNorm(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
               const Tensor& weight, const Tensor& bias, double eps);
// out contiguous [count, dim]; weight [vocab, dim]; indices contiguous i64 [count].
void Embedding(const Tensor& out, const Tensor& weight, const Tensor& indices);
// out contiguous zero-initialised [rows, dim]; grad contiguous [count, dim].
void EmbeddingBackward(const Tensor& out, const Tensor& grad, const Tensor& indices);
// losses contiguous [N] (logits dtype); logits contiguous [N, C]; targets contiguous i64 [N].
// Returns the number of rows not ignored.
int64_t CrossEntropy(const Tensor& losses, const Tensor& logits, const Tensor& targets,
                     int64_t ignore_index);
// grad_logits contiguous [N, C]; row_scale contiguous f64 [N]: the loss gradient of each row.
void CrossEntropyBackward(const Tensor& grad_logits, const Tensor& logits, const Tensor& targets,
                          const Tensor& row_scale, int64_t ignore_index);

// Indexing along `dim` (tensor/cpu/index.cc); index is contiguous i64 and range-checked here.
// out contiguous with index's shape; x any strides.
void Gather(const Tensor& out, const Tensor& x, const Tensor& index, int64_t dim);
// out contiguous, holding self's values; src any strides, index.size(d) <= src.size(d).
void ScatterAdd(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim);
// out contiguous [x.shape with index.numel() at dim]; index [k].
void IndexSelect(const Tensor& out, const Tensor& x, const Tensor& index, int64_t dim);
// out contiguous, holding self's values; src any strides with index.numel() at dim.
void IndexAdd(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim);

// Convolution and max pooling over [N, C, H, W] (tensor/cpu/conv.cc); Window2d is in op_kinds.h.
// out contiguous [N, O, Ho, Wo]; x, weight [O, C, kh, kw], bias [O] (or undefined) contiguous,
// all of out's dtype.
void Conv2d(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
            const Window2d& g);
// Each gradient is contiguous and allocated by the caller, or undefined when not wanted;
// grad_out, x and weight contiguous (x is read only for grad_weight, weight for grad_input).
void Conv2dBackward(const Tensor& grad_input, const Tensor& grad_weight, const Tensor& grad_bias,
                    const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                    const Window2d& g);
// out contiguous [N, C, Ho, Wo] (x's dtype), indices contiguous i64 of the same shape; x
// contiguous.
void MaxPool2d(const Tensor& out, const Tensor& indices, const Tensor& x, const Window2d& g);
// grad_input contiguous [N, C, H, W]; grad_out and indices contiguous [N, C, Ho, Wo]; indices
// are range-checked here.
void MaxPool2dBackward(const Tensor& grad_input, const Tensor& grad_out, const Tensor& indices);

bool AnyNonFinite(const Tensor& t);
// t = t * scale in place; returns whether any element was non-finite before scaling.
bool ScaleInPlace(const Tensor& t, double scale, bool check_finite);

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_KERNELS_H_
