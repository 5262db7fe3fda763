// The RawTensor handle (tensor/tensor.h): factories, views and their storage sharing, copies and
// dtype conversion, validation errors, printing; plus the shape helpers, ForEachRow
// (tensor/strided_loop.h) and Storage.
#include "tensor/tensor.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/half.h"
#include "tensor/storage.h"
#include "tensor/strided_loop.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ThrowsError;
using ::tg::testing::ThrowsErrorExactly;
using F = std::vector<float>;
using D = std::vector<double>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Arange(0, n) reshaped: element values equal their row-major index.
RawTensor Iota(const Shape& shape, DType dtype = kF32) {
  return RawTensor::Arange(0, static_cast<double>(NumElements(shape)), 1, dtype).reshape(shape);
}

std::vector<uint16_t> HalfBits(const RawTensor& t) {
  const RawTensor c = t.contiguous();
  std::vector<uint16_t> out;
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(c.data<Half>()[i].bits);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Shape helpers

TEST(ShapeTest, ShapeToString) {
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeToString({-1}), "[-1]");
}

TEST(ShapeTest, NumElements) {
  EXPECT_EQ(NumElements({2, 3, 4}), 24);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({5, 0, 7}), 0);
  EXPECT_EQ(NumElements({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(NumElements({0, max, max}), 0);
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        NumElements({int64_t{1} << 32, int64_t{1} << 32});
      },
      "shape [4294967296, 4294967296] has more elements than int64 "
      "can count"));
  EXPECT_TRUE(ThrowsError(
      [] {
        NumElements({3, int64_t{1} << 62});
      },
      "has more elements than int64 can count"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        NumElements({2, -1});
      },
      "shape [2, -1] has a negative size"));
}

TEST(ShapeTest, ContiguousStrides) {
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(ContiguousStrides({}), Shape{});
  EXPECT_EQ(ContiguousStrides({5}), Shape{1});
  EXPECT_EQ(ContiguousStrides({2, 0, 3}), (Shape{3, 3, 1}));  // like torch: size 0 counts as 1
}

TEST(ShapeTest, BroadcastShapes) {
  EXPECT_EQ(BroadcastShapes("add", {2, 1, 3}, {4, 1}), (Shape{2, 4, 3}));
  EXPECT_EQ(BroadcastShapes("add", {}, {5}), Shape{5});
  EXPECT_EQ(BroadcastShapes("add", {3}, {}), Shape{3});
  EXPECT_EQ(BroadcastShapes("add", {0}, {1}), Shape{0});
  EXPECT_EQ(BroadcastShapes("add", {1, 0}, {3, 1}), (Shape{3, 0}));
  EXPECT_EQ(BroadcastShapes("add", {2, 3}, {2, 3}), (Shape{2, 3}));
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        BroadcastShapes("add", {2, 3}, {4});
      },
      "add: shapes [2, 3] and [4] cannot be broadcast"));
  EXPECT_TRUE(ThrowsErrorExactly([] { BroadcastShapes("mul", {0}, {2}); },
                                 "mul: shapes [0] and [2] cannot be broadcast"));
}

TEST(ShapeTest, WrapDim) {
  EXPECT_EQ(WrapDim("op", -1, 3), 2);
  EXPECT_EQ(WrapDim("op", -3, 3), 0);
  EXPECT_EQ(WrapDim("op", 2, 3), 2);
  EXPECT_EQ(WrapDim("op", 0, 0), 0);  // a 0-d tensor accepts dim 0 and -1, like torch
  EXPECT_EQ(WrapDim("op", -1, 0), 0);
  EXPECT_TRUE(ThrowsErrorExactly([] { WrapDim("op", 3, 3); },
                                 "op: dim 3 is out of range for a tensor with 3 dims"));
  EXPECT_TRUE(ThrowsErrorExactly([] { WrapDim("sum", -4, 3); },
                                 "sum: dim -4 is out of range for a tensor with 3 dims"));
  EXPECT_TRUE(ThrowsErrorExactly([] { WrapDim("op", 1, 0); },
                                 "op: dim 1 is out of range for a tensor with 0 dims"));
  EXPECT_TRUE(ThrowsError([] { WrapDim("op", -2, 0); }, "op: dim -2 is out of range"));
}

TEST(DeviceTest, Basics) {
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_EQ(Device::Cuda(1).ToString(), "cuda:1");
  EXPECT_TRUE(Device::Cpu() == Device());
  EXPECT_TRUE(Device::Cuda(0) != Device::Cuda(1));
  EXPECT_TRUE(Device::Cuda().is_cuda());
}

// ---------------------------------------------------------------------------------------------
// Factories

TEST(TensorTest, Empty) {
  const RawTensor t = RawTensor::Empty({2, 3, 4}, kF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), kF16);
  EXPECT_EQ(t.element_size(), 2u);
  EXPECT_EQ(t.storage()->nbytes(), 48u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device() == Device::Cpu());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_TRUE(ThrowsError([&] { t.size(3); }, "size: dim 3 is out of range"));

  const RawTensor s = RawTensor::Empty({});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.dtype(), kF32);
  EXPECT_TRUE(s.strides().empty());

  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        RawTensor::Empty({2, -1});
      },
      "shape [2, -1] has a negative size"));
  EXPECT_TRUE(ThrowsError([] { RawTensor::Empty({int64_t{1} << 62}); },
                          "empty: shape [4611686018427387904] is too large"));
}

TEST(TensorTest, EmptyTensorsWithZeroElementsAreContiguous) {
  // torch: a tensor with no elements is contiguous whatever its strides.
  for (const Shape& shape : {Shape{0}, Shape{3, 0}, Shape{0, 3}, Shape{2, 0, 3}}) {
    const RawTensor t = RawTensor::Empty(shape);
    EXPECT_EQ(t.numel(), 0);
    EXPECT_TRUE(t.is_contiguous()) << ShapeToString(shape);
    EXPECT_TRUE(t.contiguous().shares_storage(t)) << ShapeToString(shape);
  }
}

TEST(TensorTest, EmptyDataIs64ByteAligned) {
  for (DType d : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) {
    for (int64_t n : {0, 1, 3, 17, 63, 65, 1000}) {
      const RawTensor t = RawTensor::Empty({n}, d);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % kCpuAlignment, 0u)
          << DTypeName(d) << " " << n;
      EXPECT_EQ(t.storage()->nbytes(), static_cast<size_t>(n) * ElementSize(d));
    }
  }
  EXPECT_EQ(kCpuAlignment, 64u);
}

TEST(TensorTest, ZerosOnesFull) {
  for (DType d : {kF32, kF64, kF16, kBF16, kI32, kI64, kU8, kBool}) {
    const RawTensor z = RawTensor::Zeros({2, 3}, d);
    EXPECT_EQ(z.dtype(), d);
    EXPECT_EQ(z.to_vector<double>(), D(6, 0.0)) << DTypeName(d);
    const RawTensor o = RawTensor::Ones({3}, d);
    EXPECT_EQ(o.to_vector<double>(), D(3, 1.0)) << DTypeName(d);
  }
  EXPECT_EQ(HalfBits(RawTensor::Ones({2}, kF16)), (std::vector<uint16_t>{0x3c00, 0x3c00}));
  EXPECT_EQ(RawTensor::Ones({1}, kBF16).data<BFloat16>()[0].bits, 0x3f80u);
  EXPECT_EQ(RawTensor::Ones({1}, kBool).to_vector<uint8_t>(), std::vector<uint8_t>{1});

  EXPECT_EQ(RawTensor::Full({2, 2}, 2.5).to_vector<float>(), F(4, 2.5f));
  EXPECT_EQ(RawTensor::Full({2, 2}, 2.9, kI32).to_vector<int32_t>(), std::vector<int32_t>(4, 2));
  EXPECT_EQ(RawTensor::Full({2}, -2.9, kI64).to_vector<int64_t>(), std::vector<int64_t>(2, -2));
  EXPECT_EQ(RawTensor::Full({3}, -1, kU8).to_vector<int64_t>(), std::vector<int64_t>(3, 0));
  EXPECT_EQ(RawTensor::Full({3}, 1e3, kU8).to_vector<int64_t>(), std::vector<int64_t>(3, 255));
  EXPECT_EQ(RawTensor::Full({1}, kNaN, kI64).to_vector<int64_t>(), std::vector<int64_t>{0});
  EXPECT_EQ(RawTensor::Full({2}, 0.1, kF64).to_vector<double>(), D(2, 0.1));
  EXPECT_EQ(RawTensor::Full({2}, 0.1).to_vector<float>(), F(2, 0.1f));
  EXPECT_EQ(HalfBits(RawTensor::Full({2}, 1e6, kF16)), (std::vector<uint16_t>{0x7c00, 0x7c00}));
  EXPECT_EQ(HalfBits(RawTensor::Full({1}, 65519.0, kF16)), std::vector<uint16_t>{0x7bff});
  EXPECT_EQ(RawTensor::Full({2}, -0.5, kBool).to_vector<int64_t>(), std::vector<int64_t>(2, 1));
  EXPECT_EQ(RawTensor::Full({0}, 1).numel(), 0);
}

TEST(TensorTest, Scalar) {
  const RawTensor s = RawTensor::Scalar(3.5);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.dtype(), kF32);
  EXPECT_EQ(s.item(), 3.5);
  EXPECT_EQ(RawTensor::Scalar(7, kI64).item(), 7.0);
  EXPECT_EQ(RawTensor::Scalar(-2.5, kBool).item(), 1.0);
  EXPECT_EQ(RawTensor::Scalar(-2.5, kI32).item(), -2.0);
  EXPECT_EQ(RawTensor::Scalar(0.1, kF64).item(), 0.1);
}

TEST(TensorTest, Arange) {
  RawTensor a = RawTensor::Arange(0, 5);
  EXPECT_EQ(a.shape(), Shape{5});
  EXPECT_EQ(a.dtype(), kF32);
  EXPECT_EQ(a.to_vector<float>(), (F{0, 1, 2, 3, 4}));
  EXPECT_EQ(RawTensor::Arange(1, 2, 0.25).to_vector<float>(), (F{1, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(RawTensor::Arange(0, 10, 3).to_vector<float>(), (F{0, 3, 6, 9}));
  EXPECT_EQ(RawTensor::Arange(5, 0, -2).to_vector<float>(), (F{5, 3, 1}));
  EXPECT_EQ(RawTensor::Arange(0, -1, -0.5).to_vector<float>(), (F{0, -0.5f}));
  EXPECT_EQ(RawTensor::Arange(-2, 2, 1, kI64).to_vector<int64_t>(),
            (std::vector<int64_t>{-2, -1, 0, 1}));
  EXPECT_EQ(RawTensor::Arange(0, 3, 1, kI64).dtype(), kI64);
  // Empty ranges give shape [0].
  for (auto [start, end, step] :
       {std::tuple{3.0, 3.0, 1.0}, std::tuple{5.0, 0.0, 1.0}, std::tuple{0.0, 5.0, -1.0},
        std::tuple{0.0, 1e300, -1.0}, std::tuple{1e300, 0.0, 1.0}}) {
    const RawTensor e = RawTensor::Arange(start, end, step);
    EXPECT_EQ(e.shape(), Shape{0}) << start << " " << end << " " << step;
    EXPECT_EQ(e.numel(), 0);
  }
  EXPECT_TRUE(ThrowsError([] { RawTensor::Arange(0, 1, 0); }, "arange: start 0, end 1 and step 0"));
  EXPECT_TRUE(ThrowsError([] { RawTensor::Arange(0, kInf); }, "must be finite"));
  EXPECT_TRUE(ThrowsError([] { RawTensor::Arange(0, 1e16); }, "elements is too many"));
}

TEST(TensorTest, FromVectorAndToVector) {
  const RawTensor t = RawTensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.dtype(), kF32);
  EXPECT_EQ(t.to_vector<float>(), (F{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  const RawTensor i = RawTensor::FromVector<int64_t>({-5, 7}, {2});
  EXPECT_EQ(i.dtype(), kI64);
  EXPECT_EQ(i.to_vector<double>(), (D{-5, 7}));
  // With a dtype: converted (truncate, saturate).
  const RawTensor u = RawTensor::FromVector<float>({1.5f, -2.5f, 300}, {3}, kU8);
  EXPECT_EQ(u.dtype(), kU8);
  EXPECT_EQ(u.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 255}));
  const RawTensor h = RawTensor::FromVector<Half>({Half(1.0f), Half::FromBits(0x7bff)}, {2});
  EXPECT_EQ(h.dtype(), kF16);
  EXPECT_EQ(h.to_vector<float>(), (F{1, 65504}));
  const RawTensor s = RawTensor::FromVector<double>({4.25}, {});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 4.25);
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        RawTensor::FromVector<float>({1, 2, 3, 4, 5}, {2, 3});
      },
      "FromVector: 5 values do not fill shape [2, 3]"));
  // to_vector of a view gives the logical (row-major) order.
  EXPECT_EQ(t.transpose(0, 1).to_vector<float>(), (F{1, 4, 2, 5, 3, 6}));
}

TEST(TensorTest, DataChecksDtype) {
  const RawTensor t = RawTensor::Zeros({2});
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.data<Half>(); }, "data<f16>: tensor has dtype f32"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.data<int64_t>(); }, "data<i64>: tensor has dtype f32"));
  const RawTensor v = Iota({3, 4}).select(0, 1);
  EXPECT_EQ(v.data<float>() - static_cast<float*>(v.storage()->data()), 4);
  EXPECT_EQ(v.raw_data(), static_cast<void*>(v.data<float>()));
}

TEST(TensorTest, Item) {
  EXPECT_EQ(RawTensor::FromVector<float>({2.5f}, {1, 1}).item(), 2.5);
  EXPECT_EQ(RawTensor::FromVector<Half>({Half::FromBits(0x3555)}, {1}).item(), 0.333251953125);
  EXPECT_EQ(Iota({2, 3}).select(0, 1).select(0, 2).item(), 5.0);
  EXPECT_EQ(RawTensor::Ones({1}, kBool).item(), 1.0);
  EXPECT_EQ(RawTensor::Full({1}, -3, kI32).item(), -3.0);
  EXPECT_TRUE(ThrowsErrorExactly(
      [] {
        Iota({2, 3}).item();
      },
      "item: the tensor has 6 elements (shape [2, 3]), expected 1"));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Empty({0}).item(); },
                                 "item: the tensor has 0 elements (shape [0]), expected 1"));
}

TEST(TensorTest, UndefinedTensor) {
  const RawTensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.ToString(), "tensor(undefined)");
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.view({1}); }, "view: the tensor is undefined"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.clone(); }, "clone: the tensor is undefined"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.item(); }, "item: the tensor is undefined"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { t.device(); }, "device: the tensor is undefined"));
  EXPECT_TRUE(ThrowsError([&] { RawTensor::Zeros({1}).copy_(t); }, "copy_: undefined tensor"));
}

// ---------------------------------------------------------------------------------------------
// Views

TEST(TensorTest, ViewsShareStorageAndWritesShowThrough) {
  const RawTensor x = Iota({2, 3});
  const RawTensor row = x.select(0, 1);
  EXPECT_TRUE(row.shares_storage(x));
  row.fill_(7);
  EXPECT_EQ(x.to_vector<float>(), (F{0, 1, 2, 7, 7, 7}));
  const RawTensor xt = x.transpose(0, 1);
  EXPECT_TRUE(xt.shares_storage(x));
  xt.slice(0, 2, 3).fill_(-1);  // column 2 of x
  EXPECT_EQ(x.to_vector<float>(), (F{0, 1, -1, 7, 7, -1}));
  xt.data<float>()[xt.strides()[1]] = 42;  // xt[0][1] == x[1][0]
  EXPECT_EQ(x.to_vector<float>(), (F{0, 1, -1, 42, 7, -1}));
  x.reshape({6}).slice(0, 1, 2).fill_(9);
  EXPECT_EQ(x.to_vector<float>(), (F{0, 9, -1, 42, 7, -1}));
  x.unsqueeze(0).expand({4, 2, 3}).select(0, 3).select(1, 0).fill_(5);  // column 0 of x
  EXPECT_EQ(x.to_vector<float>(), (F{5, 9, -1, 5, 7, -1}));
  EXPECT_FALSE(x.shares_storage(Iota({2, 3})));
}

TEST(TensorTest, ReshapeIsAViewWhenPossible) {
  const RawTensor x = Iota({2, 3});
  const RawTensor r = x.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.strides(), (Shape{2, 1}));
  EXPECT_TRUE(r.shares_storage(x));
  const RawTensor v = x.view({6});
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.to_vector<float>(), (F{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(x.view({1, 2, 1, 3}).strides(), (Shape{6, 3, 3, 1}));
  EXPECT_EQ(x.flatten().shape(), Shape{6});
  EXPECT_TRUE(x.flatten().shares_storage(x));
  // 0-d and one-element reshapes.
  const RawTensor s = RawTensor::Scalar(5).reshape({1, 1});
  EXPECT_EQ(s.shape(), (Shape{1, 1}));
  EXPECT_EQ(s.item(), 5.0);
  EXPECT_EQ(RawTensor::Arange(1, 2).reshape({}).dim(), 0);
  EXPECT_EQ(RawTensor::Empty({0, 3}).reshape({3, 0}).shape(), (Shape{3, 0}));
}

TEST(TensorTest, ReshapeOfTransposedCopiesAndViewThrows) {
  const RawTensor x = Iota({2, 3});
  const RawTensor xt = x.transpose(0, 1);
  const RawTensor r = xt.reshape({6});
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(r.to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(ThrowsError([&] { xt.view({6}); }, "view:"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { xt.view({6}); },
                                 "view: shape [6] is not compatible with the strides [1, 3] of a "
                                 "tensor of shape [3, 2]; use reshape() to copy"));
  // The copy is independent of x.
  r.fill_(0);
  EXPECT_EQ(x.to_vector<float>(), (F{0, 1, 2, 3, 4, 5}));
}

TEST(TensorTest, ViewOfNonContiguousSplitsAndMergesCompatibleDims) {
  const RawTensor x = Iota({2, 3, 4});
  const RawTensor t = x.transpose(0, 1);  // [3, 2, 4], strides [4, 12, 1]
  ASSERT_EQ(t.strides(), (Shape{4, 12, 1}));
  const RawTensor v = t.view({3, 2, 2, 2});  // splitting the last dim keeps it a view
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_EQ(v.to_vector<float>(), t.contiguous().to_vector<float>());
  EXPECT_TRUE(ThrowsError([&] { t.view({3, 8}); }, "view: shape [3, 8] is not compatible"));
  EXPECT_TRUE(ThrowsError([&] { t.view({6, 4}); }, "view:"));
  const RawTensor r = t.reshape({3, 8});
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_EQ(r.to_vector<float>(), t.contiguous().to_vector<float>());

  const RawTensor s = x.slice(2, 0, 2);  // [2, 3, 2], strides [12, 4, 1]
  const RawTensor m = s.view({6, 2});    // dims 0 and 1 merge: 12 == 3 * 4
  EXPECT_TRUE(m.shares_storage(x));
  EXPECT_EQ(m.strides(), (Shape{4, 1}));
  EXPECT_EQ(m.to_vector<float>(), (F{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21}));
  EXPECT_TRUE(ThrowsError([&] { s.view({12}); }, "view:"));
}

TEST(TensorTest, ReshapeErrors) {
  const RawTensor x = Iota({2, 3});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        x.reshape({4, -1});
      },
      "reshape: shape [4, -1] is invalid for 6 elements"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        x.reshape({-1, -1});
      },
      "reshape: only one dimension can be -1 in [-1, -1]"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { x.reshape({7}); }, "reshape: shape [7] is invalid for 6 elements"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        x.reshape({-2, 3});
      },
      "reshape: invalid size -2 in [-2, 3]"));
  EXPECT_TRUE(ThrowsError([&] { x.view({5}); }, "view: shape [5] is invalid for 6 elements"));
  EXPECT_TRUE(ThrowsError([] { RawTensor::Empty({0, 3}).reshape({-1, 0}); }, "is invalid for 0"));
}

TEST(TensorTest, Slice) {
  const RawTensor x = Iota({10});
  const RawTensor a = x.slice(0, -3, 100);
  EXPECT_EQ(a.to_vector<float>(), (F{7, 8, 9}));
  EXPECT_EQ(a.offset(), 7);
  EXPECT_TRUE(a.shares_storage(x));
  const RawTensor b = x.slice(0, 2, 8, 3);
  EXPECT_EQ(b.to_vector<float>(), (F{2, 5}));
  EXPECT_EQ(b.strides(), Shape{3});
  EXPECT_EQ(b.offset(), 2);
  EXPECT_EQ(x.slice(0, -100, 2).to_vector<float>(), (F{0, 1}));
  EXPECT_EQ(x.slice(0, 1, 10, 4).to_vector<float>(), (F{1, 5, 9}));
  EXPECT_EQ(x.slice(0, 9, 10, 5).to_vector<float>(), (F{9}));
  EXPECT_EQ(x.slice(-1, -4, -1, 2).to_vector<float>(), (F{6, 8}));
  EXPECT_EQ(x.slice(0, 0, 10).to_vector<float>(), x.to_vector<float>());
  // Empty results: start past end, start past the size.
  EXPECT_EQ(x.slice(0, 8, 2).shape(), Shape{0});
  EXPECT_EQ(x.slice(0, 12, 20).shape(), Shape{0});
  EXPECT_EQ(x.slice(0, 5, 5).to_vector<float>(), F{});

  const RawTensor y = Iota({3, 4});
  const RawTensor c = y.slice(1, 1, 3);
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.strides(), (Shape{4, 1}));
  EXPECT_EQ(c.offset(), 1);
  EXPECT_EQ(c.to_vector<float>(), (F{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(y.slice(0, -1, 3).to_vector<float>(), (F{8, 9, 10, 11}));
  EXPECT_EQ(y.slice(1, 1, 4, 2).slice(0, 0, 3, 2).to_vector<float>(), (F{1, 3, 9, 11}));

  EXPECT_TRUE(
      ThrowsErrorExactly([&] { x.slice(0, 0, 5, 0); }, "slice: step must be positive, got 0"));
  EXPECT_TRUE(ThrowsError([&] { x.slice(0, 5, 0, -1); }, "slice: step must be positive, got -1"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.slice(2, 0, 1); },
                                 "slice: dim 2 is out of range for a tensor with 2 dims"));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Scalar(1).slice(0, 0, 1); },
                                 "slice: cannot slice a 0-d tensor"));
}

TEST(TensorTest, Narrow) {
  const RawTensor x = Iota({10});
  EXPECT_EQ(x.narrow(0, 2, 3).to_vector<float>(), (F{2, 3, 4}));
  EXPECT_EQ(x.narrow(-1, 7, 3).to_vector<float>(), (F{7, 8, 9}));
  EXPECT_EQ(x.narrow(0, 10, 0).numel(), 0);
  EXPECT_TRUE(x.narrow(0, 2, 3).shares_storage(x));
  EXPECT_TRUE(ThrowsErrorExactly([&] { x.narrow(0, 8, 3); },
                                 "narrow: range [8, 11) is out of bounds for dim 0 of size 10"));
  EXPECT_TRUE(ThrowsError([&] { x.narrow(0, -1, 2); }, "narrow: range [-1, 1) is out of bounds"));
  EXPECT_TRUE(ThrowsError([&] { x.narrow(0, 2, -1); }, "narrow: range [2, 1) is out of bounds"));
  EXPECT_TRUE(ThrowsError(
      [&] {
        Iota({2, 3}).narrow(1, 1, 3);
      },
      "narrow: range [1, 4) is out of bounds for dim 1 of size 3"));
}

TEST(TensorTest, Select) {
  const RawTensor y = Iota({3, 4});
  const RawTensor col = y.select(1, -1);
  EXPECT_EQ(col.shape(), Shape{3});
  EXPECT_EQ(col.strides(), Shape{4});
  EXPECT_EQ(col.offset(), 3);
  EXPECT_EQ(col.to_vector<float>(), (F{3, 7, 11}));
  EXPECT_EQ(y.select(0, 2).to_vector<float>(), (F{8, 9, 10, 11}));
  EXPECT_EQ(y.select(-2, -3).to_vector<float>(), (F{0, 1, 2, 3}));
  const RawTensor e = y.select(0, 1).select(0, 2);
  EXPECT_EQ(e.dim(), 0);
  EXPECT_EQ(e.item(), 6.0);
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.select(0, 3); },
                                 "select: index 3 is out of range for dim 0 of size 3"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.select(1, -5); },
                                 "select: index -5 is out of range for dim 1 of size 4"));
  EXPECT_TRUE(ThrowsErrorExactly([] { RawTensor::Scalar(1).select(0, 0); },
                                 "select: cannot select from a 0-d tensor"));
  EXPECT_TRUE(ThrowsError([&] { y.select(2, 0); }, "select: dim 2 is out of range"));
}

TEST(TensorTest, Transpose) {
  const RawTensor y = Iota({3, 4});
  const RawTensor t = y.transpose(0, 1);
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_EQ(t.strides(), (Shape{1, 4}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.shares_storage(y));
  EXPECT_EQ(t.to_vector<float>(), (F{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(y.transpose(-1, -2).strides(), (Shape{1, 4}));
  EXPECT_EQ(y.transpose(1, 1).strides(), (Shape{4, 1}));
  EXPECT_EQ(t.transpose(0, 1).to_vector<float>(), y.to_vector<float>());
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.transpose(0, 2); },
                                 "transpose: dim 2 is out of range for a tensor with 2 dims"));
  const RawTensor s = RawTensor::Scalar(2);
  EXPECT_EQ(s.transpose(0, 0).item(), 2.0);
}

TEST(TensorTest, Permute) {
  const RawTensor z = Iota({2, 3, 4});
  const RawTensor p = z.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(p.shares_storage(z));
  const F v = p.to_vector<float>();
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(v[i * 6 + j * 3 + k], j * 12 + k * 4 + i);  // p[i][j][k] == z[j][k][i]
      }
    }
  }
  EXPECT_EQ(z.permute({-1, -3, -2}).shape(), (Shape{4, 2, 3}));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        z.permute({0, 0, 1});
      },
      "permute: dim 0 repeats in [0, 0, 1]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        z.permute({0, -3, 1});
      },
      "permute: dim 0 repeats in [0, -3, 1]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        z.permute({0, 1});
      },
      "permute: 2 dims given for a tensor of shape [2, 3, 4]"));
  EXPECT_TRUE(ThrowsError([&] { z.permute({0, 1, 3}); }, "permute: dim 3 is out of range"));
}

TEST(TensorTest, Expand) {
  const RawTensor c = RawTensor::FromVector<float>({1, 2, 3}, {3, 1});
  const RawTensor e = c.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(e.shares_storage(c));
  EXPECT_FALSE(e.is_contiguous());
  const F v = e.to_vector<float>();
  ASSERT_EQ(v.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], (i / 4) % 3 + 1) << i;
  const RawTensor k = c.expand({-1, 5});
  EXPECT_EQ(k.shape(), (Shape{3, 5}));
  EXPECT_EQ(k.strides(), (Shape{1, 0}));
  EXPECT_EQ(c.expand({3, 1}).strides(), c.strides());
  const RawTensor row = RawTensor::FromVector<float>({1, 2}, {2});
  EXPECT_EQ(row.expand({3, 2}).strides(), (Shape{0, 1}));
  EXPECT_EQ(row.expand({3, 2}).to_vector<float>(), (F{1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(row.expand({0, 2}).numel(), 0);
  // Writing to the base shows up in every expanded position.
  c.fill_(8);
  EXPECT_EQ(e.to_vector<float>(), F(24, 8));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        c.expand({2, 4});
      },
      "expand: cannot expand shape [3, 1] to [2, 4]"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { c.expand({4}); }, "expand: cannot expand shape [3, 1] to [4]"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        c.expand({-1, 3, 1});
      },
      "expand: invalid size -1 in [-1, 3, 1]"));
  EXPECT_TRUE(ThrowsError([&] { row.expand({2, 3}); }, "expand: cannot expand shape [2] to"));
}

TEST(TensorTest, UnsqueezeSqueeze) {
  const RawTensor y = Iota({3, 4});
  const RawTensor a = y.unsqueeze(0);
  EXPECT_EQ(a.shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(a.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(a.shares_storage(y));
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(y.unsqueeze(1).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(y.unsqueeze(1).strides(), (Shape{4, 4, 1}));
  EXPECT_EQ(y.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(y.unsqueeze(-1).strides(), (Shape{4, 1, 1}));
  EXPECT_EQ(y.unsqueeze(2).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(y.unsqueeze(-3).shape(), (Shape{1, 3, 4}));
  EXPECT_TRUE(ThrowsErrorExactly([&] { y.unsqueeze(3); },
                                 "unsqueeze: dim 3 is out of range for a tensor with 3 dims"));
  EXPECT_EQ(RawTensor::Scalar(1).unsqueeze(0).shape(), Shape{1});

  EXPECT_EQ(a.squeeze(0).shape(), (Shape{3, 4}));
  EXPECT_EQ(a.squeeze(0).strides(), (Shape{4, 1}));
  EXPECT_TRUE(a.squeeze(0).shares_storage(y));
  EXPECT_EQ(y.squeeze(0).shape(), (Shape{3, 4}));  // size 3: unchanged
  EXPECT_EQ(y.unsqueeze(-1).squeeze(-1).shape(), (Shape{3, 4}));
  EXPECT_EQ(RawTensor::FromVector<float>({4}, {1}).squeeze(0).dim(), 0);
  EXPECT_EQ(RawTensor::Scalar(1).squeeze(0).dim(), 0);
  EXPECT_TRUE(ThrowsError([&] { y.squeeze(2); }, "squeeze: dim 2 is out of range"));
  // Values are unchanged by these views.
  EXPECT_EQ(y.unsqueeze(1).to_vector<float>(), y.to_vector<float>());
}

TEST(TensorTest, IsContiguousIgnoresSize1Strides) {
  auto storage = std::make_shared<Storage>(3 * sizeof(float), CpuAllocator());
  EXPECT_TRUE(RawTensor(storage, {1, 3}, {100, 1}, 0, kF32).is_contiguous());
  EXPECT_TRUE(RawTensor(storage, {3, 1}, {1, 7}, 0, kF32).is_contiguous());
  EXPECT_FALSE(RawTensor(storage, {3}, {1}, 0, kF32).slice(0, 0, 3, 2).is_contiguous());
  EXPECT_TRUE(Iota({4, 3}).slice(0, 1, 3).is_contiguous());  // offset does not matter
  EXPECT_FALSE(Iota({4, 3}).slice(1, 0, 2).is_contiguous());
}

// ---------------------------------------------------------------------------------------------
// Copies

TEST(TensorTest, ContiguousIsANoOpWhenContiguous) {
  const RawTensor y = Iota({3, 4});
  const RawTensor c = y.contiguous();
  EXPECT_TRUE(c.shares_storage(y));
  EXPECT_EQ(c.raw_data(), y.raw_data());
  const RawTensor rows = y.slice(0, 1, 3);
  EXPECT_EQ(rows.contiguous().raw_data(), rows.raw_data());

  const RawTensor t = y.transpose(0, 1);
  const RawTensor tc = t.contiguous();
  EXPECT_FALSE(tc.shares_storage(y));
  EXPECT_TRUE(tc.is_contiguous());
  EXPECT_EQ(tc.shape(), (Shape{4, 3}));
  EXPECT_EQ(tc.strides(), (Shape{3, 1}));
  EXPECT_EQ(tc.offset(), 0);
  EXPECT_EQ(tc.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(tc.storage()->nbytes(), 12 * sizeof(float));
}

TEST(TensorTest, CloneDoesNotShare) {
  const RawTensor y = Iota({3, 4});
  const RawTensor c = y.clone();
  EXPECT_FALSE(c.shares_storage(y));
  EXPECT_EQ(c.to_vector<float>(), y.to_vector<float>());
  c.fill_(-1);
  EXPECT_EQ(y.to_vector<float>(), Iota({3, 4}).to_vector<float>());
  const RawTensor ct = y.slice(1, 1, 4, 2).clone();
  EXPECT_TRUE(ct.is_contiguous());
  EXPECT_EQ(ct.to_vector<float>(), (F{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(ct.storage()->nbytes(), 6 * sizeof(float));
  const RawTensor h = Iota({2}, kF16).clone();
  EXPECT_EQ(h.dtype(), kF16);
  EXPECT_EQ(HalfBits(h), (std::vector<uint16_t>{0x0000, 0x3c00}));
}

TEST(TensorTest, ToConvertsValues) {
  const RawTensor f = RawTensor::FromVector<float>(
      {1, 65504, 65519, 65520, 1e6f, -1e6f, 1e-8f, -0.0f, std::ldexp(1.0f, -24), 0.1f}, {10});
  const RawTensor h = f.to(kF16);
  EXPECT_EQ(h.dtype(), kF16);
  EXPECT_EQ(h.shape(), Shape{10});
  EXPECT_EQ(HalfBits(h), (std::vector<uint16_t>{0x3c00, 0x7bff, 0x7bff, 0x7c00, 0x7c00, 0xfc00,
                                                0x0000, 0x8000, 0x0001, 0x2e66}));
  EXPECT_EQ(h.to(kF32).to_vector<float>()[3], kInf);
  const RawTensor b = RawTensor::FromVector<float>({1.01171875f, 1.00390625f}, {2}).to(kBF16);
  EXPECT_EQ(b.data<BFloat16>()[0].bits, 0x3f82u);
  EXPECT_EQ(b.data<BFloat16>()[1].bits, 0x3f80u);

  const RawTensor g =
      RawTensor::FromVector<float>({-3.7f, 3.7f, static_cast<float>(kNaN), 1e30f, -1e30f}, {5});
  EXPECT_EQ(g.to(kI32).to_vector<int32_t>(),
            (std::vector<int32_t>{-3, 3, 0, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(g.to(kBool).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(RawTensor::FromVector<float>({0, -0.0f, 0.5f}, {3}).to(kBool).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(RawTensor::FromVector<int64_t>({-1, 256, 300}, {3}).to(kU8).to_vector<int64_t>(),
            (std::vector<int64_t>{255, 0, 44}));
  EXPECT_EQ(RawTensor::FromVector<int64_t>({1, 2}, {2}).to(kF64).to_vector<double>(), (D{1, 2}));
  // Same dtype: the same handle's data.
  EXPECT_TRUE(f.to(kF32).shares_storage(f));
  // A view converts in logical order into a contiguous result.
  const RawTensor t = Iota({2, 3}).transpose(0, 1).to(kI64);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorTest, CopyBroadcastsAndConverts) {
  const RawTensor dst = RawTensor::Zeros({2, 3}, kF64);
  const RawTensor& ret = dst.copy_(RawTensor::FromVector<int32_t>({1, 2, 3}, {3}));
  EXPECT_EQ(&ret, &dst);
  EXPECT_EQ(dst.to_vector<double>(), (D{1, 2, 3, 1, 2, 3}));
  dst.copy_(RawTensor::FromVector<float>({-1.5f, 2.5f}, {2, 1}));
  EXPECT_EQ(dst.to_vector<double>(), (D{-1.5, -1.5, -1.5, 2.5, 2.5, 2.5}));
  dst.copy_(RawTensor::Scalar(4, kU8));
  EXPECT_EQ(dst.to_vector<double>(), D(6, 4));
  dst.copy_(Iota({2, 3}, kI64));
  EXPECT_EQ(dst.to_vector<double>(), (D{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(ThrowsErrorExactly([&] { dst.copy_(RawTensor::Zeros({4})); },
                                 "copy_: source shape [4] cannot be broadcast to [2, 3]"));
  EXPECT_TRUE(ThrowsError(
      [&] {
        dst.copy_(RawTensor::Zeros({1, 2, 3}));
      },
      "copy_: source shape [1, 2, 3] cannot be broadcast to [2, 3]"));

  // Into a non-contiguous destination.
  const RawTensor d2 = RawTensor::Zeros({3, 2});
  d2.transpose(0, 1).copy_(Iota({2, 3}));
  EXPECT_EQ(d2.to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
  // From a non-contiguous source, f32 -> f16 with overflow.
  const RawTensor src = RawTensor::FromVector<float>({70000, 1, -70000, 0.5f}, {2, 2});
  const RawTensor h = RawTensor::Zeros({2, 2}, kF16);
  h.copy_(src.transpose(0, 1));
  EXPECT_EQ(HalfBits(h), (std::vector<uint16_t>{0x7c00, 0xfc00, 0x3c00, 0x3800}));
  // A zero-element copy does nothing and does not throw.
  RawTensor::Zeros({0, 3}).copy_(RawTensor::Ones({3}));
}

TEST(TensorTest, CopyIntoExpandedViewThrows) {
  const RawTensor base = RawTensor::Zeros({3, 1});
  const RawTensor e = base.expand({3, 4});
  EXPECT_TRUE(ThrowsError(
      [&] {
        e.copy_(RawTensor::Ones({3, 4}));
      },
      "copy_: the destination of shape [3, 4] is an expanded view (stride 0)"));
  EXPECT_TRUE(ThrowsError([&] { e.fill_(1); }, "expanded view"));
  EXPECT_EQ(base.to_vector<float>(), F(3, 0));
  // Size-1 dims with stride 0 are fine: no element is written twice.
  const RawTensor one = RawTensor::Zeros({1}).expand({1, 1});
  one.fill_(3);
  EXPECT_EQ(one.item(), 3.0);
}

TEST(TensorTest, FillOnNonContiguousViewTouchesOnlyTheView) {
  const RawTensor x = RawTensor::Zeros({3, 4});
  x.slice(1, 1, 4, 2).fill_(5);
  EXPECT_EQ(x.to_vector<float>(), (F{0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5}));
  x.select(0, 1).fill_(-1);
  EXPECT_EQ(x.to_vector<float>(), (F{0, 5, 0, 5, -1, -1, -1, -1, 0, 5, 0, 5}));
  x.transpose(0, 1).select(0, 0).fill_(2);  // column 0
  EXPECT_EQ(x.to_vector<float>(), (F{2, 5, 0, 5, 2, -1, -1, -1, 2, 5, 0, 5}));

  // A strided view in the middle of a larger storage: nothing outside it changes.
  auto storage = std::make_shared<Storage>(10 * sizeof(int32_t), CpuAllocator());
  const RawTensor all(storage, {10}, {1}, 0, kI32);
  all.fill_(0);
  const RawTensor v(storage, {3}, {2}, 3, kI32);
  v.fill_(7.9);
  EXPECT_EQ(all.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0, 7, 0, 7, 0, 7, 0, 0}));

  const RawTensor h = RawTensor::Zeros({2, 2}, kF16);
  h.select(1, 1).fill_(1e5);
  EXPECT_EQ(HalfBits(h), (std::vector<uint16_t>{0, 0x7c00, 0, 0x7c00}));
  EXPECT_EQ(&x.zero_(), &x);
  EXPECT_EQ(x.to_vector<float>(), F(12, 0));
}

// ---------------------------------------------------------------------------------------------
// View validation

TEST(TensorTest, ConstructorRejectsViewsOutsideStorage) {
  auto storage = std::make_shared<Storage>(6 * sizeof(float), CpuAllocator());
  const RawTensor ok(storage, {2, 3}, {3, 1}, 0, kF32);
  EXPECT_EQ(ok.numel(), 6);
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {2, 3}, {3, 1}, 1, kF32); }, "reaches outside"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        RawTensor(storage, {2, 3}, {3, 1}, 1, kF32);
      },
      "RawTensor: view of shape [2, 3] with strides [3, 1] and offset 1 "
      "reaches outside a storage of 6 f32 elements"));
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {7}, {1}, 0, kF32); }, "reaches outside"));
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {4}, {2}, 0, kF32); }, "reaches outside"));
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {4}, {1}, 0, kF64); },
                          "reaches outside a storage of 3 f64 elements"));
  EXPECT_EQ(RawTensor(storage, {3}, {1}, 0, kF64).numel(), 3);
  EXPECT_EQ(RawTensor(storage, {12}, {1}, 0, kF16).numel(), 12);
  // Negative strides: the lowest address must not go below 0.
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {3}, {-1}, 1, kF32); }, "reaches outside"));
  const RawTensor base(storage, {6}, {1}, 0, kF32);
  base.copy_(Iota({6}));
  const RawTensor rev(storage, {3}, {-1}, 2, kF32);
  EXPECT_EQ(rev.to_vector<float>(), (F{2, 1, 0}));
  EXPECT_EQ(RawTensor(storage, {2, 3}, {-3, -1}, 5, kF32).to_vector<float>(),
            (F{5, 4, 3, 2, 1, 0}));
  // Other constructor checks.
  EXPECT_TRUE(ThrowsErrorExactly([&] { RawTensor(storage, {2}, {1}, -1, kF32); },
                                 "RawTensor: negative offset -1"));
  EXPECT_TRUE(ThrowsError([&] { RawTensor(storage, {2, 3}, {1}, 0, kF32); }, "differ in length"));
  EXPECT_TRUE(
      ThrowsErrorExactly([] { RawTensor(nullptr, {1}, {1}, 0, kF32); }, "RawTensor: null storage"));
  // A view with no elements addresses nothing, wherever it points.
  EXPECT_EQ(RawTensor(storage, {0, 5}, {5, 1}, 100, kF32).numel(), 0);
  // A storage that is not a multiple of the element size holds floor(nbytes / size) elements.
  auto odd = std::make_shared<Storage>(7, CpuAllocator());
  EXPECT_EQ(RawTensor(odd, {1}, {1}, 0, kI32).numel(), 1);
  EXPECT_TRUE(ThrowsError([&] { RawTensor(odd, {2}, {1}, 0, kI32); },
                          "reaches outside a storage of 1 i32 elements"));
}

TEST(TensorTest, CopyBetweenNegativelyStridedViews) {
  auto storage = std::make_shared<Storage>(8 * sizeof(float), CpuAllocator());
  const RawTensor base(storage, {8}, {1}, 0, kF32);
  base.copy_(Iota({8}));
  const RawTensor rev(storage, {2, 4}, {-4, -1}, 7, kF32);  // base reversed, as [2, 4]
  const RawTensor dst = RawTensor::Zeros({2, 4}, kF64);
  dst.copy_(rev);
  EXPECT_EQ(dst.to_vector<double>(), (D{7, 6, 5, 4, 3, 2, 1, 0}));
  rev.select(0, 0).copy_(RawTensor::FromVector<int32_t>({10, 11, 12, 13}, {4}));
  EXPECT_EQ(base.to_vector<float>(), (F{0, 1, 2, 3, 13, 12, 11, 10}));
}

// ---------------------------------------------------------------------------------------------
// Printing

TEST(TensorTest, ToString) {
  EXPECT_EQ(RawTensor::FromVector<float>({1, 2, 3, 4}, {2, 2}).ToString(),
            "tensor([[1, 2], [3, 4]], f32, shape=[2, 2])");
  EXPECT_EQ(RawTensor::Scalar(3).ToString(), "tensor(3, f32, shape=[])");
  EXPECT_EQ(RawTensor::Arange(0, 0).ToString(), "tensor([], f32, shape=[0])");
  EXPECT_EQ(RawTensor::Empty({3, 0}).ToString(), "tensor([], f32, shape=[3, 0])");
  EXPECT_EQ(RawTensor::FromVector<float>({1.5f, -0.25f}, {2}).to(kF16).ToString(),
            "tensor([1.5, -0.25], f16, shape=[2])");
  EXPECT_EQ(Iota({2, 1, 2}).ToString(), "tensor([[[0, 1]], [[2, 3]]], f32, shape=[2, 1, 2])");
  EXPECT_EQ(Iota({2, 2}).transpose(0, 1).ToString(), "tensor([[0, 2], [1, 3]], f32, shape=[2, 2])");
  EXPECT_EQ(Iota({1, 3}, kI64).ToString(), "tensor([[0, 1, 2]], i64, shape=[1, 3])");
  EXPECT_EQ(RawTensor::Ones({2}, kBool).ToString(), "tensor([1, 1], bool, shape=[2])");
  EXPECT_EQ(RawTensor::FromVector<float>({kInf, -kInf, 0.1f, 1234567}, {4}).ToString(),
            "tensor([inf, -inf, 0.1, 1.23457e+06], f32, shape=[4])");
  // Elided beyond max_elements.
  EXPECT_EQ(RawTensor::Arange(0, 100).ToString(), "tensor(... 100 elements ..., f32, shape=[100])");
  EXPECT_EQ(Iota({2, 2}).ToString(3), "tensor(... 4 elements ..., f32, shape=[2, 2])");
  EXPECT_EQ(Iota({2, 2}).ToString(4), "tensor([[0, 1], [2, 3]], f32, shape=[2, 2])");
}

// ---------------------------------------------------------------------------------------------
// ForEachRow and BroadcastByteStrides (tensor/strided_loop.h)

struct Row {
  std::array<int64_t, 2> start;  // byte offsets from each base
  int64_t n;
  std::array<int64_t, 2> step;
  bool operator==(const Row& o) const { return start == o.start && n == o.n && step == o.step; }
};

std::vector<Row> Rows(const Shape& shape, const Shape& s0, const Shape& s1) {
  static char buffer[2][4096];
  std::vector<Row> rows;
  ForEachRow<2>(
      shape, {buffer[0] + 2048, buffer[1] + 2048}, {s0, s1},
      [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> step) {
        rows.push_back(Row{{p[0] - (buffer[0] + 2048), p[1] - (buffer[1] + 2048)}, n, step});
      });
  return rows;
}

// Byte offsets of every element of (shape, strides) in row-major order, computed directly.
std::vector<int64_t> Offsets(const Shape& shape, const Shape& strides) {
  std::vector<int64_t> out;
  const int64_t n = NumElements(shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      off += (rem % shape[d]) * strides[d];
      rem /= shape[d];
    }
    out.push_back(off);
  }
  return out;
}

TEST(StridedLoopTest, ContiguousOperandsAreOneRow) {
  const std::vector<Row> rows = Rows({2, 3, 4}, {48, 16, 4}, {96, 32, 8});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], (Row{{0, 0}, 24, {4, 8}}));
}

TEST(StridedLoopTest, UnmergeableDimsGiveOneRowPerOuterIndex) {
  // dst contiguous [3, 2] f32; src a transposed [2, 3] f32 (byte strides 4, 12).
  const std::vector<Row> rows = Rows({3, 2}, {8, 4}, {4, 12});
  ASSERT_EQ(rows.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(rows[i], (Row{{8 * i, 4 * i}, 2, {4, 12}})) << i;
  // A broadcast operand (stride 0) stops the merge.
  const std::vector<Row> b = Rows({2, 3}, {12, 4}, {0, 4});
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1], (Row{{12, 0}, 3, {4, 4}}));
}

TEST(StridedLoopTest, Size1DimsAreDroppedAndScalarsAreOneElement) {
  const std::vector<Row> rows = Rows({1, 5, 1}, {999, 4, 777}, {123, 8, 5});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0], (Row{{0, 0}, 5, {4, 8}}));
  const std::vector<Row> scalar = Rows({}, {}, {});
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar[0].n, 1);
  EXPECT_EQ(Rows({1, 1}, {4, 4}, {4, 4}).size(), 1u);
  EXPECT_TRUE(Rows({3, 0, 2}, {0, 8, 4}, {0, 8, 4}).empty());
  EXPECT_TRUE(Rows({0}, {4}, {4}).empty());
}

TEST(StridedLoopTest, VisitsEveryElementInRowMajorOrder) {
  struct Case {
    Shape shape, s0, s1;
  };
  const Case cases[] = {
      {{2, 3, 4}, {4, 32, 8}, {48, 16, 4}},           // permuted vs contiguous
      {{4, 1, 3, 2}, {24, 99, 8, 4}, {0, 0, 2, -1}},  // broadcast and negative strides
      {{3, 4, 5}, {-80, 20, 4}, {40, 10, 2}},         // partially mergeable
      {{2, 2, 2, 2}, {8, 4, 2, 1}, {1, 2, 4, 8}},     // fully reversed strides
  };
  for (const Case& c : cases) {
    std::vector<int64_t> got0, got1;
    for (const Row& r : Rows(c.shape, c.s0, c.s1)) {
      for (int64_t i = 0; i < r.n; ++i) {
        got0.push_back(r.start[0] + i * r.step[0]);
        got1.push_back(r.start[1] + i * r.step[1]);
      }
    }
    EXPECT_EQ(got0, Offsets(c.shape, c.s0)) << ShapeToString(c.shape);
    EXPECT_EQ(got1, Offsets(c.shape, c.s1)) << ShapeToString(c.shape);
  }
}

TEST(StridedLoopTest, BroadcastByteStrides) {
  const RawTensor c = RawTensor::Zeros({3, 1});
  EXPECT_EQ(BroadcastByteStrides(c, {2, 3, 4}), (Shape{0, 4, 0}));
  EXPECT_EQ(BroadcastByteStrides(Iota({2, 3}, kF64).transpose(0, 1), {3, 2}), (Shape{8, 24}));
  EXPECT_EQ(BroadcastByteStrides(RawTensor::Scalar(1, kI64), {5}), Shape{0});
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        BroadcastByteStrides(c, {2, 4});
      },
      "broadcast: cannot broadcast shape [3, 1] to [2, 4]"));
  EXPECT_TRUE(ThrowsError([&] { BroadcastByteStrides(c, {3}); },
                          "broadcast: cannot broadcast shape [3, 1] to [3]"));
}

TEST(StorageTest, Basics) {
  Storage s(100, CpuAllocator());
  EXPECT_EQ(s.nbytes(), 100u);
  EXPECT_NE(s.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u);
  EXPECT_TRUE(s.device().is_cpu());
  std::memset(s.data(), 0xab, s.nbytes());  // the whole range is writable (ASan checks)
  Storage empty(0, CpuAllocator());
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_NE(empty.data(), nullptr);
  EXPECT_EQ(CpuAllocator(), CpuAllocator());
  EXPECT_TRUE(CpuAllocator()->device() == Device::Cpu());
}

}  // namespace
}  // namespace tg
