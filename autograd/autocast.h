// Autocast: a thread-local mixed-precision policy that the differentiable ops consult, so a model
// written in f32 runs its matmuls in f16/bf16 and its numerically sensitive ops in f32 without
// touching the model code (PyTorch's torch.autocast, for the CPU and CUDA).
//
// It lives in autograd/, below amp/: as PyTorch's Autocast dispatch key, it is a property of the
// op layer that the engine and the ops consult, while amp/ (loss scaling, master weights) sits
// above autograd and optim. The names stay in tg::amp, as PyTorch keeps torch.amp.autocast.
//
//   {
//     tg::amp::AutocastGuard autocast(tg::kBF16);
//     tg::Tensor h = tg::Linear(x, w, b);        // bf16 (w's bf16 copy is cached)
//     tg::Tensor loss = tg::CrossEntropy(h, y);  // computed in f32
//   }
//   loss.backward();                               // outside the guard, as in PyTorch
//
// Each op's policy is an attribute of its entry in the op list (tensor/op_list.inc, read with
// AutocastPolicyOf(OpId) of tensor/op_list.h), after PyTorch's autocast op lists; the
// differentiable ops apply it with AutocastInputs (autograd/ops/autocast_inputs.h):
//   kLowPrecision  matmul, bmm, linear, conv2d, scaled_dot_product_attention: every floating
//                  input that is not f64 is cast to the autocast dtype.
//   kFloat32       softmax, log_softmax, layer_norm, cross-entropy, exp, log, pow, sum, mean:
//                  f16/bf16 inputs are cast to f32.
//   kPromote       add, sub, mul, div, where, cat, stack: nothing is cast; mixed inputs promote
//                  to the widest dtype, as the tensor ops already do (PromoteTypes, with the
//                  gradient cast back to each input's dtype), with or without autocast.
//   kNone          everything else: nothing is cast.
// f64 tensors and integer tensors are never cast. Casts are recorded ops, so gradients flow back
// to the original dtype. The low-precision cast of an f32 leaf that requires grad (a weight) is
// cached until the outermost guard exits, so a weight used by several ops is cast once per
// forward, as PyTorch does; it is cached only with grad mode on (a cast made under no_grad has no
// history and must not be handed to a later recorded use).
//
// Module types: like DeepSpeed's lower_precision_safe_modules, a configurable list of module type
// names says which modules may compute in low precision; inside any other module (entered with
// AutocastModuleScope by the nn layer), kLowPrecision ops run in f32 instead.
#ifndef TAPEGRAD_AUTOGRAD_AUTOCAST_H_
#define TAPEGRAD_AUTOGRAD_AUTOCAST_H_

#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/op_list.h"

namespace tg {
namespace amp {

// The whole thread-local state; copyable so that checkpointing and the engine's hand-off threads
// can capture and re-establish it.
struct AutocastState {
  bool enabled = false;
  DType dtype = kBF16;           // kF16 or kBF16
  bool low_precision_ok = true;  // false inside a module type that is not low-precision safe
  int nesting = 0;               // enabled guards currently open (the cache lives while > 0)
  // Module type names allowed to compute in low precision (see AutocastModuleScope).
  std::shared_ptr<const std::vector<std::string>> safe_modules;
};

// Default lower-precision-safe module types: the ones whose low-precision op is a matmul.
const std::vector<std::string>& DefaultLowPrecisionSafeModules();

AutocastState GetAutocastState();
void SetAutocastState(const AutocastState& state);

// Whether autocast is on for this thread (one thread-local read: the ops' fast path).
bool AutocastEnabled();
DType AutocastDType();

// The dtype an input of dtype `dtype` must be cast to under `policy` (tg::CastPolicy of
// tensor/op_list.h) in the current state: its own dtype when it must not be cast (autocast off,
// f64, integers, kPromote and kNone).
DType AutocastTargetDType(CastPolicy policy, DType dtype);

// Turns autocast on (or off, with enabled = false) for its lifetime, restoring the previous state
// after. dtype must be kF16 or kBF16 (tg::Error otherwise). The cast cache is cleared when the
// outermost enabled guard exits.
class AutocastGuard {
 public:
  explicit AutocastGuard(
      DType dtype = kBF16, bool enabled = true,
      std::vector<std::string> low_precision_safe_modules = DefaultLowPrecisionSafeModules());
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// Re-establishes a captured state (checkpoint recomputation, engine hand-off threads) and
// restores the previous one after; the cast cache is left alone.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& state);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState previous_;
};

// Entered by a module's forward: inside a module whose type is not in the guard's
// low-precision-safe list, kLowPrecision ops compute in f32. Nested safe modules inside an
// unsafe one stay in f32 (the outer module asked for f32).
class AutocastModuleScope {
 public:
  explicit AutocastModuleScope(const std::string& module_type);
  ~AutocastModuleScope();
  AutocastModuleScope(const AutocastModuleScope&) = delete;
  AutocastModuleScope& operator=(const AutocastModuleScope&) = delete;

 private:
  bool previous_;
};

// The cast cache, type-erased so that this leaf library needs only tensor/: the autograd layer
// stores its cast Tensors here, keyed by the source's identity and the target dtype. Holding
// `value` keeps the source alive, so a key is never reused while its entry exists.
std::shared_ptr<const void> LookupCachedCast(const void* source, DType dtype);
void StoreCachedCast(const void* source, DType dtype, std::shared_ptr<const void> value);
size_t CachedCastCount();

}  // namespace amp
}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_AUTOCAST_H_
