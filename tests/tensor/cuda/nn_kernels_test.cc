// The CUDA row, indexing and pooling kernels (tensor/cuda/nn.cu, index.cu, pool.cu) against the
// CPU ops in f32, f64, f16 and bf16, and the fused kernels (tensor/cuda/nn_fused.h) against
// compositions of tg ops in f64 and against the CPU ops in their own dtype. Shapes cover both
// row paths (one warp per row up to 1024 elements, one block beyond), row lengths that are not a
// multiple of the 128-bit vector width (7, 1025, 50257), and tensors whose first element is not
// 16-byte aligned (the scalar head of each row).
//
// Tolerances, written next to each comparison with the reason:
//  - Copies (embedding, gather, index_select, max-pool values and indices) are bit-exact.
//  - Sums whose terms are multiples of a power of two small enough to be exact in the
//    accumulator (scatter_add, index_add, max-pool backward) are bit-exact too: the order of
//    additions then cannot matter, and both devices round the exact sum once. Embedding backward
//    is bit-exact for any values: both devices add in f64 in position order.
//  - exp/log come from CUDA's libdevice (2 ulp) on the GPU and glibc on the CPU, and the softmax
//    statistics are built online (rescaled running sums) on the GPU and in two passes on the
//    CPU, so softmax, cross-entropy and their gradients agree to a few f32 ulp of the values
//    that enter exp/log: relative 1e-5. f64 agrees to 1e-12.
//  - f16/bf16 results are f32 results rounded once: where the f32 values differ in their last
//    bits, the rounded ones may differ by one ulp of the 16-bit type (2^-10 relative for f16,
//    plus 2^-24 absolute for its subnormals; 2^-7 for bf16).
//
// Every test that needs a GPU skips without one; the argument checks of the fused kernels run
// everywhere (they throw before touching the device).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/cuda/index_errors.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/nn_fused.h"
#include "tensor/cuda/runtime.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsError;

const Device kGpu = Device::Cuda(0);
constexpr DType kFloatDTypes[] = {kF32, kF64, kF16, kBF16};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class CudaNnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::Available()) GTEST_SKIP() << "no CUDA device";
  }
};

// ---- Data ---------------------------------------------------------------------------------------

// Deterministic values in [lo, hi) on the grid of multiples of (hi - lo) / 2^bits (an LCG, so
// every run tests the same data), converted to `dtype`.
RawTensor Uniform(const Shape& shape, DType dtype, uint32_t seed, double lo = -4, double hi = 4,
                  int bits = 16) {
  const int64_t n = NumElements(shape);
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  const double steps = std::ldexp(1.0, bits);
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const double u = std::floor((s >> 8) / 16777216.0 * steps) / steps;  // [0, 1)
    v[i] = lo + (hi - lo) * u;
  }
  return RawTensor::FromVector<double>(v, shape).to(dtype);
}

// Indices in [0, bound) (i64), with `ignored` rows set to ignore_index where asked.
RawTensor Indices(const Shape& shape, int64_t bound, uint32_t seed) {
  const int64_t n = NumElements(shape);
  std::vector<int64_t> v(static_cast<size_t>(n));
  uint32_t s = seed * 2246822519u + 7u;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<int64_t>((s >> 8) % static_cast<uint32_t>(bound));
  }
  return RawTensor::FromVector<int64_t>(v, shape);
}

// A contiguous copy of t on the GPU whose first element lies `misalign` elements past the start
// of its allocation (allocations are at least 512-byte aligned), so misalign = 1 gives rows
// that start off a 16-byte boundary.
RawTensor Gpu(const RawTensor& t, int64_t misalign = 0) {
  const RawTensor buffer = RawTensor::Empty({t.numel() + misalign}, t.dtype(), kGpu);
  const RawTensor view = buffer.narrow(0, misalign, t.numel()).view(t.shape());
  if (t.numel() > 0) view.copy_(t.contiguous());
  return view;
}

RawTensor EmptyGpu(const Shape& shape, DType dtype, int64_t misalign = 0) {
  const RawTensor buffer = RawTensor::Empty({NumElements(shape) + misalign}, dtype, kGpu);
  return buffer.narrow(0, misalign, NumElements(shape)).view(shape);
}

RawTensor Cpu(const RawTensor& t) { return t.to(Device::Cpu()); }

// ---- Comparisons --------------------------------------------------------------------------------

struct Tol {
  double rtol;
  double atol;
};

constexpr double kF16Ulp = 1.0 / 1024;        // one f16 ulp, relative
constexpr double kF16SubnormalUlp = 0x1p-24;  // one f16 ulp below 2^-14
constexpr double kBF16Ulp = 1.0 / 128;        // one bf16 ulp, relative

// The tolerance for `dtype` given the f32 and f64 ones: f16/bf16 add one ulp of their own for
// the final rounding of an f32 result (see the file comment).
Tol ForDType(DType dtype, Tol f32, Tol f64) {
  switch (dtype) {
    case kF64:
      return f64;
    case kF16:
      return {std::max(f32.rtol, kF16Ulp), std::max(f32.atol, kF16SubnormalUlp)};
    case kBF16:
      return {std::max(f32.rtol, kBF16Ulp), f32.atol};
    default:
      return f32;
  }
}

// |actual - expected| <= atol + extra + rtol * |expected| element by element (in f64, on the
// CPU), where `extra` (f64, broadcast to the shape) adds an element's own absolute slack; NaN
// matches NaN and infinities must match exactly.
::testing::AssertionResult AllClose(const RawTensor& actual, const RawTensor& expected, Tol tol,
                                    const RawTensor& extra = RawTensor()) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure() << "shape " << ShapeToString(actual.shape())
                                         << " != " << ShapeToString(expected.shape());
  }
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  const std::vector<double> x = extra.defined() ? extra.expand(expected.shape()).to_vector<double>()
                                                : std::vector<double>(a.size(), 0.0);
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < a.size(); ++i) {
    bool ok;
    if (std::isnan(e[i]) || std::isnan(a[i])) {
      ok = std::isnan(e[i]) && std::isnan(a[i]);
    } else if (std::isinf(e[i]) || std::isinf(a[i])) {
      ok = a[i] == e[i];
    } else {
      ok = std::fabs(a[i] - e[i]) <= tol.atol + x[i] + tol.rtol * std::fabs(e[i]);
    }
    if (!ok && bad++ < 5) absl::StrAppend(&first, " [", i, "] ", a[i], " vs ", e[i], ";");
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.size() << " elements differ (rtol "
                                       << tol.rtol << ", atol " << tol.atol << "):" << first;
}

// Same dtype, shape and bytes.
::testing::AssertionResult BitEqual(const RawTensor& actual, const RawTensor& expected) {
  if (actual.dtype() != expected.dtype() || actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << DTypeName(actual.dtype()) << ShapeToString(actual.shape()) << " vs "
           << DTypeName(expected.dtype()) << ShapeToString(expected.shape());
  }
  const RawTensor a = Cpu(actual).contiguous(), e = Cpu(expected).contiguous();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pe = static_cast<const unsigned char*>(e.raw_data());
  const size_t es = a.element_size();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * es, pe + i * es, es) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " differs: " << a.reshape({-1}).select(0, i).item() << " vs "
             << e.reshape({-1}).select(0, i).item();
    }
  }
  return ::testing::AssertionSuccess();
}

std::string Label(DType dtype, int64_t rows, int64_t n, int64_t misalign = 0) {
  return absl::StrCat(DTypeName(dtype), " [", rows, ", ", n, "] misalign ", misalign);
}

// ---- Dropout masks ------------------------------------------------------------------------------

// tensor/cuda/random.cu draws the generator's Philox stream on the device: the mask is the
// CPU's bit for bit (many grid-stride iterations, every start position inside a block of four
// draws) and the generator advances by the same count.
TEST_F(CudaNnTest, DropoutMaskIsTheCpusMask) {
  struct Case {
    DType dtype;
    uint64_t skip;
    double p;
    Shape shape;
  };
  std::vector<Case> cases;
  for (DType dtype : kFloatDTypes) {
    for (uint64_t skip : {0, 1, 2, 3}) {
      for (double p : {0.1, 0.5, 0.97}) cases.push_back({dtype, skip, p, {37, 1031}});
    }
  }
  // 17.2M elements = 4.3M blocks of four draws: more than one launch's grid on an H100/H200
  // (32 blocks of 256 threads per SM), so threads take several blocks each.
  cases.push_back({kF16, 3, 0.5, {4099, 4201}});
  for (const Case& c : cases) {
    Generator on_gpu(2024), on_cpu(2024);
    on_gpu.Reserve(c.skip);
    on_cpu.Reserve(c.skip);
    const RawTensor gpu = DropoutMask(c.shape, c.p, on_gpu, c.dtype, kGpu);
    const RawTensor cpu = DropoutMask(c.shape, c.p, on_cpu, c.dtype, Device::Cpu());
    EXPECT_TRUE(BitEqual(gpu, cpu)) << DTypeName(c.dtype) << ShapeToString(c.shape) << " skip "
                                    << c.skip << " p " << c.p;
    EXPECT_EQ(on_gpu.state(), on_cpu.state());
  }
}

// ---- Softmax / LogSoftmax -----------------------------------------------------------------------

// Online statistics vs the CPU's two passes, libdevice vs glibc exp/log: see the file comment.
// The statistics' last-bit differences shift log_sum by a few 1e-7 (1e-16 in f64) absolutely,
// which is what log_softmax values near 0 (a dominant logit) see: hence the absolute terms.
constexpr Tol kSoftmaxF32{1e-5, 1e-9};
constexpr Tol kSoftmaxF64{1e-12, 1e-18};
constexpr Tol kLogSoftmaxF32{1e-5, 2e-6};
constexpr Tol kLogSoftmaxF64{1e-12, 1e-14};

TEST_F(CudaNnTest, SoftmaxAndLogSoftmaxMatchCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {3, 1}, {5, 7}, {9, 33}, {4, 1024}, {3, 1025}, {2, 4099}, {2, 50257}};
  uint32_t seed = 1;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, n] : shapes) {
      for (int64_t misalign : {0, 1}) {
        SCOPED_TRACE(Label(dtype, rows, n, misalign));
        const RawTensor x = Uniform({rows, n}, dtype, ++seed, -8, 8);
        const RawTensor xg = Gpu(x, misalign);
        for (bool log : {false, true}) {
          const Tol tol = log ? ForDType(dtype, kLogSoftmaxF32, kLogSoftmaxF64)
                              : ForDType(dtype, kSoftmaxF32, kSoftmaxF64);
          const RawTensor out = EmptyGpu({rows, n}, dtype, misalign);
          cuda::Softmax(out, xg, log);
          EXPECT_TRUE(AllClose(Cpu(out), log ? LogSoftmax(x) : Softmax(x), tol)) << "log " << log;
        }
      }
    }
  }
}

TEST_F(CudaNnTest, SoftmaxSpecialRowsMatchCpu) {
  // all -inf (NaN outputs), a +inf (shift 0, log_sum +inf), a NaN (all NaN), large logits, and a
  // -inf among finite values, on both row paths.
  for (DType dtype : kFloatDTypes) {
    for (int64_t n : {6, 1500}) {
      SCOPED_TRACE(Label(dtype, 6, n));
      RawTensor x = Uniform({6, n}, kF64, 7, -3, 3);
      x.select(0, 0).fill_(-kInf);
      x.select(0, 1).select(0, 2).fill_(kInf);
      x.select(0, 2).select(0, n - 1).fill_(kNaN);
      x.select(0, 3).copy_(AddScalar(x.select(0, 3), 1000));
      x.select(0, 4).select(0, 0).fill_(-kInf);
      x.select(0, 5).select(0, 3).fill_(kInf);
      x.select(0, 5).select(0, 4).fill_(kInf);
      x = x.to(dtype);
      for (bool log : {false, true}) {
        const Tol tol = log ? ForDType(dtype, kLogSoftmaxF32, kLogSoftmaxF64)
                            : ForDType(dtype, kSoftmaxF32, kSoftmaxF64);
        const RawTensor out = EmptyGpu({6, n}, dtype);
        cuda::Softmax(out, Gpu(x), log);
        EXPECT_TRUE(AllClose(Cpu(out), log ? LogSoftmax(x) : Softmax(x), tol)) << "log " << log;
      }
    }
  }
}

// ---- LayerNorm ----------------------------------------------------------------------------------

// Both devices accumulate the statistics in f64 (the GPU in another order) and then apply the
// same f32 operations (nn.cu is built without FMA contraction): mean and rstd agree to an f32
// ulp or two, the outputs to a few ulp.
constexpr Tol kLayerNormF32{4e-6, 4e-6};
constexpr Tol kLayerNormF64{1e-13, 1e-13};
constexpr Tol kStatsF32{1e-6, 1e-7};
constexpr Tol kStatsF64{1e-13, 1e-14};

TEST_F(CudaNnTest, LayerNormMatchesCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4, 1},    {5, 7},    {6, 768},
                                                           {3, 1000}, {3, 1025}, {2, 4099}};
  uint32_t seed = 100;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, n] : shapes) {
      for (int affine = 0; affine < 3; ++affine) {  // none, weight only, weight and bias
        const int64_t misalign = affine == 1 ? 1 : 0;
        SCOPED_TRACE(absl::StrCat(Label(dtype, rows, n, misalign), " affine ", affine));
        RawTensor x = Uniform({rows, n}, kF64, ++seed);
        if (rows >= 3) {
          x.select(0, 0).fill_(0.25);                             // var = 0: rstd = 1/sqrt(eps)
          x.select(0, 1).copy_(AddScalar(x.select(0, 1), 1000));  // a large mean
        }
        x = x.to(dtype);
        const RawTensor w = affine >= 1 ? Uniform({n}, dtype, ++seed, 0.5, 1.5) : RawTensor();
        const RawTensor b = affine >= 2 ? Uniform({n}, dtype, ++seed) : RawTensor();
        const LayerNormResult expected = LayerNorm(x, w, b, 1e-5);
        const DType stat = dtype == kF64 ? kF64 : kF32;
        const RawTensor out = EmptyGpu({rows, n}, dtype, misalign);
        const RawTensor mean = EmptyGpu({rows}, stat), rstd = EmptyGpu({rows}, stat);
        cuda::LayerNorm(out, mean, rstd, Gpu(x, misalign), w.defined() ? Gpu(w) : RawTensor(),
                        b.defined() ? Gpu(b) : RawTensor(), 1e-5);
        const Tol stats = dtype == kF64 ? kStatsF64 : kStatsF32;
        EXPECT_TRUE(AllClose(Cpu(mean), expected.mean, stats));
        EXPECT_TRUE(AllClose(Cpu(rstd), expected.rstd, stats));
        EXPECT_TRUE(
            AllClose(Cpu(out), expected.output, ForDType(dtype, kLayerNormF32, kLayerNormF64)));
      }
    }
  }
}

// ---- Embedding ----------------------------------------------------------------------------------

TEST_F(CudaNnTest, EmbeddingCopiesRowsExactly) {
  // dim 8 x f32 rows are 16-byte aligned (128-bit copies); dim 7 and a transposed weight are not.
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI64, kU8}) {
    for (int64_t dim : {7, 8, 768}) {
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " dim ", dim, " transposed ", transposed));
        const RawTensor weight = Uniform({50, dim}, dtype, 11, 0, 100);
        const RawTensor idx = Indices({3, 41}, 50, 5);
        const RawTensor wg = transposed ? Gpu(weight.transpose(0, 1)).transpose(0, 1) : Gpu(weight);
        const RawTensor out = EmptyGpu({idx.numel(), dim}, dtype);
        cuda::Embedding(out, wg, Gpu(idx.reshape({-1})));
        EXPECT_TRUE(BitEqual(Cpu(out), Embedding(weight, idx).reshape({idx.numel(), dim})));
      }
    }
  }
}

TEST_F(CudaNnTest, EmbeddingBackwardMatchesCpuAndIsDeterministic) {
  // Both devices add a row's gradients in f64 in position order (the stable sort keeps equal
  // indices in order) and round the sum once to the dtype: bit-exact. Gradients on the 2^-8
  // grid give sums exact in any accumulator; 24-bit values give sums of the long run that f32
  // could not hold (an f32 accumulator differed from the CPU in the last bits). Row 3 takes
  // 3000 of the 4096 positions (one long run after the sort), rows 0..99 the rest, rows
  // 100..149 none (they stay zero).
  for (DType dtype : kFloatDTypes) {
    for (int64_t dim : {7, 8, 768}) {
      for (int bits : {11, 24}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " dim ", dim, " bits ", bits));
        std::vector<int64_t> v = Indices({4096}, 100, 17).to_vector<int64_t>();
        for (size_t i = 0; i < v.size(); i += 4) v[i] = v[i + 1] = v[i + 2] = 3;
        const RawTensor idx = RawTensor::FromVector<int64_t>(v, {4096});
        const RawTensor grad = Uniform({4096, dim}, dtype, 23, -4, 4, bits);
        const RawTensor expected = EmbeddingBackward(grad, idx, 150);
        RawTensor first;
        for (int run = 0; run < 2; ++run) {
          const RawTensor out = RawTensor::Zeros({150, dim}, dtype, kGpu);
          cuda::EmbeddingBackward(out, Gpu(grad), Gpu(idx));
          EXPECT_TRUE(BitEqual(Cpu(out), expected));
          if (run == 0) {
            first = Cpu(out);
          } else {
            EXPECT_TRUE(BitEqual(Cpu(out), first)) << "not deterministic";
          }
        }
      }
    }
  }
}

// ---- Cross-entropy ------------------------------------------------------------------------------

// Cross-entropy losses are log_sum - (x[t] - shift): near 0 for a dominant target, where the
// absolute error of log_sum (see kLogSoftmaxF32) is what remains.
Tol LossTol(DType dtype) { return ForDType(dtype, kLogSoftmaxF32, kLogSoftmaxF64); }

// Gradients (p - onehot) * scale: p carries a relative error of a few 1e-6 (1e-15), and at the
// target p - 1 cancels when p is close to 1, leaving that error relative to |scale| instead of
// to the result. So the target entries get |scale| * 4e-6 (1e-14 for f64) of absolute slack;
// all others are compared relatively.
RawTensor TargetSlack(DType dtype, const RawTensor& targets, int64_t classes,
                      const RawTensor& scale) {
  const int64_t n = targets.size(0);
  const RawTensor onehot =
      Eq(RawTensor::Arange(0, static_cast<double>(classes), 1, kI64).reshape({1, classes}),
         targets.reshape({n, 1}))
          .to(kF64);
  return MulScalar(Mul(onehot, Abs(scale.to(kF64)).reshape({n, 1})), dtype == kF64 ? 1e-14 : 4e-6);
}

// Every 5th row ignored (targets = ignore_index); vocabularies on both row paths, including one
// that is not a multiple of any vector width (50257, GPT-2's).
RawTensor Targets(int64_t rows, int64_t classes, int64_t ignore_index, uint32_t seed) {
  std::vector<int64_t> v = Indices({rows}, classes, seed).to_vector<int64_t>();
  for (int64_t r = 0; r < rows; r += 5) v[r] = ignore_index;
  return RawTensor::FromVector<int64_t>(v, {rows});
}

TEST_F(CudaNnTest, CrossEntropyAndBackwardMatchCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {6, 10}, {11, 33}, {5, 1000}, {4, 1025}, {7, 50257}};
  uint32_t seed = 300;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, classes] : shapes) {
      for (int64_t misalign : {0, 1}) {
        SCOPED_TRACE(Label(dtype, rows, classes, misalign));
        const RawTensor logits = Uniform({rows, classes}, dtype, ++seed, -8, 8);
        const RawTensor targets = Targets(rows, classes, -100, ++seed);
        const RawTensor lg = Gpu(logits, misalign), tg = Gpu(targets);
        const RawTensor losses = EmptyGpu({rows}, dtype);
        const int64_t counted = cuda::CrossEntropy(losses, lg, tg, -100);
        EXPECT_EQ(counted, rows - (rows + 4) / 5);
        const Tol tol = ForDType(dtype, kSoftmaxF32, kSoftmaxF64);
        EXPECT_TRUE(AllClose(Cpu(losses), CrossEntropy(logits, targets, -100, Reduction::kNone),
                             LossTol(dtype)));

        // Row scales as the dispatch passes them for Reduction::kNone.
        const RawTensor scale = Uniform({rows}, kF64, ++seed, -2, 2);
        const RawTensor grad = EmptyGpu({rows, classes}, dtype, misalign);
        cuda::CrossEntropyBackward(grad, lg, tg, Gpu(scale), -100);
        EXPECT_TRUE(AllClose(Cpu(grad),
                             CrossEntropyBackward(logits, targets, scale, -100, Reduction::kNone),
                             tol, TargetSlack(dtype, targets, classes, scale)));
      }
    }
  }
}

TEST_F(CudaNnTest, CrossEntropyAllIgnoredAndLargeLogits) {
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    // A batch where every row is ignored: count 0, zero losses and gradients.
    const RawTensor logits = Uniform({4, 50257}, dtype, 41, -8, 8);
    const RawTensor targets = RawTensor::Full({4}, 7, kI64);
    const RawTensor losses = EmptyGpu({4}, dtype);
    EXPECT_EQ(cuda::CrossEntropy(losses, Gpu(logits), Gpu(targets), 7), 0);
    EXPECT_TRUE(BitEqual(Cpu(losses), RawTensor::Zeros({4}, dtype)));
    const RawTensor grad = EmptyGpu({4, 50257}, dtype);
    cuda::CrossEntropyBackward(grad, Gpu(logits), Gpu(targets), Gpu(RawTensor::Ones({4}, kF64)), 7);
    EXPECT_TRUE(BitEqual(Cpu(grad), RawTensor::Zeros({4, 50257}, dtype)));
    // Logits around 1000: x[t] - shift is taken before the sum, as on the CPU.
    const RawTensor big = AddScalar(Uniform({3, 1000}, kF64, 43, -1, 1), 1000).to(dtype);
    const RawTensor t = Indices({3}, 1000, 47);
    const RawTensor big_losses = EmptyGpu({3}, dtype);
    cuda::CrossEntropy(big_losses, Gpu(big), Gpu(t), -100);
    EXPECT_TRUE(
        AllClose(Cpu(big_losses), CrossEntropy(big, t, -100, Reduction::kNone), LossTol(dtype)));
  }
}

// ---- Fused softmax cross-entropy ----------------------------------------------------------------

// losses and d loss / d logits in f64 composed from tg ops: -log_softmax at the target, and
// (softmax - onehot) * scale, zero on ignored rows; scale = row_scale, or 1 / (rows not ignored).
struct CrossEntropyReference {
  RawTensor losses;  // [N] f64
  RawTensor grad;    // [N, C] f64
};

CrossEntropyReference ReferenceSoftmaxCrossEntropy(const RawTensor& logits,
                                                   const RawTensor& targets,
                                                   const RawTensor& row_scale,
                                                   int64_t ignore_index) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const RawTensor x = logits.to(kF64);
  const RawTensor t = targets.reshape({n, 1});
  const RawTensor valid = Ne(t, RawTensor::Scalar(static_cast<double>(ignore_index), kI64));
  const RawTensor safe_t = Where(valid, t, RawTensor::Scalar(0, kI64));
  const RawTensor zero = RawTensor::Scalar(0, kF64);
  const RawTensor picked = Gather(LogSoftmax(x), 1, safe_t);
  const RawTensor onehot =
      Eq(RawTensor::Arange(0, static_cast<double>(c), 1, kI64).reshape({1, c}), safe_t).to(kF64);
  RawTensor scale;
  if (row_scale.defined()) {
    scale = row_scale.reshape({n, 1});
  } else {
    scale = RawTensor::Full({n, 1}, 1.0 / Sum(valid.to(kF64)).item(), kF64);
  }
  return {Where(valid, Neg(picked), zero).reshape({n}),
          Where(valid, Mul(Sub(Softmax(x), onehot), scale), zero)};
}

TEST_F(CudaNnTest, SoftmaxCrossEntropyFusedMatchesComposition) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{6, 10}, {5, 1025}, {6, 50257}};
  uint32_t seed = 500;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, classes] : shapes) {
      for (int variant = 0; variant < 4; ++variant) {
        // bit 0: row_scale given (else the mean's 1 / count); bit 1: in place (grad = logits).
        const bool scaled = variant & 1, in_place = variant & 2;
        SCOPED_TRACE(
            absl::StrCat(Label(dtype, rows, classes), " scaled ", scaled, " in place ", in_place));
        const RawTensor logits = Uniform({rows, classes}, dtype, ++seed, -8, 8);
        const RawTensor targets = Targets(rows, classes, -1, ++seed);
        const RawTensor scale = scaled ? Uniform({rows}, kF64, ++seed, 0.5, 2) : RawTensor();
        const CrossEntropyReference ref = ReferenceSoftmaxCrossEntropy(logits, targets, scale, -1);
        const RawTensor lg = Gpu(logits);
        const RawTensor grad = in_place ? lg : EmptyGpu({rows, classes}, dtype);
        const RawTensor losses = EmptyGpu({rows}, dtype);
        cuda::SoftmaxCrossEntropyFused(losses, grad, lg, Gpu(targets),
                                       scaled ? Gpu(scale) : RawTensor(), -1);
        // Against the exact (f64) composition of the same (rounded) inputs: the f32 compute
        // error of the softmax path, plus the final rounding for f16/bf16.
        const int64_t counted = rows - (rows + 4) / 5;
        const RawTensor row_scale = scaled ? scale : RawTensor::Full({rows}, 1.0 / counted, kF64);
        const RawTensor slack = TargetSlack(dtype, targets, classes, row_scale);
        EXPECT_TRUE(AllClose(Cpu(losses), ref.losses, LossTol(dtype)));
        EXPECT_TRUE(
            AllClose(Cpu(grad), ref.grad, ForDType(dtype, {1e-5, 1e-12}, {1e-12, 1e-17}), slack));
        // And against the unfused CPU ops in the same dtype.
        const RawTensor grad_loss = scaled ? scale : RawTensor::Scalar(1.0, kF64);
        const RawTensor unfused = CrossEntropyBackward(
            logits, targets, grad_loss, -1, scaled ? Reduction::kNone : Reduction::kMean);
        EXPECT_TRUE(AllClose(Cpu(grad), unfused, ForDType(dtype, kSoftmaxF32, kSoftmaxF64), slack));
      }
    }
  }
}

TEST_F(CudaNnTest, SoftmaxCrossEntropyFusedAllIgnoredGivesZeros) {
  for (DType dtype : kFloatDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const RawTensor lg = Gpu(Uniform({3, 50257}, dtype, 61, -8, 8));
    const RawTensor losses = EmptyGpu({3}, dtype);
    // The mean's scale would be 1 / 0; no row uses it.
    cuda::SoftmaxCrossEntropyFused(losses, lg, lg, Gpu(RawTensor::Full({3}, -100, kI64)),
                                   RawTensor(), -100);
    EXPECT_TRUE(BitEqual(Cpu(losses), RawTensor::Zeros({3}, dtype)));
    EXPECT_TRUE(BitEqual(Cpu(lg), RawTensor::Zeros({3, 50257}, dtype)));
  }
}

// GPT-2-sized logits past 2^31 elements (42693 rows of 50304 bf16 values, 4.3 GB): element
// offsets of the last rows do not fit in int32. Rows 42689..42692 hold data (42690 straddles
// element 2^31; one of them is ignored), every other row is constant; those four rows must get
// their own losses and gradients from the unfused loss and from the fused kernel in place.
TEST_F(CudaNnTest, CrossEntropyIndexesLogitsPast2To31Elements) {
  constexpr int64_t kClasses = 50304;
  const int64_t rows = (int64_t{1} << 31) / kClasses + 3;
  const int64_t tail = 4;
  const DType dtype = kBF16;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess ||
      free_bytes < (size_t{6} << 30)) {
    GTEST_SKIP() << "needs 6 GiB of free device memory";
  }
  {
    const RawTensor lg = RawTensor::Empty({rows, kClasses}, dtype, kGpu);
    cuda::Fill(lg, 0.5);
    const RawTensor data = Uniform({tail, kClasses}, dtype, 77, -8, 8);
    lg.narrow(0, rows - tail, tail).copy_(Gpu(data));
    std::vector<int64_t> tv(static_cast<size_t>(rows), 1);
    const std::vector<int64_t> tail_targets = {kClasses - 1, 12345, -100, 50000};
    std::copy(tail_targets.begin(), tail_targets.end(), tv.end() - tail);
    const RawTensor targets = RawTensor::FromVector<int64_t>(tv, {rows});
    const RawTensor tt = RawTensor::FromVector<int64_t>(tail_targets, {tail});
    const RawTensor tg = Gpu(targets);
    const int64_t counted = rows - 1;

    const RawTensor losses = EmptyGpu({rows}, dtype);
    EXPECT_EQ(cuda::CrossEntropy(losses, lg, tg, -100), counted);
    const RawTensor fused_losses = EmptyGpu({rows}, dtype);
    cuda::SoftmaxCrossEntropyFused(fused_losses, lg, lg, tg, RawTensor(), -100);

    const RawTensor row_scale = RawTensor::Full({tail}, 1.0 / counted, kF64);
    const CrossEntropyReference ref = ReferenceSoftmaxCrossEntropy(data, tt, row_scale, -100);
    EXPECT_TRUE(AllClose(Cpu(losses.narrow(0, rows - tail, tail)), ref.losses, LossTol(dtype)));
    EXPECT_TRUE(
        AllClose(Cpu(fused_losses.narrow(0, rows - tail, tail)), ref.losses, LossTol(dtype)));
    EXPECT_TRUE(AllClose(Cpu(lg.narrow(0, rows - tail, tail)), ref.grad,
                         ForDType(dtype, {1e-5, 1e-12}, {1e-12, 1e-17}),
                         TargetSlack(dtype, tt, kClasses, row_scale)));
    // A constant row just before the data: log(C) and (1 / C - onehot) / count.
    const RawTensor flat = RawTensor::Full({1, kClasses}, 0.5, dtype);
    const RawTensor t1 = RawTensor::FromVector<int64_t>({1}, {1});
    const RawTensor s1 = RawTensor::Full({1}, 1.0 / counted, kF64);
    const CrossEntropyReference ref1 = ReferenceSoftmaxCrossEntropy(flat, t1, s1, -100);
    EXPECT_TRUE(AllClose(Cpu(fused_losses.narrow(0, rows - tail - 1, 1)), ref1.losses,
                         LossTol(dtype)));
    EXPECT_TRUE(AllClose(Cpu(lg.narrow(0, rows - tail - 1, 1)), ref1.grad,
                         ForDType(dtype, {1e-5, 1e-12}, {1e-12, 1e-17}),
                         TargetSlack(dtype, t1, kClasses, s1)));
  }
  cuda::EmptyCache();
}

// ---- Layer-norm backward ------------------------------------------------------------------------

struct LayerNormGrads {
  RawTensor grad_x, grad_weight, grad_bias;  // f64
};

// autograd/ops/nn.cc's LayerNorm backward, in f64 tg ops, from the forward's saved statistics.
LayerNormGrads ReferenceLayerNormBackward(const RawTensor& grad_out, const RawTensor& x,
                                          const RawTensor& mean, const RawTensor& rstd,
                                          const RawTensor& weight) {
  const int64_t rows = x.size(0), n = x.size(1);
  const RawTensor g = grad_out.to(kF64);
  const RawTensor rs = rstd.to(kF64).reshape({rows, 1});
  const RawTensor xhat = Mul(Sub(x.to(kF64), mean.to(kF64).reshape({rows, 1})), rs);
  const RawTensor dxhat = weight.defined() ? Mul(g, weight.to(kF64).reshape({1, n})) : g;
  const RawTensor centered = Sub(dxhat, Mean(dxhat, {-1}, /*keepdim=*/true));
  const RawTensor dx = Mul(rs, Sub(centered, Mul(xhat, Mean(Mul(dxhat, xhat), {-1}, true))));
  return {dx, Sum(Mul(g, xhat), {0}), Sum(g, {0})};
}

TEST_F(CudaNnTest, LayerNormBackwardMatchesCompositionAndIsDeterministic) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {5, 7}, {64, 768}, {300, 33}, {9, 1025}, {3, 4099}};
  uint32_t seed = 700;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, n] : shapes) {
      for (int variant = 0; variant < 3; ++variant) {
        // 0: everything with a weight; 1: no weight; 2: grad_x only.
        SCOPED_TRACE(absl::StrCat(Label(dtype, rows, n), " variant ", variant));
        const RawTensor x = Uniform({rows, n}, dtype, ++seed);
        const RawTensor w = variant == 1 ? RawTensor() : Uniform({n}, dtype, ++seed, 0.5, 1.5);
        const RawTensor grad_out = Uniform({rows, n}, dtype, ++seed, -1, 1);
        const LayerNormResult fwd = LayerNorm(x, w, RawTensor(), 1e-5);
        const LayerNormGrads ref = ReferenceLayerNormBackward(grad_out, x, fwd.mean, fwd.rstd, w);
        const bool params = variant != 2;
        RawTensor first_gw;
        for (int run = 0; run < 2; ++run) {
          const RawTensor gx = EmptyGpu({rows, n}, dtype);
          const RawTensor gw = params ? EmptyGpu({n}, dtype) : RawTensor();
          const RawTensor gb = params ? EmptyGpu({n}, dtype) : RawTensor();
          cuda::LayerNormBackward(gx, gw, gb, Gpu(grad_out), Gpu(x), Gpu(fwd.mean), Gpu(fwd.rstd),
                                  w.defined() ? Gpu(w) : RawTensor());
          // grad_x: f32 row sums of n terms and a cancelling difference, scaled by rstd (~0.4).
          EXPECT_TRUE(AllClose(Cpu(gx), ref.grad_x, ForDType(dtype, {1e-5, 1e-5}, {1e-12, 1e-13})));
          if (!params) continue;
          // grad_weight / grad_bias: f32 partial sums over `rows` terms of magnitude <= ~2.
          const Tol sums = ForDType(dtype, {1e-5, 4e-6 * rows}, {1e-12, 1e-13 * rows});
          EXPECT_TRUE(AllClose(Cpu(gw), ref.grad_weight, sums));
          EXPECT_TRUE(AllClose(Cpu(gb), ref.grad_bias, sums));
          if (run == 0) {
            first_gw = Cpu(gw);
          } else {
            EXPECT_TRUE(BitEqual(Cpu(gw), first_gw)) << "not deterministic";
          }
        }
      }
    }
  }
}

// ---- Add + LayerNorm ----------------------------------------------------------------------------

TEST_F(CudaNnTest, AddLayerNormMatchesComposition) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{5, 7}, {6, 768}, {3, 1025}};
  uint32_t seed = 900;
  for (DType dtype : kFloatDTypes) {
    for (const auto& [rows, n] : shapes) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(absl::StrCat(Label(dtype, rows, n), " in place ", in_place));
        const RawTensor a = Uniform({rows, n}, dtype, ++seed);
        const RawTensor b = Uniform({rows, n}, dtype, ++seed);
        const RawTensor w = Uniform({n}, dtype, ++seed, 0.5, 1.5);
        const RawTensor bias = Uniform({n}, dtype, ++seed);
        const RawTensor sum = Add(a, b);
        const LayerNormResult expected = LayerNorm(sum, w, bias, 1e-5);
        const RawTensor ag = Gpu(a);
        const RawTensor residual = in_place ? ag : EmptyGpu({rows, n}, dtype);
        const DType stat = dtype == kF64 ? kF64 : kF32;
        const RawTensor out = EmptyGpu({rows, n}, dtype);
        const RawTensor mean = EmptyGpu({rows}, stat), rstd = EmptyGpu({rows}, stat);
        cuda::AddLayerNorm(residual, out, mean, rstd, ag, Gpu(b), Gpu(w), Gpu(bias), 1e-5);
        // The sum is one f32 (f64) addition rounded once on both devices: exact.
        EXPECT_TRUE(BitEqual(Cpu(residual), sum));
        const Tol stats = dtype == kF64 ? kStatsF64 : kStatsF32;
        EXPECT_TRUE(AllClose(Cpu(mean), expected.mean, stats));
        EXPECT_TRUE(AllClose(Cpu(rstd), expected.rstd, stats));
        EXPECT_TRUE(
            AllClose(Cpu(out), expected.output, ForDType(dtype, kLayerNormF32, kLayerNormF64)));
      }
    }
  }
}

// ---- Indexing -----------------------------------------------------------------------------------

// x as a strided GPU tensor with x's values: a contiguous copy of a permutation, permuted back.
RawTensor StridedGpu(const RawTensor& x) { return Gpu(x.permute({2, 0, 1})).permute({1, 2, 0}); }

TEST_F(CudaNnTest, GatherAndIndexSelectCopyExactly) {
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) {
    const RawTensor x = Uniform({4, 5, 6}, kF64, 71, 0, 3).to(dtype);
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " dim ", dim));
      Shape ishape = {3, 4, 5};
      ishape[dim] = 7;  // the indexed dim may be longer than x's
      const RawTensor index = Indices(ishape, x.size(dim), 73 + dim);
      const RawTensor out = EmptyGpu(ishape, dtype);
      cuda::Gather(out, StridedGpu(x), Gpu(index), dim);
      EXPECT_TRUE(BitEqual(Cpu(out), Gather(x, dim, index)));

      const RawTensor list = Indices({9}, x.size(dim), 79 + dim);
      Shape oshape = x.shape();
      oshape[dim] = 9;
      const RawTensor selected = EmptyGpu(oshape, dtype);
      cuda::IndexSelect(selected, StridedGpu(x), Gpu(list), dim);
      EXPECT_TRUE(BitEqual(Cpu(selected), IndexSelect(x, dim, list)));
    }
  }
}

TEST_F(CudaNnTest, ScatterAddAndIndexAddMatchCpuExactly) {
  // Values are multiples of 2^-8 in [-4, 4): every sum of them is exact in f64 (and its f32/
  // f16/bf16 rounding is the CPU's); integers wrap identically. So the atomics' order cannot
  // show and the results are bit-exact.
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8}) {
    const bool floating = IsFloating(dtype);
    auto values = [&](const Shape& shape, uint32_t seed) {
      return floating ? Uniform(shape, dtype, seed, -4, 4, 11)
                      : Uniform(shape, kF64, seed, 0, 256, 8).to(dtype);
    };
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " dim ", dim));
      const RawTensor self = values({4, 5, 6}, 81 + dim);
      Shape ishape = {3, 4, 5};
      ishape[dim] = 9;  // many repeated indices along dim
      const RawTensor index = Indices(ishape, self.size(dim), 83 + dim);
      const RawTensor src = values({9, 9, 9}, 85 + dim);  // larger than index: a corner is read
      const RawTensor out = Gpu(self);
      cuda::ScatterAdd(out, Gpu(index), StridedGpu(src), dim);
      EXPECT_TRUE(BitEqual(Cpu(out), ScatterAdd(self, dim, index, src)));

      const RawTensor list = Indices({11}, self.size(dim), 87 + dim);
      Shape sshape = self.shape();
      sshape[dim] = 11;
      const RawTensor isrc = values(sshape, 89 + dim);
      const RawTensor out2 = Gpu(self);
      cuda::IndexAdd(out2, Gpu(list), StridedGpu(isrc), dim);
      EXPECT_TRUE(BitEqual(Cpu(out2), IndexAdd(self, dim, list, isrc)));
    }
  }
}

// ---- Max pooling --------------------------------------------------------------------------------

Window2d PoolWindow(const Shape& x, std::array<int64_t, 2> k, std::array<int64_t, 2> s,
                    std::array<int64_t, 2> p) {
  Window2d g{};
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.o = x[1];
  g.kh = k[0];
  g.kw = k[1];
  g.sh = s[0];
  g.sw = s[1];
  g.ph = p[0];
  g.pw = p[1];
  g.dh = 1;
  g.dw = 1;
  g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

TEST_F(CudaNnTest, MaxPool2dMatchesCpuExactly) {
  struct Geometry {
    std::array<int64_t, 2> k, s, p;
  };
  const Geometry geometries[] = {
      {{2, 2}, {2, 2}, {0, 0}}, {{3, 3}, {1, 1}, {1, 1}}, {{3, 2}, {2, 1}, {1, 0}}};
  for (DType dtype : kFloatDTypes) {
    for (const Geometry& geo : geometries) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " kernel ", geo.k[0], "x", geo.k[1]));
      // Few distinct values (many ties: the first maximum wins) and some NaNs (the last wins).
      RawTensor x = Uniform({2, 3, 9, 10}, kF64, 91, 0, 4, 2);
      x.select(1, 1).select(1, 4).select(1, 4).fill_(kNaN);
      x.select(1, 1).select(1, 4).select(1, 5).fill_(kNaN);
      x = x.to(dtype);
      const MaxPool2dResult expected = MaxPool2d(x, geo.k, geo.s, geo.p);
      const Window2d g = PoolWindow(x.shape(), geo.k, geo.s, geo.p);
      const RawTensor out = EmptyGpu({g.n, g.c, g.oh, g.ow}, dtype);
      const RawTensor indices = EmptyGpu({g.n, g.c, g.oh, g.ow}, kI64);
      cuda::MaxPool2d(out, indices, Gpu(x), g);
      EXPECT_TRUE(BitEqual(Cpu(out), expected.output));
      EXPECT_TRUE(BitEqual(Cpu(indices), expected.indices));

      // Gradients on the 2^-8 grid: the sums of overlapping windows are exact in f32, so the
      // atomics' order cannot show.
      const RawTensor grad_out = Uniform(expected.output.shape(), dtype, 93, -4, 4, 11);
      const RawTensor grad_in = EmptyGpu(x.shape(), dtype);
      cuda::MaxPool2dBackward(grad_in, Gpu(grad_out), Gpu(expected.indices));
      EXPECT_TRUE(BitEqual(Cpu(grad_in), MaxPool2dBackward(grad_out, expected.indices, x.shape())));
    }
  }
}

// ---- Index errors -------------------------------------------------------------------------------

TEST_F(CudaNnTest, IndexErrorsNameTheOpAndTheValue) {
  const RawTensor x = Gpu(Uniform({2, 3}, kF32, 1));
  const RawTensor bad = Gpu(RawTensor::FromVector<int64_t>({0, 2, 7, 1, 0, 1}, {2, 3}));

  // gather: reported at the next check (the kernel only records it).
  cuda::Gather(EmptyGpu({2, 3}, kF32), x, bad, 1);
  EXPECT_TRUE(
      ThrowsError([] { cuda::CheckIndexErrors(); },
                  "gather: index 7 at position [0, 2] is out of range for dim 1 of size 3"));
  cuda::CheckIndexErrors();  // reported once, then clear

  const RawTensor list = Gpu(RawTensor::FromVector<int64_t>({1, -1}, {2}));
  cuda::IndexSelect(EmptyGpu({2, 2}, kF32), x, list, 1);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); },
                          "index_select: index -1 at position 1 is out of range for dim 1 of "
                          "size 3"));

  const RawTensor out = Gpu(RawTensor::Zeros({2, 3}, kF32));
  cuda::ScatterAdd(out, bad, x, 1);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); }, "scatter_add: index 7"));

  const RawTensor weight = Gpu(Uniform({4, 8}, kF32, 3));
  const RawTensor idx = Gpu(RawTensor::FromVector<int64_t>({1, 4, 2}, {3}));
  cuda::Embedding(EmptyGpu({3, 8}, kF32), weight, idx);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); },
                          "embedding: index 4 at position 1 is out of range for 4 rows"));
  cuda::EmbeddingBackward(RawTensor::Zeros({4, 8}, kF32, kGpu), Gpu(Uniform({3, 8}, kF32, 5)), idx);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); }, "embedding_backward: index 4"));

  // cross_entropy waits for its count anyway, so it throws itself.
  const RawTensor logits = Gpu(Uniform({3, 5}, kF32, 9));
  const RawTensor targets = Gpu(RawTensor::FromVector<int64_t>({1, 5, -100}, {3}));
  EXPECT_TRUE(ThrowsError([&] { cuda::CrossEntropy(EmptyGpu({3}, kF32), logits, targets, -100); },
                          "cross_entropy: target 5 at position 1 is out of range for 5 classes"));
  cuda::CrossEntropyBackward(EmptyGpu({3, 5}, kF32), logits, targets,
                             Gpu(RawTensor::Ones({3}, kF64)), -100);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); }, "cross_entropy_backward: target 5"));
  cuda::SoftmaxCrossEntropyFused(RawTensor(), EmptyGpu({3, 5}, kF32), logits, targets, RawTensor(),
                                 -100);
  EXPECT_TRUE(
      ThrowsError([] { cuda::CheckIndexErrors(); }, "softmax_cross_entropy_fused: target 5"));

  const RawTensor pool_idx = Gpu(RawTensor::FromVector<int64_t>({0, 1, 2, 9}, {1, 1, 2, 2}));
  cuda::MaxPool2dBackward(EmptyGpu({1, 1, 3, 3}, kF32), Gpu(RawTensor::Ones({1, 1, 2, 2})),
                          pool_idx);
  EXPECT_TRUE(ThrowsError([] { cuda::CheckIndexErrors(); },
                          "max_pool2d_backward: index 9 at position 3 is out of range for an "
                          "input plane of 3 x 3 elements"));

  // An unchecked error surfaces at the next index-reading call on the device.
  cuda::Gather(EmptyGpu({2, 3}, kF32), x, bad, 1);
  cuda::Synchronize();
  const RawTensor good = Gpu(RawTensor::Zeros({2, 3}, kI64));
  EXPECT_TRUE(ThrowsError(
      [&] {
        cuda::Gather(EmptyGpu({2, 3}, kF32), x, good, 1);
      },
      "gather: index 7"));
  cuda::CheckIndexErrors();
}

// ---- Argument checks of the fused kernels (no GPU needed) -------------------------------------

TEST(CudaNnFusedArgsTest, RejectHostTensorsAndBadShapes) {
  const RawTensor logits = RawTensor::Zeros({2, 3});
  const RawTensor targets = RawTensor::Zeros({2}, kI64);
  EXPECT_TRUE(ThrowsError(
      [&] {
        cuda::SoftmaxCrossEntropyFused(RawTensor(), logits, logits, targets, RawTensor(), -100);
      },
      "softmax_cross_entropy_fused: logits is on cpu, expected a CUDA device"));
  EXPECT_TRUE(ThrowsError(
      [&] {
        cuda::LayerNormBackward(RawTensor(), RawTensor(), RawTensor(), logits,
                                RawTensor::Zeros({2, 3}, kI32), RawTensor(), RawTensor(),
                                RawTensor());
      },
      "layer_norm_backward: x is on cpu, expected a CUDA device"));
  EXPECT_TRUE(ThrowsError(
      [&] {
        cuda::AddLayerNorm(logits, logits, RawTensor(), RawTensor(), RawTensor(), logits,
                           RawTensor(), RawTensor(), 1e-5);
      },
      "add_layer_norm: a is an undefined tensor"));
}

}  // namespace
}  // namespace tg
