// Highway's dynamic dispatch: foreach_target.h includes this file once per target, each copy
// compiling the HWY_NAMESPACE part for that instruction set; HWY_ONCE marks the last pass, which
// holds the dispatching entry points. Built with -ffp-contract=off (tensor/cpu/BUILD): a Mul
// followed by an Add stays two roundings, as in the composed tensor ops.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/vec_math.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstring>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "tensor/cpu/vec_math.h"

HWY_BEFORE_NAMESPACE();
namespace tg::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway's Exp (1 ulp) on its domain; NaN stays NaN, above log(FLT_MAX) is +inf, and below
// -104 it is 0 (the exact value is under half the smallest subnormal there).
struct ExpOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    const V overflow = hn::Set(d, 88.72283935546875f);
    const V y = hn::IfThenElse(hn::Gt(x, overflow), hn::Inf(d), hn::Exp(d, hn::Min(x, overflow)));
    return hn::IfThenElse(hn::IsNaN(x), x, y);
  }
};

struct TanhOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    return hn::Tanh(d, x);
  }
};

// 0.5 x (1 + tanh(k (x + c x^3))), the scalar form's order (tensor/cpu/activation.h).
struct GeluTanhOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    const V k = hn::Set(d, 0.7978845608028654f), c = hn::Set(d, 0.044715f);
    const V one = hn::Set(d, 1.0f), half = hn::Set(d, 0.5f);
    const V cube = hn::Mul(hn::Mul(hn::Mul(c, x), x), x);
    const V t = hn::Tanh(d, hn::Mul(k, hn::Add(x, cube)));
    return hn::Mul(hn::Mul(half, x), hn::Add(one, t));
  }
};

struct GeluTanhGradOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    const double k = 0.7978845608028654, c = 0.044715;
    const V kv = hn::Set(d, static_cast<float>(k)), cv = hn::Set(d, static_cast<float>(c));
    const V c3 = hn::Set(d, static_cast<float>(3 * c));
    const V one = hn::Set(d, 1.0f), half = hn::Set(d, 0.5f);
    const V x2 = hn::Mul(x, x);
    const V t = hn::Tanh(d, hn::Mul(hn::Add(x, hn::Mul(hn::Mul(x2, x), cv)), kv));
    const V left = hn::Mul(hn::Add(t, one), half);
    const V du = hn::Mul(hn::Add(hn::Mul(x2, c3), one), kv);
    const V right = hn::Mul(hn::Mul(x, half), hn::Mul(hn::Add(hn::Neg(hn::Mul(t, t)), one), du));
    return hn::Add(left, right);
  }
};

// y[i] = op(x[i]): whole vectors, then the tail through one zero-padded vector.
template <class Op>
void Map(const float* x, float* y, int64_t n, Op op) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(op(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    std::memcpy(tail, x + i, bytes);
    hn::Store(op(d, hn::Load(d, tail)), d, tail);
    std::memcpy(y + i, tail, bytes);
  }
}

void Exp(const float* x, float* y, int64_t n) { Map(x, y, n, ExpOp()); }
void Tanh(const float* x, float* y, int64_t n) { Map(x, y, n, TanhOp()); }
void GeluTanh(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanhOp()); }
void GeluTanhGrad(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanhGradOp()); }

}  // namespace tg::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tg::cpu {

HWY_EXPORT(Exp);
HWY_EXPORT(Tanh);
HWY_EXPORT(GeluTanh);
HWY_EXPORT(GeluTanhGrad);

void ExpF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Exp)(x, y, n); }
void TanhF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Tanh)(x, y, n); }
void GeluTanhF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(GeluTanh)(x, y, n); }
void GeluTanhGradF32(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTanhGrad)(x, y, n);
}

const char* VecMathTarget() {
  // The best target compiled here that this CPU supports, as HWY_DYNAMIC_DISPATCH chooses it.
  return hwy::TargetName(hwy::SupportedAndGeneratedTargets()[0]);
}

}  // namespace tg::cpu
#endif  // HWY_ONCE
