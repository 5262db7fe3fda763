#include "autograd/ops/autocast_inputs.h"

#include <memory>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tg {
namespace {

// A cache entry keeps the source alive, so its address (the key) is not reused meanwhile.
struct CachedCast {
  Tensor source;
  Tensor cast;
};

}  // namespace

Tensor AutocastInput(const Tensor& x, CastPolicy policy) {
  if (!x.defined()) return x;
  const DType to = amp::AutocastTargetDType(policy, x.dtype());
  if (to == x.dtype()) return x;
  // PyTorch caches the casts of f32 leaves that require grad (the weights); we also require grad
  // mode: a cast made under no_grad has no history and must not serve a later recorded use.
  const bool cacheable = policy == CastPolicy::kLowPrecision && x.dtype() == kF32 && x.is_leaf() &&
                         x.requires_grad() && GradMode::is_enabled();
  if (cacheable) {
    if (auto hit = amp::LookupCachedCast(x.impl().get(), to)) {
      return static_cast<const CachedCast*>(hit.get())->cast;
    }
  }
  Tensor cast = Cast(x, to);
  if (cacheable) {
    amp::StoreCachedCast(x.impl().get(), to,
                         std::make_shared<const CachedCast>(CachedCast{x, cast}));
  }
  return cast;
}

}  // namespace tg
