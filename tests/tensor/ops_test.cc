// Tests of the tensor ops (tensor/ops.h): every kernel against a straightforward f64 reference
// loop on random shapes, with broadcasting and non-contiguous inputs (transposed, stepped and
// expanded views), for f32/f64/f16/bf16 (and the integer types where the op takes them); exact
// values at the edges (f16 overflow, NaN, -inf, integer wrap-around); and the error text for bad
// input.
//
// Tolerances: f64 ~1e-12 relative, f32 ~1e-5 relative. f16/bf16 kernels compute in f32 and round
// once, so their result must equal the f64 reference rounded through the same dtype to within one
// unit in the last place of the low type.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/philox.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kFloatTypes = {kF32, kF64, kF16, kBF16};

// ---- Error checking ---------------------------------------------------------------------------

// Exact and substring checks of the tg::Error a statement throws (tests/tensor/throws.h).
#define EXPECT_ERROR(stmt, text) \
  EXPECT_TRUE(::tg::testing::ThrowsErrorExactly([&] { (void)(stmt); }, text))
#define EXPECT_ERROR_CONTAINS(stmt, text) \
  EXPECT_TRUE(::tg::testing::ThrowsError([&] { (void)(stmt); }, text))

// ---- Reading tensors independently of the library's copy kernels ------------------------------

template <typename T>
double AsDouble(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// All elements of `t` in row-major order, read through its own shape, strides and offset.
std::vector<double> Values(const RawTensor& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  if (t.numel() == 0) return out;
  Visit(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* base = static_cast<const T*>(t.storage()->data()) + t.offset();
    const Shape& shape = t.shape();
    const Shape& strides = t.strides();
    std::vector<int64_t> index(shape.size(), 0);
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d) off += index[d] * strides[d];
      out.push_back(AsDouble(base[off]));
      for (size_t d = shape.size(); d-- > 0;) {
        if (++index[d] < shape[d]) break;
        index[d] = 0;
      }
    }
  });
  return out;
}

// The values of `t` broadcast (numpy rules) to `shape`, row-major.
std::vector<double> BroadcastValues(const RawTensor& t, const Shape& shape) {
  const std::vector<double> v = Values(t);
  const Shape& ts = t.shape();
  EXPECT_LE(ts.size(), shape.size());
  const size_t lead = shape.size() - ts.size();
  const Shape tstrides = ContiguousStrides(ts);
  const int64_t n = NumElements(shape);
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = lead; d < shape.size(); ++d) {
      if (ts[d - lead] != 1) off += index[d] * tstrides[d - lead];
    }
    out[static_cast<size_t>(i)] = v[static_cast<size_t>(off)];
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

Shape Broadcast2(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---- Rounding to the low-precision types ------------------------------------------------------

// `v` as the library converts a double to `dtype` (floating dtypes: via f32, round to nearest
// even), back as a double.
double RoundTo(DType dtype, double v) {
  switch (dtype) {
    case DType::kF64:
      return v;
    case DType::kF32:
      return static_cast<float>(v);
    case DType::kF16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case DType::kBF16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    default:
      return v;
  }
}

// Position of a finite or infinite value on the ordered line of the low type's bit patterns.
int64_t OrderedBits(DType dtype, double v) {
  const uint16_t bits =
      dtype == kF16 ? Half(static_cast<float>(v)).bits : BFloat16(static_cast<float>(v)).bits;
  const int64_t magnitude = bits & 0x7fff;
  return (bits & 0x8000) ? -magnitude : magnitude;
}

// Integer results wrap to the width of their dtype.
double WrapInt(DType dtype, int64_t v) {
  switch (dtype) {
    case DType::kI32:
      return static_cast<int32_t>(static_cast<uint32_t>(v));
    case DType::kU8:
      return static_cast<uint8_t>(v);
    case DType::kBool:
      return v != 0;
    default:
      return static_cast<double>(v);
  }
}

// ---- Comparing against a reference -------------------------------------------------------------

struct Tol {
  double rtol = -1;  // < 0: the dtype's default
  double atol = -1;
  // Per-element extra absolute slack (e.g. sum |a_i b_i| * eps for a dot product); may be empty.
  std::vector<double> slack;
};

// Checks `got` (shape `shape`, dtype `dtype`) against the f64 reference `ref`.
void ExpectMatches(const RawTensor& got, const Shape& shape, DType dtype,
                   const std::vector<double>& ref, const std::string& what, Tol tol = {}) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), shape) << what << ": shape " << ShapeToString(got.shape());
  ASSERT_EQ(got.dtype(), dtype) << what << ": dtype " << DTypeName(got.dtype());
  const std::vector<double> g = Values(got);
  ASSERT_EQ(g.size(), ref.size()) << what;
  double rtol = tol.rtol, atol = tol.atol;
  if (dtype == kF64) {
    if (rtol < 0) rtol = 1e-12;
    if (atol < 0) atol = 1e-12;
  } else if (dtype == kF32) {
    if (rtol < 0) rtol = 1e-5;
    if (atol < 0) atol = 1e-6;
  } else if (atol < 0) {
    atol = 0;
  }
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double r = ref[i];
    const double slack = tol.slack.empty() ? 0.0 : tol.slack[i];
    bool ok;
    if (IsIntegral(dtype)) {
      ok = g[i] == r;
    } else if (std::isnan(r)) {
      ok = std::isnan(g[i]);
    } else if (std::isnan(g[i])) {
      ok = false;
    } else if (dtype == kF32 || dtype == kF64) {
      ok = std::isinf(r) ? g[i] == r : std::abs(g[i] - r) <= atol + slack + rtol * std::abs(r);
    } else {
      // f16/bf16: within one ulp of the correctly rounded reference.
      const double rounded = RoundTo(dtype, r);
      ok = std::abs(OrderedBits(dtype, g[i]) - OrderedBits(dtype, rounded)) <= 1 ||
           std::abs(g[i] - r) <= atol + slack;
    }
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << what << " [" << DTypeName(dtype) << "]: element " << i << " is " << g[i]
                    << ", expected " << r << " (rounded to dtype: " << RoundTo(dtype, r) << ")";
    }
  }
  if (failures > 5) ADD_FAILURE() << what << ": " << failures << " mismatches in total";
}

void ExpectExact(const RawTensor& got, const Shape& shape, DType dtype,
                 const std::vector<double>& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), shape) << what;
  ASSERT_EQ(got.dtype(), dtype) << what << ": dtype " << DTypeName(got.dtype());
  const std::vector<double> g = Values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << what << ": element " << i << " is " << g[i];
    } else {
      EXPECT_EQ(g[i], want[i]) << what << ": element " << i;
    }
  }
}

// ---- Random inputs and their layouts ----------------------------------------------------------

// Values of `shape` and `dtype`: floats uniform in [lo, hi) (normal with stddev hi when
// normal == true); integer types uniform integers in [lo, hi] (u8 clamps lo to 0; bool is 0/1).
RawTensor Draw(const Shape& shape, DType dtype, Generator& gen, double lo, double hi,
               bool normal = false) {
  if (IsFloating(dtype)) {
    return normal ? RandNormal(shape, gen, 0, hi, dtype) : RandUniform(shape, gen, lo, hi, dtype);
  }
  if (dtype == kU8) lo = std::max(lo, 0.0);
  if (dtype == kBool) lo = 0, hi = 1;
  const int64_t n = NumElements(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = std::floor(lo + (hi - lo + 1) * gen.NextUniformDouble());
  return RawTensor::FromVector<double>(v, shape).to(dtype);
}

enum class Layout { kContiguous, kTransposed, kStepped, kExpanded };

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kTransposed:
      return "transposed";
    case Layout::kStepped:
      return "stepped";
    case Layout::kExpanded:
      return "expanded";
  }
  return "?";
}

using Maker = std::function<RawTensor(const Shape&)>;

// A tensor of logical shape `shape` whose values come from `make`, laid out as `layout`:
// transposed (the last two dims swapped in memory), stepped (every other element along the last
// dim, at an offset), or expanded (size-1 dims broadcast with stride 0).
RawTensor WithLayout(const Shape& shape, Layout layout, const Maker& make) {
  const size_t nd = shape.size();
  if (layout == Layout::kTransposed && nd < 2) layout = Layout::kStepped;
  switch (layout) {
    case Layout::kContiguous:
      return make(shape);
    case Layout::kTransposed: {
      Shape s = shape;
      std::swap(s[nd - 1], s[nd - 2]);
      RawTensor t = make(s).transpose(-1, -2);
      EXPECT_EQ(t.shape(), shape);
      return t;
    }
    case Layout::kStepped: {
      if (nd == 0) return make({3}).select(0, 1);
      Shape s = shape;
      s[nd - 1] = 2 * s[nd - 1] + 1;
      RawTensor t = make(s).slice(-1, 1, s[nd - 1], 2);
      EXPECT_EQ(t.shape(), shape);
      return t;
    }
    case Layout::kExpanded: {
      Shape s = shape;
      for (size_t i = 0; i < nd; i += 2) {
        if (s[i] > 1) s[i] = 1;
      }
      return make(s).expand(shape);
    }
  }
  return RawTensor();
}

const std::vector<Layout> kAllLayouts = {Layout::kContiguous, Layout::kTransposed, Layout::kStepped,
                                         Layout::kExpanded};

// Pairs of layouts for the two inputs of a binary op.
const std::vector<std::pair<Layout, Layout>> kLayoutPairs = {
    {Layout::kContiguous, Layout::kContiguous},
    {Layout::kTransposed, Layout::kStepped},
    {Layout::kStepped, Layout::kExpanded},
    {Layout::kExpanded, Layout::kTransposed},
};

// Shape pairs that broadcast, including 0-d and empty tensors.
const std::vector<std::pair<Shape, Shape>> kBroadcastPairs = {
    {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}},    {{5}, {}},
    {{}, {}},         {{0, 3}, {3}},    {{4, 1, 6}, {1, 5, 1}}, {{1}, {2, 3}},
};

std::string Describe(const std::string& op, DType dtype, const Shape& a, const Shape& b, Layout la,
                     Layout lb) {
  return op + " " + DTypeName(dtype) + " " + ShapeToString(a) + " (" + LayoutName(la) + ") and " +
         ShapeToString(b) + " (" + LayoutName(lb) + ")";
}

// ==== Binary elementwise ops =====================================================================

struct BinarySpec {
  BinaryOp op;
  std::function<double(double, double)> ref;
  double a_lo, a_hi, b_lo, b_hi;
  bool normal;  // draw both from N(0, a_hi) instead
};

const std::vector<BinarySpec>& BinarySpecs() {
  static const auto* specs = new std::vector<BinarySpec>{
      {BinaryOp::kAdd, [](double a, double b) { return a + b; }, 0, 2, 0, 2, true},
      {BinaryOp::kSub, [](double a, double b) { return a - b; }, 0, 2, 0, 2, true},
      {BinaryOp::kMul, [](double a, double b) { return a * b; }, 0, 2, 0, 2, true},
      {BinaryOp::kDiv, [](double a, double b) { return a / b; }, -3, 3, 0.25, 4, false},
      {BinaryOp::kPow, [](double a, double b) { return std::pow(a, b); }, 0.1, 3, -2.5, 2.5, false},
      {BinaryOp::kMaximum, [](double a, double b) { return std::max(a, b); }, 0, 2, 0, 2, true},
      {BinaryOp::kMinimum, [](double a, double b) { return std::min(a, b); }, 0, 2, 0, 2, true},
  };
  return *specs;
}

TEST(BinaryOps, MatchReferenceOnBroadcastAndStridedInputs) {
  Generator gen(1);
  int checked = 0;
  for (const BinarySpec& spec : BinarySpecs()) {
    for (DType dtype : kFloatTypes) {
      for (const auto& [sa, sb] : kBroadcastPairs) {
        for (const auto& [la, lb] : kLayoutPairs) {
          const RawTensor a = WithLayout(sa, la, [&](const Shape& s) {
            return Draw(s, dtype, gen, spec.a_lo, spec.a_hi, spec.normal);
          });
          RawTensor b = WithLayout(sb, lb, [&](const Shape& s) {
            return Draw(s, dtype, gen, spec.b_lo, spec.b_hi, spec.normal);
          });
          const Shape out_shape = Broadcast2(sa, sb);
          const std::vector<double> av = BroadcastValues(a, out_shape);
          const std::vector<double> bv = BroadcastValues(b, out_shape);
          std::vector<double> ref(av.size());
          for (size_t i = 0; i < av.size(); ++i) ref[i] = spec.ref(av[i], bv[i]);
          ExpectMatches(Binary(spec.op, a, b), out_shape, dtype, ref,
                        Describe(BinaryOpName(spec.op), dtype, sa, sb, la, lb));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 7 * 4 * 8 * 4);
}

TEST(BinaryOps, IntegerTypesAreExactAndWrap) {
  Generator gen(2);
  const std::vector<BinaryOp> ops = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul,
                                     BinaryOp::kMaximum, BinaryOp::kMinimum};
  for (BinaryOp op : ops) {
    for (DType dtype : {kI32, kI64, kU8}) {
      for (const auto& [sa, sb] : kBroadcastPairs) {
        for (const auto& [la, lb] : kLayoutPairs) {
          const RawTensor a =
              WithLayout(sa, la, [&](const Shape& s) { return Draw(s, dtype, gen, -40, 40); });
          const RawTensor b =
              WithLayout(sb, lb, [&](const Shape& s) { return Draw(s, dtype, gen, -40, 40); });
          const Shape out_shape = Broadcast2(sa, sb);
          const std::vector<double> av = BroadcastValues(a, out_shape);
          const std::vector<double> bv = BroadcastValues(b, out_shape);
          std::vector<double> ref(av.size());
          for (size_t i = 0; i < av.size(); ++i) {
            const auto x = static_cast<int64_t>(av[i]), y = static_cast<int64_t>(bv[i]);
            int64_t r = 0;
            switch (op) {
              case BinaryOp::kAdd:
                r = x + y;
                break;
              case BinaryOp::kSub:
                r = x - y;
                break;
              case BinaryOp::kMul:
                r = x * y;
                break;
              case BinaryOp::kMaximum:
                r = std::max(x, y);
                break;
              case BinaryOp::kMinimum:
                r = std::min(x, y);
                break;
              default:
                break;
            }
            ref[i] = WrapInt(dtype, r);
          }
          ExpectMatches(Binary(op, a, b), out_shape, dtype, ref,
                        Describe(BinaryOpName(op), dtype, sa, sb, la, lb));
        }
      }
    }
  }
}

TEST(BinaryOps, IntegerOverflowWrapsAroundWithoutUndefinedBehaviour) {
  const int64_t kMax64 = std::numeric_limits<int64_t>::max();
  const int64_t kMin64 = std::numeric_limits<int64_t>::min();
  const RawTensor a = RawTensor::FromVector<int64_t>({kMax64, kMin64, kMax64}, {3});
  const RawTensor b = RawTensor::FromVector<int64_t>({1, 1, 2}, {3});
  EXPECT_EQ(Add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{kMin64, kMin64 + 1, kMin64 + 1}));
  EXPECT_EQ(Sub(a, b).to_vector<int64_t>(), (std::vector<int64_t>{kMax64 - 1, kMax64, kMax64 - 2}));
  EXPECT_EQ(Mul(a, b).to_vector<int64_t>(), (std::vector<int64_t>{kMax64, kMin64, -2}));
  const RawTensor i32 = RawTensor::FromVector<int32_t>({2147483647, -2147483647 - 1}, {2});
  EXPECT_EQ(AddScalar(i32, 1).to_vector<int32_t>(),
            (std::vector<int32_t>{-2147483647 - 1, -2147483647}));
  const RawTensor u8 = RawTensor::FromVector<uint8_t>({3, 250}, {2});
  EXPECT_EQ(Sub(u8, RawTensor::FromVector<uint8_t>({5, 0}, {2})).to_vector<int64_t>(),
            (std::vector<int64_t>{254, 250}));
  EXPECT_EQ(AddScalar(u8, 10).to_vector<int64_t>(), (std::vector<int64_t>{13, 4}));
}

TEST(BinaryOps, DtypePromotion) {
  Generator gen(3);
  struct Case {
    DType a, b, out;
  };
  const std::vector<Case> cases = {
      {kF16, kF32, kF32},  {kBF16, kF16, kF32}, {kI32, kF16, kF16}, {kI64, kBF16, kBF16},
      {kF32, kF64, kF64},  {kU8, kI32, kI32},   {kI32, kI64, kI64}, {kBool, kI32, kI32},
      {kBool, kF16, kF16}, {kU8, kF64, kF64},
  };
  for (const Case& c : cases) {
    const RawTensor a = Draw({2, 3}, c.a, gen, -5, 5);
    const RawTensor b = Draw({3}, c.b, gen, -5, 5);
    const std::vector<double> av = BroadcastValues(a, {2, 3}), bv = BroadcastValues(b, {2, 3});
    std::vector<double> sum(6), prod(6);
    for (size_t i = 0; i < 6; ++i) {
      sum[i] = av[i] + bv[i];
      prod[i] = av[i] * bv[i];
    }
    const std::string what = std::string(DTypeName(c.a)) + " with " + DTypeName(c.b);
    ExpectMatches(Add(a, b), {2, 3}, c.out, sum, "add " + what);
    ExpectMatches(Mul(b, a), {2, 3}, c.out, prod, "mul " + what);
  }
}

TEST(BinaryOps, ScalarOperandsKeepTheTensorDtype) {
  Generator gen(4);
  for (DType dtype : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const RawTensor x =
          WithLayout({3, 5}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0.2, 3); });
      const std::vector<double> xv = Values(x);
      struct Case {
        BinaryOp op;
        double s;
        std::function<double(double, double)> ref;
      };
      const std::vector<Case> cases = {
          {BinaryOp::kAdd, 1.75, [](double a, double s) { return a + s; }},
          {BinaryOp::kSub, -0.5, [](double a, double s) { return a - s; }},
          {BinaryOp::kMul, 3.25, [](double a, double s) { return a * s; }},
          {BinaryOp::kDiv, 7.0, [](double a, double s) { return a / s; }},
          {BinaryOp::kPow, 2.0, [](double a, double s) { return std::pow(a, s); }},
          {BinaryOp::kPow, 0.5, [](double a, double s) { return std::pow(a, s); }},
          {BinaryOp::kPow, -1.5, [](double a, double s) { return std::pow(a, s); }},
          {BinaryOp::kMaximum, 1.0, [](double a, double s) { return std::max(a, s); }},
          {BinaryOp::kMinimum, 1.0, [](double a, double s) { return std::min(a, s); }},
      };
      for (const Case& c : cases) {
        std::vector<double> ref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) ref[i] = c.ref(xv[i], c.s);
        ExpectMatches(BinaryScalar(c.op, x, c.s), {3, 5}, dtype, ref,
                      std::string(BinaryOpName(c.op)) + " scalar " + std::to_string(c.s) + " " +
                          LayoutName(layout));
      }
    }
  }
}

TEST(BinaryOps, PowWithTensorAndScalarExponents) {
  // Negative bases with integral exponents, and the usual special cases.
  const RawTensor base = RawTensor::FromVector<double>({-2, -1.5, 0, 3, 4}, {5});
  ExpectMatches(Pow(base, 3.0), {5}, kF64, {-8, -3.375, 0, 27, 64}, "pow(x, 3)");
  ExpectMatches(Pow(base, 2.0), {5}, kF64, {4, 2.25, 0, 9, 16}, "pow(x, 2)");
  ExpectMatches(Pow(base.to(kF32), 0.0), {5}, kF32, {1, 1, 1, 1, 1}, "pow(x, 0)");
  ExpectMatches(Pow(RawTensor::FromVector<float>({4, 9, 0.25f}, {3}), 0.5), {3}, kF32, {2, 3, 0.5},
                "pow(x, 0.5)");
  const std::vector<double> neg_half = Values(Pow(RawTensor::FromVector<float>({-4}, {1}), 0.5));
  EXPECT_TRUE(std::isnan(neg_half[0]));
  ExpectMatches(Pow(RawTensor::FromVector<float>({0, 2}, {2}), -1.0), {2}, kF32, {kInf, 0.5},
                "pow(x, -1)");
  // RawTensor exponent broadcast over rows.
  const RawTensor b = RawTensor::FromVector<float>({2, 3, 4}, {3});
  const RawTensor e = RawTensor::FromVector<float>({1, 2, -1}, {3});
  ExpectMatches(Pow(b.expand({2, 3}), e), {2, 3}, kF32, {2, 9, 0.25, 2, 9, 0.25}, "pow broadcast");
  // f16 and bf16 exponentiation rounds once.
  ExpectExact(Pow(RawTensor::FromVector<float>({3, 10}, {2}, kF16), 2.0), {2}, kF16, {9, 100},
              "pow f16");
  // 3^7 = 2187 is a tie between 2186 and 2188 in f16 (spacing 2): the even 2188.
  ExpectExact(Pow(RawTensor::FromVector<float>({3}, {1}, kF16),
                  RawTensor::FromVector<float>({7}, {1}, kF16)),
              {1}, kF16, {2188}, "pow f16 2187 -> 2188");
  // 3^6 = 729 rounds to 728 in bf16 (spacing 4).
  ExpectExact(Pow(RawTensor::FromVector<float>({3}, {1}, kBF16), 6.0), {1}, kBF16, {728},
              "pow bf16 729 -> 728");
}

TEST(BinaryOps, MaximumAndMinimumPropagateNaN) {
  for (DType dtype : kFloatTypes) {
    const RawTensor a = RawTensor::FromVector<double>({kNaN, 1, 2, kNaN, -kInf}, {5}, dtype);
    const RawTensor b = RawTensor::FromVector<double>({0, kNaN, 3, kNaN, 5}, {5}, dtype);
    ExpectExact(Maximum(a, b), {5}, dtype, {kNaN, kNaN, 3, kNaN, 5}, "maximum");
    ExpectExact(Minimum(a, b), {5}, dtype, {kNaN, kNaN, 2, kNaN, -kInf}, "minimum");
    ExpectExact(Maximum(b, a), {5}, dtype, {kNaN, kNaN, 3, kNaN, 5}, "maximum swapped");
    ExpectExact(Minimum(b, a), {5}, dtype, {kNaN, kNaN, 2, kNaN, -kInf}, "minimum swapped");
  }
}

TEST(BinaryOps, ReluBackwardIsPyTorchsThresholdBackward) {
  // 0 where y <= 0 (a NaN or infinite gradient there too), the gradient where y > 0 or y is NaN.
  for (DType dtype : kFloatTypes) {
    const RawTensor grad =
        RawTensor::FromVector<double>({1.5, kNaN, kInf, -2, 3, kNaN, 4}, {7}, dtype);
    const RawTensor y = RawTensor::FromVector<double>({0, -0.0, -1, 2, kNaN, 5, kInf}, {7}, dtype);
    ExpectExact(ReluBackward(grad, y), {7}, dtype, {0, 0, 0, -2, 3, kNaN, 4}, "relu_backward");
    // Broadcast and strided operands go through the same rule.
    const RawTensor g2 = RawTensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {3, 2}, dtype);
    const RawTensor y2 = RawTensor::FromVector<double>({1, -1}, {2}, dtype);
    ExpectExact(ReluBackward(g2.transpose(0, 1).contiguous().transpose(0, 1), y2), {3, 2}, dtype,
                {1, 0, 3, 0, 5, 0}, "relu_backward broadcast");
  }
  const RawTensor gi = RawTensor::FromVector<int64_t>({7, 8, 9}, {3});
  const RawTensor yi = RawTensor::FromVector<int64_t>({0, 1, -1}, {3});
  EXPECT_EQ(ReluBackward(gi, yi).to_vector<int64_t>(), (std::vector<int64_t>{0, 8, 0}));
}

TEST(BinaryOps, F16AndBF16RoundToNearestEvenAndOverflowToInf) {
  // 300 * 300 = 90000 is above the f16 maximum 65504.
  const RawTensor x = RawTensor::Full({2}, 300, kF16);
  ExpectExact(Mul(x, x), {2}, kF16, {kInf, kInf}, "f16 300 * 300");
  ExpectExact(MulScalar(x, 300), {2}, kF16, {kInf, kInf}, "f16 300 * scalar 300");
  ExpectExact(Mul(Neg(x), x), {2}, kF16, {-kInf, -kInf}, "f16 -300 * 300");
  // The same product fits in bf16 (rounded to 8 significant bits: 90112).
  ExpectExact(Mul(x.to(kBF16), x.to(kBF16)), {2}, kBF16, {90112, 90112}, "bf16 300 * 300");
  // 65504 + d: the exact sum rounds to nearest even; 65520 (halfway to 65536) and above is inf.
  const RawTensor max = RawTensor::Full({1}, 65504, kF16);
  auto add = [&](double d) { return Add(max, RawTensor::Full({1}, d, kF16)).item(); };
  EXPECT_EQ(add(8), 65504);
  EXPECT_EQ(add(15), 65504);
  EXPECT_EQ(add(16), kInf);
  EXPECT_EQ(add(32), kInf);
  EXPECT_EQ(add(-16), 65472);  // 65488 is a tie between 65472 (even) and 65504 (odd)
  EXPECT_EQ(Add(Neg(max), RawTensor::Full({1}, -16, kF16)).item(), -kInf);
  // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and rounds to the even 1.
  const RawTensor one = RawTensor::Full({1}, 1, kBF16);
  EXPECT_EQ(Add(one, RawTensor::Full({1}, 0.00390625, kBF16)).item(), 1.0);
  EXPECT_EQ(Add(one, RawTensor::Full({1}, 0.005859375, kBF16)).item(), 1.0078125);
  // f16 subnormals are produced: 2^-14 / 4 = 2^-16.
  EXPECT_EQ(
      Div(RawTensor::Full({1}, std::ldexp(1.0, -14), kF16), RawTensor::Full({1}, 4, kF16)).item(),
      std::ldexp(1.0, -16));
  // Division by zero.
  ExpectExact(Div(RawTensor::FromVector<float>({1, -1, 0}, {3}, kF16), RawTensor::Zeros({3}, kF16)),
              {3}, kF16, {kInf, -kInf, kNaN}, "f16 x / 0");
}

TEST(BinaryOps, OperatorsMatchNamedOps) {
  const RawTensor a = RawTensor::FromVector<float>({1, 2, 3}, {3});
  const RawTensor b = RawTensor::FromVector<float>({4, 5, 6}, {3});
  ExpectExact(a + b, {3}, kF32, {5, 7, 9}, "+");
  ExpectExact(a - b, {3}, kF32, {-3, -3, -3}, "-");
  ExpectExact(a * b, {3}, kF32, {4, 10, 18}, "*");
  ExpectExact(b / RawTensor::FromVector<float>({2, 4, 8}, {3}), {3}, kF32, {2, 1.25, 0.75}, "/");
  ExpectExact(-a, {3}, kF32, {-1, -2, -3}, "unary -");
}

TEST(BinaryOps, Errors) {
  const RawTensor a = RawTensor::Zeros({2, 3});
  EXPECT_ERROR(Add(a, RawTensor::Zeros({4})), "add: shapes [2, 3] and [4] cannot be broadcast");
  EXPECT_ERROR(Mul(RawTensor::Zeros({2, 1, 3}), RawTensor::Zeros({4, 2})),
               "mul: shapes [2, 1, 3] and [4, 2] cannot be broadcast");
  EXPECT_ERROR(Div(RawTensor::Zeros({2}, kI64), RawTensor::Zeros({2}, kI32)),
               "div: expected floating inputs, got i64 and i32; cast them first");
  EXPECT_ERROR(Pow(RawTensor::Zeros({2}, kI32), RawTensor::Zeros({2}, kI32)),
               "pow: expected floating inputs, got i32 and i32; cast them first");
  EXPECT_ERROR(Pow(RawTensor::Zeros({2}, kI32), 2.0),
               "pow: expected a floating tensor, got i32; cast it first");
  EXPECT_ERROR(BinaryScalar(BinaryOp::kDiv, RawTensor::Zeros({2}, kI64), 2.0),
               "div: expected a floating tensor, got i64; cast it first");
  EXPECT_ERROR(AddScalar(RawTensor::Zeros({2}, kI32), 0.5),
               "add: scalar 0.5 is not an integer, and the tensor is i32; cast it first");
  EXPECT_ERROR(Add(RawTensor::Zeros({2}, kBool), RawTensor::Zeros({2}, kBool)),
               "add: not defined for bool tensors; cast them first");
  EXPECT_ERROR(MulScalar(RawTensor::Zeros({2}, kBool), 2),
               "mul: not defined for bool tensors; cast them first");
  EXPECT_ERROR(Add(RawTensor(), a), "add: the first input is an undefined tensor");
  EXPECT_ERROR(Sub(a, RawTensor()), "sub: the second input is an undefined tensor");
}

// ==== Unary ops
// ===================================================================================

struct UnarySpec {
  UnaryOp op;
  std::function<double(double)> ref;
  double lo, hi;
  bool normal;
  bool ints;  // defined for integer dtypes too
};

double GeluRef(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double GeluTanhRef(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<UnarySpec>& UnarySpecs() {
  static const auto* specs = new std::vector<UnarySpec>{
      {UnaryOp::kNeg, [](double x) { return -x; }, 0, 3, true, true},
      {UnaryOp::kAbs, [](double x) { return std::abs(x); }, 0, 3, true, true},
      {UnaryOp::kExp, [](double x) { return std::exp(x); }, -6, 6, false, false},
      {UnaryOp::kLog, [](double x) { return std::log(x); }, 0.01, 20, false, false},
      {UnaryOp::kSqrt, [](double x) { return std::sqrt(x); }, 0, 50, false, false},
      {UnaryOp::kTanh, [](double x) { return std::tanh(x); }, 0, 2, true, false},
      {UnaryOp::kSigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, 0, 4, true, false},
      {UnaryOp::kRelu, [](double x) { return x > 0 ? x : 0.0; }, 0, 2, true, true},
      {UnaryOp::kGelu, GeluRef, 0, 2.5, true, false},
      {UnaryOp::kGeluTanh, GeluTanhRef, 0, 2.5, true, false},
      {UnaryOp::kSilu, [](double x) { return x / (1 + std::exp(-x)); }, 0, 4, true, false},
  };
  return *specs;
}

TEST(UnaryOps, MatchReferenceOnStridedInputs) {
  Generator gen(5);
  const std::vector<Shape> shapes = {{3, 4}, {2, 3, 5}, {7}, {}, {0, 2}, {1, 6}};
  for (const UnarySpec& spec : UnarySpecs()) {
    for (DType dtype : kFloatTypes) {
      for (const Shape& shape : shapes) {
        for (Layout layout : kAllLayouts) {
          const RawTensor x = WithLayout(shape, layout, [&](const Shape& s) {
            return Draw(s, dtype, gen, spec.lo, spec.hi, spec.normal);
          });
          const std::vector<double> xv = Values(x);
          std::vector<double> ref(xv.size());
          for (size_t i = 0; i < xv.size(); ++i) ref[i] = spec.ref(xv[i]);
          // Results that come from cancellation (1 + tanh(z) for very negative x) carry the f32
          // compute error in absolute terms; it shows only on tiny f16/bf16 results.
          Tol tol;
          if (dtype == kF16 || dtype == kBF16) tol.atol = 1e-6;
          ExpectMatches(Unary(spec.op, x), shape, dtype, ref,
                        std::string(UnaryOpName(spec.op)) + " " + ShapeToString(shape) + " " +
                            LayoutName(layout),
                        tol);
        }
      }
    }
  }
}

TEST(UnaryOps, IntegerNegAbsRelu) {
  Generator gen(6);
  for (const UnarySpec& spec : UnarySpecs()) {
    if (!spec.ints) continue;
    for (DType dtype : {kI32, kI64}) {
      for (Layout layout : kAllLayouts) {
        const RawTensor x = WithLayout(
            {4, 5}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, -100, 100); });
        const std::vector<double> xv = Values(x);
        std::vector<double> ref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) ref[i] = spec.ref(xv[i]);
        ExpectMatches(Unary(spec.op, x), {4, 5}, dtype, ref,
                      std::string(UnaryOpName(spec.op)) + " " + LayoutName(layout));
      }
    }
  }
  // Negating the most negative integer wraps (no signed-overflow UB).
  const int64_t kMin64 = std::numeric_limits<int64_t>::min();
  const RawTensor m = RawTensor::FromVector<int64_t>({kMin64, -3}, {2});
  EXPECT_EQ(Neg(m).to_vector<int64_t>(), (std::vector<int64_t>{kMin64, 3}));
  EXPECT_EQ(Abs(m).to_vector<int64_t>(), (std::vector<int64_t>{kMin64, 3}));
  EXPECT_EQ(Relu(m).to_vector<int64_t>(), (std::vector<int64_t>{0, 0}));
  const RawTensor m32 = RawTensor::FromVector<int32_t>({-2147483647 - 1, 7}, {2});
  EXPECT_EQ(Neg(m32).to_vector<int32_t>(), (std::vector<int32_t>{-2147483647 - 1, -7}));
}

TEST(UnaryOps, SpecialValues) {
  for (DType dtype : kFloatTypes) {
    const RawTensor x = RawTensor::FromVector<double>({kNaN, kInf, -kInf, 0, -0.0}, {5}, dtype);
    ExpectExact(Relu(x), {5}, dtype, {kNaN, kInf, 0, 0, 0}, "relu");
    ExpectExact(Exp(x), {5}, dtype, {kNaN, kInf, 0, 1, 1}, "exp");
    ExpectExact(Tanh(x), {5}, dtype, {kNaN, 1, -1, 0, 0}, "tanh");
    ExpectExact(Sigmoid(x), {5}, dtype, {kNaN, 1, 0, 0.5, 0.5}, "sigmoid");
    ExpectExact(Abs(x), {5}, dtype, {kNaN, kInf, kInf, 0, 0}, "abs");
    ExpectExact(Log(RawTensor::FromVector<double>({0, -1, 1, kInf}, {4}, dtype)), {4}, dtype,
                {-kInf, kNaN, 0, kInf}, "log");
    ExpectExact(Sqrt(RawTensor::FromVector<double>({-1, 0, 4, kInf}, {4}, dtype)), {4}, dtype,
                {kNaN, 0, 2, kInf}, "sqrt");
    ExpectExact(Gelu(RawTensor::FromVector<double>({0, kInf}, {2}, dtype)), {2}, dtype, {0, kInf},
                "gelu");
    // PyTorch 2.15's silu on the same values: -inf / (1 + inf) is NaN there too.
    ExpectExact(Silu(x), {5}, dtype, {kNaN, kInf, kNaN, 0, 0}, "silu");
  }
  // silu(-1000) is -0 (x / inf) and silu(-1) rounds as PyTorch's: f32 -0.2689414322376251,
  // f16 -0.26904296875, f64 -0.2689414213699951.
  EXPECT_TRUE(
      std::signbit(Silu(RawTensor::FromVector<float>({-1000.0f}, {1})).to_vector<float>()[0]));
  ExpectExact(Silu(RawTensor::Full({1}, -1.0, kF32)), {1}, kF32, {-0.2689414322376251}, "silu f32");
  ExpectExact(Silu(RawTensor::Full({1}, -1.0, kF16)), {1}, kF16, {-0.26904296875}, "silu f16");
  ExpectExact(Silu(RawTensor::Full({1}, -1.0, kF64)), {1}, kF64, {-0.2689414213699951}, "silu f64");
  // exp overflows f16 at 11.09 (e^11.09 > 65520) but not f32.
  ExpectExact(Exp(RawTensor::Full({1}, 11.25, kF16)), {1}, kF16, {kInf}, "f16 exp overflow");
  EXPECT_NEAR(Exp(RawTensor::Full({1}, 11.25, kF32)).item(), std::exp(11.25), 1e-2);
  // Sign of zero survives neg and abs.
  const std::vector<float> z = Neg(RawTensor::FromVector<float>({0.0f}, {1})).to_vector<float>();
  EXPECT_TRUE(std::signbit(z[0]));
  EXPECT_FALSE(std::signbit(Abs(RawTensor::FromVector<float>({-0.0f}, {1})).to_vector<float>()[0]));
}

TEST(UnaryOps, GeluVariantsDiffer) {
  // The exact and tanh-approximated GELU differ by ~1e-4 near |x| = 2: both must be their own.
  const RawTensor x = RawTensor::FromVector<double>({-3, -2, -1, 0.5, 1, 2, 3}, {7});
  const std::vector<double> xv = Values(x);
  std::vector<double> exact, approx;
  for (double v : xv) {
    exact.push_back(GeluRef(v));
    approx.push_back(GeluTanhRef(v));
  }
  ExpectMatches(Gelu(x), {7}, kF64, exact, "gelu exact");
  ExpectMatches(GeluTanh(x), {7}, kF64, approx, "gelu tanh");
  EXPECT_GT(std::abs(Gelu(x).to_vector<double>()[1] - GeluTanh(x).to_vector<double>()[1]), 1e-5);
  EXPECT_NEAR(Gelu(x).to_vector<double>()[4], 0.8413447460685429, 1e-15);
}

TEST(UnaryOps, Errors) {
  EXPECT_ERROR(Exp(RawTensor::Zeros({2}, kI64)),
               "exp: expected a floating dtype (f32, f64, f16, bf16), got i64");
  EXPECT_ERROR(Log(RawTensor::Zeros({2}, kI32)),
               "log: expected a floating dtype (f32, f64, f16, bf16), got i32");
  EXPECT_ERROR(Sigmoid(RawTensor::Zeros({2}, kU8)),
               "sigmoid: expected a floating dtype (f32, f64, f16, bf16), got u8");
  EXPECT_ERROR(Gelu(RawTensor::Zeros({2}, kBool)),
               "gelu: expected a floating dtype (f32, f64, f16, bf16), got bool");
  EXPECT_ERROR(Neg(RawTensor::Zeros({2}, kBool)),
               "neg: not defined for bool tensors; cast them first");
  EXPECT_ERROR(Tanh(RawTensor()), "tanh: the input is an undefined tensor");
}

// ==== Comparisons and where ======================================================================

TEST(CompareOps, MatchReferenceAndReturnBool) {
  Generator gen(7);
  const std::vector<std::pair<CompareOp, std::function<bool(double, double)>>> ops = {
      {CompareOp::kEq, [](double a, double b) { return a == b; }},
      {CompareOp::kNe, [](double a, double b) { return a != b; }},
      {CompareOp::kLt, [](double a, double b) { return a < b; }},
      {CompareOp::kLe, [](double a, double b) { return a <= b; }},
      {CompareOp::kGt, [](double a, double b) { return a > b; }},
      {CompareOp::kGe, [](double a, double b) { return a >= b; }},
  };
  const std::vector<DType> dtypes = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool};
  for (const auto& [op, ref] : ops) {
    for (DType dtype : dtypes) {
      for (const auto& [sa, sb] : kBroadcastPairs) {
        for (const auto& [la, lb] : kLayoutPairs) {
          // Small integers so that equal pairs are common.
          auto make = [&](const Shape& s) {
            return IsFloating(dtype) ? Draw(s, kI32, gen, -3, 3).to(dtype)
                                     : Draw(s, dtype, gen, -3, 3);
          };
          const RawTensor a = WithLayout(sa, la, make), b = WithLayout(sb, lb, make);
          const Shape out_shape = Broadcast2(sa, sb);
          const std::vector<double> av = BroadcastValues(a, out_shape);
          const std::vector<double> bv = BroadcastValues(b, out_shape);
          std::vector<double> want(av.size());
          for (size_t i = 0; i < av.size(); ++i) want[i] = ref(av[i], bv[i]) ? 1 : 0;
          ExpectExact(Compare(op, a, b), out_shape, kBool, want,
                      Describe(CompareOpName(op), dtype, sa, sb, la, lb));
        }
      }
    }
  }
}

TEST(CompareOps, NaNAndMixedDtypes) {
  const RawTensor a = RawTensor::FromVector<double>({kNaN, 1, 2, -kInf}, {4});
  const RawTensor b = RawTensor::FromVector<double>({kNaN, kNaN, 2, -kInf}, {4});
  ExpectExact(Eq(a, b), {4}, kBool, {0, 0, 1, 1}, "eq");
  ExpectExact(Ne(a, b), {4}, kBool, {1, 1, 0, 0}, "ne");
  ExpectExact(Lt(a, b), {4}, kBool, {0, 0, 0, 0}, "lt");
  ExpectExact(Le(a, b), {4}, kBool, {0, 0, 1, 1}, "le");
  ExpectExact(Gt(a, b), {4}, kBool, {0, 0, 0, 0}, "gt");
  ExpectExact(Ge(a, b), {4}, kBool, {0, 0, 1, 1}, "ge");
  // f16 0.1 and f32 0.1 differ; i64 3 equals f16 3.
  ExpectExact(Eq(RawTensor::Full({1}, 0.1, kF16), RawTensor::Full({1}, 0.1, kF32)), {1}, kBool, {0},
              "f16 0.1 == f32 0.1");
  // f16 0.1 is 0.0999755859375, below f32 0.1 (0.100000001490116).
  ExpectExact(Gt(RawTensor::Full({1}, 0.1, kF32), RawTensor::Full({1}, 0.1, kF16)), {1}, kBool, {1},
              "f32 0.1 > f16 0.1");
  ExpectExact(Eq(RawTensor::Full({2}, 3, kI64), RawTensor::FromVector<float>({3, 3.5}, {2}, kF16)),
              {2}, kBool, {1, 0}, "i64 vs f16");
  EXPECT_ERROR(Lt(RawTensor::Zeros({2, 3}), RawTensor::Zeros({2})),
               "lt: shapes [2, 3] and [2] cannot be broadcast");
}

TEST(WhereOp, MatchesReferenceWithBroadcasting) {
  Generator gen(8);
  struct Case {
    Shape cond, a, b;
  };
  const std::vector<Case> cases = {
      {{3, 4}, {3, 4}, {3, 4}}, {{2, 1, 4}, {3, 1}, {4}}, {{4}, {2, 4}, {}},
      {{}, {2, 2}, {2, 2}},     {{0, 2}, {2}, {1}},
  };
  const std::vector<DType> dtypes = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool};
  for (const Case& c : cases) {
    for (DType dtype : dtypes) {
      for (size_t l = 0; l < kLayoutPairs.size(); ++l) {
        const auto [la, lb] = kLayoutPairs[l];
        const DType cond_dtype = l % 2 == 0 ? kBool : kU8;
        const RawTensor cond = WithLayout(c.cond, lb, [&](const Shape& s) {
          return cond_dtype == kU8 ? Draw(s, kU8, gen, 0, 2) : Draw(s, kBool, gen, 0, 1);
        });
        const RawTensor a =
            WithLayout(c.a, la, [&](const Shape& s) { return Draw(s, dtype, gen, -50, 50); });
        const RawTensor b =
            WithLayout(c.b, lb, [&](const Shape& s) { return Draw(s, dtype, gen, -50, 50); });
        const Shape out_shape = Broadcast2(c.cond, Broadcast2(c.a, c.b));
        const std::vector<double> cv = BroadcastValues(cond, out_shape);
        const std::vector<double> av = BroadcastValues(a, out_shape);
        const std::vector<double> bv = BroadcastValues(b, out_shape);
        std::vector<double> want(cv.size());
        for (size_t i = 0; i < cv.size(); ++i) want[i] = cv[i] != 0 ? av[i] : bv[i];
        ExpectExact(Where(cond, a, b), out_shape, dtype, want,
                    std::string("where ") + DTypeName(dtype) + " " + ShapeToString(c.cond) + " " +
                        LayoutName(la));
      }
    }
  }
}

TEST(WhereOp, PromotesAndRejectsBadConditions) {
  const RawTensor cond = RawTensor::FromVector<bool>({true, false, true}, {3});
  const RawTensor a = RawTensor::FromVector<float>({1.5f, 2.5f, 3.5f}, {3}, kF16);
  const RawTensor b = RawTensor::FromVector<float>({-1, -2, -3}, {3});
  ExpectExact(Where(cond, a, b), {3}, kF32, {1.5, -2, 3.5}, "where f16/f32");
  ExpectExact(Where(cond, RawTensor::Full({}, 7, kI32), RawTensor::Full({}, 0.25, kF64)), {3}, kF64,
              {7, 0.25, 7}, "where scalars");
  EXPECT_ERROR(Where(RawTensor::Ones({3}), a, b),
               "where: the condition must be bool or u8, got f32");
  EXPECT_ERROR(Where(RawTensor::Ones({3}, kI64), a, b),
               "where: the condition must be bool or u8, got i64");
  EXPECT_ERROR(Where(RawTensor::Ones({2}, kBool), a, b),
               "where: shapes [2] and [3] cannot be broadcast");
  EXPECT_ERROR(Where(RawTensor(), a, b), "where: the condition is an undefined tensor");
}

// ==== Reductions =================================================================================

// Reference reduction of `x` over `dims` (empty: all), with `combine` over the reduced elements
// of each output position; returns the output shape too.
struct Reduced {
  Shape shape;
  std::vector<std::vector<double>> groups;  // the reduced values of each output element
};

Reduced ReduceRef(const RawTensor& x, std::vector<int64_t> dims, bool keepdim) {
  const int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) reduced[static_cast<size_t>(d < 0 ? d + nd : d)] = true;
  Shape out_shape, kept_shape;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) {
      out_shape.push_back(x.size(d));
      kept_shape.push_back(x.size(d));
    } else if (keepdim) {
      out_shape.push_back(1);
    }
  }
  Reduced r;
  r.shape = out_shape;
  r.groups.resize(static_cast<size_t>(NumElements(kept_shape)));
  const std::vector<double> v = Values(x);
  const Shape kept_strides = ContiguousStrides(kept_shape);
  std::vector<int64_t> index(static_cast<size_t>(nd), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t o = 0, k = 0;
    for (int64_t d = 0; d < nd; ++d) {
      if (!reduced[d]) o += index[d] * kept_strides[k++];
    }
    r.groups[static_cast<size_t>(o)].push_back(v[i]);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < x.size(static_cast<int64_t>(d))) break;
      index[d] = 0;
    }
  }
  return r;
}

const std::vector<std::vector<int64_t>> kDimLists = {{}, {0}, {-1}, {1}, {0, 2}, {2, 0, 1}, {-2}};

TEST(Reductions, SumAndMeanMatchReference) {
  Generator gen(9);
  for (DType dtype : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const RawTensor x = WithLayout(
          {3, 4, 5}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 2, true); });
      for (const auto& dims : kDimLists) {
        for (bool keepdim : {false, true}) {
          const Reduced r = ReduceRef(x, dims, keepdim);
          std::vector<double> sum, mean, slack;
          for (const auto& g : r.groups) {
            double s = 0, abs = 0;
            for (double v : g) s += v, abs += std::abs(v);
            sum.push_back(s);
            mean.push_back(s / static_cast<double>(g.size()));
            slack.push_back(abs * 1e-15);
          }
          const std::string what =
              std::string(ShapeToString(dims)) + (keepdim ? " keepdim " : " ") + LayoutName(layout);
          // f64 accumulation: for f32 the result is the correctly rounded sum.
          Tol tol;
          tol.slack = slack;
          if (dtype == kF32) tol.rtol = 2e-7;
          ExpectMatches(Sum(x, dims, keepdim), r.shape, dtype, sum, "sum " + what, tol);
          ExpectMatches(Mean(x, dims, keepdim), r.shape, dtype, mean, "mean " + what, tol);
        }
      }
    }
  }
}

TEST(Reductions, IntegerAndBoolSumsGiveI64) {
  Generator gen(10);
  for (DType dtype : {kI32, kI64, kU8, kBool}) {
    for (Layout layout : kAllLayouts) {
      const RawTensor x = WithLayout(
          {3, 4, 5}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, -100, 200); });
      for (const auto& dims : kDimLists) {
        const Reduced r = ReduceRef(x, dims, true);
        std::vector<double> sum;
        for (const auto& g : r.groups) {
          double s = 0;
          for (double v : g) s += v;
          sum.push_back(s);
        }
        ExpectExact(Sum(x, dims, true), r.shape, kI64, sum,
                    std::string("sum ") + DTypeName(dtype) + " " + ShapeToString(dims));
      }
    }
  }
  // u8 values sum without wrapping at 256; bool counts the true values.
  EXPECT_EQ(Sum(RawTensor::Full({10}, 200, kU8)).item(), 2000);
  EXPECT_EQ(Sum(RawTensor::FromVector<bool>({true, false, true, true}, {4})).item(), 3);
  EXPECT_EQ(Sum(RawTensor::FromVector<bool>({true, false, true, true}, {4})).dtype(), kI64);
  EXPECT_ERROR(Mean(RawTensor::Zeros({3}, kI32)),
               "mean: expected a floating dtype (f32, f64, f16, bf16), got i32");
}

TEST(Reductions, EdgeShapes) {
  // 0-d input: sum over all dims or dim 0 / -1.
  const RawTensor s = RawTensor::Scalar(2.5);
  ExpectExact(Sum(s), {}, kF32, {2.5}, "sum 0-d");
  ExpectExact(Sum(s, {0}), {}, kF32, {2.5}, "sum 0-d dim 0");
  ExpectExact(Mean(s, {-1}, true), {}, kF32, {2.5}, "mean 0-d keepdim");
  ExpectExact(Max(s, 0), {}, kF32, {2.5}, "max 0-d");
  ExpectExact(Argmax(s, -1), {}, kI64, {0}, "argmax 0-d");
  // Reducing an empty dim: sum 0, mean NaN; an empty non-reduced dim gives an empty result.
  const RawTensor e = RawTensor::Zeros({2, 0});
  ExpectExact(Sum(e, {1}), {2}, kF32, {0, 0}, "sum over empty dim");
  ExpectExact(Mean(e, {1}), {2}, kF32, {kNaN, kNaN}, "mean over empty dim");
  ExpectExact(Sum(e, {0}), {0}, kF32, {}, "sum leaving an empty dim");
  ExpectExact(Sum(e), {}, kF32, {0}, "sum of an empty tensor");
  ExpectExact(Sum(e, {}, true), {1, 1}, kF32, {0}, "sum keepdim all");
  ExpectExact(Max(RawTensor::Zeros({0, 3}), 1), {0}, kF32, {}, "max leaving an empty dim");
}

TEST(Reductions, LowPrecisionAccumulatesInF64AndRoundsOnce) {
  // The f16 partial sums 65504 + 65504 overflow f16; the f64 accumulator does not.
  const RawTensor h = RawTensor::FromVector<float>({65504, 65504, -65504}, {3}, kF16);
  EXPECT_EQ(Sum(h).item(), 65504);
  // Mean divides the f64 sum: 60000 + 60000 overflows f16 but the mean is 60000.
  EXPECT_EQ(Mean(RawTensor::Full({2}, 60000, kF16)).item(), 60000);
  EXPECT_EQ(Mean(RawTensor::FromVector<float>({65504, 65504, 65504, -65504}, {2, 2}, kF16), {1})
                .to_vector<double>(),
            (std::vector<double>{65504, 0}));
  // 4096 ones in f16: a f16 accumulator would stall at 2048.
  EXPECT_EQ(Sum(RawTensor::Ones({4096}, kF16)).item(), 4096);
  EXPECT_EQ(Mean(RawTensor::Ones({4096}, kBF16)).item(), 1);
  // bf16: 256 + 1 + 1 = 258 exactly; a bf16 accumulator would give 256.
  EXPECT_EQ(Sum(RawTensor::FromVector<float>({256, 1, 1}, {3}, kBF16)).item(), 258);
  // f32 mean is the correctly rounded f64 quotient.
  const RawTensor f = RawTensor::FromVector<float>({1, 2, 2}, {3});
  EXPECT_EQ(Mean(f).item(), static_cast<double>(static_cast<float>(5.0 / 3.0)));
}

TEST(Reductions, MaxAndArgmaxMatchReference) {
  Generator gen(11);
  const std::vector<DType> dtypes = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8};
  for (DType dtype : dtypes) {
    for (Layout layout : kAllLayouts) {
      // Small integers: ties are common, and argmax must give the first maximum.
      const RawTensor x = WithLayout({3, 4, 5}, layout, [&](const Shape& s) {
        return IsFloating(dtype) ? Draw(s, kI32, gen, -4, 4).to(dtype) : Draw(s, dtype, gen, -4, 4);
      });
      for (int64_t dim : {0, 1, 2, -1, -3}) {
        for (bool keepdim : {false, true}) {
          const Reduced r = ReduceRef(x, {dim}, keepdim);
          std::vector<double> max, arg;
          for (const auto& g : r.groups) {
            const auto it = std::max_element(g.begin(), g.end());
            max.push_back(*it);
            arg.push_back(static_cast<double>(it - g.begin()));
          }
          const std::string what = std::string(DTypeName(dtype)) + " dim " + std::to_string(dim) +
                                   " " + LayoutName(layout);
          ExpectExact(Max(x, dim, keepdim), r.shape, dtype, max, "max " + what);
          ExpectExact(Argmax(x, dim, keepdim), r.shape, kI64, arg, "argmax " + what);
        }
      }
    }
  }
}

TEST(Reductions, MaxLetsNaNWin) {
  for (DType dtype : kFloatTypes) {
    const RawTensor x = RawTensor::FromVector<double>({1, kNaN, 5, kNaN,            //
                                                       -kInf, -kInf, -kInf, -kInf,  //
                                                       kNaN, 9, 2, 3,               //
                                                       0, 7, 7, kInf},
                                                      {4, 4}, dtype);
    ExpectExact(Max(x, 1), {4}, dtype, {kNaN, -kInf, kNaN, kInf}, "max rows");
    ExpectExact(Argmax(x, 1), {4}, kI64, {1, 0, 0, 3}, "argmax rows");
    ExpectExact(Argmax(x, 0), {4}, kI64, {2, 0, 3, 0}, "argmax cols");
  }
}

TEST(Reductions, Errors) {
  const RawTensor x = RawTensor::Zeros({2, 3, 4});
  EXPECT_ERROR(Sum(x, {1, -2}), "sum: dim 1 appears more than once in [1, -2]");
  EXPECT_ERROR(Mean(x, {0, 0}), "mean: dim 0 appears more than once in [0, 0]");
  EXPECT_ERROR(Mean(x, {5}), "mean: dim 5 is out of range for a tensor with 3 dims");
  EXPECT_ERROR(Sum(x, {3}), "sum: dim 3 is out of range for a tensor with 3 dims");
  EXPECT_ERROR(Sum(x, {-4}), "sum: dim -4 is out of range for a tensor with 3 dims");
  EXPECT_ERROR(Max(x, 3), "max: dim 3 is out of range for a tensor with 3 dims");
  EXPECT_ERROR(Argmax(x, -4), "argmax: dim -4 is out of range for a tensor with 3 dims");
  EXPECT_ERROR(Max(RawTensor::Scalar(1), 1), "max: dim 1 is out of range for a tensor with 0 dims");
  EXPECT_ERROR(Max(RawTensor::Zeros({2, 0}), 1),
               "max: dim 1 of shape [2, 0] is empty; there is no maximum");
  EXPECT_ERROR(Argmax(RawTensor::Zeros({0, 3}), 0),
               "argmax: dim 0 of shape [0, 3] is empty; there is no maximum");
  EXPECT_ERROR(Sum(RawTensor()), "sum: the input is an undefined tensor");
}

// ==== Matmul ====================================================================================

// Reference batched matmul of a [..., m, k] and b [..., k, n] (1-D operands promoted and the
// result squeezed like the op). `slack` gets sum |a||b| * eps per output element.
std::vector<double> MatmulRef(const RawTensor& a_in, const RawTensor& b_in, Shape* out_shape,
                              std::vector<double>* abs_sum) {
  const RawTensor a = a_in.dim() == 1 ? a_in.unsqueeze(0) : a_in;
  const RawTensor b = b_in.dim() == 1 ? b_in.unsqueeze(1) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Shape batch = Broadcast2(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2));
  Shape as = batch, bs = batch;
  as.insert(as.end(), {m, k});
  bs.insert(bs.end(), {k, n});
  const std::vector<double> av = BroadcastValues(a, as), bv = BroadcastValues(b, bs);
  const int64_t nb = NumElements(batch);
  std::vector<double> out(static_cast<size_t>(nb * m * n));
  abs_sum->assign(out.size(), 0);
  for (int64_t p = 0; p < nb; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, abs = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = av[(p * m + i) * k + l], y = bv[(p * k + l) * n + j];
          s += x * y;
          abs += std::abs(x * y);
        }
        out[(p * m + i) * n + j] = s;
        (*abs_sum)[(p * m + i) * n + j] = abs;
      }
    }
  }
  *out_shape = batch;
  if (a_in.dim() > 1) out_shape->push_back(m);
  if (b_in.dim() > 1) out_shape->push_back(n);
  return out;
}

void CheckMatmul(const RawTensor& a, const RawTensor& b, const std::string& what) {
  Shape shape;
  std::vector<double> abs;
  const std::vector<double> ref = MatmulRef(a, b, &shape, &abs);
  Tol tol;
  const double eps = a.dtype() == kF64 ? 1e-14 : 1e-6;
  tol.slack.resize(abs.size());
  for (size_t i = 0; i < abs.size(); ++i) tol.slack[i] = abs[i] * eps;
  ExpectMatches(Matmul(a, b), shape, a.dtype(), ref, what, tol);
}

TEST(Matmul, TwoDimensionalWithStridedOperands) {
  Generator gen(12);
  const std::vector<std::array<int64_t, 3>> sizes = {{1, 1, 1}, {3, 4, 5},   {7, 2, 3}, {1, 6, 4},
                                                     {5, 8, 1}, {16, 9, 11}, {2, 33, 3}};
  for (DType dtype : kFloatTypes) {
    for (const auto& [m, k, n] : sizes) {
      for (const auto& [la, lb] : kLayoutPairs) {
        for (bool swap : {false, true}) {
          const Layout a_layout = swap ? lb : la, b_layout = swap ? la : lb;
          auto make = [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); };
          const RawTensor a = WithLayout({m, k}, a_layout, make);
          const RawTensor b = WithLayout({k, n}, b_layout, make);
          CheckMatmul(a, b,
                      std::string("matmul ") + DTypeName(dtype) + " " + std::to_string(m) + "x" +
                          std::to_string(k) + "x" + std::to_string(n) + " " + LayoutName(a_layout) +
                          "/" + LayoutName(b_layout));
        }
      }
    }
  }
}

// Products large enough for oneDNN's blocked bf16/f16 kernels (tensor/cpu/dnnl.h: AVX-512 BF16
// or AMX where present, f32 accumulation, one rounding), with transposed operands (the GEMM's
// transpose flags) and a batch, against the reference within CheckMatmul's tolerance (one
// rounding plus sum |a||b| * 1e-6 for the f32 sums); and the same bits on a second call.
TEST(Matmul, LargeLowPrecisionProducts) {
  Generator gen(31);
  const std::vector<std::array<int64_t, 3>> sizes = {{64, 300, 48}, {130, 96, 70}, {1, 256, 33}};
  for (DType dtype : {kBF16, kF16, kF32}) {
    for (const auto& [m, k, n] : sizes) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const std::string what = std::string(DTypeName(dtype)) + " " + std::to_string(m) + "x" +
                                   std::to_string(k) + "x" + std::to_string(n) +
                                   (ta ? " a^T" : "") + (tb ? " b^T" : "");
          const RawTensor a = ta ? Draw({k, m}, dtype, gen, -1, 1).transpose(0, 1)
                                 : Draw({m, k}, dtype, gen, -1, 1);
          const RawTensor b = tb ? Draw({n, k}, dtype, gen, -1, 1).transpose(0, 1)
                                 : Draw({k, n}, dtype, gen, -1, 1);
          CheckMatmul(a, b, what);
          const std::vector<double> first = Matmul(a, b).to_vector<double>();
          EXPECT_EQ(Matmul(a, b).to_vector<double>(), first) << what << ": second call";
        }
      }
    }
    const RawTensor a = Draw({3, 40, 72}, dtype, gen, -1, 1),
                    b = Draw({3, 72, 50}, dtype, gen, -1, 1);
    CheckMatmul(a, b, std::string(DTypeName(dtype)) + " batch of 3");
  }
}

TEST(Matmul, TransposedViewsGiveTheSameNumbersAsCopies) {
  Generator gen(13);
  for (DType dtype : {kF32, kF64}) {
    const RawTensor at = Draw({6, 5}, dtype, gen, 0, 1, true);  // a = at^T is [5, 6]
    const RawTensor bt = Draw({4, 6}, dtype, gen, 0, 1, true);  // b = bt^T is [6, 4]
    const RawTensor at_copy = at.clone();
    const RawTensor a = at.transpose(0, 1), b = bt.transpose(0, 1);
    ASSERT_FALSE(a.is_contiguous());
    ASSERT_FALSE(b.is_contiguous());
    const RawTensor copied = Matmul(a.contiguous(), b.contiguous());
    for (const RawTensor& got :
         {Matmul(a, b), Matmul(a, b.contiguous()), Matmul(a.contiguous(), b)}) {
      const std::vector<double> g = Values(got), c = Values(copied);
      ASSERT_EQ(g.size(), c.size());
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_NEAR(g[i], c[i], (dtype == kF64 ? 1e-13 : 1e-5) * (1 + std::abs(c[i])));
      }
    }
    CheckMatmul(a, b, "transposed views");
    // The inputs are untouched (no in-place transposition or copy into them).
    EXPECT_EQ(a.strides(), (Shape{1, 5}));
    EXPECT_EQ(Values(at), Values(at_copy));
  }
}

TEST(Matmul, BatchedWithBroadcastBatchDims) {
  Generator gen(14);
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 2}}, {{3, 4}, {2, 4, 5}},
      {{2, 3, 4}, {4, 5}},    {{1, 3, 4}, {6, 4, 2}},    {{4, 1, 2, 3}, {1, 3, 3, 2}},
      {{0, 3, 4}, {4, 2}},
  };
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      for (const auto& [la, lb] : kLayoutPairs) {
        auto make = [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); };
        CheckMatmul(WithLayout(c.a, la, make), WithLayout(c.b, lb, make),
                    std::string("batched matmul ") + DTypeName(dtype) + " " + ShapeToString(c.a) +
                        " @ " + ShapeToString(c.b) + " " + LayoutName(la) + "/" + LayoutName(lb));
      }
    }
    // A batch dim that is neither contiguous nor broadcast: a permuted [3, 2, 4] -> [2, 3, 4].
    const RawTensor a = Draw({3, 2, 4}, dtype, gen, 0, 1, true).permute({1, 0, 2});
    const RawTensor b = Draw({5, 2, 4}, dtype, gen, 0, 1, true).permute({1, 2, 0});  // [2, 4, 5]
    CheckMatmul(a, b, std::string("permuted batch ") + DTypeName(dtype));
  }
}

TEST(Matmul, OneDimensionalOperands) {
  Generator gen(15);
  for (DType dtype : kFloatTypes) {
    auto make = [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); };
    const RawTensor v = make({4});
    CheckMatmul(v, make({4}), "dot");
    EXPECT_EQ(Matmul(v, make({4})).shape(), Shape{});
    CheckMatmul(v, make({4, 3}), "vector @ matrix");
    CheckMatmul(make({5, 4}), v, "matrix @ vector");
    CheckMatmul(v, make({2, 4, 3}), "vector @ batch");
    CheckMatmul(make({2, 5, 4}), v, "batch @ vector");
    CheckMatmul(WithLayout({4}, Layout::kStepped, make), make({3, 4}).transpose(0, 1),
                "stepped vector @ transposed matrix");
  }
  // Exact small case.
  const RawTensor a = RawTensor::FromVector<double>({1, 2, 3}, {3});
  const RawTensor m = RawTensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  ExpectExact(Matmul(a, a), {}, kF64, {14}, "1-D dot");
  ExpectExact(Matmul(a, m), {2}, kF64, {22, 28}, "1-D @ 2-D");
  ExpectExact(Matmul(m.transpose(0, 1), a), {2}, kF64, {22, 28}, "2-D @ 1-D");
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  for (DType dtype : kFloatTypes) {
    // The output comes from uninitialised memory: k == 0 must write zeros explicitly.
    for (int rep = 0; rep < 3; ++rep) {
      ExpectExact(Matmul(RawTensor::Ones({3, 0}, dtype), RawTensor::Ones({0, 4}, dtype)), {3, 4},
                  dtype, std::vector<double>(12, 0), "k == 0");
      ExpectExact(Matmul(RawTensor::Ones({2, 3, 0}, dtype), RawTensor::Ones({0, 2}, dtype)),
                  {2, 3, 2}, dtype, std::vector<double>(12, 0), "batched k == 0");
      ExpectExact(Matmul(RawTensor::Ones({0}, dtype), RawTensor::Ones({0}, dtype)), {}, dtype, {0},
                  "empty dot");
    }
    ExpectExact(Matmul(RawTensor::Ones({0, 3}, dtype), RawTensor::Ones({3, 4}, dtype)), {0, 4},
                dtype, {}, "m == 0");
    ExpectExact(Matmul(RawTensor::Ones({2, 3}, dtype), RawTensor::Ones({3, 0}, dtype)), {2, 0},
                dtype, {}, "n == 0");
  }
}

TEST(Matmul, LowPrecisionRoundsTheF32ProductOnce) {
  // 255 * 257 + 1 * 15 = 65550 is above 65520: the rounded f32 result is inf.
  const RawTensor a = RawTensor::FromVector<float>({255, 1}, {1, 2}, kF16);
  const RawTensor b = RawTensor::FromVector<float>({257, 15}, {2, 1}, kF16);
  ExpectExact(Matmul(a, b), {1, 1}, kF16, {kInf}, "65535 + 15 -> inf");
  const RawTensor c = RawTensor::FromVector<float>({256, -256}, {1, 2}, kF16);
  const RawTensor d = RawTensor::FromVector<float>({300, 300}, {2, 1}, kF16);
  // The f32 accumulator sees 76800 - 76800 = 0, not inf - inf.
  ExpectExact(Matmul(c, d), {1, 1}, kF16, {0}, "no intermediate f16 rounding");
  ExpectExact(Matmul(c.to(kBF16), d.to(kBF16)), {1, 1}, kBF16, {0}, "bf16");
}

TEST(Matmul, Bmm) {
  Generator gen(16);
  for (DType dtype : kFloatTypes) {
    auto make = [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); };
    for (const auto& [la, lb] : kLayoutPairs) {
      const RawTensor a = WithLayout({3, 4, 5}, la, make), b = WithLayout({3, 5, 2}, lb, make);
      Shape shape;
      std::vector<double> abs;
      const std::vector<double> ref = MatmulRef(a, b, &shape, &abs);
      Tol tol;
      tol.slack.resize(abs.size());
      for (size_t i = 0; i < abs.size(); ++i)
        tol.slack[i] = abs[i] * (dtype == kF64 ? 1e-14 : 1e-6);
      ExpectMatches(Bmm(a, b), {3, 4, 2}, dtype, ref, std::string("bmm ") + LayoutName(la), tol);
    }
  }
  EXPECT_ERROR(Bmm(RawTensor::Zeros({2, 3, 4}), RawTensor::Zeros({3, 4, 5})),
               "bmm: expected [b, m, k] and [b, k, n], got [2, 3, 4] and [3, 4, 5]");
  EXPECT_ERROR(Bmm(RawTensor::Zeros({3, 4}), RawTensor::Zeros({4, 5})),
               "bmm: expected [b, m, k] and [b, k, n], got [3, 4] and [4, 5]");
  EXPECT_ERROR(Bmm(RawTensor::Zeros({2, 3, 4}), RawTensor::Zeros({2, 5, 4})),
               "bmm: expected [b, m, k] and [b, k, n], got [2, 3, 4] and [2, 5, 4]");
}

TEST(Matmul, Errors) {
  EXPECT_ERROR(Matmul(RawTensor::Zeros({2, 3}), RawTensor::Zeros({4, 5})),
               "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  EXPECT_ERROR(Matmul(RawTensor::Zeros({3}), RawTensor::Zeros({4})),
               "matmul: shapes [3] and [4] cannot be multiplied (3 != 4)");
  EXPECT_ERROR(Matmul(RawTensor::Zeros({2, 3}), RawTensor::Zeros({3, 4}, kF64)),
               "matmul: dtypes f32 and f64 differ");
  EXPECT_ERROR(Matmul(RawTensor::Zeros({2, 3}, kF16), RawTensor::Zeros({3, 4}, kBF16)),
               "matmul: dtypes f16 and bf16 differ");
  EXPECT_ERROR(Matmul(RawTensor::Zeros({2, 3}, kI64), RawTensor::Zeros({3, 4}, kI64)),
               "matmul: expected a floating dtype (f32, f64, f16, bf16), got i64");
  EXPECT_ERROR(Matmul(RawTensor::Scalar(1), RawTensor::Zeros({3})),
               "matmul: shapes [] and [3]: 0-d tensors cannot be multiplied");
  EXPECT_ERROR(Matmul(RawTensor::Zeros({2, 3, 4}), RawTensor::Zeros({3, 4, 5})),
               "matmul: the batch dims of shapes [2, 3, 4] and [3, 4, 5] cannot be broadcast");
  EXPECT_ERROR(Bmm(RawTensor::Zeros({2, 3, 4}), RawTensor::Zeros({2, 4, 5}, kF64)),
               "bmm: dtypes f32 and f64 differ");
  EXPECT_ERROR(Matmul(RawTensor(), RawTensor::Zeros({3})),
               "matmul: the first input is an undefined tensor");
}

// ==== Softmax and log-softmax ====================================================================

std::vector<double> SoftmaxRef(const std::vector<double>& v, int64_t n, bool log) {
  std::vector<double> out(v.size());
  for (size_t r = 0; n > 0 && r < v.size() / static_cast<size_t>(n); ++r) {
    const double* row = v.data() + r * n;
    double max = -kInf;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, row[i]);
    const double shift = std::isinf(max) ? 0 : max;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - shift);
    for (int64_t i = 0; i < n; ++i) {
      const double z = row[i] - shift - std::log(sum);
      out[r * n + i] = log ? z : std::exp(z);
    }
  }
  return out;
}

TEST(Softmax, MatchesReferenceOverTheLastDim) {
  Generator gen(17);
  const std::vector<Shape> shapes = {{4, 7}, {2, 3, 5}, {9}, {3, 1}, {1, 40}, {0, 3}};
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : shapes) {
      for (Layout layout : kAllLayouts) {
        const RawTensor x = WithLayout(
            shape, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 3, true); });
        const std::vector<double> xv = Values(x);
        const int64_t n = shape.back();
        const std::string what = ShapeToString(shape) + " " + LayoutName(layout);
        ExpectMatches(Softmax(x), shape, dtype, SoftmaxRef(xv, n, false), "softmax " + what);
        // log_softmax values are O(10): allow f32 rounding of the inputs' magnitude.
        Tol tol;
        if (dtype != kF64) tol.atol = 1e-5;
        ExpectMatches(LogSoftmax(x), shape, dtype, SoftmaxRef(xv, n, true), "log_softmax " + what,
                      tol);
      }
    }
  }
}

// GPT-2's vocabulary: 50257 terms exp(x - max) with x in [-8, 8) sum to ~3200, whose f32 ulp
// (2^-12) exceeds about half the terms; an f32 running sum drops the terms' low bits (7/16 of them
// entirely) and comes out ~5e-5 low, which every softmax value of the row then carries.
TEST(Softmax, LongRowsMatchReferenceRelatively) {
  Generator gen(29);
  const Shape shape = {2, 50257};
  for (DType dtype : {kF32, kF64}) {
    const RawTensor x = Draw(shape, dtype, gen, -8, 8);
    const std::vector<double> xv = Values(x);
    Tol tol;
    tol.atol = 0;  // values ~3e-5: the default f32 atol (1e-6) would hide a relative error
    ExpectMatches(Softmax(x), shape, dtype, SoftmaxRef(xv, shape[1], false), "softmax", tol);
  }
}

TEST(Softmax, StableForLargeInputsAndInfinities) {
  for (DType dtype : kFloatTypes) {
    const RawTensor x = RawTensor::FromVector<double>({1000, 999, -1000,  //
                                                       -kInf, 0, 1,       //
                                                       -kInf, -kInf, 2,   //
                                                       -1000, -1000, -1000},
                                                      {4, 3}, dtype);
    const double e1 = std::exp(-1.0);
    std::vector<double> soft = {
        1 / (1 + e1), e1 / (1 + e1), 0,      0, 1 / (1 + std::exp(1.0)), 1 / (1 + e1), 0, 0, 1,
        1.0 / 3,      1.0 / 3,       1.0 / 3};
    std::vector<double> log_soft = {-std::log1p(e1),
                                    -1 - std::log1p(e1),
                                    -2000 - std::log1p(e1),
                                    -kInf,
                                    -1 - std::log1p(e1),
                                    -std::log1p(e1),
                                    -kInf,
                                    -kInf,
                                    0,
                                    -std::log(3.0),
                                    -std::log(3.0),
                                    -std::log(3.0)};
    if (dtype == kBF16) {
      // 999 is not a bf16 value (it rounds to 1000): use the reference of the stored values.
      ASSERT_EQ(Values(x)[1], 1000);
      soft = SoftmaxRef(Values(x), 3, false);
      log_soft = SoftmaxRef(Values(x), 3, true);
      EXPECT_EQ(soft[0], 0.5);
    }
    Tol tol;
    if (dtype == kF32) tol.atol = 1e-4;  // log values near 2000 carry f32 rounding of 1000
    ExpectMatches(Softmax(x), {4, 3}, dtype, soft, "softmax large");
    ExpectMatches(LogSoftmax(x), {4, 3}, dtype, log_soft, "log_softmax large", tol);
    // No value is NaN and every row sums to 1.
    const std::vector<double> sv = Values(Softmax(x));
    for (double v : sv) EXPECT_FALSE(std::isnan(v));
    for (int r = 0; r < 4; ++r) {
      EXPECT_NEAR(sv[r * 3] + sv[r * 3 + 1] + sv[r * 3 + 2], 1, dtype == kBF16 ? 1e-2 : 1e-3);
    }
  }
  // A row of only -inf has no distribution: NaN, as in PyTorch.
  const std::vector<double> all_neg = Values(Softmax(RawTensor::Full({1, 3}, -kInf)));
  for (double v : all_neg) EXPECT_TRUE(std::isnan(v));
}

TEST(Softmax, Errors) {
  EXPECT_ERROR(Softmax(RawTensor::Zeros({2, 3}, kI32)),
               "softmax: expected a floating dtype (f32, f64, f16, bf16), got i32");
  EXPECT_ERROR(LogSoftmax(RawTensor::Zeros({2, 3}, kI64)),
               "log_softmax: expected a floating dtype (f32, f64, f16, bf16), got i64");
}

// ==== Layer norm ================================================================================

TEST(LayerNorm, MatchesReferenceWithAndWithoutAffine) {
  Generator gen(18);
  const std::vector<Shape> shapes = {{4, 16}, {2, 3, 8}, {5}, {3, 1}, {2, 64}};
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : shapes) {
      const int64_t n = shape.back();
      for (Layout layout : kAllLayouts) {
        for (int affine = 0; affine < 4; ++affine) {
          const RawTensor x = WithLayout(
              shape, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 2, true); });
          const RawTensor w =
              affine & 1 ? WithLayout({n}, layout,
                                      [&](const Shape& s) { return Draw(s, dtype, gen, 0.5, 1.5); })
                         : RawTensor();
          const RawTensor b = affine & 2 ? Draw({n}, dtype, gen, 0, 1, true) : RawTensor();
          const double eps = 1e-5;
          const LayerNormResult r = LayerNorm(x, w, b, eps);
          const std::vector<double> xv = Values(x);
          const std::vector<double> wv = w.defined() ? Values(w) : std::vector<double>(n, 1);
          const std::vector<double> bv = b.defined() ? Values(b) : std::vector<double>(n, 0);
          const size_t rows = xv.size() / static_cast<size_t>(n);
          std::vector<double> out(xv.size()), mean(rows), rstd(rows);
          for (size_t row = 0; row < rows; ++row) {
            double s = 0, sq = 0;
            for (int64_t i = 0; i < n; ++i) s += xv[row * n + i];
            mean[row] = s / n;
            for (int64_t i = 0; i < n; ++i) sq += std::pow(xv[row * n + i] - mean[row], 2);
            rstd[row] = 1 / std::sqrt(sq / n + eps);
            for (int64_t i = 0; i < n; ++i) {
              out[row * n + i] = (xv[row * n + i] - mean[row]) * rstd[row] * wv[i] + bv[i];
            }
          }
          const Shape stat_shape(shape.begin(), shape.end() - 1);
          const DType stat_dtype = dtype == kF64 ? kF64 : kF32;
          const std::string what = std::string("layer_norm ") + DTypeName(dtype) + " " +
                                   ShapeToString(shape) + " " + LayoutName(layout) + " affine " +
                                   std::to_string(affine);
          Tol tol;
          if (dtype == kF32) tol.atol = 1e-5;
          // f16/bf16 outputs come from f32 arithmetic on normalised values of size ~3.
          if (dtype == kF16 || dtype == kBF16) tol.atol = 1e-5;
          ExpectMatches(r.output, shape, dtype, out, what + " output", tol);
          Tol stat_tol;
          if (stat_dtype == kF32) stat_tol.rtol = 1e-6;
          ExpectMatches(r.mean, stat_shape, stat_dtype, mean, what + " mean", stat_tol);
          ExpectMatches(r.rstd, stat_shape, stat_dtype, rstd, what + " rstd", stat_tol);
        }
      }
    }
  }
}

TEST(LayerNorm, ConstantRowsAndLargeOffsets) {
  // Variance 0: rstd = 1/sqrt(eps), output = bias.
  const RawTensor x = RawTensor::Full({2, 4}, 3.0);
  const RawTensor bias = RawTensor::FromVector<float>({1, 2, 3, 4}, {4});
  const LayerNormResult r = LayerNorm(x, RawTensor(), bias, 1e-4);
  ExpectExact(r.output, {2, 4}, kF32, {1, 2, 3, 4, 1, 2, 3, 4}, "constant rows");
  ExpectMatches(r.rstd, {2}, kF32, {100, 100}, "rstd of constant rows");
  ExpectExact(r.mean, {2}, kF32, {3, 3}, "mean of constant rows");
  // Two-pass variance: a large common offset does not cancel the spread.
  const RawTensor y = RawTensor::FromVector<float>({10000, 10001, 10002, 10003}, {1, 4});
  const LayerNormResult ry = LayerNorm(y, RawTensor(), RawTensor(), 0);
  const double sd = std::sqrt(1.25);
  ExpectMatches(ry.output, {1, 4}, kF32, {-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd}, "offset");
  ExpectMatches(ry.rstd, {1}, kF32, {1 / sd}, "offset rstd");
}

TEST(LayerNorm, EmptyLastDimGivesNaNStatistics) {
  const LayerNormResult r = LayerNorm(RawTensor::Zeros({3, 0}), RawTensor(), RawTensor());
  EXPECT_EQ(r.output.shape(), (Shape{3, 0}));
  ASSERT_EQ(r.mean.shape(), (Shape{3}));
  ASSERT_EQ(r.rstd.shape(), (Shape{3}));
  for (double v : r.mean.to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v : r.rstd.to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(Softmax(RawTensor::Zeros({3, 0})).shape(), (Shape{3, 0}));
}

TEST(LayerNorm, Errors) {
  const RawTensor x = RawTensor::Zeros({2, 4});
  EXPECT_ERROR(LayerNorm(x, RawTensor::Ones({5}), RawTensor()),
               "layer_norm: weight of shape [5] does not match the last dim of input [2, 4]");
  EXPECT_ERROR(LayerNorm(x, RawTensor::Ones({4}), RawTensor::Zeros({1, 4})),
               "layer_norm: bias of shape [1, 4] does not match the last dim of input [2, 4]");
  EXPECT_ERROR(LayerNorm(x, RawTensor(), RawTensor::Zeros({4}, kF64)),
               "layer_norm: bias dtype f64 differs from input dtype f32");
  EXPECT_ERROR(LayerNorm(RawTensor::Scalar(1), RawTensor(), RawTensor()),
               "layer_norm: expected at least 1 dim, got a 0-d tensor");
  EXPECT_ERROR(LayerNorm(RawTensor::Zeros({2, 4}, kI32), RawTensor(), RawTensor()),
               "layer_norm: expected a floating dtype (f32, f64, f16, bf16), got i32");
  EXPECT_ERROR(LayerNorm(x, RawTensor(), RawTensor(), -1),
               "layer_norm: eps must be non-negative, got -1");
}

// ==== Embedding ================================================================================

TEST(Embedding, GathersRowsExactly) {
  Generator gen(19);
  for (DType dtype : kFloatTypes) {
    for (DType index_dtype : {kI32, kI64}) {
      for (Layout layout : kAllLayouts) {
        const RawTensor weight = WithLayout(
            {10, 6}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); });
        const RawTensor idx = WithLayout(
            {2, 3}, layout, [&](const Shape& s) { return Draw(s, index_dtype, gen, 0, 9); });
        const std::vector<double> wv = Values(weight), iv = Values(idx);
        std::vector<double> want;
        for (double i : iv) {
          for (int64_t j = 0; j < 6; ++j) want.push_back(wv[static_cast<size_t>(i) * 6 + j]);
        }
        ExpectExact(Embedding(weight, idx), {2, 3, 6}, dtype, want,
                    std::string("embedding ") + DTypeName(dtype) + " " + LayoutName(layout));
      }
    }
  }
  // Repeated indices and a 0-d index.
  const RawTensor w = RawTensor::FromVector<double>({0, 1, 10, 11, 20, 21}, {3, 2});
  ExpectExact(Embedding(w, RawTensor::FromVector<int64_t>({2, 0, 2}, {3})), {3, 2}, kF64,
              {20, 21, 0, 1, 20, 21}, "repeated");
  ExpectExact(Embedding(w, RawTensor::Full({}, 1, kI32)), {2}, kF64, {10, 11}, "0-d index");
  ExpectExact(Embedding(w, RawTensor::Zeros({0}, kI64)), {0, 2}, kF64, {}, "no indices");
}

TEST(Embedding, BackwardAccumulatesRepeatedIndices) {
  Generator gen(20);
  for (DType dtype : kFloatTypes) {
    for (Layout layout : kAllLayouts) {
      const RawTensor idx = Draw({4, 5}, kI64, gen, 0, 6);  // 20 indices into 7 rows: repeats
      const RawTensor grad = WithLayout(
          {4, 5, 3}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 1, true); });
      const std::vector<double> iv = Values(idx), gv = Values(grad);
      std::vector<double> want(7 * 3, 0);
      for (size_t i = 0; i < iv.size(); ++i) {
        for (size_t j = 0; j < 3; ++j) want[static_cast<size_t>(iv[i]) * 3 + j] += gv[i * 3 + j];
      }
      Tol tol;
      if (dtype == kF32) tol.rtol = 2e-7;  // f64 accumulation, one rounding
      ExpectMatches(EmbeddingBackward(grad, idx, 7), {7, 3}, dtype, want,
                    std::string("embedding_backward ") + LayoutName(layout), tol);
      // i32 indices give the same result.
      ExpectMatches(EmbeddingBackward(grad, idx.to(kI32), 7), {7, 3}, dtype, want,
                    "embedding_backward i32", tol);
    }
  }
  // Exact accumulation: four times the same row, and a row never indexed stays zero.
  const RawTensor g = RawTensor::Full({4, 2}, 0.25, kF16);
  ExpectExact(EmbeddingBackward(g, RawTensor::Full({4}, 1, kI64), 3), {3, 2}, kF16,
              {0, 0, 1, 1, 0, 0}, "repeated index");
  // f16 sums that pass through values above 65504 are accumulated in f32/f64.
  const RawTensor big = RawTensor::FromVector<float>({60000, 60000, -60000}, {3, 1}, kF16);
  ExpectExact(EmbeddingBackward(big, RawTensor::Zeros({3}, kI64), 1), {1, 1}, kF16, {60000},
              "f16 intermediate overflow");
}

TEST(Embedding, Errors) {
  const RawTensor w = RawTensor::Zeros({10, 4});
  EXPECT_ERROR(Embedding(w, RawTensor::FromVector<int64_t>({1, 2, 3, 10}, {4})),
               "embedding: index 10 at position 3 is out of range for 10 rows");
  EXPECT_ERROR(Embedding(w, RawTensor::FromVector<int32_t>({-1}, {1})),
               "embedding: index -1 at position 0 is out of range for 10 rows");
  EXPECT_ERROR(Embedding(w, RawTensor::Zeros({2})),
               "embedding: expected an index dtype (i32 or i64), got f32");
  EXPECT_ERROR(Embedding(RawTensor::Zeros({10}), RawTensor::Zeros({2}, kI64)),
               "embedding: expected a 2-D weight [rows, dim], got [10]");
  EXPECT_ERROR(EmbeddingBackward(RawTensor::Zeros({2, 4}), RawTensor::Zeros({3}, kI64), 5),
               "embedding_backward: gradient shape [2, 4] does not match indices shape [3] plus "
               "one dim");
  EXPECT_ERROR(
      EmbeddingBackward(RawTensor::Zeros({2, 4}), RawTensor::FromVector<int64_t>({0, 5}, {2}), 5),
      "embedding_backward: index 5 at position 1 is out of range for 5 rows");
  EXPECT_ERROR(EmbeddingBackward(RawTensor::Zeros({2, 4}), RawTensor::Zeros({2}, kI64), -1),
               "embedding_backward: num_rows must be non-negative, got -1");
  EXPECT_ERROR(EmbeddingBackward(RawTensor::Zeros({2, 4}, kI32), RawTensor::Zeros({2}, kI64), 5),
               "embedding_backward: expected a floating dtype (f32, f64, f16, bf16), got i32");
}

// ==== Cross-entropy ==============================================================================

struct CrossEntropyRef {
  std::vector<double> losses;  // per row, 0 where ignored
  std::vector<double> grad;    // d(sum of losses)/d logits per row, zero where ignored
  int64_t counted = 0;
};

CrossEntropyRef ReferenceCrossEntropy(const RawTensor& logits, const RawTensor& targets,
                                      int64_t ignore_index) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const std::vector<double> lv = Values(logits), tv = Values(targets);
  CrossEntropyRef r;
  r.losses.assign(n, 0);
  r.grad.assign(n * c, 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto t = static_cast<int64_t>(tv[i]);
    if (t == ignore_index) continue;
    ++r.counted;
    const std::vector<double> row(lv.begin() + i * c, lv.begin() + (i + 1) * c);
    const std::vector<double> logp = SoftmaxRef(row, c, true);
    r.losses[i] = -logp[t];
    for (int64_t j = 0; j < c; ++j) r.grad[i * c + j] = std::exp(logp[j]) - (j == t ? 1 : 0);
  }
  return r;
}

TEST(CrossEntropy, MatchesReferenceForEveryReduction) {
  Generator gen(21);
  for (DType dtype : kFloatTypes) {
    for (Layout layout : {Layout::kContiguous, Layout::kTransposed, Layout::kStepped}) {
      for (int64_t ignore_index : {int64_t{-100}, int64_t{2}}) {
        const RawTensor logits = WithLayout(
            {8, 5}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 2, true); });
        const std::vector<int64_t> t = {0, 4, 2, 1, ignore_index, 3, 2, 4};
        const RawTensor targets = RawTensor::FromVector<int64_t>(t, {8});
        const CrossEntropyRef r = ReferenceCrossEntropy(logits, targets, ignore_index);
        ASSERT_EQ(r.counted, ignore_index == 2 ? 5 : 7);
        double total = 0;
        for (double l : r.losses) total += l;
        const std::string what = std::string(DTypeName(dtype)) + " " + LayoutName(layout) +
                                 " ignore " + std::to_string(ignore_index);
        // f16/bf16: the per-row losses are rounded to the dtype before they are summed.
        Tol tol;
        if (dtype == kF16) tol.atol = 2e-3 * 8;
        if (dtype == kBF16) tol.atol = 2e-2 * 8;
        const RawTensor none = CrossEntropy(logits, targets, ignore_index, Reduction::kNone);
        ExpectMatches(none, {8}, dtype, r.losses, "none " + what);
        ExpectMatches(CrossEntropy(logits, targets, ignore_index, Reduction::kSum), {}, dtype,
                      {total}, "sum " + what, tol);
        ExpectMatches(CrossEntropy(logits, targets, ignore_index), {}, dtype, {total / r.counted},
                      "mean " + what, tol);
        ExpectMatches(CrossEntropy(logits, targets.to(kI32), ignore_index, Reduction::kMean), {},
                      dtype, {total / r.counted}, "mean i32 targets " + what, tol);
        // Ignored rows are exactly zero.
        const std::vector<double> nv = Values(none);
        EXPECT_EQ(nv[4], 0);
        if (ignore_index == 2) {
          EXPECT_EQ(nv[2], 0);
          EXPECT_EQ(nv[6], 0);
        }
        for (size_t i : {0, 1, 3, 5, 7}) EXPECT_GT(nv[i], 0) << what << " row " << i;
      }
    }
  }
}

TEST(CrossEntropy, AllIgnoredAndExtremeLogits) {
  const RawTensor logits = RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const RawTensor ignored = RawTensor::Full({2}, -100, kI64);
  EXPECT_TRUE(std::isnan(CrossEntropy(logits, ignored).item()));
  EXPECT_EQ(CrossEntropy(logits, ignored, -100, Reduction::kSum).item(), 0);
  ExpectExact(CrossEntropy(logits, ignored, -100, Reduction::kNone), {2}, kF32, {0, 0},
              "all ignored none");
  // Large logits are stable: loss = log(1 + e^-1) for the larger class, accurate to the loss's
  // own precision (not to the precision of 1000).
  for (DType dtype : {kF32, kF64, kF16}) {  // (999 is not a bf16 value)
    const RawTensor big = RawTensor::FromVector<double>({1000, 999, -1000, 0}, {2, 2}, dtype);
    const RawTensor t = RawTensor::FromVector<int64_t>({0, 1}, {2});
    ExpectMatches(CrossEntropy(big, t, -100, Reduction::kNone), {2}, dtype,
                  {std::log1p(std::exp(-1.0)), 0}, std::string("large logits ") + DTypeName(dtype));
    ExpectMatches(CrossEntropy(big, t), {}, dtype, {std::log1p(std::exp(-1.0)) / 2},
                  std::string("large logits mean ") + DTypeName(dtype));
  }
  // A -inf logit at the target gives an infinite loss.
  const RawTensor neg = RawTensor::FromVector<double>({-kInf, 0}, {1, 2});
  EXPECT_EQ(CrossEntropy(neg, RawTensor::Zeros({1}, kI64)).item(), kInf);
  EXPECT_EQ(CrossEntropy(neg, RawTensor::Ones({1}, kI64)).item(), 0);
}

TEST(CrossEntropy, BackwardIsSoftmaxMinusOneHotScaled) {
  Generator gen(22);
  for (DType dtype : kFloatTypes) {
    for (Layout layout : {Layout::kContiguous, Layout::kTransposed}) {
      const RawTensor logits = WithLayout(
          {6, 4}, layout, [&](const Shape& s) { return Draw(s, dtype, gen, 0, 2, true); });
      const RawTensor targets = RawTensor::FromVector<int64_t>({3, -100, 0, 1, 1, 2}, {6});
      const CrossEntropyRef r = ReferenceCrossEntropy(logits, targets, -100);
      ASSERT_EQ(r.counted, 5);
      const std::string what = std::string(DTypeName(dtype)) + " " + LayoutName(layout);
      Tol tol;
      if (dtype == kF32) tol.atol = 1e-6;
      // Mean: (softmax - onehot) * g / counted.
      std::vector<double> mean_grad(r.grad.size()), sum_grad(r.grad.size()),
          none_grad(r.grad.size());
      const std::vector<double> row_g = {0.5, 7, -1, 2, 0.25, 3};
      for (size_t i = 0; i < r.grad.size(); ++i) {
        mean_grad[i] = r.grad[i] * 2.5 / 5;
        sum_grad[i] = r.grad[i] * -1.5;
        none_grad[i] = r.grad[i] * row_g[i / 4];
      }
      ExpectMatches(CrossEntropyBackward(logits, targets, RawTensor::Scalar(2.5, dtype)), {6, 4},
                    dtype, mean_grad, "mean " + what, tol);
      ExpectMatches(
          CrossEntropyBackward(logits, targets, RawTensor::Scalar(-1.5), -100, Reduction::kSum),
          {6, 4}, dtype, sum_grad, "sum " + what, tol);
      ExpectMatches(
          CrossEntropyBackward(logits, targets, RawTensor::FromVector<double>(row_g, {6}, dtype),
                               -100, Reduction::kNone),
          {6, 4}, dtype, none_grad, "none " + what, tol);
    }
  }
  // All rows ignored: zeros, not NaN.
  ExpectExact(CrossEntropyBackward(RawTensor::Ones({2, 3}), RawTensor::Full({2}, 7, kI64),
                                   RawTensor::Scalar(1), 7),
              {2, 3}, kF32, std::vector<double>(6, 0), "all ignored");
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  Generator gen(23);
  const RawTensor logits = Draw({3, 4}, kF64, gen, 0, 1, true);
  const RawTensor targets = RawTensor::FromVector<int32_t>({2, 0, 3}, {3});
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum}) {
    const std::vector<double> analytic =
        Values(CrossEntropyBackward(logits, targets, RawTensor::Scalar(1, kF64), -100, reduction));
    std::vector<double> lv = Values(logits);
    const double h = 1e-6;
    for (size_t i = 0; i < lv.size(); ++i) {
      std::vector<double> plus = lv, minus = lv;
      plus[i] += h;
      minus[i] -= h;
      const double fp =
          CrossEntropy(RawTensor::FromVector<double>(plus, {3, 4}), targets, -100, reduction)
              .item();
      const double fm =
          CrossEntropy(RawTensor::FromVector<double>(minus, {3, 4}), targets, -100, reduction)
              .item();
      EXPECT_NEAR(analytic[i], (fp - fm) / (2 * h), 1e-8) << "element " << i;
    }
  }
}

TEST(CrossEntropy, Errors) {
  const RawTensor logits = RawTensor::Zeros({4, 5});
  EXPECT_ERROR(CrossEntropy(logits, RawTensor::FromVector<int64_t>({0, 1, 5, 2}, {4})),
               "cross_entropy: target 5 at position 2 is out of range for 5 classes");
  EXPECT_ERROR(CrossEntropy(logits, RawTensor::FromVector<int64_t>({0, -1, 1, 2}, {4})),
               "cross_entropy: target -1 at position 1 is out of range for 5 classes");
  EXPECT_ERROR(
      CrossEntropy(logits, RawTensor::Zeros({3}, kI64)),
      "cross_entropy: targets of shape [3] do not match logits of shape [4, 5] (expected [4])");
  EXPECT_ERROR(
      CrossEntropy(logits, RawTensor::Zeros({4, 1}, kI64)),
      "cross_entropy: targets of shape [4, 1] do not match logits of shape [4, 5] (expected [4])");
  EXPECT_ERROR(CrossEntropy(RawTensor::Zeros({5}), RawTensor::Zeros({5}, kI64)),
               "cross_entropy: expected logits [N, C], got [5]");
  EXPECT_ERROR(CrossEntropy(logits, RawTensor::Zeros({4})),
               "cross_entropy: expected an index dtype (i32 or i64), got f32");
  EXPECT_ERROR(CrossEntropy(RawTensor::Zeros({4, 5}, kI32), RawTensor::Zeros({4}, kI64)),
               "cross_entropy: expected a floating dtype (f32, f64, f16, bf16), got i32");
  EXPECT_ERROR(CrossEntropyBackward(logits, RawTensor::FromVector<int64_t>({0, 1, 2, 9}, {4}),
                                    RawTensor::Scalar(1)),
               "cross_entropy_backward: target 9 at position 3 is out of range for 5 classes");
  EXPECT_ERROR(CrossEntropyBackward(logits, RawTensor::Zeros({4}, kI64), RawTensor::Ones({1}), -100,
                                    Reduction::kNone),
               "cross_entropy_backward: expected a loss gradient of shape [4] for reduction none, "
               "got [1]");
  EXPECT_ERROR(CrossEntropyBackward(logits, RawTensor::Zeros({4}, kI64), RawTensor::Ones({4})),
               "cross_entropy_backward: expected a one-element loss gradient, got shape [4]");
}

// ==== Indexing: gather, scatter_add, index_select, index_add =====================================

// Row-major linear index of `pos` in `shape`.
int64_t LinearIndex(const std::vector<int64_t>& pos, const Shape& shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + pos[d];
  return i;
}

// Every position of `shape` in row-major order.
std::vector<std::vector<int64_t>> Positions(const Shape& shape) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> pos(shape.size(), 0);
  for (int64_t i = 0; i < NumElements(shape); ++i) {
    out.push_back(pos);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++pos[d] < shape[d]) break;
      pos[d] = 0;
    }
  }
  return out;
}

// Integer types wrap on overflow; the reference adds in f64 (exact for the small test values).
const std::vector<DType> kScatterTypes = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8};

TEST(Indexing, GatherMatchesReference) {
  Generator gen(31);
  const Shape x_shape = {3, 4, 5};
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI32, kI64, kBool}) {
    for (int64_t dim : {0, 1, 2, -1}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      // index may be larger than x along dim and no larger elsewhere.
      Shape index_shape = {2, 3, 4};
      index_shape[d] = 6;
      for (const auto& [lx, li] : kLayoutPairs) {
        const RawTensor x = WithLayout(x_shape, lx, [&](const Shape& s) {
          return Draw(s, dtype, gen, -5, 5, IsFloating(dtype));
        });
        const RawTensor index = WithLayout(
            index_shape, li, [&](const Shape& s) { return Draw(s, kI64, gen, 0, x_shape[d] - 1); });
        const std::vector<double> xv = Values(x), iv = Values(index);
        std::vector<double> want;
        for (const auto& pos : Positions(index_shape)) {
          std::vector<int64_t> src = pos;
          src[d] = static_cast<int64_t>(iv[LinearIndex(pos, index_shape)]);
          want.push_back(xv[LinearIndex(src, x_shape)]);
        }
        const std::string what = std::string("gather ") + DTypeName(dtype) + " dim " +
                                 std::to_string(dim) + " " + LayoutName(lx) + "/" + LayoutName(li);
        ExpectExact(Gather(x, dim, index), index_shape, dtype, want, what);
        ExpectExact(Gather(x, dim, index.to(kI32)), index_shape, dtype, want, what + " i32");
      }
    }
  }
  // 0-d input and index; an empty index gives an empty result.
  ExpectExact(Gather(RawTensor::Scalar(7.5, kF64), 0, RawTensor::Zeros({}, kI64)), {}, kF64, {7.5},
              "0-d");
  ExpectExact(Gather(RawTensor::Ones({2, 3}), 1, RawTensor::Zeros({2, 0}, kI64)), {2, 0}, kF32, {},
              "empty index");
}

TEST(Indexing, ScatterAddMatchesReferenceWithRepeatedIndices) {
  Generator gen(32);
  const Shape self_shape = {3, 4, 5};
  for (DType dtype : kScatterTypes) {
    for (int64_t dim : {0, 1, 2}) {
      Shape index_shape = {2, 3, 4};
      index_shape[dim] = 7;  // more entries than rows along dim: repeats
      Shape src_shape = index_shape;
      src_shape[0] += 1;  // src may be larger than index
      for (const auto& [ls, lsrc] : kLayoutPairs) {
        const RawTensor self = WithLayout(self_shape, ls, [&](const Shape& s) {
          return Draw(s, dtype, gen, 0, 9, IsFloating(dtype));
        });
        const RawTensor src = WithLayout(src_shape, lsrc, [&](const Shape& s) {
          return Draw(s, dtype, gen, 0, 9, IsFloating(dtype));
        });
        const RawTensor index = Draw(index_shape, kI64, gen, 0, self_shape[dim] - 1);
        const std::vector<double> sv = Values(self), srcv = Values(src), iv = Values(index);
        std::vector<double> want = sv;
        for (const auto& pos : Positions(index_shape)) {
          std::vector<int64_t> at = pos;
          at[dim] = static_cast<int64_t>(iv[LinearIndex(pos, index_shape)]);
          want[LinearIndex(at, self_shape)] += srcv[LinearIndex(pos, src_shape)];
        }
        if (dtype == kU8) {
          for (double& w : want) w = WrapInt(kU8, static_cast<int64_t>(w));
        }
        Tol tol;
        if (dtype == kF32) tol.rtol = 2e-7;  // f64 accumulation, one rounding
        const std::string what = std::string("scatter_add dim ") + std::to_string(dim) + " " +
                                 LayoutName(ls) + "/" + LayoutName(lsrc);
        ExpectMatches(ScatterAdd(self, dim, index, src), self_shape, dtype, want, what, tol);
      }
    }
  }
  // self is not modified; repeated f16 additions round once (2048 + 1 + 1 = 2050, while
  // adding 1 to 2048 in f16 twice would stay 2048).
  const RawTensor self = RawTensor::Full({1, 2}, 2048, kF16);
  const RawTensor out =
      ScatterAdd(self, 1, RawTensor::Zeros({1, 2}, kI64), RawTensor::Ones({1, 2}, kF16));
  ExpectExact(out, {1, 2}, kF16, {2050, 2048}, "f16 rounds once");
  ExpectExact(self, {1, 2}, kF16, {2048, 2048}, "self unchanged");
}

TEST(Indexing, IndexSelectAndIndexAddMatchReference) {
  Generator gen(33);
  const Shape x_shape = {5, 3, 4};
  for (DType dtype : kScatterTypes) {
    for (int64_t dim : {0, 1, -1}) {
      const int64_t d = dim < 0 ? dim + 3 : dim;
      for (Layout layout : kAllLayouts) {
        const RawTensor x = WithLayout(x_shape, layout, [&](const Shape& s) {
          return Draw(s, dtype, gen, 0, 9, IsFloating(dtype));
        });
        const RawTensor index = Draw({6}, kI32, gen, 0, x_shape[d] - 1);  // repeats
        const std::vector<double> xv = Values(x), iv = Values(index);
        Shape out_shape = x_shape;
        out_shape[d] = 6;
        std::vector<double> want;
        for (const auto& pos : Positions(out_shape)) {
          std::vector<int64_t> src = pos;
          src[d] = static_cast<int64_t>(iv[pos[d]]);
          want.push_back(xv[LinearIndex(src, x_shape)]);
        }
        const std::string what = std::string(DTypeName(dtype)) + " dim " + std::to_string(dim) +
                                 " " + LayoutName(layout);
        ExpectExact(IndexSelect(x, dim, index), out_shape, dtype, want, "index_select " + what);

        // index_add of a src shaped like that result, into x.
        const RawTensor src = WithLayout(out_shape, layout, [&](const Shape& s) {
          return Draw(s, dtype, gen, 0, 9, IsFloating(dtype));
        });
        const std::vector<double> srcv = Values(src);
        std::vector<double> sum = xv;
        for (const auto& pos : Positions(out_shape)) {
          std::vector<int64_t> at = pos;
          at[d] = static_cast<int64_t>(iv[pos[d]]);
          sum[LinearIndex(at, x_shape)] += srcv[LinearIndex(pos, out_shape)];
        }
        if (dtype == kU8) {
          for (double& w : sum) w = WrapInt(kU8, static_cast<int64_t>(w));
        }
        Tol tol;
        if (dtype == kF32) tol.rtol = 2e-7;
        ExpectMatches(IndexAdd(x, dim, index, src), x_shape, dtype, sum, "index_add " + what, tol);
      }
    }
  }
  // A 0-d index selects one slice and keeps the dim; an empty index gives an empty dim.
  const RawTensor x = RawTensor::FromVector<double>({0, 1, 10, 11, 20, 21}, {3, 2});
  ExpectExact(IndexSelect(x, 0, RawTensor::Full({}, 2, kI64)), {1, 2}, kF64, {20, 21}, "0-d index");
  ExpectExact(IndexSelect(x, 0, RawTensor::Zeros({0}, kI64)), {0, 2}, kF64, {}, "empty index");
  ExpectExact(IndexAdd(x, 0, RawTensor::Zeros({0}, kI64), RawTensor::Zeros({0, 2}, kF64)), {3, 2},
              kF64, {0, 1, 10, 11, 20, 21}, "empty index_add");
}

TEST(Indexing, Errors) {
  const RawTensor x = RawTensor::Zeros({2, 5});
  EXPECT_ERROR(Gather(x, 1, RawTensor::FromVector<int64_t>({0, 1, 2, 5}, {2, 2})),
               "gather: index 5 at position [1, 1] is out of range for dim 1 of size 5");
  EXPECT_ERROR(Gather(x, 1, RawTensor::FromVector<int32_t>({0, -1}, {1, 2})),
               "gather: index -1 at position [0, 1] is out of range for dim 1 of size 5");
  EXPECT_ERROR(Gather(x, 0, RawTensor::Zeros({2}, kI64)),
               "gather: index of shape [2] and input of shape [2, 5] differ in rank");
  EXPECT_ERROR(Gather(x, 0, RawTensor::Zeros({1, 6}, kI64)),
               "gather: index of shape [1, 6] is larger than input of shape [2, 5] at dim 1 (only "
               "dim 0 may be larger)");
  EXPECT_ERROR(Gather(x, 2, RawTensor::Zeros({2, 5}, kI64)),
               "gather: dim 2 is out of range for a tensor with 2 dims");
  EXPECT_ERROR(Gather(x, 0, RawTensor::Zeros({2, 5})),
               "gather: expected an index dtype (i32 or i64), got f32");

  EXPECT_ERROR(
      ScatterAdd(x, 1, RawTensor::FromVector<int64_t>({7}, {1, 1}), RawTensor::Ones({1, 1})),
      "scatter_add: index 7 at position [0, 0] is out of range for dim 1 of size 5");
  EXPECT_ERROR(ScatterAdd(x, 1, RawTensor::Zeros({1, 1}, kI64), RawTensor::Ones({1, 1}, kF64)),
               "scatter_add: src dtype f64 differs from self dtype f32");
  EXPECT_ERROR(ScatterAdd(x, 1, RawTensor::Zeros({2, 2}, kI64), RawTensor::Ones({1, 2})),
               "scatter_add: index of shape [2, 2] is larger than src of shape [1, 2] or self of "
               "shape [2, 5] at dim 0");
  EXPECT_ERROR(ScatterAdd(x, 1, RawTensor::Zeros({2}, kI64), RawTensor::Ones({2})),
               "scatter_add: self [2, 5], index [2] and src [2] must have the same rank");
  EXPECT_ERROR(ScatterAdd(RawTensor::Zeros({2}, kBool), 0, RawTensor::Zeros({2}, kI64),
                          RawTensor::Zeros({2}, kBool)),
               "scatter_add: not defined for bool tensors; cast them first");

  EXPECT_ERROR(IndexSelect(x, 1, RawTensor::FromVector<int64_t>({0, 4, 7}, {3})),
               "index_select: index 7 at position 2 is out of range for dim 1 of size 5");
  EXPECT_ERROR(IndexSelect(x, 0, RawTensor::FromVector<int64_t>({-1}, {1})),
               "index_select: index -1 at position 0 is out of range for dim 0 of size 2");
  EXPECT_ERROR(IndexSelect(x, 0, RawTensor::Zeros({1, 1}, kI64)),
               "index_select: expected a 1-D index, got shape [1, 1]");
  EXPECT_ERROR(IndexSelect(RawTensor::Scalar(1), 0, RawTensor::Zeros({1}, kI64)),
               "index_select: cannot index a 0-d tensor");
  EXPECT_ERROR(IndexAdd(x, 0, RawTensor::Zeros({3}, kI64), RawTensor::Ones({2, 5})),
               "index_add: src of shape [2, 5] does not match self of shape [2, 5] with 3 indices "
               "at dim 0 (expected [3, 5])");
  EXPECT_ERROR(IndexAdd(x, 0, RawTensor::FromVector<int64_t>({2}, {1}), RawTensor::Ones({1, 5})),
               "index_add: index 2 at position 0 is out of range for dim 0 of size 2");
}

// ==== Mixed-precision list ops ===================================================================

TEST(ListOps, AnyNonFinite) {
  EXPECT_FALSE(AnyNonFinite({}));
  for (DType dtype : kFloatTypes) {
    const RawTensor finite = RawTensor::FromVector<double>({1, -2, 65504, 0}, {2, 2}, dtype);
    EXPECT_FALSE(AnyNonFinite({finite, RawTensor::Zeros({3}, kF32)})) << DTypeName(dtype);
    for (double bad : {kInf, -kInf, kNaN}) {
      const RawTensor t = RawTensor::FromVector<double>({1, 2, bad, 4}, {4}, dtype);
      EXPECT_TRUE(AnyNonFinite({finite, t})) << DTypeName(dtype) << " " << bad;
      // Only the elements a view addresses count.
      EXPECT_FALSE(AnyNonFinite({t.slice(0, 0, 4, 3)}));  // elements 0 and 3
      EXPECT_TRUE(AnyNonFinite({t.slice(0, 1, 4, 1)}));
      EXPECT_TRUE(AnyNonFinite({t.view({2, 2}).transpose(0, 1)}));
    }
  }
  // 70000 is finite in f32 but not once rounded to f16.
  EXPECT_FALSE(AnyNonFinite({RawTensor::Full({2}, 70000)}));
  EXPECT_TRUE(AnyNonFinite({RawTensor::Full({2}, 70000).to(kF16)}));
  EXPECT_FALSE(AnyNonFinite({RawTensor::Full({2}, 70000).to(kBF16)}));
  // Integer tensors are always finite and are skipped, not rejected.
  EXPECT_FALSE(AnyNonFinite({RawTensor::Full({2}, 7, kI64), RawTensor::Ones({3}, kBool)}));
  EXPECT_TRUE(AnyNonFinite({RawTensor::Full({2}, 7, kI32), RawTensor::Full({1}, kNaN)}));
}

TEST(ListOps, MulScalarInPlace) {
  Generator gen(24);
  for (DType dtype : kFloatTypes) {
    const RawTensor a = Draw({3, 4}, dtype, gen, 0, 1, true);
    const RawTensor base = Draw({4, 6}, dtype, gen, 0, 1, true);
    const RawTensor view = base.transpose(0, 1).slice(0, 0, 6, 2);  // [3, 4], non-contiguous
    ASSERT_FALSE(view.is_contiguous());
    const std::vector<double> av = Values(a), bv = Values(base);
    MulScalarInPlace({a, view}, 0.375);
    std::vector<double> want_a(av.size()), want_base = bv;
    for (size_t i = 0; i < av.size(); ++i) want_a[i] = av[i] * 0.375;
    // The view covers base columns 0, 2 and 4.
    for (size_t r = 0; r < 4; ++r) {
      for (size_t c = 0; c < 6; c += 2) want_base[r * 6 + c] = bv[r * 6 + c] * 0.375;
    }
    ExpectMatches(a, {3, 4}, dtype, want_a, "mul_scalar_ contiguous");
    ExpectMatches(base, {4, 6}, dtype, want_base, "mul_scalar_ through a view");
  }
  // Rounded to the tensor's dtype: f16 300 * 300 overflows.
  const RawTensor h = RawTensor::Full({2}, 300, kF16);
  MulScalarInPlace({h}, 300);
  ExpectExact(h, {2}, kF16, {kInf, kInf}, "f16 overflow");
  // Every tensor is validated before any is changed.
  const RawTensor f = RawTensor::Ones({2});
  EXPECT_ERROR(MulScalarInPlace({f, RawTensor::Ones({2}, kI32)}, 2),
               "mul_scalar_: expected a floating dtype (f32, f64, f16, bf16), got i32");
  ExpectExact(f, {2}, kF32, {1, 1}, "unchanged after error");
}

TEST(ListOps, NonFiniteCheckAndUnscale) {
  const RawTensor found = RawTensor::Zeros({}, kF32);
  const RawTensor inv = RawTensor::Scalar(0.25);
  const RawTensor a = RawTensor::FromVector<float>({4, -8, 1, 2}, {2, 2});
  const RawTensor b = RawTensor::FromVector<float>({8, 16, 32}, {3}, kF16);
  NonFiniteCheckAndUnscale({a, b}, found, inv);
  EXPECT_EQ(found.item(), 0);
  ExpectExact(a, {2, 2}, kF32, {1, -2, 0.25, 0.5}, "a unscaled");
  ExpectExact(b, {3}, kF16, {2, 4, 8}, "b unscaled");
  // A non-finite value anywhere sets found_inf; finite values are still scaled.
  const RawTensor base = RawTensor::FromVector<double>({1, kInf, 2, 3, kNaN, 4}, {2, 3}, kBF16);
  const RawTensor finite_view = base.slice(1, 0, 3, 2).select(0, 0);  // elements 1, 2 (cols 0, 2)
  NonFiniteCheckAndUnscale({finite_view}, found, inv);
  EXPECT_EQ(found.item(), 0) << "the view does not address the inf";
  ExpectExact(base, {2, 3}, kBF16, {0.25, kInf, 0.5, 3, kNaN, 4}, "only the view scaled");
  NonFiniteCheckAndUnscale({a, base.transpose(0, 1)}, found, inv);
  EXPECT_EQ(found.item(), 1);
  ExpectExact(a, {2, 2}, kF32, {0.25, -0.5, 0.0625, 0.125}, "scaled on overflow too");
  ExpectExact(base, {2, 3}, kBF16, {0.0625, kInf, 0.125, 0.75, kNaN, 1}, "transposed view");
  // found_inf accumulates: a clean call afterwards leaves it at 1.
  NonFiniteCheckAndUnscale({a}, found, RawTensor::Scalar(4));
  EXPECT_EQ(found.item(), 1);
  ExpectExact(a, {2, 2}, kF32, {1, -2, 0.25, 0.5}, "scaled back");
  // -inf in f64, found_inf starting from another value is only ever set to 1.
  const RawTensor found2 = RawTensor::Full({1}, 0, kF32);
  NonFiniteCheckAndUnscale({RawTensor::FromVector<double>({-kInf}, {1})}, found2,
                           RawTensor::Full({1}, 2, kF32));
  EXPECT_EQ(found2.item(), 1);
  EXPECT_EQ(found2.shape(), Shape{1});
  // An empty list changes nothing.
  const RawTensor found3 = RawTensor::Zeros({});
  NonFiniteCheckAndUnscale({}, found3, inv);
  EXPECT_EQ(found3.item(), 0);
}

TEST(ListOps, Errors) {
  const RawTensor t = RawTensor::Ones({2});
  EXPECT_ERROR(
      NonFiniteCheckAndUnscale({t}, RawTensor::Zeros({}, kF64), RawTensor::Scalar(1)),
      "non_finite_check_and_unscale: found_inf must be a one-element f32 tensor, got f64 []");
  EXPECT_ERROR(
      NonFiniteCheckAndUnscale({t}, RawTensor::Zeros({}), RawTensor::Ones({2})),
      "non_finite_check_and_unscale: inv_scale must be a one-element f32 tensor, got f32 [2]");
  EXPECT_ERROR(NonFiniteCheckAndUnscale({t, RawTensor::Ones({2}, kI64)}, RawTensor::Zeros({}),
                                        RawTensor::Scalar(2)),
               "non_finite_check_and_unscale: expected a floating dtype (f32, f64, f16, bf16), got "
               "i64");
  ExpectExact(t, {2}, kF32, {1, 1}, "unchanged after error");
  EXPECT_ERROR(AnyNonFinite({t, RawTensor()}),
               "non_finite_check: a list element is an undefined tensor");
}

// ---- DropoutMask ---------------------------------------------------------------------------------

// The documented rule drawn one by one: element i is dropped iff the generator's i-th next
// NextUniform() is below p.
std::vector<double> SequentialMask(int64_t n, double p, Generator& gen) {
  std::vector<double> out(static_cast<size_t>(n));
  for (double& v : out) v = gen.NextUniform() < p ? 0.0 : 1.0;
  return out;
}

TEST(DropoutMaskTest, EqualsTheSequentialDrawsFromAnyOffset) {
  // Offsets 0..7 start inside a Philox block of four draws at every position; the sizes end
  // inside one; p covers tiny, common and nearly-one rates.
  for (double p : {1e-9, 0.1, 0.25, 0.5, 0.9, 1 - 0x1.0p-24}) {
    for (uint64_t skip : {0, 1, 2, 3, 4, 5, 6, 7}) {
      for (int64_t n : {1, 2, 3, 5, 13, 1000}) {
        Generator gen(1234), ref(1234);
        gen.Reserve(skip);
        ref.Reserve(skip);
        const RawTensor mask = DropoutMask({n}, p, gen, kF32, Device::Cpu());
        EXPECT_EQ(Values(mask), SequentialMask(n, p, ref)) << "p " << p << " skip " << skip;
        EXPECT_EQ(gen.state(), ref.state()) << "one draw per element";
      }
    }
  }
}

TEST(DropoutMaskTest, ThresholdIsExactAtTheEdgesOfA24BitUniform) {
  // u = k * 2^-24 is dropped iff u < p: p exactly on a grid point keeps that point, the next
  // double above it drops it.
  for (uint32_t k : {0u, 1u, 12345u, 8388608u, 16777215u}) {
    const double on = k * 0x1.0p-24;
    EXPECT_EQ(DropoutThreshold(on), k);
    EXPECT_EQ(DropoutThreshold(std::nextafter(on, 1.0)), k + 1);
    const uint32_t draw = k << 8;  // the draw whose uniform is exactly `on`
    EXPECT_TRUE(DropoutKeeps(draw, DropoutThreshold(on)));
    EXPECT_FALSE(DropoutKeeps(draw, DropoutThreshold(std::nextafter(on, 1.0))));
  }
  EXPECT_EQ(DropoutThreshold(0), 0u);  // p = 0 keeps everything
}

TEST(DropoutMaskTest, EveryFloatingDtypeShapeAndBadInput) {
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    Generator gen(5), ref(5);
    const RawTensor mask = DropoutMask({3, 4, 5}, 0.3, gen, dtype, Device::Cpu());
    EXPECT_EQ(mask.dtype(), dtype);
    EXPECT_EQ(mask.shape(), (Shape{3, 4, 5}));
    EXPECT_EQ(Values(mask), SequentialMask(60, 0.3, ref)) << DTypeName(dtype);
  }
  Generator gen(5);
  EXPECT_EQ(DropoutMask({0, 3}, 0.5, gen, kF32, Device::Cpu()).numel(), 0);
  EXPECT_EQ(gen.state().offset, 0u) << "an empty mask draws nothing";
  EXPECT_ERROR(DropoutMask({2}, 1.0, gen, kF32, Device::Cpu()),
                       "dropout: p must be in [0, 1), got 1");
  EXPECT_ERROR(DropoutMask({2}, 0.5, gen, kI64, Device::Cpu()),
                       "dropout: expected a floating dtype (f32, f64, f16, bf16), got i64");
}

}  // namespace
}  // namespace tg
