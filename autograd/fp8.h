// FP8 GEMMs in the differentiable ops: the thread-local FP8 scope that an op whose op-list entry
// says Fp8Policy::kGemm (Linear) consults, and the quantizer interface through which it casts its
// GEMM operands. Like autocast (autograd/autocast.h) this is a property of the op layer; the
// scaling recipes that implement it (delayed, current, block: amp/fp8.h) sit above, in amp/.
//
//   amp::Fp8Training fp8(model_weights, options);   // amp/fp8.h: an Fp8Scope
//   {
//     amp::Fp8Autocast on(fp8);                     // installs it on this thread
//     loss = model.forward(x);                      // covered Linears run Fp8Linear
//     on.Finish();                                  // the forward's scale update
//   }
//   loss.backward();
//
// Linear asks the scope for the quantizers of its weight (the parameter itself, before autocast
// casts it, so a weight is cast to FP8 straight from its master dtype); a weight the scope does
// not cover, or no scope, leaves Linear as it is.
#ifndef TAPEGRAD_AUTOGRAD_FP8_H_
#define TAPEGRAD_AUTOGRAD_FP8_H_

#include <memory>
#include <optional>

#include "autograd/variable.h"
#include "tensor/fp8_scale.h"
#include "tensor/tensor.h"

namespace tg {

// One GEMM operand: FP8 data [rows, k] (k contiguous, the layout of tg::Fp8Gemm's a and b) and
// its scale_inv grid of `tiling`.
struct Fp8Operand {
  RawTensor data;
  RawTensor scale_inv;
  Fp8Tiling tiling = Fp8Tiling::kTensor;
};

// x [rows, cols] quantized for the two kinds of GEMM that read it: `rowwise` contracts over cols
// (x itself), `columnwise` contracts over rows (the operand of x^T, [cols, rows]). Either may be
// left undefined when not asked for.
struct Fp8Quantized {
  Fp8Operand rowwise;
  Fp8Operand columnwise;
};

// Casts one tensor role of one layer (its input, weight or output gradient) to FP8 with its
// recipe's scales, recording what the recipe needs (amaxes) for its next update.
class Fp8Quantizer {
 public:
  virtual ~Fp8Quantizer() = default;
  // x: contiguous [rows, cols] of f32, bf16 or f16.
  virtual Fp8Quantized Quantize(const RawTensor& x, bool rowwise, bool columnwise) = 0;
};

// The quantizers of one FP8 Linear, kept alive by its backward node.
struct Fp8LinearQuantizers {
  std::shared_ptr<Fp8Quantizer> input;
  std::shared_ptr<Fp8Quantizer> weight;
  std::shared_ptr<Fp8Quantizer> grad_output;
};

// What a kGemm op asks the scope installed on its thread.
class Fp8Scope {
 public:
  virtual ~Fp8Scope() = default;
  // The quantizers for `weight`, or nullopt when the scope does not cover that weight.
  virtual std::optional<Fp8LinearQuantizers> LinearQuantizers(const Tensor& weight) = 0;
};

// The scope installed on this thread, or nullptr.
Fp8Scope* CurrentFp8Scope();

// Installs `scope` on this thread for its lifetime (nullptr: FP8 off inside), restoring the
// previous one after, as a guard nests.
class Fp8ScopeGuard {
 public:
  explicit Fp8ScopeGuard(Fp8Scope* scope);
  ~Fp8ScopeGuard();
  Fp8ScopeGuard(const Fp8ScopeGuard&) = delete;
  Fp8ScopeGuard& operator=(const Fp8ScopeGuard&) = delete;

 private:
  Fp8Scope* previous_;
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_FP8_H_
