// Matrix products on CUDA through cuBLASLt, with the fused epilogues that a Linear layer with a
// GELU uses (bias, GELU, their gradients), and the switch that lets f32 products use TF32.
//
// tg::cuda::Matmul (tensor/cuda/kernels.h) is the plain product behind tg::Matmul; MatmulEx adds
// transposes, alpha/beta and the epilogues. Both take row-major tapegrad tensors: cuBLASLt is
// column-major, so out = op(a) @ op(b) is computed as out^T = op(b)^T @ op(a)^T, which is the
// same memory read column-major (no copies). An operand whose last two dims are neither
// row-major nor column-major (e.g. a slice with a step) is made contiguous first.
//
// Precision: f16/bf16 inputs accumulate in f32 (CUBLAS_COMPUTE_32F) and round once on output;
// f64 computes in f64. f32 computes in full f32 by default (CUBLAS_COMPUTE_32F, no TF32),
// because tapegrad compares CUDA with CPU results at f32 tolerances; an AllowTf32Scope on the
// calling thread lets f32 products use TF32 tensor cores (10-bit mantissa inputs, f32
// accumulation) where speed matters more, like torch.backends.cuda.matmul.allow_tf32.
//
// A two-layer MLP, y = gelu(x W1^T + b1) W2^T + b2, forward and backward (all on one device):
//
//   // forward; pre [M, H] keeps the GELU input for the backward (row stride a multiple of 8)
//   MatmulEx(h, x, false, w1, /*transpose_b=*/true, Epilogue::kBiasGelu, b1, pre);
//   MatmulEx(y, h, false, w2, /*transpose_b=*/true, Epilogue::kBias, b2, RawTensor());
//   // backward: dW2 = dy^T h, and db2 = the column sums of dy in the same product
//   MatmulEx(dw2, dy, /*transpose_a=*/true, h, false, Epilogue::kBgrad, db2, RawTensor());
//   // dpre = (dy W2) * gelu'(pre), and db1 = the column sums of dpre
//   MatmulEx(dpre, dy, false, w2, false, Epilogue::kDGeluBgrad, db1, pre);
//   MatmulEx(dw1, dpre, /*transpose_a=*/true, x, false, Epilogue::kNone, RawTensor(), RawTensor());
//   MatmulEx(dx, dpre, false, w1, false, Epilogue::kNone, RawTensor(), RawTensor());
#ifndef TAPEGRAD_TENSOR_CUDA_BLAS_H_
#define TAPEGRAD_TENSOR_CUDA_BLAS_H_

#include <string>

#include "tensor/tensor.h"

namespace tg::cuda {

// What cuBLASLt applies to the product P = alpha * op(a) @ op(b) + beta * out before (or while)
// storing it in out [batch..., m, n]. GELU is the tanh approximation
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// which is the form cuBLASLt implements (UnaryOp::kGeluTanh, not the erf form of kGelu).
enum class Epilogue {
  kNone,        // out = P
  kBias,        // out = P + bias;  bias [n]: one value per column, broadcast over rows and batches
  kGelu,        // out = gelu(P);  aux (optional) receives P, the GELU input
  kBiasGelu,    // out = gelu(P + bias);  aux (optional) receives P + bias
  kDGelu,       // out = P * gelu'(aux);  aux = the GELU input saved by a forward kGelu/kBiasGelu
  kDGeluBgrad,  // as kDGelu, and bias [batch..., n] receives the column sums of out (over m)
  kBgrad,       // out = P, and bias [batch..., m] receives the row sums of op(a) (over k)
};

// "none", "bias", "gelu", "bias_gelu", "dgelu", "dgelu_bgrad", "bgrad".
const char* EpilogueName(Epilogue epilogue);

// out [batch..., m, n] = epilogue(alpha * op(a) @ op(b) + beta * out), where op(a) is a's last two
// dims, transposed when transpose_a (a is then [batch..., k, m]), and likewise for b.
//
// - All tensors on one CUDA device; the call enqueues on its current stream and returns.
// - a and b share a dtype: f32, f64, f16 or bf16. out has their dtype, or f32 when they are
//   f16/bf16 (the f32 accumulator is then stored without rounding to 16 bits).
// - out: unit stride along n and a row stride >= n (a column slice of a wider buffer is fine);
//   its batch dims (any number, any strides) are looped over or batched in one call.
// - a, b: batch dims equal to out's; stride 0 broadcasts an operand along a batch dim. Any
//   strides for the matrices (transposed views are passed to cuBLASLt as transposes).
// - bias: out's dtype, contiguous. kBias/kBiasGelu read [n] (the same bias for every batch);
//   kDGeluBgrad writes [batch..., n] and kBgrad writes [batch..., m] (one gradient per batch
//   entry; flatten the batch into m to sum over it, as a Linear layer does).
// - aux: out's dtype and shape, unit stride along n, and a row stride (and batch stride) that is
//   a multiple of 8 elements (a cuBLASLt requirement; pad the row stride when n is not a
//   multiple of 8 and pass a narrow() view). Required by kDGelu/kDGeluBgrad (which may read a
//   broadcast aux, stride 0 along a batch dim); kGelu/kBiasGelu write it, so not broadcast.
// - k == 0 gives out = beta * out with beta 0 or 1 and epilogue kNone (cuBLASLt has no empty
//   products).
// When cuBLASLt has no fused kernel for an epilogue (its epilogue kernels have type, layout and
// alignment limits), kBias, kBgrad and kDGeluBgrad fall back to unfused products with a vector
// of ones: the same sums, but kBias then adds the bias to the already rounded product (one more
// rounding for f16/bf16 outputs) and kDGeluBgrad sums the rounded dGELU output; those sums and
// broadcasts run in full f32 also under AllowTf32Scope. The GELU epilogues have no fallback.
// Throws tg::Error ("matmul_ex: ...", with the shapes) on invalid input. Returns false, with
// nothing enqueued and cuBLASLt's reason in *why (if given), when cuBLASLt has no algorithm for
// the combination (e.g. a GELU epilogue with f64): the fused Linear kernels then decline.
bool TryMatmulEx(const RawTensor& out, const RawTensor& a, bool transpose_a, const RawTensor& b,
                 bool transpose_b, Epilogue epilogue, const RawTensor& bias, const RawTensor& aux,
                 float alpha, float beta, std::string* why);
// TryMatmulEx that throws tg::Error with the reason when cuBLASLt has no algorithm.
void MatmulEx(const RawTensor& out, const RawTensor& a, bool transpose_a, const RawTensor& b,
              bool transpose_b, Epilogue epilogue, const RawTensor& bias, const RawTensor& aux,
              float alpha = 1, float beta = 0);

// A contiguous vector of n ones of `dtype` on CUDA device `device`: cached per device and dtype
// and grown on demand (never freed), for sums and broadcasts written as products.
RawTensor OnesVector(int64_t n, DType dtype, int device);

// Lets f32 matmuls on the calling thread use TF32 (or, with allow = false, forbids it) while it
// lives, whatever KernelOptions::allow_tf32 says (nesting restores the previous setting).
// Thread-local like grad mode: other threads follow the kernel options.
class AllowTf32Scope {
 public:
  explicit AllowTf32Scope(bool allow = true);
  ~AllowTf32Scope();
  AllowTf32Scope(const AllowTf32Scope&) = delete;
  AllowTf32Scope& operator=(const AllowTf32Scope&) = delete;

 private:
  int previous_;
};
// Whether f32 matmuls (and, in tensor/cuda/conv.cc, f32 convolutions) on this thread may use
// TF32 now: the innermost AllowTf32Scope, else KernelOptions::allow_tf32 (tensor/kernel_options.h).
bool Tf32Allowed();

}  // namespace tg::cuda

#endif  // TAPEGRAD_TENSOR_CUDA_BLAS_H_
