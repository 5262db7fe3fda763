#include "autograd/autocast.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "tensor/error.h"

namespace tg {
namespace amp {
namespace {

thread_local AutocastState state;

using CacheKey = std::pair<const void*, DType>;
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return absl::HashOf(k.first, static_cast<int>(k.second));
  }
};
thread_local absl::flat_hash_map<CacheKey, std::shared_ptr<const void>, CacheKeyHash> cache;

}  // namespace

const std::vector<std::string>& DefaultLowPrecisionSafeModules() {
  static const auto* modules =
      new std::vector<std::string>{"Linear", "Conv2d", "CausalSelfAttention"};
  return *modules;
}

AutocastState GetAutocastState() { return state; }
void SetAutocastState(const AutocastState& s) { state = s; }
bool AutocastEnabled() { return state.enabled; }
DType AutocastDType() { return state.dtype; }

DType AutocastTargetDType(CastPolicy policy, DType dtype) {
  if (!state.enabled || !IsFloating(dtype) || dtype == kF64) return dtype;
  switch (policy) {
    case CastPolicy::kLowPrecision:
      return state.low_precision_ok ? state.dtype : kF32;
    case CastPolicy::kFloat32:
      return kF32;
    case CastPolicy::kPromote:
    case CastPolicy::kNone:
      break;
  }
  return dtype;
}

AutocastGuard::AutocastGuard(DType dtype, bool enabled,
                             std::vector<std::string> low_precision_safe_modules)
    : previous_(state) {
  TG_CHECK(dtype == kF16 || dtype == kBF16,
           "AutocastGuard: the autocast dtype must be f16 or bf16, got ", DTypeName(dtype));
  state.enabled = enabled;
  if (!enabled) return;
  state.dtype = dtype;
  state.low_precision_ok = true;
  state.safe_modules =
      std::make_shared<const std::vector<std::string>>(std::move(low_precision_safe_modules));
  ++state.nesting;
}

AutocastGuard::~AutocastGuard() {
  const bool clear = state.enabled && state.nesting == 1;
  state = previous_;
  // PyTorch clears the cache when the outermost autocast region exits.
  if (clear) cache.clear();
}

AutocastStateGuard::AutocastStateGuard(const AutocastState& s) : previous_(state) {
  state = s;
  state.nesting = previous_.nesting;  // the cache's lifetime stays with the real guards
}

AutocastStateGuard::~AutocastStateGuard() { state = previous_; }

AutocastModuleScope::AutocastModuleScope(const std::string& module_type)
    : previous_(state.low_precision_ok) {
  if (!state.enabled || !state.low_precision_ok) return;
  const std::vector<std::string>* safe = state.safe_modules.get();
  state.low_precision_ok =
      safe != nullptr && std::find(safe->begin(), safe->end(), module_type) != safe->end();
}

AutocastModuleScope::~AutocastModuleScope() { state.low_precision_ok = previous_; }

std::shared_ptr<const void> LookupCachedCast(const void* source, DType dtype) {
  auto it = cache.find(CacheKey{source, dtype});
  return it == cache.end() ? nullptr : it->second;
}

void StoreCachedCast(const void* source, DType dtype, std::shared_ptr<const void> value) {
  if (state.nesting == 0) return;  // no enabled guard: nothing would ever clear it
  cache[CacheKey{source, dtype}] = std::move(value);
}

size_t CachedCastCount() { return cache.size(); }

}  // namespace amp
}  // namespace tg
