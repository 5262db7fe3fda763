// Highway's dynamic dispatch: foreach_target.h includes this file once per target, each copy
// compiling the HWY_NAMESPACE part for that instruction set; HWY_ONCE marks the last pass, which
// holds the dispatching entry points. Built with -ffp-contract=off (tensor/cpu/BUILD): a Mul
// followed by an Add stays two roundings, as in the composed tensor ops.
// clang-format off: foreach_target.h must come before the other includes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/vec_math.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/float8.h"
#include "tensor/half.h"

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

// exp(-x) as ExpF32 computes it on the negated values, then sigmoid 1 / (1 + exp(-x)) and SiLU
// x / (1 + exp(-x)) (tensor/elementwise_formulas.h), one division each.
template <class D, class V>
V ExpOfNegated(D d, V x) {
  return ExpOp()(d, hn::Neg(x));
}
struct SigmoidOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    return hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), ExpOfNegated(d, x)));
  }
};
struct SiluOp {
  template <class D, class V>
  V operator()(D d, V x) const {
    return hn::Div(x, hn::Add(hn::Set(d, 1.0f), ExpOfNegated(d, x)));
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

// fn(d, x, y) on the vectors of kIn inputs (x) into kOut outputs (y) of n elements: whole vectors,
// then the tail through zero-padded vectors (as Map).
template <size_t kIn, size_t kOut, class Fn>
void MapVectors(const std::array<const float*, kIn>& in, const std::array<float*, kOut>& out,
                int64_t n, Fn fn) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  std::array<V, kIn> x;
  std::array<V, kOut> y;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (size_t k = 0; k < kIn; ++k) x[k] = hn::LoadU(d, in[k] + i);
    fn(d, x, y);
    for (size_t k = 0; k < kOut; ++k) hn::StoreU(y[k], d, out[k] + i);
  }
  if (i < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    const size_t bytes = static_cast<size_t>(n - i) * sizeof(float);
    for (size_t k = 0; k < kIn; ++k) {
      std::memset(tail, 0, sizeof(tail));
      std::memcpy(tail, in[k] + i, bytes);
      x[k] = hn::Load(d, tail);
    }
    fn(d, x, y);
    for (size_t k = 0; k < kOut; ++k) {
      hn::Store(y[k], d, tail);
      std::memcpy(out[k] + i, tail, bytes);
    }
  }
}

// ---- Conversions between f32 and the 2-byte floats, rounding to nearest even exactly like
// tensor/half.h's scalar FloatToHalfBits / FloatToBFloat16Bits (NaN stays NaN). ----

// Applies `vec` to whole vectors of `lanes` and `scalar` to the rest.
template <class In, class Out, class Vec, class Scalar>
void Convert(const In* in, Out* out, int64_t n, int64_t lanes, Vec vec, Scalar scalar) {
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) vec(in + i, out + i);
  for (; i < n; ++i) out[i] = scalar(in[i]);
}

void BFloat16ToFloat(const uint16_t* in, float* out, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  Convert(
      in, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const uint16_t* src, float* dst) {
        const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src)));
        hn::StoreU(hn::BitCast(df, bits), df, dst);
      },
      [](uint16_t b) { return BFloat16BitsToFloat(b); });
}

void FloatToBFloat16(const float* in, uint16_t* out, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<uint16_t, decltype(df)> du16;
  Convert(
      in, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const float* src, uint16_t* dst) {
        const auto x = hn::BitCast(du32, hn::LoadU(df, src));
        const auto upper = hn::ShiftRight<16>(x);
        // Round to nearest even: add 0x7fff plus the lowest kept bit.
        const auto one = hn::Set(du32, 1u);
        const auto rounded =
            hn::ShiftRight<16>(hn::Add(x, hn::Add(hn::Set(du32, 0x7fffu), hn::And(upper, one))));
        // NaN: the sign and top payload bits, with a payload bit set when those are zero.
        const auto is_nan =
            hn::Gt(hn::And(x, hn::Set(du32, 0x7fffffffu)), hn::Set(du32, 0x7f800000u));
        const auto empty = hn::Eq(hn::And(upper, hn::Set(du32, 0x7fu)), hn::Zero(du32));
        const auto nan = hn::IfThenElse(empty, hn::Or(upper, hn::Set(du32, 0x40u)), upper);
        // Each lane holds 16 bits: narrowing the int32 lanes with saturation keeps them.
        const hn::RebindToSigned<decltype(du32)> di32;
        const auto result = hn::BitCast(di32, hn::IfThenElse(is_nan, nan, rounded));
        hn::StoreU(hn::DemoteTo(du16, result), du16, dst);
      },
      [](float f) { return FloatToBFloat16Bits(f); });
}

// x[i] = x[i] rounded to bf16 and widened back, in one pass: FloatToBFloat16's bits shifted
// into the upper half of an f32 (the same rounding and NaN rule), so the same values as
// BFloat16ToFloat(FloatToBFloat16(x)).
void RoundToBFloat16(float* x, int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  Convert(
      x, x, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const float* src, float* dst) {
        const auto u = hn::BitCast(du32, hn::LoadU(df, src));
        const auto upper = hn::ShiftRight<16>(u);
        const auto rounded =
            hn::And(hn::Add(u, hn::Add(hn::Set(du32, 0x7fffu), hn::And(upper, hn::Set(du32, 1u)))),
                    hn::Set(du32, 0xffff0000u));
        const auto is_nan =
            hn::Gt(hn::And(u, hn::Set(du32, 0x7fffffffu)), hn::Set(du32, 0x7f800000u));
        const auto empty = hn::Eq(hn::And(upper, hn::Set(du32, 0x7fu)), hn::Zero(du32));
        const auto nan =
            hn::ShiftLeft<16>(hn::IfThenElse(empty, hn::Or(upper, hn::Set(du32, 0x40u)), upper));
        hn::StoreU(hn::BitCast(df, hn::IfThenElse(is_nan, nan, rounded)), df, dst);
      },
      [](float f) { return BFloat16BitsToFloat(FloatToBFloat16Bits(f)); });
}

// The row loops of a [rows, n] block with strided rows: one dispatch per block, not per row (a
// head of attention is 64 rows of 16 values).
void BFloat16RowsToFloat(const uint16_t* in, int64_t in_stride, int64_t rows, int64_t n,
                         float* out) {
  for (int64_t r = 0; r < rows; ++r) BFloat16ToFloat(in + r * in_stride, out + r * n, n);
}
void FloatRowsToBFloat16(const float* in, int64_t rows, int64_t n, uint16_t* out,
                         int64_t out_stride) {
  for (int64_t r = 0; r < rows; ++r) FloatToBFloat16(in + r * n, out + r * out_stride, n);
}

// out[i] = tensor/float8.h's saturating cast (kSatFinite) of x[i] * scale, the product one f32
// rounding: the same bits as FloatToE4M3Bits / FloatToE5M2Bits (tests/tensor:fp8_ops_test casts
// every f16 and bf16 pattern through the CPU's Fp8Cast). Normal results rebias the exponent and
// round the dropped mantissa bits to nearest even; subnormal ones count units of the smallest
// subnormal, rounded to nearest even by adding 2^23 in f32; then saturation, the sign, and NaN as
// 0x7f. Comparisons are of |x|'s bits as int32 (all below 2^31).
template <int kExpBits, int kManBits>
void ScaleToFp8Format(const float* x, float scale, uint8_t* out, int64_t n, uint32_t overflow_from,
                      uint32_t max_code) {
  constexpr uint32_t kBias = (1u << (kExpBits - 1)) - 1;
  constexpr int kDropped = 23 - kManBits;
  constexpr float kToUnits = static_cast<float>(1u << (kBias - 1 + kManBits));
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const auto vscale = hn::Set(df, scale);
  Convert(
      x, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const float* src, uint8_t* dst) {
        const auto v = hn::Mul(hn::LoadU(df, src), vscale);
        const auto bits = hn::BitCast(du, v);
        const auto sign = hn::And(hn::ShiftRight<24>(bits), hn::Set(du, 0x80u));
        const auto abs = hn::And(bits, hn::Set(du, 0x7fffffffu));
        const auto iabs = hn::BitCast(di, abs);
        const auto rebiased = hn::Sub(abs, hn::Set(du, (127u - kBias) << 23));
        const auto normal = hn::ShiftRight<kDropped>(
            hn::Add(hn::Add(rebiased, hn::Set(du, (1u << (kDropped - 1)) - 1)),
                    hn::And(hn::ShiftRight<kDropped>(rebiased), hn::Set(du, 1u))));
        const auto units =
            hn::Add(hn::Mul(hn::BitCast(df, abs), hn::Set(df, kToUnits)), hn::Set(df, 8388608.0f));
        const auto subnormal = hn::Sub(hn::BitCast(du, units), hn::Set(du, 0x4b000000u));
        const auto min_normal = hn::Set(di, static_cast<int32_t>((127u - kBias + 1) << 23));
        auto r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(iabs, min_normal)), subnormal, normal);
        const auto overflow = hn::Gt(iabs, hn::Set(di, static_cast<int32_t>(overflow_from - 1)));
        r = hn::IfThenElse(hn::RebindMask(du, overflow), hn::Set(du, max_code), r);
        r = hn::Or(r, sign);
        const auto nan = hn::Gt(iabs, hn::Set(di, 0x7f800000));
        r = hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7fu), r);
        hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, r)), d8, dst);
      },
      [&](float f) {
        return kExpBits == 4 ? FloatToE4M3Bits(f * scale) : FloatToE5M2Bits(f * scale);
      });
}

// out[i] = the exact f32 value of the FP8 code in[i] (tensor/float8.h's E4M3BitsToFloat /
// E5M2BitsToFloat, NaN payloads included): normal codes rebias their exponent, subnormal ones
// are mantissa * 2^(1 - bias - kManBits) (exact in f32), and the specials are selected last.
template <int kExpBits, int kManBits>
void Fp8FormatToFloat(const uint8_t* in, float* out, int64_t n) {
  constexpr uint32_t kBias = (1u << (kExpBits - 1)) - 1;
  constexpr uint32_t kExpMask = (1u << kExpBits) - 1;
  constexpr uint32_t kManMask = (1u << kManBits) - 1;
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const float subnormal_unit = std::ldexp(1.0f, 1 - static_cast<int>(kBias) - kManBits);
  Convert(
      in, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const uint8_t* src, float* dst) {
        const auto b = hn::PromoteTo(du, hn::LoadU(d8, src));
        const auto sign = hn::ShiftLeft<24>(hn::And(b, hn::Set(du, 0x80u)));
        const auto e = hn::And(hn::ShiftRight<kManBits>(b), hn::Set(du, kExpMask));
        const auto m = hn::And(b, hn::Set(du, kManMask));
        const auto man_bits = hn::ShiftLeft<23 - kManBits>(m);
        const auto normal =
            hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du, 127u - kBias))), man_bits);
        const auto sub = hn::BitCast(
            du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, m)), hn::Set(df, subnormal_unit)));
        auto r = hn::IfThenElse(hn::Eq(e, hn::Zero(du)), sub, normal);
        if constexpr (kExpBits == 4) {  // e4m3fn: only 0x7f / 0xff are NaN; no infinities
          const auto is_nan = hn::Eq(hn::And(b, hn::Set(du, 0x7fu)), hn::Set(du, 0x7fu));
          r = hn::IfThenElse(is_nan, hn::Or(hn::Set(du, 0x7fc00000u), man_bits), r);
        } else {  // e5m2: all-ones exponent: inf (mantissa 0) or NaN
          const auto special = hn::Eq(e, hn::Set(du, kExpMask));
          const auto inf_or_nan = hn::IfThenElse(hn::Eq(m, hn::Zero(du)), hn::Set(du, 0x7f800000u),
                                                 hn::Or(hn::Set(du, 0x7fc00000u), man_bits));
          r = hn::IfThenElse(special, inf_or_nan, r);
        }
        hn::StoreU(hn::BitCast(df, hn::Or(r, sign)), df, dst);
      },
      [](uint8_t code) { return kExpBits == 4 ? E4M3BitsToFloat(code) : E5M2BitsToFloat(code); });
}

void Fp8ToFloat(const uint8_t* in, float* out, int64_t n, bool e4m3) {
  if (e4m3) {
    Fp8FormatToFloat<4, 3>(in, out, n);
  } else {
    Fp8FormatToFloat<5, 2>(in, out, n);
  }
}

void ScaleToFp8(const float* x, float scale, uint8_t* out, int64_t n, bool e4m3) {
  if (e4m3) {
    ScaleToFp8Format<4, 3>(x, scale, out, n, 0x43e80001u, 0x7eu);
  } else {
    ScaleToFp8Format<5, 2>(x, scale, out, n, 0x47700000u, 0x7bu);
  }
}

// f16 <-> f32 through F16C (AVX2 and up: exact, rounding to nearest even); Highway's emulation
// for older targets truncates, so those convert one value at a time with the scalar code.
void HalfToFloat(const uint16_t* in, float* out, int64_t n) {
#if HWY_TARGET >= HWY_SSE4
  for (int64_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(in[i]);
#else
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  Convert(
      in, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const uint16_t* src, float* dst) {
        const auto* half = reinterpret_cast<const hwy::float16_t*>(src);
        const auto wide = hn::PromoteTo(df, hn::LoadU(df16, half));
        hn::StoreU(wide, df, dst);
        // F16C sets the quiet bit of a signalling NaN; the scalar rule (and the CUDA kernels)
        // keep its bits. NaNs are rare: redo such a vector one value at a time.
        if (HWY_UNLIKELY(!hn::AllFalse(df, hn::IsNaN(wide)))) {
          for (size_t k = 0; k < hn::Lanes(df); ++k) dst[k] = HalfBitsToFloat(src[k]);
        }
      },
      [](uint16_t h) { return HalfBitsToFloat(h); });
#endif
}

void FloatToHalf(const float* in, uint16_t* out, int64_t n) {
#if HWY_TARGET >= HWY_SSE4
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalfBits(in[i]);
#else
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  Convert(
      in, out, n, static_cast<int64_t>(hn::Lanes(df)),
      [&](const float* src, uint16_t* dst) {
        const auto x = hn::LoadU(df, src);
        hn::StoreU(hn::DemoteTo(df16, x), df16, reinterpret_cast<hwy::float16_t*>(dst));
        if (HWY_UNLIKELY(!hn::AllFalse(df, hn::IsNaN(x)))) {  // as in HalfToFloat
          for (size_t k = 0; k < hn::Lanes(df); ++k) dst[k] = FloatToHalfBits(src[k]);
        }
      },
      [](float f) { return FloatToHalfBits(f); });
#endif
}

inline float Sqrt(float x) { return std::sqrt(x); }
template <class V>
HWY_INLINE V Sqrt(V x) {
  return hn::Sqrt(x);
}

// a * b + c rounded once: the FMA instruction where the target has one, else glibc's exact fma
// lane by lane (hn::MulAdd would round twice there).
inline float Fma(float a, float b, float c) { return std::fma(a, b, c); }
template <class V>
HWY_INLINE V Fma(V a, V b, V c) {
#if HWY_NATIVE_FMA
  return hn::MulAdd(a, b, c);
#else
  const hn::DFromV<V> d;
  HWY_ALIGN float la[HWY_MAX_BYTES / sizeof(float)], lb[HWY_MAX_BYTES / sizeof(float)],
      lc[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(a, d, la);
  hn::Store(b, d, lb);
  hn::Store(c, d, lc);
  for (size_t k = 0; k < hn::Lanes(d); ++k) la[k] = std::fma(la[k], lb[k], lc[k]);
  return hn::Load(d, la);
#endif
}

// The Adam element update on a vector or a scalar (hn::Mul etc. on Vec, plain operators on
// float): the same operations in the same order either way (tensor/kernel_list.inc's FusedAdam).
template <int kDecay, class V, class S>
HWY_INLINE void AdamElement(V& p, V g, V& m, V& v, const S& s, bool lerp_from_end) {
  if constexpr (kDecay == 1) g = Fma(s.weight_decay, p, g);
  if constexpr (kDecay == 2) p = p * s.decay;
  m = Fma(s.lerp_weight, g - m, lerp_from_end ? g : m);
  v = Fma(g * s.one_minus_beta2, g, v * s.beta2);
  const V denom = Sqrt(v) / s.bias_correction2_sqrt + s.eps;
  p = p - (m * s.step_size) / denom;
}

// The scalars as vectors (for AdamElement on vectors).
template <class V>
struct AdamVecScalars {
  V weight_decay, decay, lerp_weight, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
};

template <int kDecay>
void AdamLoop(float* p, const float* g, float* m, float* v, int64_t n, const AdamF32Scalars& s) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const AdamVecScalars<V> vs{hn::Set(d, s.weight_decay),    hn::Set(d, s.decay),
                             hn::Set(d, s.lerp_weight),     hn::Set(d, s.beta2),
                             hn::Set(d, s.one_minus_beta2), hn::Set(d, s.eps),
                             hn::Set(d, s.step_size),       hn::Set(d, s.bias_correction2_sqrt)};
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {  // two vectors at a time: two divide chains
    V p0 = hn::LoadU(d, p + i), m0 = hn::LoadU(d, m + i), v0 = hn::LoadU(d, v + i);
    V p1 = hn::LoadU(d, p + i + lanes), m1 = hn::LoadU(d, m + i + lanes),
      v1 = hn::LoadU(d, v + i + lanes);
    AdamElement<kDecay>(p0, hn::LoadU(d, g + i), m0, v0, vs, s.lerp_from_end);
    AdamElement<kDecay>(p1, hn::LoadU(d, g + i + lanes), m1, v1, vs, s.lerp_from_end);
    hn::StoreU(p0, d, p + i);
    hn::StoreU(m0, d, m + i);
    hn::StoreU(v0, d, v + i);
    hn::StoreU(p1, d, p + i + lanes);
    hn::StoreU(m1, d, m + i + lanes);
    hn::StoreU(v1, d, v + i + lanes);
  }
  for (; i + lanes <= n; i += lanes) {
    V pv = hn::LoadU(d, p + i), mv = hn::LoadU(d, m + i), vv = hn::LoadU(d, v + i);
    AdamElement<kDecay>(pv, hn::LoadU(d, g + i), mv, vv, vs, s.lerp_from_end);
    hn::StoreU(pv, d, p + i);
    hn::StoreU(mv, d, m + i);
    hn::StoreU(vv, d, v + i);
  }
  for (; i < n; ++i) AdamElement<kDecay>(p[i], g[i], m[i], v[i], s, s.lerp_from_end);
}

void Adam(float* p, const float* g, float* m, float* v, int64_t n, const AdamF32Scalars& s) {
  switch (s.weight_decay_kind) {
    case 1:
      return AdamLoop<1>(p, g, m, v, n, s);
    case 2:
      return AdamLoop<2>(p, g, m, v, n, s);
    default:
      return AdamLoop<0>(p, g, m, v, n, s);
  }
}

// The largest of x[0, n), or the first NaN among them (as the Max reduction answers); -inf when
// n == 0. Max over whole vectors with the NaNs noted aside (the vector Max's NaN rule varies by
// target), the tail through one vector padded with -inf.
float Max(const float* x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto max = neg_inf;
  auto nan = hn::FirstN(d, 0);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    nan = hn::Or(nan, hn::IsNaN(v));
    max = hn::Max(max, v);
  }
  if (i < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(neg_inf, d, tail);
    std::memcpy(tail, x + i, static_cast<size_t>(n - i) * sizeof(float));
    const auto v = hn::Load(d, tail);
    nan = hn::Or(nan, hn::IsNaN(v));
    max = hn::Max(max, v);
  }
  if (HWY_UNLIKELY(!hn::AllFalse(d, nan))) {
    return *std::find_if(x, x + n, [](float v) { return v != v; });
  }
  return hn::GetLane(hn::MaxOfLanes(d, max));
}

// x[i] *= s (one f32 product each, as the scalar loop); returns whether any x[i] was inf or NaN
// (before scaling) when check_finite. The tail through one vector padded with zeros.
bool Scale(float* x, int64_t n, float s, bool check_finite) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto scale = hn::Set(d, s);
  auto bad = hn::FirstN(d, 0);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    if (check_finite) bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
    hn::StoreU(hn::Mul(v, scale), d, x + i);
  }
  if (i < n) {
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rest = static_cast<size_t>(n - i);
    std::memcpy(tail, x + i, rest * sizeof(float));
    const auto v = hn::Load(d, tail);
    if (check_finite) bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
    hn::Store(hn::Mul(v, scale), d, tail);
    std::memcpy(x + i, tail, rest * sizeof(float));
  }
  return check_finite && !hn::AllFalse(d, bad);
}

// Sums in f64 in the order of tensor/cpu/rows.h's SumF64: eight partial sums, element i going to
// sum i % 8, each added in the order of i, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
// The eight sums are 8 / lanes vectors of f64 (one on AVX-512, two on AVX2, four on SSE4), so
// every target gives the scalar loop's bits. term(d, i) is the vector of terms i, i + 1, ...;
// scalar(i) one term.
template <class Term, class Scalar>
double SumF64Order(int64_t n, Term term, Scalar scalar) {
  const hn::CappedTag<double, 8> d;
  constexpr size_t kMaxVectors = 8;  // 8 sums in vectors of 1 lane (HWY_SCALAR) or more
  const size_t lanes = hn::Lanes(d), vectors = 8 / lanes;
  hn::Vec<decltype(d)> acc[kMaxVectors];
  for (size_t v = 0; v < kMaxVectors; ++v) acc[v] = hn::Zero(d);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t v = 0; v < vectors; ++v) {
      acc[v] = hn::Add(acc[v], term(d, i + static_cast<int64_t>(v * lanes)));
    }
  }
  HWY_ALIGN double sums[8];
  for (size_t v = 0; v < vectors; ++v) hn::Store(acc[v], d, sums + v * lanes);
  for (int l = 0; i < n; ++i, ++l) sums[l] += scalar(i);
  return ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
}

double SumAsF64(const float* x, int64_t n) {
  return SumF64Order(
      n,
      [x](auto d, int64_t i) {
        return hn::PromoteTo(d, hn::LoadU(hn::Rebind<float, decltype(d)>(), x + i));
      },
      [x](int64_t i) { return static_cast<double>(x[i]); });
}

double SumProductsAsF64(const float* x, const float* y, int64_t n) {
  return SumF64Order(
      n,
      [x, y](auto d, int64_t i) {
        const hn::Rebind<float, decltype(d)> df;
        return hn::PromoteTo(d, hn::Mul(hn::LoadU(df, x + i), hn::LoadU(df, y + i)));
      },
      [x, y](int64_t i) { return static_cast<double>(x[i] * y[i]); });
}

double SumSquaredDeviationsF64(const float* x, int64_t n, double mean) {
  return SumF64Order(
      n,
      [x, mean](auto d, int64_t i) {
        const auto dev = hn::Sub(
            hn::PromoteTo(d, hn::LoadU(hn::Rebind<float, decltype(d)>(), x + i)), hn::Set(d, mean));
        return hn::Mul(dev, dev);
      },
      [x, mean](int64_t i) {
        const double dev = static_cast<double>(x[i]) - mean;
        return dev * dev;
      });
}

// col[j] += x[r * stride + j] for r = 0, 1, ..., rows - 1 in that order, in f64: the columns in
// blocks of four vectors held in registers over all the rows (one load and add per vector and
// row, no store of the sums in between), the remaining columns one by one.
void AddColumnsToF64(const float* x, int64_t rows, int64_t stride, int64_t cols, double* col) {
  const hn::ScalableTag<double> d;
  const hn::Rebind<float, decltype(d)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto load = [&](int64_t r, int64_t j) {
    return hn::PromoteTo(d, hn::LoadU(df, x + r * stride + j));
  };
  int64_t j = 0;
  for (; j + 4 * lanes <= cols; j += 4 * lanes) {
    auto a0 = hn::LoadU(d, col + j), a1 = hn::LoadU(d, col + j + lanes);
    auto a2 = hn::LoadU(d, col + j + 2 * lanes), a3 = hn::LoadU(d, col + j + 3 * lanes);
    for (int64_t r = 0; r < rows; ++r) {
      a0 = hn::Add(a0, load(r, j));
      a1 = hn::Add(a1, load(r, j + lanes));
      a2 = hn::Add(a2, load(r, j + 2 * lanes));
      a3 = hn::Add(a3, load(r, j + 3 * lanes));
    }
    hn::StoreU(a0, d, col + j);
    hn::StoreU(a1, d, col + j + lanes);
    hn::StoreU(a2, d, col + j + 2 * lanes);
    hn::StoreU(a3, d, col + j + 3 * lanes);
  }
  for (; j + lanes <= cols; j += lanes) {
    auto a = hn::LoadU(d, col + j);
    for (int64_t r = 0; r < rows; ++r) a = hn::Add(a, load(r, j));
    hn::StoreU(a, d, col + j);
  }
  for (; j < cols; ++j) {
    for (int64_t r = 0; r < rows; ++r) col[j] += static_cast<double>(x[r * stride + j]);
  }
}

// Layer norm's weight and bias gradients over a [rows, cols] block: per column j, in row order,
// gw[j] += g * ((x - mean[r]) * rstd[r]) (in f32, then widened) and gb[j] += g. Columns in
// blocks of two vectors held in registers over all the rows, the rest one at a time.
void LayerNormParamGrads(const float* x, const float* g, int64_t rows, int64_t stride, int64_t cols,
                         const float* mean, const float* rstd, double* gw, double* gb) {
  const hn::ScalableTag<double> d;
  const hn::Rebind<float, decltype(d)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + 2 * lanes <= cols; j += 2 * lanes) {
    auto w0 = hn::LoadU(d, gw + j), w1 = hn::LoadU(d, gw + j + lanes);
    auto b0 = hn::LoadU(d, gb + j), b1 = hn::LoadU(d, gb + j + lanes);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * stride + j;
      const float* gr = g + r * stride + j;
      const auto m = hn::Set(df, mean[r]), rs = hn::Set(df, rstd[r]);
      const auto g0 = hn::LoadU(df, gr), g1 = hn::LoadU(df, gr + lanes);
      const auto p0 = hn::Mul(g0, hn::Mul(hn::Sub(hn::LoadU(df, xr), m), rs));
      const auto p1 = hn::Mul(g1, hn::Mul(hn::Sub(hn::LoadU(df, xr + lanes), m), rs));
      w0 = hn::Add(w0, hn::PromoteTo(d, p0));
      w1 = hn::Add(w1, hn::PromoteTo(d, p1));
      b0 = hn::Add(b0, hn::PromoteTo(d, g0));
      b1 = hn::Add(b1, hn::PromoteTo(d, g1));
    }
    hn::StoreU(w0, d, gw + j);
    hn::StoreU(w1, d, gw + j + lanes);
    hn::StoreU(b0, d, gb + j);
    hn::StoreU(b1, d, gb + j + lanes);
  }
  for (; j < cols; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      const float gv = g[r * stride + j];
      gw[j] += static_cast<double>(gv * ((x[r * stride + j] - mean[r]) * rstd[r]));
      gb[j] += static_cast<double>(gv);
    }
  }
}

// y[i] = ((x[i] - mean) * rstd) * w[i] + b[i], each operation rounded (w, b may be null).
void Normalize(const float* x, int64_t n, float mean, float rstd, const float* w, const float* b,
               float* y) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto m = hn::Set(d, mean), rs = hn::Set(d, rstd);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto v = hn::Mul(hn::Sub(hn::LoadU(d, x + i), m), rs);
    if (w != nullptr) v = hn::Mul(v, hn::LoadU(d, w + i));
    if (b != nullptr) v = hn::Add(v, hn::LoadU(d, b + i));
    hn::StoreU(v, d, y + i);
  }
  for (; i < n; ++i) {
    float v = (x[i] - mean) * rstd;
    if (w != nullptr) v *= w[i];
    if (b != nullptr) v += b[i];
    y[i] = v;
  }
}

// C [m, n] = A @ B (+ C when accumulate) for small f32 products (an attention head's), where
// OpenBLAS's fixed costs per call (its zeroing pass over C, packing both operands) outweigh the
// product: B [k, n] row-major (the caller packs a transposed B), its rows loaded as vectors and
// A's entries broadcast, 4 rows by 2 vectors of C at a time. Each element is its sum over k in
// order, one MulAdd per term from 0, then C added; the columns past the last whole vector go
// through a zero-padded copy of B's last columns, so that every element takes the same steps.
template <int kRows, int kVecs, class D>
HWY_INLINE void SmallGemmBlock(D d, bool ta, int64_t k, const float* a, int64_t lda, int64_t i,
                               const float* b, int64_t ldb, float* c, int64_t ldc, int64_t cols,
                               bool accumulate) {
  static_assert(kRows == 1 || kRows == 4, "SmallGemmBlock: 1 or 4 rows");
  static_assert(kVecs == 1 || kVecs == 2, "SmallGemmBlock: 1 or 2 vectors");
  using V = hn::Vec<D>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // Named accumulators (an array stayed in memory): row r, vector v is a<r><v>.
  V a00 = hn::Zero(d), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  // A's entry (row i + r, column p) and the step from one p to the next.
  const float* ap = ta ? a + i : a + i * lda;
  const int64_t a_row = ta ? 1 : lda, a_step = ta ? lda : 1;
  for (int64_t p = 0; p < k; ++p, ap += a_step) {
    const float* bp = b + p * ldb;
    const V b0 = hn::LoadU(d, bp);
    const V b1 = kVecs == 2 ? hn::LoadU(d, bp + lanes) : b0;
    const V x0 = hn::Set(d, ap[0]);
    a00 = hn::MulAdd(x0, b0, a00);
    if (kVecs == 2) a01 = hn::MulAdd(x0, b1, a01);
    if (kRows == 4) {
      const V x1 = hn::Set(d, ap[a_row]), x2 = hn::Set(d, ap[2 * a_row]),
              x3 = hn::Set(d, ap[3 * a_row]);
      a10 = hn::MulAdd(x1, b0, a10);
      a20 = hn::MulAdd(x2, b0, a20);
      a30 = hn::MulAdd(x3, b0, a30);
      if (kVecs == 2) {
        a11 = hn::MulAdd(x1, b1, a11);
        a21 = hn::MulAdd(x2, b1, a21);
        a31 = hn::MulAdd(x3, b1, a31);
      }
    }
  }
  HWY_ALIGN float tail[64];  // a vector's lanes (at most 16 f32 on x86)
  auto store = [&](V acc, int64_t r, int64_t v) {
    float* row = c + (i + r) * ldc + v * lanes;
    const int64_t count = std::min(lanes, cols - v * lanes);
    if (count == lanes) {
      hn::StoreU(accumulate ? hn::Add(hn::LoadU(d, row), acc) : acc, d, row);
    } else {
      hn::Store(acc, d, tail);
      for (int64_t t = 0; t < count; ++t) row[t] = accumulate ? row[t] + tail[t] : tail[t];
    }
  };
  store(a00, 0, 0);
  if (kVecs == 2) store(a01, 0, 1);
  if (kRows == 4) {
    store(a10, 1, 0);
    store(a20, 2, 0);
    store(a30, 3, 0);
    if (kVecs == 2) {
      store(a11, 1, 1);
      store(a21, 2, 1);
      store(a31, 3, 1);
    }
  }
}

// Max pooling's 2 x 2 windows at stride 2 along one output row: window ox holds r0[2 ox],
// r0[2 ox + 1], r1[2 ox], r1[2 ox + 1] (taps 0, 1, below, below + 1), taken in that order with the
// scalar rule (conv.cc's MaxTap): a later element wins when it is larger or NaN. Whole vectors of
// windows, then the last few through one vector of copies (rows of the small CNN's planes are 7
// or 14 windows long; data-dependent branches per element were 5x slower than the old loop).
void MaxPool2x2Row(const float* r0, const float* r1, int64_t ow, int32_t below, float* value,
                   int32_t* tap) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(di, 1), down = hn::Set(di, below), down_right = hn::Set(di, below + 1);
  // Windows [ox, ox + lanes) of rows starting at p0 and p1 (their 2 * lanes elements each).
  auto windows = [&](const float* p0, const float* p1, float* v_out, int32_t* t_out) {
    hn::Vec<decltype(d)> e0, o0, e1, o1;
    hn::LoadInterleaved2(d, p0, e0, o0);
    hn::LoadInterleaved2(d, p1, e1, o1);
    auto v = e0;
    auto t = hn::Zero(di);
    auto take_tap = [&](hn::Vec<decltype(d)> x, hn::Vec<decltype(di)> x_tap) {
      const auto take = hn::Or(hn::Gt(x, v), hn::IsNaN(x));
      v = hn::IfThenElse(take, x, v);
      t = hn::IfThenElse(hn::RebindMask(di, take), x_tap, t);
    };
    take_tap(o0, one);
    take_tap(e1, down);
    take_tap(o1, down_right);
    hn::StoreU(v, d, v_out);
    hn::StoreU(t, di, t_out);
  };
  int64_t ox = 0;
  for (; ox + lanes <= ow; ox += lanes) windows(r0 + 2 * ox, r1 + 2 * ox, value + ox, tap + ox);
  if (ox < ow) {
    constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
    HWY_ALIGN float in0[2 * kMaxLanes] = {}, in1[2 * kMaxLanes] = {}, v_tail[kMaxLanes];
    HWY_ALIGN int32_t t_tail[kMaxLanes];
    const size_t count = static_cast<size_t>(ow - ox);
    std::memcpy(in0, r0 + 2 * ox, 2 * count * sizeof(float));
    std::memcpy(in1, r1 + 2 * ox, 2 * count * sizeof(float));
    windows(in0, in1, v_tail, t_tail);
    std::memcpy(value + ox, v_tail, count * sizeof(float));
    std::memcpy(tap + ox, t_tail, count * sizeof(int32_t));
  }
}

// out[p * n + j] = b[j * ldb + p] for p < k, j < n (SmallGemmF32's copy of a transposed B): 4 x 4
// blocks through 128-bit vectors (four row loads, a transpose in registers, four row stores),
// the edges one element at a time. A copy: the same values on every target.
void TransposeToRows(const float* b, int64_t ldb, int64_t n, int64_t k, float* out) {
  int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR  // one lane: no 4-lane vectors
  const hn::FixedTag<float, 4> d;
  for (; j + 4 <= n; j += 4) {
    const float* row = b + j * ldb;
    int64_t p = 0;
    for (; p + 4 <= k; p += 4) {
      const auto r0 = hn::LoadU(d, row + p), r1 = hn::LoadU(d, row + ldb + p);
      const auto r2 = hn::LoadU(d, row + 2 * ldb + p), r3 = hn::LoadU(d, row + 3 * ldb + p);
      const auto t0 = hn::InterleaveLower(d, r0, r1), t1 = hn::InterleaveLower(d, r2, r3);
      const auto t2 = hn::InterleaveUpper(d, r0, r1), t3 = hn::InterleaveUpper(d, r2, r3);
      hn::StoreU(hn::ConcatLowerLower(d, t1, t0), d, out + p * n + j);
      hn::StoreU(hn::ConcatUpperUpper(d, t1, t0), d, out + (p + 1) * n + j);
      hn::StoreU(hn::ConcatLowerLower(d, t3, t2), d, out + (p + 2) * n + j);
      hn::StoreU(hn::ConcatUpperUpper(d, t3, t2), d, out + (p + 3) * n + j);
    }
    for (; p < k; ++p) {
      for (int64_t r = 0; r < 4; ++r) out[p * n + j + r] = row[r * ldb + p];
    }
  }
#endif
  for (; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) out[p * n + j] = b[j * ldb + p];
  }
}

void SmallGemm(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate, float* padded) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto columns = [&](const float* bj, int64_t ld, int64_t j, int64_t width) {
    int64_t i = 0;
    if (width > lanes) {
      for (; i + 4 <= m; i += 4) {
        SmallGemmBlock<4, 2>(d, ta, k, a, lda, i, bj, ld, c + j, ldc, width, accumulate);
      }
      for (; i < m; ++i) {
        SmallGemmBlock<1, 2>(d, ta, k, a, lda, i, bj, ld, c + j, ldc, width, accumulate);
      }
    } else {
      for (; i + 4 <= m; i += 4) {
        SmallGemmBlock<4, 1>(d, ta, k, a, lda, i, bj, ld, c + j, ldc, width, accumulate);
      }
      for (; i < m; ++i) {
        SmallGemmBlock<1, 1>(d, ta, k, a, lda, i, bj, ld, c + j, ldc, width, accumulate);
      }
    }
  };
  int64_t j = 0;
  for (; j + 2 * lanes <= n; j += 2 * lanes) columns(b + j, ldb, j, 2 * lanes);
  for (; j + lanes <= n; j += lanes) columns(b + j, ldb, j, lanes);
  if (j < n) {
    // `padded` holds k x lanes floats.
    for (int64_t p = 0; p < k; ++p) {
      float* row = padded + p * lanes;
      std::copy(b + p * ldb + j, b + p * ldb + n, row);
      std::fill(row + (n - j), row + lanes, 0.0f);
    }
    columns(padded, lanes, j, n - j);
  }
}

void Exp(const float* x, float* y, int64_t n) { Map(x, y, n, ExpOp()); }
void Tanh(const float* x, float* y, int64_t n) { Map(x, y, n, TanhOp()); }
void GeluTanh(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanhOp()); }
void GeluTanhGrad(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanhGradOp()); }
void Sigmoid(const float* x, float* y, int64_t n) { Map(x, y, n, SigmoidOp()); }
void Silu(const float* x, float* y, int64_t n) { Map(x, y, n, SiluOp()); }
void Swiglu(const float* gate, const float* up, float* y, int64_t n) {
  MapVectors<2, 1>({gate, up}, {y}, n, [](auto d, const auto& x, auto& out) {
    out[0] = hn::Mul(SiluOp()(d, x[0]), x[1]);
  });
}
// grad_up = dy silu(g); grad_gate = (dy u) (s ((g (1 - s)) + 1)), s = sigmoid(g): one exp for both.
void SwigluGrad(const float* gate, const float* up, const float* dy, float* grad_gate,
                float* grad_up, int64_t n) {
  MapVectors<3, 2>({gate, up, dy}, {grad_gate, grad_up}, n, [](auto d, const auto& x, auto& out) {
    const auto one = hn::Set(d, 1.0f);
    const auto denom = hn::Add(one, ExpOfNegated(d, x[0]));
    out[1] = hn::Mul(x[2], hn::Div(x[0], denom));
    const auto s = hn::Div(one, denom);
    const auto t = hn::Mul(s, hn::Add(hn::Mul(x[0], hn::Add(hn::Neg(s), one)), one));
    out[0] = hn::Mul(hn::Mul(x[2], x[1]), t);
  });
}

}  // namespace tg::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tg::cpu {

HWY_EXPORT(BFloat16ToFloat);
HWY_EXPORT(FloatToBFloat16);
HWY_EXPORT(RoundToBFloat16);
HWY_EXPORT(BFloat16RowsToFloat);
HWY_EXPORT(FloatRowsToBFloat16);
HWY_EXPORT(HalfToFloat);
HWY_EXPORT(FloatToHalf);
HWY_EXPORT(Adam);
HWY_EXPORT(Exp);
HWY_EXPORT(Max);
HWY_EXPORT(Scale);
HWY_EXPORT(SumAsF64);
HWY_EXPORT(SumProductsAsF64);
HWY_EXPORT(SumSquaredDeviationsF64);
HWY_EXPORT(Normalize);
HWY_EXPORT(AddColumnsToF64);
HWY_EXPORT(LayerNormParamGrads);
HWY_EXPORT(Tanh);
HWY_EXPORT(GeluTanh);
HWY_EXPORT(GeluTanhGrad);
HWY_EXPORT(Sigmoid);
HWY_EXPORT(Silu);
HWY_EXPORT(Swiglu);
HWY_EXPORT(SwigluGrad);
HWY_EXPORT(ScaleToFp8);
HWY_EXPORT(Fp8ToFloat);
HWY_EXPORT(SmallGemm);
HWY_EXPORT(TransposeToRows);
HWY_EXPORT(MaxPool2x2Row);

void ExpF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Exp)(x, y, n); }
float MaxF32(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(Max)(x, n); }
bool ScaleF32(float* x, int64_t n, float s, bool check_finite) {
  return HWY_DYNAMIC_DISPATCH(Scale)(x, n, s, check_finite);
}
void MaxPool2x2RowF32(const float* r0, const float* r1, int64_t ow, int32_t below, float* value,
                      int32_t* tap) {
  HWY_DYNAMIC_DISPATCH(MaxPool2x2Row)(r0, r1, ow, below, value, tap);
}
double SumAsF64(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumAsF64)(x, n); }
double SumProductsAsF64(const float* x, const float* y, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumProductsAsF64)(x, y, n);
}
double SumSquaredDeviationsF64(const float* x, int64_t n, double mean) {
  return HWY_DYNAMIC_DISPATCH(SumSquaredDeviationsF64)(x, n, mean);
}
void AddColumnsToF64(const float* x, int64_t rows, int64_t stride, int64_t cols, double* col) {
  HWY_DYNAMIC_DISPATCH(AddColumnsToF64)(x, rows, stride, cols, col);
}
void LayerNormParamGradsF32(const float* x, const float* g, int64_t rows, int64_t stride,
                            int64_t cols, const float* mean, const float* rstd, double* gw,
                            double* gb) {
  HWY_DYNAMIC_DISPATCH(LayerNormParamGrads)(x, g, rows, stride, cols, mean, rstd, gw, gb);
}
void NormalizeF32(const float* x, int64_t n, float mean, float rstd, const float* w, const float* b,
                  float* y) {
  HWY_DYNAMIC_DISPATCH(Normalize)(x, n, mean, rstd, w, b, y);
}
void AdamF32(float* p, const float* g, float* m, float* v, int64_t n, const AdamF32Scalars& s) {
  HWY_DYNAMIC_DISPATCH(Adam)(p, g, m, v, n, s);
}
void BFloat16BitsToF32(const uint16_t* in, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(BFloat16ToFloat)(in, out, n);
}
void F32ToBFloat16Bits(const float* in, uint16_t* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FloatToBFloat16)(in, out, n);
}
void RoundToBFloat16F32(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(RoundToBFloat16)(x, n); }
void BFloat16BitsRowsToF32(const uint16_t* in, int64_t in_stride, int64_t rows, int64_t n,
                           float* out) {
  HWY_DYNAMIC_DISPATCH(BFloat16RowsToFloat)(in, in_stride, rows, n, out);
}
void F32RowsToBFloat16Bits(const float* in, int64_t rows, int64_t n, uint16_t* out,
                           int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(FloatRowsToBFloat16)(in, rows, n, out, out_stride);
}
void HalfBitsToF32(const uint16_t* in, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(HalfToFloat)(in, out, n);
}
void F32ToHalfBits(const float* in, uint16_t* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(FloatToHalf)(in, out, n);
}
void TanhF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Tanh)(x, y, n); }
void GeluTanhF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(GeluTanh)(x, y, n); }
void GeluTanhGradF32(const float* x, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTanhGrad)(x, y, n);
}
void SigmoidF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Sigmoid)(x, y, n); }
void SiluF32(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(Silu)(x, y, n); }
void SwigluF32(const float* gate, const float* up, float* y, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Swiglu)(gate, up, y, n);
}
void SwigluGradF32(const float* gate, const float* up, const float* dy, float* grad_gate,
                   float* grad_up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluGrad)(gate, up, dy, grad_gate, grad_up, n);
}
void ScaleToFp8F32(const float* x, float scale, uint8_t* out, int64_t n, bool e4m3) {
  HWY_DYNAMIC_DISPATCH(ScaleToFp8)(x, scale, out, n, e4m3);
}
void Fp8ToF32(const uint8_t* in, float* out, int64_t n, bool e4m3) {
  HWY_DYNAMIC_DISPATCH(Fp8ToFloat)(in, out, n, e4m3);
}
void SmallGemmF32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  // A transposed B is packed to [k, n]; the padded copy of the last columns needs k x lanes
  // (at most 64 floats per row on any target).
  thread_local std::vector<float> packed, padded;
  if (tb) {
    packed.resize(static_cast<size_t>(k * n));
    HWY_DYNAMIC_DISPATCH(TransposeToRows)(b, ldb, n, k, packed.data());
    b = packed.data();
    ldb = n;
  }
  padded.resize(static_cast<size_t>(std::max<int64_t>(k, 1) * 64));
  HWY_DYNAMIC_DISPATCH(SmallGemm)(ta, m, n, k, a, lda, b, ldb, c, ldc, accumulate, padded.data());
}

const char* VecMathTarget() {
  // The best target compiled here that this CPU supports, as HWY_DYNAMIC_DISPATCH chooses it.
  return hwy::TargetName(hwy::SupportedAndGeneratedTargets()[0]);
}

}  // namespace tg::cpu
#endif  // HWY_ONCE
