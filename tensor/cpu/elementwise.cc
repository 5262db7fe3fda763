// Elementwise CPU kernels: one loop per (op, dtype), over rows given by ForEachRow.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/convert.h"
#include "tensor/cpu/activation.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/elementwise_formulas.h"
#include "tensor/strided_loop.h"

namespace tg::cpu {
namespace {

template <size_t N>
std::array<Shape, N> RowStrides(const RawTensor& out,
                                const std::array<const RawTensor*, N - 1>& in) {
  std::array<Shape, N> s;
  s[0] = BroadcastByteStrides(out, out.shape());
  for (size_t k = 0; k + 1 < N; ++k) s[k + 1] = BroadcastByteStrides(*in[k], out.shape());
  return s;
}

// The common case: every operand contiguous with out's shape, walked as one flat row without
// computing broadcast strides (most of the cost of an op on a small tensor).
bool FlatSameShape(const RawTensor& out, std::initializer_list<const RawTensor*> inputs) {
  if (!out.is_contiguous()) return false;
  for (const RawTensor* t : inputs) {
    if (t->shape() != out.shape() || !t->is_contiguous()) return false;
  }
  return true;
}

// Elements per thread below which a flat loop stays on one thread (parallel.h).
constexpr int64_t kElementsPerThread = int64_t{1} << 14;

// f16/bf16 operands of a flat loop go through f32 blocks of this many values, widened and rounded
// with the vectorised conversions (vec_math.h), the loop over a block being plain f32 code.
constexpr int64_t kBlock = 256;
template <typename Out, typename In>
constexpr bool kTwoByteFloats = std::is_same_v<Out, In> &&
                                (std::is_same_v<In, Half> || std::is_same_v<In, BFloat16>);

// out[i] = f(a[i], b[i]) with Out/In storage types; f takes and returns compute types.
template <typename Out, typename In, typename F>
void Map2(const RawTensor& out, const RawTensor& a, const RawTensor& b, F f) {
  // n contiguous elements (f16/bf16: widened and rounded in blocks by the vector conversions).
  auto contiguous = [&](Out* o, const In* x, const In* y, int64_t n) {
    if constexpr (kTwoByteFloats<Out, In>) {
      float xb[kBlock], yb[kBlock];
      for (int64_t i = 0; i < n; i += kBlock) {
        const int64_t len = std::min(kBlock, n - i);
        WidenToF32(x + i, xb, len);
        WidenToF32(y + i, yb, len);
        for (int64_t j = 0; j < len; ++j) xb[j] = f(xb[j], yb[j]);
        RoundFromF32(xb, o + i, len);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = Convert<Out>(f(Widen(x[i]), Widen(y[i])));
    }
  };
  if (FlatSameShape(out, {&a, &b})) {
    Out* o = static_cast<Out*>(out.raw_data());
    const In* x = static_cast<const In*>(a.raw_data());
    const In* y = static_cast<const In*>(b.raw_data());
    ParallelFor(out.numel(), kElementsPerThread, [&](int64_t begin, int64_t end) {
      contiguous(o + begin, x + begin, y + begin, end - begin);
    });
    return;
  }
  ForEachRow<3>(out.shape(),
                {static_cast<char*>(out.raw_data()), static_cast<char*>(a.raw_data()),
                 static_cast<char*>(b.raw_data())},
                RowStrides<3>(out, {&a, &b}),
                [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> step) {
                  Out* o = reinterpret_cast<Out*>(p[0]);
                  const In* x = reinterpret_cast<const In*>(p[1]);
                  const In* y = reinterpret_cast<const In*>(p[2]);
                  if (step[0] == sizeof(Out) && step[1] == sizeof(In) && step[2] == sizeof(In)) {
                    contiguous(o, x, y, n);
                    return;
                  }
                  const int64_t so = step[0] / int64_t{sizeof(Out)};
                  const int64_t sx = step[1] / int64_t{sizeof(In)};
                  const int64_t sy = step[2] / int64_t{sizeof(In)};
                  for (int64_t i = 0; i < n; ++i) {
                    o[i * so] = Convert<Out>(f(Widen(x[i * sx]), Widen(y[i * sy])));
                  }
                });
}

template <typename Out, typename In, typename F>
void Map1(const RawTensor& out, const RawTensor& x, F f) {
  if (FlatSameShape(out, {&x})) {
    Out* o = static_cast<Out*>(out.raw_data());
    const In* v = static_cast<const In*>(x.raw_data());
    ParallelFor(out.numel(), kElementsPerThread, [&](int64_t begin, int64_t end) {
      if constexpr (kTwoByteFloats<Out, In>) {
        float vb[kBlock];
        for (int64_t i = begin; i < end; i += kBlock) {
          const int64_t len = std::min(kBlock, end - i);
          WidenToF32(v + i, vb, len);
          for (int64_t j = 0; j < len; ++j) vb[j] = f(vb[j]);
          RoundFromF32(vb, o + i, len);
        }
      } else {
        for (int64_t i = begin; i < end; ++i) o[i] = Convert<Out>(f(Widen(v[i])));
      }
    });
    return;
  }
  ForEachRow<2>(out.shape(), {static_cast<char*>(out.raw_data()), static_cast<char*>(x.raw_data())},
                RowStrides<2>(out, {&x}),
                [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> step) {
                  Out* o = reinterpret_cast<Out*>(p[0]);
                  const In* v = reinterpret_cast<const In*>(p[1]);
                  if (step[0] == sizeof(Out) && step[1] == sizeof(In)) {
                    for (int64_t i = 0; i < n; ++i) o[i] = Convert<Out>(f(Widen(v[i])));
                    return;
                  }
                  const int64_t so = step[0] / int64_t{sizeof(Out)};
                  const int64_t sv = step[1] / int64_t{sizeof(In)};
                  for (int64_t i = 0; i < n; ++i) o[i * so] = Convert<Out>(f(Widen(v[i * sv])));
                });
}

// out = row_fn(x) for a unary op with a row form (tensor/cpu/activation.h: exp, tanh, GELU-tanh,
// sigmoid, SiLU): the
// values go through row_fn in blocks of the compute type C, widened from T and rounded back, so
// every layout and dtype gets the row form's value for each element.
template <typename T, typename RowFn>
void MapRows(const RawTensor& out, const RawTensor& x, RowFn row_fn) {
  using C = ComputeType<T>;
  auto run = [&](T* o, int64_t so, const T* v, int64_t sv, int64_t n) {
    if constexpr (std::is_same_v<T, C>) {
      if (so == 1 && sv == 1) return row_fn(v, o, n);
    }
    C block[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      for (int64_t j = 0; j < len; ++j) block[j] = Widen(v[(i + j) * sv]);
      row_fn(block, block, len);
      for (int64_t j = 0; j < len; ++j) o[(i + j) * so] = Convert<T>(block[j]);
    }
  };
  if (FlatSameShape(out, {&x})) {
    T* o = static_cast<T*>(out.raw_data());
    const T* v = static_cast<const T*>(x.raw_data());
    ParallelFor(out.numel(), kElementsPerThread,
                [&](int64_t begin, int64_t end) { run(o + begin, 1, v + begin, 1, end - begin); });
    return;
  }
  ForEachRow<2>(out.shape(), {static_cast<char*>(out.raw_data()), static_cast<char*>(x.raw_data())},
                RowStrides<2>(out, {&x}),
                [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> step) {
                  run(reinterpret_cast<T*>(p[0]), step[0] / int64_t{sizeof(T)},
                      reinterpret_cast<const T*>(p[1]), step[1] / int64_t{sizeof(T)}, n);
                });
}

using elementwise::HostMath;

template <typename C>
C ApplyBinary(BinaryOp op, C a, C b) {
  return elementwise::ApplyBinary<HostMath>(op, a, b);
}

// Each op gets its own loop instantiation (the switch is hoisted out of the element loop).
template <typename T, typename Fn>
void ForBinaryOp(BinaryOp op, Fn&& run) {
  using C = ComputeType<T>;
  switch (op) {
    case BinaryOp::kAdd:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kAdd, a, b); });
    case BinaryOp::kSub:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kSub, a, b); });
    case BinaryOp::kMul:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kMul, a, b); });
    case BinaryOp::kDiv:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kDiv, a, b); });
    case BinaryOp::kPow:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kPow, a, b); });
    case BinaryOp::kMaximum:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kMaximum, a, b); });
    case BinaryOp::kMinimum:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kMinimum, a, b); });
    case BinaryOp::kReluBackward:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kReluBackward, a, b); });
    case BinaryOp::kGeluTanhBackward:
      return run([](C a, C b) { return ApplyBinary<C>(BinaryOp::kGeluTanhBackward, a, b); });
  }
}

// out = grad * GeluTanh'(x) (BinaryOp::kGeluTanhBackward) for floating T: the derivative by rows
// (activation.h's GeluTanhGradRow, the vectorised form of composed::GeluTanhGrad) in blocks of
// the compute type, times the widened grad, rounded once: the epilogue of the fused Linear's
// backward (fused_linear.cc). grad and x are broadcast to out's shape.
template <typename T>
void GeluTanhBackwardRows(const RawTensor& out, const RawTensor& grad, const RawTensor& x) {
  using C = ComputeType<T>;
  auto run = [](T* o, int64_t so, const T* g, int64_t sg, const T* v, int64_t sv, int64_t n) {
    C d[kBlock], gw[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      for (int64_t j = 0; j < len; ++j) {
        d[j] = Widen(v[(i + j) * sv]);
        gw[j] = Widen(g[(i + j) * sg]);
      }
      GeluTanhGradRow(d, d, len);
      for (int64_t j = 0; j < len; ++j) o[(i + j) * so] = Convert<T>(gw[j] * d[j]);
    }
  };
  if (FlatSameShape(out, {&grad, &x})) {
    T* o = static_cast<T*>(out.raw_data());
    const T* g = static_cast<const T*>(grad.raw_data());
    const T* v = static_cast<const T*>(x.raw_data());
    ParallelFor(out.numel(), kElementsPerThread, [&](int64_t begin, int64_t end) {
      run(o + begin, 1, g + begin, 1, v + begin, 1, end - begin);
    });
    return;
  }
  ForEachRow<3>(out.shape(),
                {static_cast<char*>(out.raw_data()), static_cast<char*>(grad.raw_data()),
                 static_cast<char*>(x.raw_data())},
                RowStrides<3>(out, {&grad, &x}),
                [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> step) {
                  run(reinterpret_cast<T*>(p[0]), step[0] / int64_t{sizeof(T)},
                      reinterpret_cast<const T*>(p[1]), step[1] / int64_t{sizeof(T)},
                      reinterpret_cast<const T*>(p[2]), step[2] / int64_t{sizeof(T)}, n);
                });
}

// exp, tanh, GELU-tanh, sigmoid and SiLU of floating types take the row forms (MapRows with
// activation.h) instead: ForUnaryOp never instantiates them.
template <typename C>
C ApplyUnary(UnaryOp op, C x) {
  return elementwise::ApplyUnary<HostMath>(op, x);
}

template <typename T, typename Fn>
void ForUnaryOp(UnaryOp op, Fn&& run) {
  using C = ComputeType<T>;
  switch (op) {
#define TG_UNARY_CASE(name) \
  case UnaryOp::name:       \
    return run([](C x) { return ApplyUnary<C>(UnaryOp::name, x); });
    TG_UNARY_CASE(kNeg)
    TG_UNARY_CASE(kAbs)
    TG_UNARY_CASE(kLog)
    TG_UNARY_CASE(kSqrt)
    TG_UNARY_CASE(kRelu)
    TG_UNARY_CASE(kGelu)
    TG_UNARY_CASE(kErf)
#undef TG_UNARY_CASE
    case UnaryOp::kExp:
    case UnaryOp::kTanh:
    case UnaryOp::kGeluTanh:
    case UnaryOp::kSigmoid:
    case UnaryOp::kSilu:
      break;  // row forms: MapRows (Unary)
  }
}

using elementwise::ApplyCompare;

// Visits the numeric (non-bool) dtypes.
template <typename Fn>
void VisitNumeric(DType dtype, Fn&& fn) {
  Visit(dtype, [&](auto tag) {
    if constexpr (!std::is_same_v<decltype(tag), bool>) fn(tag);
  });
}

}  // namespace

void Binary(BinaryOp op, const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  VisitNumeric(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<ComputeType<T>>) {
      if (op == BinaryOp::kGeluTanhBackward) return GeluTanhBackwardRows<T>(out, a, b);
    }
    ForBinaryOp<T>(op, [&](auto f) { Map2<T, T>(out, a, b, f); });
  });
}

void BinaryScalar(BinaryOp op, const RawTensor& out, const RawTensor& x, double scalar) {
  VisitNumeric(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    const C s = static_cast<C>(scalar);
    ForBinaryOp<T>(op, [&](auto f) { Map1<T, T>(out, x, [&](C v) { return f(v, s); }); });
  });
}

void Compare(CompareOp op, const RawTensor& out, const RawTensor& a, const RawTensor& b) {
  Visit(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    switch (op) {
#define TG_COMPARE_CASE(name) \
  case CompareOp::name:       \
    return Map2<bool, T>(out, a, b, [](C x, C y) { return ApplyCompare(CompareOp::name, x, y); });
      TG_COMPARE_CASE(kEq)
      TG_COMPARE_CASE(kNe)
      TG_COMPARE_CASE(kLt)
      TG_COMPARE_CASE(kLe)
      TG_COMPARE_CASE(kGt)
      TG_COMPARE_CASE(kGe)
#undef TG_COMPARE_CASE
    }
  });
}

void Unary(UnaryOp op, const RawTensor& out, const RawTensor& x) {
  VisitNumeric(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using C = ComputeType<T>;
    if constexpr (std::is_floating_point_v<C>) {
      if (op == UnaryOp::kExp) {
        return MapRows<T>(out, x, [](const C* v, C* o, int64_t n) { ExpRow(v, o, n); });
      }
      if (op == UnaryOp::kTanh) {
        return MapRows<T>(out, x, [](const C* v, C* o, int64_t n) { TanhRow(v, o, n); });
      }
      if (op == UnaryOp::kGeluTanh) {
        return MapRows<T>(out, x, [](const C* v, C* o, int64_t n) { GeluTanhRow(v, o, n); });
      }
      if (op == UnaryOp::kSigmoid) {
        return MapRows<T>(out, x, [](const C* v, C* o, int64_t n) { SigmoidRow(v, o, n); });
      }
      if (op == UnaryOp::kSilu) {
        return MapRows<T>(out, x, [](const C* v, C* o, int64_t n) { SiluRow(v, o, n); });
      }
    }
    ForUnaryOp<T>(op, [&](auto f) { Map1<T, T>(out, x, f); });
  });
}

void Where(const RawTensor& out, const RawTensor& cond, const RawTensor& a, const RawTensor& b) {
  Visit(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    ForEachRow<4>(out.shape(),
                  {static_cast<char*>(out.raw_data()), static_cast<char*>(cond.raw_data()),
                   static_cast<char*>(a.raw_data()), static_cast<char*>(b.raw_data())},
                  RowStrides<4>(out, {&cond, &a, &b}),
                  [](std::array<char*, 4> p, int64_t n, std::array<int64_t, 4> step) {
                    for (int64_t i = 0; i < n; ++i) {
                      const uint8_t c = *reinterpret_cast<const uint8_t*>(p[1] + i * step[1]);
                      const char* src = c != 0 ? p[2] + i * step[2] : p[3] + i * step[3];
                      *reinterpret_cast<T*>(p[0] + i * step[0]) = *reinterpret_cast<const T*>(src);
                    }
                  });
  });
}

}  // namespace tg::cpu
