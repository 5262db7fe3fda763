// The CUDA elementwise, copy and reduction kernels (tensor/cuda/elementwise.cu, reduce.cu)
// against the CPU kernels, for every op and dtype and over the layouts that take different
// paths: contiguous and 16-byte aligned (vectorised, with a tail when the size is not a multiple
// of the vector width), misaligned by one element, broadcast (stride 0), transposed and
// sliced (strided), more than six dims that do not merge (several launches), and empty.
//
// Exact (bit for bit) wherever both devices compute IEEE-exact operations: conversions, fills,
// compares, where, max, integer ops, +, -, *, /, sqrt, neg/abs/relu, max/min and scaling, in
// every dtype (f16/bf16 results are the same f32 value rounded the same way). A NaN produced
// by arithmetic matches any NaN: x86 produces a negative "default NaN", CUDA a positive one.
// Conversions keep NaN payloads on both, so copies compare NaN bits too.
//
// exp/log/tanh/sigmoid/gelu/erf/pow use CUDA's libdevice on the GPU and glibc on the CPU; both
// are within a few ulp of the true value but not identically rounded (CUDA documents expf,
// tanhf and erff at 2 ulp, powf at 4; glibc's are at most 1-2 ulp), so they are compared with
// a tolerance: relative 1e-6 (about 8 f32 ulp) or 1e-13 for f64, plus an absolute 1e-6 (1e-13)
// for results near zero that come from cancellation (gelu(-6) = x/2 (1 + erf(...)), where an
// ulp of erf near -1 is all that is left). f16/bf16 results may then round to the neighbouring
// value: one ulp of the 16-bit type, or the same absolute bound.
//
// Every test skips without a CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace tg {
namespace {

const Device kGpu = Device::Cuda(0);
constexpr DType kAllDTypes[] = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool};
constexpr DType kNumericDTypes[] = {kF32, kF64, kF16, kBF16, kI32, kI64, kU8};
constexpr DType kFloatDTypes[] = {kF32, kF64, kF16, kBF16};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::Available()) GTEST_SKIP() << "no CUDA device";
  }
};

RawTensor ToGpu(const RawTensor& t) { return t.contiguous().to(kGpu); }
RawTensor ToCpu(const RawTensor& t) { return t.to(Device::Cpu()); }

// Deterministic values of `dtype`'s range (an LCG, so every run tests the same data). With
// `specials`, floating tensors get inf, NaN, signed zeros, f16 subnormals and values beyond f16's
// range at every 7th element, and integer tensors their extremes (arithmetic then wraps).
RawTensor Make(DType dtype, const Shape& shape, uint32_t seed, bool specials = true) {
  const int64_t n = NumElements(shape);
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  const double float_specials[] = {kNaN, kInf, -kInf, -0.0, 0.0, 1e-6, 7e4, -7e4, 0.5, 1e30};
  const double int_specials[] = {2147483647.0, -2147483648.0, 9.2e18, -9.2e18, 255, 0};
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const double u = (s >> 8) / 16777216.0;  // [0, 1)
    double x;
    if (dtype == kBool) {
      x = u < 0.5 ? 0 : 1;
    } else if (dtype == kU8) {
      x = std::floor(u * 256);
    } else if (IsIntegral(dtype)) {
      x = std::floor(u * 201) - 100;
    } else {
      x = u * 8 - 4;
    }
    if (specials && i % 7 == 3) {
      if (IsFloating(dtype)) x = float_specials[(i / 7) % 10];
      if (dtype == kI32 || dtype == kI64) x = int_specials[(i / 7) % 6];
    }
    v[static_cast<size_t>(i)] = x;
  }
  return RawTensor::FromVector<double>(v, shape).to(dtype);
}

// Raw element bits in row-major order.
std::vector<uint64_t> Bits(const RawTensor& t) {
  const RawTensor c = ToCpu(t).contiguous();
  const size_t size = c.element_size();
  std::vector<uint64_t> bits(static_cast<size_t>(c.numel()), 0);
  const char* p = static_cast<const char*>(c.raw_data());
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&bits[i], p + i * size, size);
  return bits;
}

void ExpectSameLayout(const RawTensor& expected, const RawTensor& actual) {
  ASSERT_EQ(expected.dtype(), actual.dtype())
      << DTypeName(expected.dtype()) << " vs " << DTypeName(actual.dtype());
  ASSERT_EQ(ShapeToString(expected.shape()), ShapeToString(actual.shape()));
}

// `actual` (on any device) holds `expected`'s bits; with any_nan a NaN matches any NaN.
void ExpectExact(const RawTensor& expected, const RawTensor& actual, bool any_nan = true) {
  ExpectSameLayout(expected, actual);
  const std::vector<uint64_t> e = Bits(expected), a = Bits(actual);
  const std::vector<double> ev = ToCpu(expected).to_vector<double>();
  const std::vector<double> av = ToCpu(actual).to_vector<double>();
  int failures = 0;
  for (size_t i = 0; i < e.size() && failures < 8; ++i) {
    if (e[i] == a[i] || (any_nan && std::isnan(ev[i]) && std::isnan(av[i]))) continue;
    ADD_FAILURE() << "element " << i << ": expected " << ev[i] << " (bits 0x" << std::hex << e[i]
                  << "), got " << av[i] << " (bits 0x" << a[i] << std::dec << ")";
    ++failures;
  }
}

// Position of a 16-bit float in the order of the values, so that neighbours differ by one.
int32_t Ordinal16(uint64_t bits) {
  const int32_t magnitude = static_cast<int32_t>(bits & 0x7fffu);
  return (bits & 0x8000u) != 0 ? -magnitude : magnitude;
}

// The tolerance of the file comment, for results of libdevice vs glibc transcendentals.
void ExpectClose(const RawTensor& expected, const RawTensor& actual) {
  ExpectSameLayout(expected, actual);
  const DType dtype = expected.dtype();
  const double tol = dtype == kF64 ? 1e-13 : 1e-6;
  const bool reduced = dtype == kF16 || dtype == kBF16;
  const std::vector<uint64_t> eb = Bits(expected), ab = Bits(actual);
  const std::vector<double> e = ToCpu(expected).to_vector<double>();
  const std::vector<double> a = ToCpu(actual).to_vector<double>();
  int failures = 0;
  for (size_t i = 0; i < e.size() && failures < 8; ++i) {
    if (std::isnan(e[i]) && std::isnan(a[i])) continue;
    if (e[i] == a[i]) continue;  // equal values, infinities included
    const double diff = std::fabs(a[i] - e[i]);
    if (std::isfinite(diff) && diff <= tol + (reduced ? 0 : tol * std::fabs(e[i]))) continue;
    if (reduced && std::abs(Ordinal16(eb[i]) - Ordinal16(ab[i])) <= 1) continue;
    ADD_FAILURE() << "element " << i << ": expected " << e[i] << ", got " << a[i];
    ++failures;
  }
}

// ---- Layouts ------------------------------------------------------------------------------------

// A way to build the inputs of an op from contiguous base tensors, applied identically on the
// CPU and the GPU (views are device independent).
struct Layout {
  const char* name;
  std::vector<Shape> bases;  // one base per input (the last one repeats for more inputs)
  std::function<RawTensor(const RawTensor&, size_t input)> view;
  bool misaligned_out = false;
};

RawTensor Identity(const RawTensor& t, size_t) { return t; }

std::vector<Layout> Layouts() {
  return {
      // 1003 = 125 vectors of 8 (f16/bf16) + 3, 250 of 4 (f32) + 3, 501 of 2 (f64) + 1.
      {"contiguous", {{1003}}, Identity},
      {"broadcast", {{3, 1, 5}, {4, 1}}, Identity},
      {"scalar operand", {{257}, {}}, Identity},
      {"transposed",
       {{37, 29}, {29, 37}},
       [](const RawTensor& t, size_t input) { return input == 0 ? t.transpose(0, 1) : t; }},
      {"sliced with step",
       {{2000}, {999}},
       [](const RawTensor& t, size_t input) { return input == 0 ? t.slice(0, 3, 2000, 2) : t; }},
      // Contiguous but one element past an aligned address: the scalar path, output included.
      {"misaligned",
       {{1004}},
       [](const RawTensor& t, size_t) { return t.slice(0, 1, 1004); },
       true},
      {"empty", {{0, 3}}, Identity},
      // Reversed strides do not merge with the contiguous operands: 7 dims, several launches.
      {"7 dims not mergeable",
       {{2, 3, 2, 3, 2, 3, 2}},
       [](const RawTensor& t, size_t input) {
         return input == 0 ? t.permute({6, 5, 4, 3, 2, 1, 0}) : t.reshape({2, 3, 2, 3, 2, 3, 2});
       }},
  };
}

// The inputs of one op under a layout, on both devices.
struct Inputs {
  std::vector<RawTensor> cpu, gpu;
};

Inputs MakeInputs(const Layout& layout, const std::vector<DType>& dtypes, uint32_t seed) {
  Inputs in;
  for (size_t k = 0; k < dtypes.size(); ++k) {
    const Shape& shape = layout.bases[std::min(k, layout.bases.size() - 1)];
    const RawTensor base = Make(dtypes[k], shape, seed + static_cast<uint32_t>(k) * 101);
    in.cpu.push_back(layout.view(base, k));
    in.gpu.push_back(layout.view(ToGpu(base), k));
  }
  return in;
}

// A GPU output of `shape`, one element past an aligned address when the layout asks for it.
RawTensor GpuOutput(const Layout& layout, const Shape& shape, DType dtype) {
  if (!layout.misaligned_out) return RawTensor::Empty(shape, dtype, kGpu);
  const int64_t n = NumElements(shape);
  return RawTensor::Empty({n + 1}, dtype, kGpu).slice(0, 1, n + 1).view(shape);
}

bool IsFloatingOnly(UnaryOp op) {
  return op != UnaryOp::kNeg && op != UnaryOp::kAbs && op != UnaryOp::kRelu;
}

bool IsExact(UnaryOp op) {
  return op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kRelu || op == UnaryOp::kSqrt;
}

// ---- Copy and fill ------------------------------------------------------------------------------

// Values every conversion must get right: ties in f16/bf16, values that overflow f16, saturate
// or wrap each integer type, subnormals, signed zeros and NaNs with payloads (signalling ones
// too, written as bits in the source's own format).
RawTensor ConversionSource(DType dtype) {
  std::vector<double> v = {
      0.0,         -0.0,        1.0,          -1.0,          0.5,    -0.7,    2.5,
      -2.5,        3.5,         127.9,        128.0,         255.6,  256.0,   -129.0,
      65504,       65519.99,    65520,        1e-8,          6e-8,   3e-5,    1e10,
      -1e10,       2147483647,  2147483648.0, -2147483649.0, 9.3e18, -9.3e18, 1e300,
      -1e300,      1e-300,      kInf,         -kInf,         kNaN,   0.1,     1.0 / 3,
      16777217,    1 + 0x1p-11, 1 + 0x1p-8,   1 + 0x3p-9,    -300.5, 1e-40,   3.4e38,
      1 + 0x1p-24, 4097,        -4097};
  while (v.size() < 301) v.push_back(v[v.size() % 45] * 1.5 + 0.25);  // 301: a vector tail
  RawTensor t = RawTensor::FromVector<double>(v, {301}).to(dtype);
  if (dtype == kF64) {
    const uint64_t nans[] = {0x7ff0000000000001ull, 0xfff8000000abcdefull, 0x7ff4000000000000ull};
    for (int k = 0; k < 3; ++k) std::memcpy(t.data<double>() + 50 + k, &nans[k], 8);
  } else if (dtype == kF32) {
    const uint32_t nans[] = {0x7f800001u, 0xffc12345u, 0x7fa00000u};
    for (int k = 0; k < 3; ++k) std::memcpy(t.data<float>() + 50 + k, &nans[k], 4);
  } else if (dtype == kF16) {
    const uint16_t nans[] = {0x7c01u, 0xfe55u, 0x7d00u};
    for (int k = 0; k < 3; ++k) t.data<Half>()[50 + k] = Half::FromBits(nans[k]);
  } else if (dtype == kBF16) {
    const uint16_t nans[] = {0x7f81u, 0xffc1u, 0x7fa0u};
    for (int k = 0; k < 3; ++k) t.data<BFloat16>()[50 + k] = BFloat16::FromBits(nans[k]);
  }
  return t;
}

TEST_F(CudaKernelTest, CopyConvertsEveryDTypePairExactly) {
  for (DType from : kAllDTypes) {
    const RawTensor src = ConversionSource(from);
    const RawTensor src_gpu = ToGpu(src);
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(from), " -> ", DTypeName(to)));
      {
        SCOPED_TRACE("contiguous");
        const RawTensor out = RawTensor::Empty(src.shape(), to, kGpu);
        cuda::Copy(out, src_gpu);
        ExpectExact(src.to(to), out, /*any_nan=*/false);
      }
      {
        SCOPED_TRACE("misaligned source and destination");
        const RawTensor out = RawTensor::Empty({301}, to, kGpu).slice(0, 1, 301);
        cuda::Copy(out, src_gpu.slice(0, 1, 301));
        ExpectExact(src.slice(0, 1, 301).to(to), out, false);
      }
      {
        SCOPED_TRACE("transposed source");
        const RawTensor s = src.slice(0, 0, 300).view({12, 25});
        const RawTensor out = RawTensor::Empty({25, 12}, to, kGpu);
        cuda::Copy(out, src_gpu.slice(0, 0, 300).view({12, 25}).transpose(0, 1));
        ExpectExact(s.transpose(0, 1).contiguous().to(to), out, false);
      }
      {
        SCOPED_TRACE("broadcast source, strided destination");
        const RawTensor row = src.slice(0, 0, 30).view({1, 30});
        const RawTensor cpu_base = RawTensor::Zeros({30, 4}, to);
        cpu_base.transpose(0, 1).copy_(row.expand({4, 30}));
        const RawTensor gpu_base = ToGpu(RawTensor::Zeros({30, 4}, to));
        cuda::Copy(gpu_base.transpose(0, 1), src_gpu.slice(0, 0, 30).view({1, 30}).expand({4, 30}));
        ExpectExact(cpu_base, gpu_base, false);
      }
    }
  }
}

TEST_F(CudaKernelTest, CopySameDTypeAnyLayout) {
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    for (const Layout& layout : Layouts()) {
      SCOPED_TRACE(layout.name);
      const Inputs in = MakeInputs(layout, {dtype}, 7);
      const RawTensor out = GpuOutput(layout, in.cpu[0].shape(), dtype);
      cuda::Copy(out, in.gpu[0]);
      ExpectExact(in.cpu[0].contiguous(), out, /*any_nan=*/false);
    }
  }
}

TEST_F(CudaKernelTest, FillMatchesCpuFill) {
  const double values[] = {0.0, 1.5, -2.7, 1e10, -1e10, kNaN, -kInf, 65519.0, 300.0, 1e-8};
  for (DType dtype : kAllDTypes) {
    for (double value : values) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " fill ", value));
      for (int layout = 0; layout < 3; ++layout) {
        // Contiguous (a memset when all bytes are equal), misaligned, and transposed.
        const RawTensor cpu_base = Make(dtype, {33, 31}, 3);
        const RawTensor gpu_base = ToGpu(cpu_base);
        auto view = [&](const RawTensor& t) {
          if (layout == 0) return t;
          if (layout == 1) return t.view({33 * 31}).slice(0, 1, 33 * 31 - 2);
          return t.slice(1, 2, 30).transpose(0, 1);
        };
        view(cpu_base).fill_(value);
        cuda::Fill(view(gpu_base), value);
        ExpectExact(cpu_base, gpu_base, /*any_nan=*/false);
      }
    }
  }
}

// ---- Elementwise ops ----------------------------------------------------------------------------

TEST_F(CudaKernelTest, BinaryMatchesCpu) {
  const BinaryOp ops[] = {BinaryOp::kAdd, BinaryOp::kSub,     BinaryOp::kMul,    BinaryOp::kDiv,
                          BinaryOp::kPow, BinaryOp::kMaximum, BinaryOp::kMinimum};
  for (DType dtype : kNumericDTypes) {
    for (BinaryOp op : ops) {
      if (!IsFloating(dtype) && (op == BinaryOp::kDiv || op == BinaryOp::kPow)) continue;
      SCOPED_TRACE(absl::StrCat(BinaryOpName(op), " ", DTypeName(dtype)));
      for (const Layout& layout : Layouts()) {
        SCOPED_TRACE(layout.name);
        const Inputs in = MakeInputs(layout, {dtype, dtype}, 11);
        const RawTensor expected = Binary(op, in.cpu[0], in.cpu[1]);
        const RawTensor out = GpuOutput(layout, expected.shape(), dtype);
        cuda::Binary(op, out, in.gpu[0], in.gpu[1]);
        if (op == BinaryOp::kPow) {
          ExpectClose(expected, out);
        } else {
          ExpectExact(expected, out);
        }
      }
    }
  }
}

TEST_F(CudaKernelTest, BinaryScalarMatchesCpu) {
  const BinaryOp ops[] = {BinaryOp::kAdd, BinaryOp::kSub,     BinaryOp::kMul,    BinaryOp::kDiv,
                          BinaryOp::kPow, BinaryOp::kMaximum, BinaryOp::kMinimum};
  for (DType dtype : kNumericDTypes) {
    // Scalars that are not exact in f16/bf16 (0.1) test that the scalar stays f32.
    const std::vector<double> scalars = IsFloating(dtype)
                                            ? std::vector<double>{2.5, 0.1, -1.5, 3, 0.5}
                                            : std::vector<double>{3, -7};
    for (BinaryOp op : ops) {
      if (!IsFloating(dtype) && (op == BinaryOp::kDiv || op == BinaryOp::kPow)) continue;
      for (double scalar : scalars) {
        SCOPED_TRACE(absl::StrCat(BinaryOpName(op), " ", DTypeName(dtype), " scalar ", scalar));
        for (const Layout& layout : Layouts()) {
          SCOPED_TRACE(layout.name);
          const Inputs in = MakeInputs(layout, {dtype}, 13);
          const RawTensor expected = BinaryScalar(op, in.cpu[0], scalar);
          const RawTensor out = GpuOutput(layout, expected.shape(), dtype);
          cuda::BinaryScalar(op, out, in.gpu[0], scalar);
          if (op == BinaryOp::kPow) {
            ExpectClose(expected, out);
          } else {
            ExpectExact(expected, out);
          }
        }
      }
    }
  }
}

TEST_F(CudaKernelTest, CompareMatchesCpu) {
  const CompareOp ops[] = {CompareOp::kEq, CompareOp::kNe, CompareOp::kLt,
                           CompareOp::kLe, CompareOp::kGt, CompareOp::kGe};
  for (DType dtype : kAllDTypes) {
    for (CompareOp op : ops) {
      SCOPED_TRACE(absl::StrCat(CompareOpName(op), " ", DTypeName(dtype)));
      for (const Layout& layout : Layouts()) {
        SCOPED_TRACE(layout.name);
        const Inputs in = MakeInputs(layout, {dtype, dtype}, 17);
        const RawTensor expected = Compare(op, in.cpu[0], in.cpu[1]);
        const RawTensor out = GpuOutput(layout, expected.shape(), kBool);
        cuda::Compare(op, out, in.gpu[0], in.gpu[1]);
        ExpectExact(expected, out);
      }
    }
  }
}

TEST_F(CudaKernelTest, UnaryMatchesCpu) {
  const UnaryOp ops[] = {UnaryOp::kNeg,      UnaryOp::kAbs,  UnaryOp::kExp,     UnaryOp::kLog,
                         UnaryOp::kSqrt,     UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kRelu,
                         UnaryOp::kGeluTanh, UnaryOp::kGelu, UnaryOp::kErf};
  for (DType dtype : kNumericDTypes) {
    for (UnaryOp op : ops) {
      if (!IsFloating(dtype) && IsFloatingOnly(op)) continue;
      SCOPED_TRACE(absl::StrCat(UnaryOpName(op), " ", DTypeName(dtype)));
      for (const Layout& layout : Layouts()) {
        SCOPED_TRACE(layout.name);
        const Inputs in = MakeInputs(layout, {dtype}, 19);
        const RawTensor expected = Unary(op, in.cpu[0]);
        const RawTensor out = GpuOutput(layout, expected.shape(), dtype);
        cuda::Unary(op, out, in.gpu[0]);
        if (IsExact(op)) {
          ExpectExact(expected, out);
        } else {
          ExpectClose(expected, out);
        }
      }
    }
  }
}

TEST_F(CudaKernelTest, WhereMatchesCpu) {
  for (DType cond_dtype : {kBool, kU8}) {
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(absl::StrCat("cond ", DTypeName(cond_dtype), ", values ", DTypeName(dtype)));
      for (const Layout& layout : Layouts()) {
        SCOPED_TRACE(layout.name);
        const Inputs in = MakeInputs(layout, {cond_dtype, dtype, dtype}, 23);
        const RawTensor expected = Where(in.cpu[0], in.cpu[1], in.cpu[2]);
        const RawTensor out = GpuOutput(layout, expected.shape(), dtype);
        cuda::Where(out, in.gpu[0], in.gpu[1], in.gpu[2]);
        ExpectExact(expected, out, /*any_nan=*/false);
      }
    }
  }
}

TEST_F(CudaKernelTest, ElementwiseRunsOnTheCurrentStream) {
  cuda::Stream side;
  cuda::StreamGuard guard(side);
  const RawTensor a = Make(kF32, {100000}, 29), b = Make(kF32, {100000}, 31);
  const RawTensor out = RawTensor::Empty({100000}, kF32, kGpu);
  cuda::Binary(BinaryOp::kMul, out, ToGpu(a), ToGpu(b));
  ExpectExact(Binary(BinaryOp::kMul, a, b), out);
}

// ---- Reductions ---------------------------------------------------------------------------------

// [rows, n] shapes that take each path: warp per row, block per row, rows cut into chunks (few
// long rows: a second launch), and the empty cases.
const Shape kRowShapes[] = {{7, 33},    {600, 300}, {5, 3000}, {1, 100003},
                            {3, 40000}, {1, 1},     {3, 0},    {0, 5}};

TEST_F(CudaKernelTest, SumRowsMatchesCpu) {
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : kRowShapes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ShapeToString(shape)));
      // Specials only in the short rows, so that most long rows have a finite sum to compare.
      const RawTensor x = Make(dtype, shape, 37, /*specials=*/shape[1] < 100);
      const RawTensor expected = Sum(x, {1});
      const RawTensor out = RawTensor::Empty({shape[0]}, expected.dtype(), kGpu);
      cuda::SumRows(out, ToGpu(x));
      if (!IsFloating(dtype)) {
        ExpectExact(expected, out);
        continue;
      }
      // Both sum in f64, in different orders: f64 results agree to the bound of the summation
      // error, 2 (n - 1) eps sum|x|; rounded to f32/f16/bf16 they agree except at a rounding
      // boundary (one ulp).
      if (dtype == kF64) {
        const std::vector<double> e = expected.to_vector<double>();
        const std::vector<double> a = ToCpu(out).to_vector<double>();
        const std::vector<double> abs_sum = Sum(Abs(x), {1}).to_vector<double>();
        for (size_t r = 0; r < e.size(); ++r) {
          if (std::isnan(e[r]) && std::isnan(a[r])) continue;
          if (e[r] == a[r]) continue;
          EXPECT_LE(std::fabs(a[r] - e[r]), 2.0 * shape[1] * 0x1p-53 * abs_sum[r]) << "row " << r;
        }
      } else {
        const std::vector<uint64_t> eb = Bits(expected), ab = Bits(out);
        const std::vector<double> e = expected.to_vector<double>();
        const std::vector<double> a = ToCpu(out).to_vector<double>();
        for (size_t r = 0; r < e.size(); ++r) {
          if ((std::isnan(e[r]) && std::isnan(a[r])) || eb[r] == ab[r]) continue;
          const int64_t ulps =
              dtype == kF32 ? std::llabs(static_cast<int64_t>(eb[r]) - static_cast<int64_t>(ab[r]))
                            : std::abs(Ordinal16(eb[r]) - Ordinal16(ab[r]));
          EXPECT_LE(ulps, 1) << "row " << r << ": expected " << e[r] << ", got " << a[r];
        }
      }
    }
  }
}

TEST_F(CudaKernelTest, SumRowsOverflowsF16LikeCpu) {
  // 40 x 60000 = 2.4e6: finite in f64, inf once rounded to f16, on both devices.
  const RawTensor x = RawTensor::Full({2, 40}, 60000, kF16);
  const RawTensor out = RawTensor::Empty({2}, kF16, kGpu);
  cuda::SumRows(out, ToGpu(x));
  ExpectExact(Sum(x, {1}), out);
  EXPECT_TRUE(std::isinf(ToCpu(out).to_vector<double>()[0]));
}

TEST_F(CudaKernelTest, MaxRowsMatchesCpu) {
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : kRowShapes) {
      if (shape[1] == 0) continue;  // no maximum (the dispatch rejects it)
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", ShapeToString(shape)));
      const RawTensor x = Make(dtype, shape, 41, /*specials=*/shape[1] < 100);
      const RawTensor x_gpu = ToGpu(x);
      const RawTensor values = RawTensor::Empty({shape[0]}, dtype, kGpu);
      const RawTensor indices = RawTensor::Empty({shape[0]}, kI64, kGpu);
      cuda::MaxRows(values, indices, x_gpu);
      ExpectExact(Max(x, 1), values, /*any_nan=*/false);  // the element itself
      ExpectExact(Argmax(x, 1), indices);
      // Either output alone.
      const RawTensor only_values = RawTensor::Empty({shape[0]}, dtype, kGpu);
      cuda::MaxRows(only_values, RawTensor(), x_gpu);
      ExpectExact(Max(x, 1), only_values, false);
      const RawTensor only_indices = RawTensor::Empty({shape[0]}, kI64, kGpu);
      cuda::MaxRows(RawTensor(), only_indices, x_gpu);
      ExpectExact(Argmax(x, 1), only_indices);
    }
  }
}

TEST_F(CudaKernelTest, MaxRowsTiesAndNaNs) {
  // Each row ends in its 6-value pattern after `filler` values below it: ties pick the first
  // maximum, the first NaN wins over everything, -0 ties with +0, an all -inf row. In long rows
  // (cut into chunks) an early copy of the maximum at column 7 makes ties span chunks.
  struct Row {
    std::vector<double> tail;
    double filler;
    double early;  // written at column 7 of long rows
  };
  const Row rows[] = {{{1, 3, 3, 2, 3, 0}, -5, 3},
                      {{1, kNaN, 5, kNaN, 7, 0}, -5, 7},
                      {{-0.0, 0.0, -1, -0.0, 0.0, -2}, -5, 0.0},
                      {{-kInf, -kInf, -kInf, -kInf, -kInf, -kInf}, -kInf, -kInf},
                      {{2, 2, 2, 2, 2, kNaN}, -5, 2}};
  for (int64_t n : {6, 20000}) {
    std::vector<double> v;
    for (const Row& row : rows) {
      for (int64_t i = 0; i < n; ++i) {
        if (i >= n - 6) {
          v.push_back(row.tail[static_cast<size_t>(i - (n - 6))]);
        } else {
          v.push_back(i == 7 ? row.early : row.filler);
        }
      }
    }
    for (DType dtype : kFloatDTypes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " n=", n));
      const RawTensor x = RawTensor::FromVector<double>(v, {5, n}).to(dtype);
      const RawTensor values = RawTensor::Empty({5}, dtype, kGpu);
      const RawTensor indices = RawTensor::Empty({5}, kI64, kGpu);
      cuda::MaxRows(values, indices, ToGpu(x));
      ExpectExact(Max(x, 1), values, /*any_nan=*/false);
      ExpectExact(Argmax(x, 1), indices);
    }
  }
}

// ---- More than 2^32 elements --------------------------------------------------------------------

// One i64 / u8 element of a one-element device tensor.
int64_t Item(const RawTensor& t) { return static_cast<int64_t>(ToCpu(t).to_vector<double>()[0]); }

// u8 tensors of 2^32 + 38 elements (4 GiB each, 2.5 of them): every element index and byte
// offset overflows int32 and uint32, the strided path divides 64-bit indices, the vector path
// has a tail of 6, and the reductions cut the one row into chunks. Checked on the device through
// SumRows / MaxRows (an element-by-element host comparison would copy 30 GiB).
TEST_F(CudaKernelTest, IndexesBeyond32Bits) {
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < (size_t{16} << 30)) GTEST_SKIP() << "needs 16 GiB of free device memory";
  const int64_t n = (int64_t{1} << 32) + 38;
  const RawTensor a = RawTensor::Empty({n}, kU8, kGpu), b = RawTensor::Empty({n}, kU8, kGpu);
  const RawTensor sum = RawTensor::Empty({1}, kI64, kGpu);
  const RawTensor max_value = RawTensor::Empty({1}, kU8, kGpu),
                  argmax = RawTensor::Empty({1}, kI64, kGpu);
  auto expect_reductions = [&](const RawTensor& t, int64_t want_sum, int64_t want_max,
                               int64_t want_argmax) {
    const RawTensor row = t.view({1, t.numel()});
    cuda::SumRows(sum, row);
    cuda::MaxRows(max_value, argmax, row);
    EXPECT_EQ(Item(sum), want_sum);
    EXPECT_EQ(Item(max_value), want_max);
    EXPECT_EQ(Item(argmax), want_argmax);
  };
  {
    SCOPED_TRACE("vectorised, contiguous");
    cuda::Fill(a, 1);
    cuda::Binary(BinaryOp::kAdd, b, a, a);  // 2 everywhere
    cuda::Fill(b.slice(0, n - 1, n), 7);
    expect_reductions(b, 2 * n + 5, 7, n - 1);
  }
  {
    SCOPED_TRACE("strided 1-D, misaligned");
    // a[k] = b[k] + b[k - 1] for k >= 1: 4, and 7 + 2 at the end; a[0] stays 1.
    cuda::Binary(BinaryOp::kAdd, a.slice(0, 1, n), b.slice(0, 1, n), b.slice(0, 0, n - 1));
    expect_reductions(a, 4 * n + 2, 9, n - 1);
  }
  {
    SCOPED_TRACE("strided 2-D (transposed copy), 64-bit division");
    const int64_t half = n / 2;
    cuda::Fill(b.slice(0, 0, half), 1);
    cuda::Fill(b.slice(0, half - 1, half), 5);
    cuda::Fill(b.slice(0, half, n), 2);
    cuda::Fill(b.slice(0, n - 1, n), 9);
    // a viewed [half, 2] holds b viewed [2, half] transposed: a[2r + c] = b[c * half + r].
    cuda::Copy(a.view({half, 2}), b.view({2, half}).transpose(0, 1));
    expect_reductions(a, half * 3 + 4 + 7, 9, n - 1);
    // Column 0 of that (a stride-2 view) is b's first half again.
    const RawTensor column = RawTensor::Empty({half}, kU8, kGpu);
    cuda::Copy(column, a.view({half, 2}).select(1, 0));
    expect_reductions(column, half + 4, 5, half - 1);
  }
}

// ---- Non-finite check and scaling --------------------------------------------------------------

// Clean data with one non-finite element at `bad` (none when bad < 0).
RawTensor WithBadElement(DType dtype, int64_t n, int64_t bad, double bad_value) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.25 * static_cast<double>(i % 9) - 1;
  if (bad >= 0) v[static_cast<size_t>(bad)] = bad_value;
  return RawTensor::FromVector<double>(v, {n}).to(dtype);
}

TEST_F(CudaKernelTest, AnyNonFiniteMatchesCpu) {
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // The last element of 1003 lies in the vector tail; 500 in the vectorised part.
    for (int64_t bad : {-1, 0, 500, 1002}) {
      for (double bad_value : {kInf, -kInf, kNaN}) {
        const RawTensor x = WithBadElement(dtype, 1003, bad, bad_value);
        EXPECT_EQ(cuda::AnyNonFinite(ToGpu(x)), AnyNonFinite({x})) << "bad at " << bad;
        // Misaligned view: skips element 0.
        EXPECT_EQ(cuda::AnyNonFinite(ToGpu(x).slice(0, 1, 1003)), bad > 0) << "bad at " << bad;
      }
    }
    // A strided view sees only its own elements.
    const RawTensor x = WithBadElement(dtype, 1000, 3, kInf).view({100, 10});
    EXPECT_FALSE(cuda::AnyNonFinite(ToGpu(x).slice(1, 4, 10, 2)));
    EXPECT_TRUE(cuda::AnyNonFinite(ToGpu(x).slice(1, 3, 10, 2)));
    EXPECT_FALSE(cuda::AnyNonFinite(RawTensor::Empty({0}, dtype, kGpu)));
  }
  EXPECT_THROW(cuda::AnyNonFinite(ToGpu(RawTensor::Zeros({3}, kI32))), Error);
}

TEST_F(CudaKernelTest, ScaleInPlaceMatchesCpu) {
  for (DType dtype : kFloatDTypes) {
    for (double scale : {0.5, 1.0 / 65536, 3.0, 1e5}) {  // 1e5 overflows f16 to inf
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " scale ", scale));
      for (bool check : {false, true}) {
        for (int layout = 0; layout < 3; ++layout) {
          // Contiguous 1003 (tail), misaligned, transposed (strided write-back).
          const RawTensor cpu_base = Make(dtype, {59, 17}, 43, /*specials=*/layout != 1);
          const RawTensor gpu_base = ToGpu(cpu_base);
          auto view = [&](const RawTensor& t) {
            if (layout == 0) return t.view({59 * 17}).slice(0, 0, 1003);
            if (layout == 1) return t.view({59 * 17}).slice(0, 1, 1003);
            return t.transpose(0, 1);
          };
          const bool expected_found = AnyNonFinite({view(cpu_base)});
          MulScalarInPlace({view(cpu_base)}, scale);
          const bool found = cuda::ScaleInPlace(view(gpu_base), scale, check);
          EXPECT_EQ(found, check && expected_found) << "layout " << layout;
          ExpectExact(cpu_base, gpu_base);
        }
      }
    }
  }
  const RawTensor expanded = ToGpu(RawTensor::Ones({1, 4}, kF32)).expand({3, 4});
  EXPECT_THROW(cuda::ScaleInPlace(expanded, 2.0, false), Error);
}

}  // namespace
}  // namespace tg
