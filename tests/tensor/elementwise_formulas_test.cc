// The elementwise formulas are one definition (tensor/elementwise_formulas.h) for every device:
// the CPU's kernels give exactly what the shared formulas give with the host's math, NaN and
// integer wrap-around included (CUDA's kernels call the same functions with libdevice math; the
// CUDA op tables compare them with the CPU on a GPU).
#include "tensor/elementwise_formulas.h"

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace tg {
namespace {

using elementwise::HostMath;

const std::vector<double> kValues = {
    -2.5, -1, -0.0, 0, 0.3, 1, 4, std::nan(""), std::numeric_limits<double>::infinity()};

// Bitwise equality, NaN equal to NaN.
void ExpectSame(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
  } else {
    EXPECT_EQ(got, want) << what;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << what;
  }
}

TEST(ElementwiseFormulasTest, CpuUnaryKernelsAreTheSharedFormulas) {
  // exp, tanh and GELU-tanh run the vectorised row forms on the CPU (tensor/cpu/vec_math.h).
  for (const UnaryOp op : {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kLog, UnaryOp::kSqrt,
                           UnaryOp::kSigmoid, UnaryOp::kRelu, UnaryOp::kGelu, UnaryOp::kErf}) {
    const RawTensor x = RawTensor::FromVector(kValues, {static_cast<int64_t>(kValues.size())});
    const std::vector<double> got = Unary(op, x).to_vector<double>();
    for (size_t i = 0; i < kValues.size(); ++i) {
      ExpectSame(got[i], elementwise::ApplyUnary<HostMath>(op, kValues[i]),
                 std::string(UnaryOpName(op)) + "(" + std::to_string(kValues[i]) + ")");
    }
  }
}

TEST(ElementwiseFormulasTest, CpuBinaryKernelsAreTheSharedFormulas) {
  for (const BinaryOp op : kAllBinaryOps) {
    for (const double a : kValues) {
      const RawTensor x = RawTensor::FromVector(kValues, {static_cast<int64_t>(kValues.size())});
      const std::vector<double> got =
          Binary(op, RawTensor::Full({static_cast<int64_t>(kValues.size())}, a, kF64), x)
              .to_vector<double>();
      for (size_t i = 0; i < kValues.size(); ++i) {
        ExpectSame(got[i], elementwise::ApplyBinary<HostMath>(op, a, kValues[i]),
                   std::string(BinaryOpName(op)) + "(" + std::to_string(a) + ", " +
                       std::to_string(kValues[i]) + ")");
      }
    }
  }
  // Integers wrap around instead of overflowing.
  const int64_t big = std::numeric_limits<int64_t>::max();
  const RawTensor i = RawTensor::Full({1}, 0, kI64);
  i.data<int64_t>()[0] = big;
  EXPECT_EQ(Binary(BinaryOp::kAdd, i, i).to_vector<int64_t>()[0],
            elementwise::ApplyBinary<HostMath>(BinaryOp::kAdd, big, big));
  EXPECT_EQ(elementwise::ApplyBinary<HostMath>(BinaryOp::kAdd, big, int64_t{1}),
            std::numeric_limits<int64_t>::min());
}

// Every kind has its own name, the one its list gives.
TEST(ElementwiseFormulasTest, KindNamesComeFromTheLists) {
  std::set<std::string> names;
  for (BinaryOp op : kAllBinaryOps) names.insert(BinaryOpName(op));
  for (CompareOp op : kAllCompareOps) names.insert(CompareOpName(op));
  for (UnaryOp op : kAllUnaryOps) names.insert(UnaryOpName(op));
  EXPECT_EQ(names.size(),
            std::size(kAllBinaryOps) + std::size(kAllCompareOps) + std::size(kAllUnaryOps));
  EXPECT_STREQ(BinaryOpName(BinaryOp::kGeluTanhBackward), "gelu_tanh_backward");
  EXPECT_STREQ(CompareOpName(CompareOp::kGe), "ge");
  EXPECT_STREQ(UnaryOpName(UnaryOp::kSilu), "silu");
  EXPECT_STREQ(UnaryOpName(static_cast<UnaryOp>(999)), "unary");
}

TEST(ElementwiseFormulasTest, CpuCompareKernelsAreTheSharedFormulas) {
  for (const CompareOp op : kAllCompareOps) {
    for (const double a : kValues) {
      const RawTensor x = RawTensor::FromVector(kValues, {static_cast<int64_t>(kValues.size())});
      const std::vector<double> got =
          Compare(op, RawTensor::Full({static_cast<int64_t>(kValues.size())}, a, kF64), x)
              .to_vector<double>();
      for (size_t i = 0; i < kValues.size(); ++i) {
        EXPECT_EQ(got[i] != 0, elementwise::ApplyCompare(op, a, kValues[i]))
            << CompareOpName(op) << "(" << a << ", " << kValues[i] << ")";
      }
    }
  }
}

}  // namespace
}  // namespace tg
