// Every op of tensor/ops.h on every registered device against the same op on the CPU, from one
// table (as ggml's test-backend-ops runs every backend): the devices are the binary's backends
// (tensor/kernel_table.h: DevicesToTestAgainstTheCpu), so a new device's backend, linked into
// //tensor:devices, is tested by registering it. The tolerances were measured on CUDA, the one
// such device today; a new device whose kernels round differently states its own. Its sibling,
// tests/autograd/op_table.h, is the table of the differentiable ops (autograd/ops.h): f64
// gradcheck, f16/bf16, autocast policy and CUDA against the CPU of forward and gradients; the two
// share their tolerance types (tests/tensor/op_table_support.h).
//
// Each row names the op it exercises, builds its inputs on the CPU from a seeded generator,
// runs the op on those inputs and on copies of them moved to the GPU, and compares every output
// in f32, f64, f16 and bf16 (and i32/i64 where the op takes integers; u8 and bool in rows of
// their own). Views (transposes,
// slices with a step, stride-0 broadcasts, offsets) are taken inside the row's run function, so
// both devices see the same non-contiguous layout. Forward and backward ops have rows of their
// own; backward rows get their saved tensors from the CPU forward, so both devices run them on
// identical inputs.
//
// Tolerances live in the table next to each row, with the reason. A CUDA output matches when,
// element by element, |cuda - cpu| <= rtol * |cpu| + atol * max(1, max |cpu|): rtol covers
// rounding relative to the element itself, atol (relative to the output's largest magnitude)
// covers sums and products whose terms cancel, where the error follows the magnitudes summed
// rather than the result. NaN must match NaN (any payload: x86 and CUDA make different default
// NaNs), infinities must match exactly, and integer and bool outputs are compared exactly. The
// tolerance of an output is chosen by that output's dtype (attention's f32 statistics of f16
// heads get the f32 tolerance).
//
// Without a GPU the comparison skips; the table is still built and checked against the tensor
// ops of the op list (tensor/op_list.inc), so a listed op without a row fails here in CI.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/device_backend.h"
#include "tensor/generator.h"
#include "tensor/kernel_table.h"
#include "tensor/op_list.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor/op_table_support.h"

namespace tg {
namespace {

using Tensors = std::vector<RawTensor>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const std::vector<DType> kFloats = {kF32, kF64, kF16, kBF16};
const std::vector<DType> kFloatsAndInts = {kF32, kF64, kF16, kBF16, kI32, kI64};

// ---- Tolerances -------------------------------------------------------------------------------

// Tol, Tols and the 16-bit ulps are shared with the autograd op table
// (tests/tensor/op_table_support.h).
using testing::kBF16Ulp;
using testing::kF16Subnormal;
using testing::kF16Ulp;
using testing::Tol;
using testing::Tols;

// Bit-exact on both devices.
Tols Exact(const std::string& why) { return {{}, {}, {}, {}, why}; }

// f64 and f32 results that may differ by the given relative amounts; f16/bf16 results are f32
// results rounded once, so where the f32 values differ they may round to neighbouring 16-bit
// values: one 16-bit ulp on top.
Tols Computed(double f64, double f32, const std::string& why) {
  return {{f64, f64},
          {f32, f32},
          {kF16Ulp + f32, f32 + kF16Subnormal},
          {kBF16Ulp + f32, f32},
          why + "; f16/bf16: that f32 result rounded once (+1 ulp: 2^-10 / 2^-7 relative)"};
}

// As Computed, for ops that also round an intermediate to the 16-bit dtype before a product
// (attention's probabilities, Linear's pre-activation gradient): one 16-bit ulp of each term,
// summed, which is bounded by the magnitude of the output's terms.
Tols RoundedIntermediate(Tols t, double f16_terms, double bf16_terms, const std::string& why) {
  t.f16.atol += f16_terms * kF16Ulp;
  t.bf16.atol += bf16_terms * kBF16Ulp;
  t.why += "; " + why;
  return t;
}

const Tols& ExactTol() {
  static const Tols* t = new Tols(
      Exact("copies, selections, comparisons and IEEE-754 + - * / sqrt max min (correctly rounded "
            "on both devices: nvcc without fast math, --fmad=false): bit-exact; f16/bf16 round "
            "the same f32 value"));
  return *t;
}

const Tols& TranscendentalTol() {
  static const Tols* t = new Tols(Computed(
      1e-13, 2e-6,
      "exp/log/tanh/sigmoid/erf/gelu/pow: CUDA libdevice (expf, tanhf, erff 2 ulp, powf 4 ulp) vs "
      "glibc (1-2 ulp), compounded in gelu/sigmoid, and cancelling in 1 + tanh/erf near -1, "
      "where an ulp of the function is all that is left: 2e-6 for f32 (~16 ulp), 1e-13 for f64"));
  return *t;
}

const Tols& SumTol() {
  static const Tols* t = new Tols(
      Computed(1e-13, 2.4e-7,
               "sum/mean accumulate in f64 on both devices, in different orders: the f64 result's "
               "last bits (1e-13), and one ulp (2^-22 relative) for the rare f32 result whose f64 "
               "sums straddle a rounding boundary"));
  return *t;
}

const Tols& ScaleTol() {
  static const Tols* t = new Tols(Computed(
      1e-15, 2.4e-7,
      "x * scale rounded once; 1 ulp (2^-22 relative) if a device rounds the scale to f32 first"));
  return *t;
}

const Tols& AccumulateTol() {
  static const Tols* t = new Tols(Computed(
      1e-13, 1e-6,
      "scatter-adds of a few repeated indices: f64 (index ops) or f32 (embedding backward, "
      "overlapping max-pool windows) accumulation in different orders, atomics on the GPU: a few "
      "f32 ulp of the summed magnitudes (1e-6)"));
  return *t;
}

const Tols& MatmulTol() {
  static const Tols* t = new Tols(
      Computed(1e-12, 1e-5,
               "matmul with k <= 64: f32 accumulation in different orders (OpenBLAS blocks vs "
               "cuBLASLt tiles, no TF32) differs by up to k * 2^-24 of sum |a b|: 1e-5 of the "
               "largest output; f64 1e-12"));
  return *t;
}

const Tols& SoftmaxTol() {
  static const Tols* t = new Tols(Computed(
      1e-12, 1e-5,
      "softmax / log_softmax / cross-entropy: exp and log from libdevice (2 ulp) vs glibc, and "
      "online (rescaled running sums) vs two-pass row statistics over up to 1000 classes: 1e-5"));
  return *t;
}

const Tols& NormTol() {
  static const Tols* t = new Tols(Computed(
      1e-12, 1e-5,
      "layer norm and its backward: row means and variances over up to 257 elements and column "
      "sums over the rows, accumulated in f32 (f64) in different orders (warp shuffles vs "
      "sequential), then rsqrt: 1e-5 of the largest value"));
  return *t;
}

const Tols& ConvTol() {
  static const Tols* t = new Tols(Computed(
      1e-12, 2e-5,
      "convolution: cuDNN engines vs im2col + OpenBLAS, f32 accumulation (no TF32) over "
      "C*kh*kw = 27 (forward, input grad) and N*Ho*Wo <= 162 (weight grad) terms in different "
      "orders: 2e-5 of the largest output"));
  return *t;
}

// A convolution with a bias in f16/bf16: cuDNN writes the convolution in the dtype and the bias
// is added after (as in PyTorch's cuDNN path), so the result is rounded twice on CUDA and once on
// the CPU (oneDNN adds the bias to the f32 accumulator): one more 16-bit ulp of the largest
// output. The H200 run showed 3 bf16 ulps where the bias cancels most of the convolution.
const Tols& ConvBiasTol() {
  static const Tols* t = new Tols(RoundedIntermediate(
      ConvTol(), 1, 1,
      "f16/bf16 with a bias: CUDA rounds the convolution to the dtype before adding the bias, one "
      "16-bit ulp of the largest output"));
  return *t;
}

const Tols& LinearTol() {
  static const Tols* t = new Tols(RoundedIntermediate(
      Computed(1e-12, 1e-5,
               "linear: cuBLASLt with the bias/GELU epilogue vs OpenBLAS + the elementwise ops, "
               "k = 64 in f32 (the matmul bound, 1e-5), and the epilogue's tanh vs glibc's "
               "(transcendental bound, included)"),
      1, 1,
      "f16/bf16: cuBLASLt's kernels for widths that are not multiples of 8 apply the epilogue to "
      "the accumulator rounded to the dtype (seen on the H200), one more 16-bit ulp"));
  return *t;
}

const Tols& LinearBackwardTol() {
  static const Tols* t = new Tols(RoundedIntermediate(
      Computed(1e-12, 1e-5,
               "linear backward: products over k = 48 or m = 10 rows in f32 in different orders "
               "(1e-5); dGELU from cuBLASLt's epilogue vs the composed tanh formula"),
      1, 1,
      "f16/bf16: the pre-activation gradient g is rounded to the dtype before its products, so "
      "g may differ by one 16-bit ulp per term"));
  return *t;
}

const Tols& AttentionTol() {
  static const Tols* t = new Tols(RoundedIntermediate(
      Computed(1e-12, 2e-5,
               "attention: scores over D <= 64 and probability-weighted sums over T <= 16 keys in "
               "f32 in different orders, exp in libdevice vs glibc: 2e-5 of the largest value"),
      2, 2,
      "f16/bf16: the probabilities (and, backward, ds) are rounded to the dtype before their "
      "products, and cuDNN's flash kernel rounds them blockwise against a running maximum rather "
      "than after the full softmax: up to two 16-bit ulp per term of the largest output"));
  return *t;
}

// ---- The table --------------------------------------------------------------------------------

struct OpRow {
  std::string op;    // the tensor op of the op list (its tensor/ops.h function) this row exercises
  std::string name;  // what the row runs
  std::vector<DType> dtypes;
  // The inputs, on the CPU (undefined entries stand for absent optional tensors).
  std::function<Tensors(DType, Generator&)> inputs;
  // The op on those inputs, on whatever device they are on; returns every output.
  std::function<Tensors(const Tensors&)> run;
  const Tols* tol;
};

// Inputs. Integers draw from a normal with a wider spread and truncate (values in about
// [-30, 30], small enough that no product overflows).
RawTensor Normal(const Shape& shape, DType dtype, Generator& gen, double stddev = 1) {
  if (IsFloating(dtype)) return RandNormal(shape, gen, 0, stddev, dtype);
  return RandNormal(shape, gen, 0, 10 * stddev, kF64).to(dtype);
}
RawTensor Uniform(const Shape& shape, DType dtype, Generator& gen, double low, double high) {
  return RandUniform(shape, gen, low, high, kF64).to(dtype);
}
// Small integers (as `dtype`): many equal values, for comparisons and ties.
RawTensor Grid(const Shape& shape, DType dtype, Generator& gen, int64_t levels = 5) {
  return Uniform(shape, kF64, gen, 0, static_cast<double>(levels)).to(kI64).to(dtype);
}
// Indices in [0, bound) as `dtype` (i32/i64).
RawTensor Indices(const Shape& shape, int64_t bound, Generator& gen, DType dtype = kI64) {
  return Uniform(shape, kF64, gen, 0, static_cast<double>(bound)).to(kI64).to(dtype);
}
// Nonzero values of either sign with |v| in [0.5, 2] (divisors).
RawTensor AwayFromZero(const Shape& shape, DType dtype, Generator& gen) {
  const RawTensor sign = Sub(MulScalar(Grid(shape, kF64, gen, 2), 2), RawTensor::Scalar(1, kF64));
  return Mul(sign, Uniform(shape, kF64, gen, 0.5, 2)).to(dtype);
}
// The special values of floating arithmetic, and ordinary ones, as `dtype` [2, 8].
RawTensor Specials(DType dtype) {
  return RawTensor::FromVector<double>({kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -3.0,
                                        65504, 1e-6, -0.75, 7, kInf, kNaN},
                                       {2, 8})
      .to(dtype);
}

// A copy of `t` with element `i` (row-major) set to `value`.
RawTensor WithValueAt(const RawTensor& t, int64_t i, double value) {
  const RawTensor c = t.to(kF64).contiguous().clone();
  c.data<double>()[i] = value;
  return c.to(t.dtype());
}
// Softmax rows with infinities and NaN, as `dtype` [5, 4]: a -inf entry, an inf entry, an
// all -inf row, a NaN entry, and an ordinary row.
RawTensor SoftmaxSpecials(DType dtype) {
  return RawTensor::FromVector<double>({-kInf, 0,     1,    2, kInf, 0, 1,  2, -kInf, -kInf,
                                        -kInf, -kInf, kNaN, 0, 1,    2, -1, 3, 0.5,   2},
                                       {5, 4})
      .to(dtype);
}

// The elementwise layouts: two operand shapes on the CPU and the views run() takes of them.
struct Layout {
  std::string name;
  Shape a, b;
  std::function<RawTensor(const RawTensor&)> view_a, view_b;
};

const std::vector<Layout>& Layouts() {
  static const auto* layouts = new std::vector<Layout>{
      {"contiguous [4, 33]",
       {4, 33},
       {4, 33},
       [](const RawTensor& t) { return t; },
       [](const RawTensor& t) { return t; }},
      {"broadcast [4, 1, 33] with [5, 1]",
       {4, 1, 33},
       {5, 1},
       [](const RawTensor& t) { return t; },
       [](const RawTensor& t) { return t; }},
      {"transposed with a stepped slice",
       {33, 4},
       {4, 66},
       [](const RawTensor& t) { return t.transpose(0, 1); },
       [](const RawTensor& t) { return t.slice(1, 0, 66, 2); }},
      {"offset by one with a stride-0 expand",
       {5, 34},
       {1, 33},
       [](const RawTensor& t) { return t.narrow(1, 1, 33); },
       [](const RawTensor& t) {
         return t.expand({5, 33});
       }},
  };
  return *layouts;
}

bool TakesIntegers(BinaryOp op) {
  return op != BinaryOp::kDiv && op != BinaryOp::kPow && op != BinaryOp::kGeluTanhBackward;
}
bool TakesIntegers(UnaryOp op) {
  return op == UnaryOp::kNeg || op == UnaryOp::kAbs || op == UnaryOp::kRelu;
}
bool IsTranscendental(UnaryOp op) { return !(TakesIntegers(op) || op == UnaryOp::kSqrt); }

// Operands for `op` that stay in its domain (positive bases and logs, divisors away from 0).
RawTensor FirstOperand(BinaryOp op, const Shape& shape, DType dtype, Generator& gen) {
  return op == BinaryOp::kPow ? Uniform(shape, dtype, gen, 0.25, 3) : Normal(shape, dtype, gen);
}
RawTensor SecondOperand(BinaryOp op, const Shape& shape, DType dtype, Generator& gen) {
  return op == BinaryOp::kDiv ? AwayFromZero(shape, dtype, gen) : Normal(shape, dtype, gen);
}
RawTensor UnaryOperand(UnaryOp op, const Shape& shape, DType dtype, Generator& gen) {
  if (op == UnaryOp::kLog || op == UnaryOp::kSqrt) return Uniform(shape, dtype, gen, 0.01, 5);
  return Normal(shape, dtype, gen, 2);
}

void AddElementwiseRows(std::vector<OpRow>* rows) {
  for (BinaryOp op : kAllBinaryOps) {  // every kind of tensor/op_kinds.h
    const Tols* tol = op == BinaryOp::kPow || op == BinaryOp::kGeluTanhBackward
                          ? &TranscendentalTol()
                          : &ExactTol();
    const std::vector<DType> dtypes = TakesIntegers(op) ? kFloatsAndInts : kFloats;
    for (const Layout& l : Layouts()) {
      rows->push_back(
          {"Binary", absl::StrCat(BinaryOpName(op), " ", l.name), dtypes,
           [op, l](DType dtype, Generator& gen) -> Tensors {
             return {FirstOperand(op, l.a, dtype, gen), SecondOperand(op, l.b, dtype, gen)};
           },
           [op, l](const Tensors& in) -> Tensors {
             return {Binary(op, l.view_a(in[0]), l.view_b(in[1]))};
           },
           tol});
    }
    rows->push_back({"Binary", absl::StrCat(BinaryOpName(op), " special values"), kFloats,
                     [](DType dtype, Generator&) -> Tensors { return {Specials(dtype)}; },
                     [op](const Tensors& in) -> Tensors {
                       // Every pair of the 16 values: [16, 1] against [1, 16].
                       return {Binary(op, in[0].reshape({16, 1}), in[0].reshape({1, 16}))};
                     },
                     tol});
    // f16 op f32 promotes to f32 (the conversion runs on the device too).
    rows->push_back(
        {"Binary",
         absl::StrCat(BinaryOpName(op), " promoted from f16 and f32"),
         {kF32},
         [op](DType, Generator& gen) -> Tensors {
           return {FirstOperand(op, {3, 17}, kF16, gen), SecondOperand(op, {17}, kF32, gen)};
         },
         [op](const Tensors& in) -> Tensors { return {Binary(op, in[0], in[1])}; },
         tol});
    const std::vector<DType> scalar_dtypes = TakesIntegers(op) ? kFloatsAndInts : kFloats;
    rows->push_back({"BinaryScalar", absl::StrCat(BinaryOpName(op), " 3 on a transposed view"),
                     scalar_dtypes,
                     [op](DType dtype, Generator& gen) -> Tensors {
                       return {FirstOperand(op, {9, 20}, dtype, gen)};
                     },
                     [op](const Tensors& in) -> Tensors {
                       // An integral scalar, so that integer tensors take it too.
                       return {BinaryScalar(op, in[0].transpose(0, 1), 3)};
                     },
                     tol});
    rows->push_back({"BinaryScalar", absl::StrCat(BinaryOpName(op), " 0.37"), kFloats,
                     [op](DType dtype, Generator& gen) -> Tensors {
                       return {FirstOperand(op, {7, 33}, dtype, gen)};
                     },
                     [op](const Tensors& in) -> Tensors { return {BinaryScalar(op, in[0], 0.37)}; },
                     tol});
  }
  for (CompareOp op : kAllCompareOps) {
    for (const Layout& l : Layouts()) {
      rows->push_back({"Compare", absl::StrCat(CompareOpName(op), " ", l.name), kFloatsAndInts,
                       [l](DType dtype, Generator& gen) -> Tensors {
                         return {Grid(l.a, dtype, gen), Grid(l.b, dtype, gen)};
                       },
                       [op, l](const Tensors& in) -> Tensors {
                         return {Compare(op, l.view_a(in[0]), l.view_b(in[1]))};
                       },
                       &ExactTol()});
    }
    rows->push_back({"Compare", absl::StrCat(CompareOpName(op), " special values"), kFloats,
                     [](DType dtype, Generator&) -> Tensors { return {Specials(dtype)}; },
                     [op](const Tensors& in) -> Tensors {
                       return {Compare(op, in[0].reshape({16, 1}), in[0].reshape({1, 16}))};
                     },
                     &ExactTol()});
  }
  for (UnaryOp op : kAllUnaryOps) {  // every kind of tensor/op_kinds.h
    const Tols* tol = IsTranscendental(op) ? &TranscendentalTol() : &ExactTol();
    const std::vector<DType> dtypes = TakesIntegers(op) ? kFloatsAndInts : kFloats;
    rows->push_back({"Unary", absl::StrCat(UnaryOpName(op), " contiguous [6, 129]"), dtypes,
                     [op](DType dtype, Generator& gen) -> Tensors {
                       return {UnaryOperand(op, {6, 129}, dtype, gen)};
                     },
                     [op](const Tensors& in) -> Tensors { return {Unary(op, in[0])}; }, tol});
    rows->push_back({"Unary", absl::StrCat(UnaryOpName(op), " transposed, offset by one"), dtypes,
                     [op](DType dtype, Generator& gen) -> Tensors {
                       return {UnaryOperand(op, {34, 6}, dtype, gen)};
                     },
                     [op](const Tensors& in) -> Tensors {
                       return {Unary(op, in[0].narrow(0, 1, 33).transpose(0, 1))};
                     },
                     tol});
    rows->push_back({"Unary", absl::StrCat(UnaryOpName(op), " special values"), kFloats,
                     [](DType dtype, Generator&) -> Tensors { return {Specials(dtype)}; },
                     [op](const Tensors& in) -> Tensors { return {Unary(op, in[0])}; }, tol});
  }
  rows->push_back({"Where", "bool [4, 1, 33] picks from [5, 33] and a stride-0 [5, 33]",
                   kFloatsAndInts,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({4, 1, 33}, kBool, gen, 2), Normal({5, 33}, dtype, gen),
                             Normal({1, 33}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Where(in[0], in[1], in[2].expand({5, 33}))};
                   },
                   &ExactTol()});
  rows->push_back(
      {"Where", "u8 condition, transposed operands", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Grid({7, 9}, kU8, gen, 3), Normal({9, 7}, dtype, gen),
                 Specials(dtype).reshape({16}).narrow(0, 0, 9)};
       },
       [](const Tensors& in) -> Tensors { return {Where(in[0], in[1].transpose(0, 1), in[2])}; },
       &ExactTol()});
  // Mixed dtypes promote before the kernel (f16 with f32 -> f32, f16 with bf16 -> f32).
  rows->push_back(
      {"Compare",
       "lt and eq promoted from f16 and f32",
       {kF32},
       [](DType, Generator& gen) -> Tensors {
         return {Grid({3, 17}, kF16, gen), Grid({17}, kF32, gen)};
       },
       [](const Tensors& in) -> Tensors {
         return {Compare(CompareOp::kLt, in[0], in[1]), Compare(CompareOp::kEq, in[0], in[1])};
       },
       &ExactTol()});
  rows->push_back({"Where",
                   "promoted from f16 and bf16",
                   {kF32},
                   [](DType, Generator& gen) -> Tensors {
                     return {Grid({3, 17}, kBool, gen, 2), Normal({3, 17}, kF16, gen),
                             Normal({17}, kBF16, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {Where(in[0], in[1], in[2])}; },
                   &ExactTol()});
  // The device draws the generator's Philox stream itself: the same 0/1 mask bit for bit, from
  // an offset inside a block of four draws, over a length that ends inside one.
  rows->push_back({"DropoutMask", "p 0.3, [7, 33] from draw 5 of seed 77", kFloats,
                   [](DType dtype, Generator&) -> Tensors { return {RawTensor::Zeros({}, dtype)}; },
                   [](const Tensors& in) -> Tensors {
                     Generator gen(77);
                     gen.Reserve(5);
                     return {DropoutMask({7, 33}, 0.3, gen, in[0].dtype(), in[0].device())};
                   },
                   &ExactTol()});
}

// The 1-byte dtypes (u8 and bool), which the floating rows above do not take: u8 arithmetic
// wraps modulo 256, bool sums to i64, and the 1-byte paths of where, gather and index_select.
// All outputs are integers or bool and compare exactly.
void AddByteRows(std::vector<OpRow>* rows) {
  const std::vector<DType> bytes = {kU8, kBool};
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kMul, BinaryOp::kMaximum}) {
    rows->push_back({"Binary",
                     absl::StrCat(BinaryOpName(op), " u8 (wrapping), broadcast"),
                     {kU8},
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Grid({4, 1, 33}, dtype, gen, 256), Grid({5, 1}, dtype, gen, 256)};
                     },
                     [op](const Tensors& in) -> Tensors { return {Binary(op, in[0], in[1])}; },
                     &ExactTol()});
  }
  rows->push_back({"Unary",
                   "neg and relu of u8 (wrapping)",
                   {kU8},
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({6, 35}, dtype, gen, 256)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Unary(UnaryOp::kNeg, in[0]), Unary(UnaryOp::kRelu, in[0])};
                   },
                   &ExactTol()});
  rows->push_back({"BinaryScalar",
                   "u8 plus 200 (wrapping) on a transposed view",
                   {kU8},
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({9, 20}, dtype, gen, 256)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {BinaryScalar(BinaryOp::kAdd, in[0].transpose(0, 1), 200)};
                   },
                   &ExactTol()});
  rows->push_back(
      {"Compare", "le and ne, broadcast", bytes,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Grid({4, 1, 33}, dtype, gen, 3), Grid({5, 1}, dtype, gen, 3)};
       },
       [](const Tensors& in) -> Tensors {
         return {Compare(CompareOp::kLe, in[0], in[1]), Compare(CompareOp::kNe, in[0], in[1])};
       },
       &ExactTol()});
  rows->push_back({"Where", "bool picks from a transposed view and a stride-0 row", bytes,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({7, 9}, kBool, gen, 2), Grid({9, 7}, dtype, gen, 256),
                             Grid({1, 9}, dtype, gen, 256)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Where(in[0], in[1].transpose(0, 1), in[2].expand({7, 9}))};
                   },
                   &ExactTol()});
  rows->push_back({"Sum", "over dim 1 of a permuted [6, 7, 33] (to i64)", bytes,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({7, 33, 6}, dtype, gen, 256)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Sum(in[0].permute({2, 0, 1}), {1}), Sum(in[0])};
                   },
                   &ExactTol()});
  for (const char* op : {"Max", "Argmax"}) {
    rows->push_back({op, "dim 1 of [5, 40] and of [2, 40000] (chunks), with ties", bytes,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Grid({5, 40}, dtype, gen, 7), Grid({2, 40000}, dtype, gen, 7)};
                     },
                     [op](const Tensors& in) -> Tensors {
                       if (std::string(op) == "Max") return {Max(in[0], 1), Max(in[1], 1)};
                       return {Argmax(in[0], 1), Argmax(in[1], 1)};
                     },
                     &ExactTol()});
  }
  rows->push_back({"Gather", "dim 1 of [5, 7, 6] at [5, 4, 6]", bytes,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({5, 7, 6}, dtype, gen, 256), Indices({5, 4, 6}, 7, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {Gather(in[0], 1, in[1])}; },
                   &ExactTol()});
  rows->push_back(
      {"IndexSelect", "dim 2 of a transposed [5, 7, 6]", bytes,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Grid({5, 6, 7}, dtype, gen, 256), Indices({8}, 6, gen)};
       },
       [](const Tensors& in) -> Tensors { return {IndexSelect(in[0].transpose(1, 2), 2, in[1])}; },
       &ExactTol()});
  rows->push_back(
      {"ScatterAdd",
       "u8 [5, 9, 6] into dim 1 of [5, 7, 6] (repeats, wrapping)",
       {kU8},
       [](DType dtype, Generator& gen) -> Tensors {
         return {Grid({5, 7, 6}, dtype, gen, 256), Indices({5, 9, 6}, 7, gen),
                 Grid({5, 9, 6}, dtype, gen, 256)};
       },
       [](const Tensors& in) -> Tensors { return {ScatterAdd(in[0], 1, in[1], in[2])}; },
       &ExactTol()});
  rows->push_back({"IndexAdd",
                   "u8 [9, 7, 6] into dim 0 of [5, 7, 6] (wrapping)",
                   {kU8},
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({5, 7, 6}, dtype, gen, 256), Indices({9}, 5, gen),
                             Grid({9, 7, 6}, dtype, gen, 256)};
                   },
                   [](const Tensors& in) -> Tensors { return {IndexAdd(in[0], 0, in[1], in[2])}; },
                   &ExactTol()});
}

void AddReductionRows(std::vector<OpRow>* rows) {
  struct Dims {
    std::vector<int64_t> dims;
    bool keepdim;
  };
  const Dims reductions[] = {{{}, false}, {{1}, false}, {{0, 2}, true}, {{-1}, true}};
  for (const Dims& r : reductions) {
    const std::string what = absl::StrCat("over ", ShapeToString(r.dims),
                                          r.keepdim ? " keepdim" : "", " of a permuted [6, 7, 33]");
    rows->push_back({"Sum", what, kFloatsAndInts,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({7, 33, 6}, dtype, gen)};
                     },
                     [r](const Tensors& in) -> Tensors {
                       return {Sum(in[0].permute({2, 0, 1}), r.dims, r.keepdim)};
                     },
                     &SumTol()});
    rows->push_back({"Mean", what, kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({7, 33, 6}, dtype, gen)};
                     },
                     [r](const Tensors& in) -> Tensors {
                       return {Mean(in[0].permute({2, 0, 1}), r.dims, r.keepdim)};
                     },
                     &SumTol()});
  }
  rows->push_back(
      {"Sum", "a full reduction of 100003 elements (several blocks per row)", kFloats,
       [](DType dtype, Generator& gen) -> Tensors { return {Normal({100003}, dtype, gen)}; },
       [](const Tensors& in) -> Tensors { return {Sum(in[0])}; }, &SumTol()});
  for (int64_t dim : {0, 1, -1}) {
    rows->push_back({"Max", absl::StrCat("dim ", dim, " with ties"), kFloatsAndInts,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Grid({5, 6, 40}, dtype, gen, 7)};
                     },
                     [dim](const Tensors& in) -> Tensors { return {Max(in[0], dim, dim == 1)}; },
                     &ExactTol()});
    rows->push_back({"Argmax", absl::StrCat("dim ", dim, " with ties (the first maximum)"),
                     kFloatsAndInts,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Grid({5, 6, 40}, dtype, gen, 7)};
                     },
                     [dim](const Tensors& in) -> Tensors {
                       return {Argmax(in[0].transpose(0, 2), dim, dim == 0)};
                     },
                     &ExactTol()});
  }
  // Few long rows: cut into chunks reduced by separate blocks, then a second pass (reduce.cu).
  rows->push_back({"Sum", "over dim -1 of [3, 40000] (rows cut into chunks)", kFloatsAndInts,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({3, 40000}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {Sum(in[0], {-1})}; }, &SumTol()});
  for (const char* op : {"Max", "Argmax"}) {
    rows->push_back({op, "dim -1 of [3, 40000] (rows cut into chunks, ties across chunks)",
                     kFloatsAndInts,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Grid({3, 40000}, dtype, gen, 7)};
                     },
                     [op](const Tensors& in) -> Tensors {
                       return {std::string(op) == "Max" ? Max(in[0], -1) : Argmax(in[0], -1)};
                     },
                     &ExactTol()});
  }
  // Empty reductions (a sum of nothing is 0, a mean of nothing NaN) and 0-d inputs.
  rows->push_back({"Sum", "over dim 0 of an empty [0, 5], and every dim of an empty [3, 0]",
                   kFloatsAndInts,
                   [](DType dtype, Generator&) -> Tensors {
                     return {RawTensor::Zeros({0, 5}, dtype), RawTensor::Zeros({3, 0}, dtype)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Sum(in[0], {0}), Sum(in[1])};
                   },
                   &SumTol()});
  rows->push_back({"Mean", "over dim 0 of an empty [0, 5] (NaN)", kFloats,
                   [](DType dtype, Generator&) -> Tensors {
                     return {RawTensor::Zeros({0, 5}, dtype)};
                   },
                   [](const Tensors& in) -> Tensors { return {Mean(in[0], {0})}; }, &SumTol()});
  for (const char* op : {"Sum", "Mean", "Max", "Argmax"}) {
    rows->push_back(
        {op, "of a 0-d tensor", kFloats,
         [](DType dtype, Generator& gen) -> Tensors { return {Normal({}, dtype, gen)}; },
         [op](const Tensors& in) -> Tensors {
           const std::string name = op;
           if (name == "Sum") return {Sum(in[0]), Sum(in[0], {0}, true)};
           if (name == "Mean") return {Mean(in[0])};
           if (name == "Max") return {Max(in[0], 0)};
           return {Argmax(in[0], -1, true)};
         },
         std::string(op) == "Sum" || std::string(op) == "Mean" ? &SumTol() : &ExactTol()});
  }
  rows->push_back({"Max", "NaN and infinities (NaN wins)", kFloats,
                   [](DType dtype, Generator&) -> Tensors { return {Specials(dtype)}; },
                   [](const Tensors& in) -> Tensors {
                     return {Max(in[0], 1), Max(in[0], 0)};
                   },
                   &ExactTol()});
  rows->push_back({"Argmax", "NaN and infinities (a NaN is the maximum)", kFloats,
                   [](DType dtype, Generator&) -> Tensors { return {Specials(dtype)}; },
                   [](const Tensors& in) -> Tensors {
                     return {Argmax(in[0], 1), Argmax(in[0], 0)};
                   },
                   &ExactTol()});
}

void AddMatmulRows(std::vector<OpRow>* rows) {
  rows->push_back({"Matmul", "[2, 3, 17, 64] @ [64, 19] (batch broadcast)", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 3, 17, 64}, dtype, gen), Normal({64, 19}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {Matmul(in[0], in[1])}; },
                   &MatmulTol()});
  rows->push_back({"Matmul", "[33, 48] @ transposed [48, 40], both views", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({48, 33}, dtype, gen), Normal({40, 48}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Matmul(in[0].transpose(0, 1), in[1].transpose(0, 1))};
                   },
                   &MatmulTol()});
  rows->push_back({"Matmul", "vector @ [3, 64, 5] and [3, 5, 64] @ vector", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({64}, dtype, gen), Normal({3, 64, 5}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {Matmul(in[0], in[1]), Matmul(in[1].transpose(1, 2), in[0])};
                   },
                   &MatmulTol()});
  rows->push_back({"Bmm", "[4, 16, 64] @ [4, 64, 8]", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({4, 16, 64}, dtype, gen), Normal({4, 64, 8}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {Bmm(in[0], in[1])}; }, &MatmulTol()});
}

// Targets [n] in [0, classes) with rows 1 and n - 2 ignored (ignore_index -100).
RawTensor Targets(int64_t n, int64_t classes, Generator& gen, DType dtype = kI64) {
  std::vector<int64_t> t = Indices({n}, classes, gen).to_vector<int64_t>();
  t[1] = -100;
  t[n - 2] = -100;
  return RawTensor::FromVector<int64_t>(t, {n}).to(dtype);
}

const char* ReductionName(Reduction r) {
  return r == Reduction::kMean ? "mean" : r == Reduction::kSum ? "sum" : "none";
}

void AddNnRows(std::vector<OpRow>* rows) {
  for (bool log : {false, true}) {
    const std::string op = log ? "LogSoftmax" : "Softmax";
    rows->push_back(
        {op, "[7, 1000] rows, scale 3", kFloats,
         [](DType dtype, Generator& gen) -> Tensors {
           return {Normal({7, 1000}, dtype, gen, 3)};
         },
         [log](const Tensors& in) -> Tensors { return {log ? LogSoftmax(in[0]) : Softmax(in[0])}; },
         &SoftmaxTol()});
    rows->push_back({op, "over dim 0 of a transposed [5, 33] (a strided last dim)", kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({5, 33}, dtype, gen, 3)};
                     },
                     [log](const Tensors& in) -> Tensors {
                       const RawTensor x = in[0].transpose(0, 1);
                       return {log ? LogSoftmax(x) : Softmax(x)};
                     },
                     &SoftmaxTol()});
    rows->push_back(
        {op, "rows with -inf, inf and NaN", kFloats,
         [](DType dtype, Generator&) -> Tensors { return {SoftmaxSpecials(dtype)}; },
         [log](const Tensors& in) -> Tensors { return {log ? LogSoftmax(in[0]) : Softmax(in[0])}; },
         &SoftmaxTol()});
  }
  rows->push_back({"LayerNorm", "[6, 257] with weight and bias", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({6, 257}, dtype, gen, 2), Normal({257}, dtype, gen),
                             Normal({257}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const LayerNormResult r = LayerNorm(in[0], in[1], in[2], 1e-5);
                     return {r.output, r.mean, r.rstd};
                   },
                   &NormTol()});
  rows->push_back({"LayerNorm", "[2, 3, 64] transposed view, no weight or bias", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 64, 3}, dtype, gen, 2)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const LayerNormResult r =
                         LayerNorm(in[0].transpose(1, 2), RawTensor(), RawTensor(), 1e-3);
                     return {r.output, r.mean, r.rstd};
                   },
                   &NormTol()});
  rows->push_back({"LlamaRmsNorm", "[2, 3, 257] with a weight of the input's dtype", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 3, 257}, dtype, gen, 2), Normal({257}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const LlamaRmsNormResult r = LlamaRmsNorm(in[0], in[1], 1e-6);
                     return {r.output, r.rstd};
                   },
                   &NormTol()});
  rows->push_back({"LlamaRmsNorm", "[6, 64] transposed view, an f32 weight (composed)", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({64, 6}, dtype, gen, 2), Normal({64}, kF32, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const LlamaRmsNormResult r = LlamaRmsNorm(in[0].transpose(0, 1), in[1], 1e-5);
                     return {r.output, r.rstd};
                   },
                   &NormTol()});
  for (bool need_weight : {true, false}) {
    rows->push_back({"LlamaRmsNormBackward",
                     need_weight ? "[6, 257] with the weight's gradient" : "[2, 3, 64] input only",
                     kFloats,
                     [need_weight](DType dtype, Generator& gen) -> Tensors {
                       const Shape shape = need_weight ? Shape{6, 257} : Shape{2, 3, 64};
                       const RawTensor x = Normal(shape, dtype, gen, 2);
                       const RawTensor w = Normal({shape.back()}, dtype, gen);
                       const LlamaRmsNormResult fwd = LlamaRmsNorm(x, w, 1e-6);
                       return {Normal(shape, dtype, gen), x, fwd.rstd, w};
                     },
                     [need_weight](const Tensors& in) -> Tensors {
                       const LlamaRmsNormGrads g =
                           LlamaRmsNormBackward(in[0], in[1], in[2], in[3], need_weight);
                       return {g.grad_input, g.grad_weight};
                     },
                     &NormTol()});
  }
  rows->push_back(
      {"Swiglu", "[3, 257] gate, a transposed up", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({3, 257}, dtype, gen, 3), Normal({257, 3}, dtype, gen)};
       },
       [](const Tensors& in) -> Tensors { return {Swiglu(in[0], in[1].transpose(0, 1))}; },
       &TranscendentalTol()});
  rows->push_back({"SwigluBackward", "[2, 3, 100]", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 3, 100}, dtype, gen), Normal({2, 3, 100}, dtype, gen, 3),
                             Normal({2, 3, 100}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const SwigluGrads g = SwigluBackward(in[0], in[1], in[2]);
                     return {g.grad_gate, g.grad_up};
                   },
                   &TranscendentalTol()});
  rows->push_back({"RotaryEmbedding", "[2, 3, 5, 16] heads-major view of [2, 5, 3, 16]", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 5, 3, 16}, dtype, gen, 2), Normal({5, 16}, dtype, gen),
                             Normal({5, 16}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {RotaryEmbedding(in[0].transpose(1, 2), in[1], in[2])};
                   },
                   &NormTol()});
  rows->push_back(
      {"RotaryEmbeddingBackward", "[4, 7, 8]", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({4, 7, 8}, dtype, gen, 2), Normal({7, 8}, dtype, gen),
                 Normal({7, 8}, dtype, gen)};
       },
       [](const Tensors& in) -> Tensors { return {RotaryEmbeddingBackward(in[0], in[1], in[2])}; },
       &NormTol()});
  rows->push_back({"AddLayerNorm", "[2, 3, 257] residual + block output, with weight and bias",
                   kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 3, 257}, dtype, gen, 2), Normal({2, 3, 257}, dtype, gen),
                             Normal({257}, dtype, gen), Normal({257}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const AddLayerNormResult r = AddLayerNorm(in[0], in[1], in[2], in[3], 1e-5);
                     return {r.residual, r.norm.output, r.norm.mean, r.norm.rstd};
                   },
                   &NormTol()});
  for (bool affine : {true, false}) {
    rows->push_back({"LayerNormBackward",
                     affine ? "[6, 257] with weight" : "[2, 3, 64] without weight", kFloats,
                     [affine](DType dtype, Generator& gen) -> Tensors {
                       const Shape shape = affine ? Shape{6, 257} : Shape{2, 3, 64};
                       const RawTensor x = Normal(shape, dtype, gen, 2);
                       const RawTensor w =
                           affine ? Normal({shape.back()}, dtype, gen) : RawTensor();
                       const LayerNormResult fwd = LayerNorm(x, w, RawTensor(), 1e-5);
                       return {Normal(shape, dtype, gen), x, fwd.mean, fwd.rstd, w};
                     },
                     [](const Tensors& in) -> Tensors {
                       const LayerNormGrads g =
                           LayerNormBackward(in[0], in[1], in[2], in[3], in[4]);
                       return {g.grad_input, g.grad_weight, g.grad_bias};
                     },
                     &NormTol()});
  }
  for (DType index : {kI64, kI32}) {
    rows->push_back({"Embedding", absl::StrCat("[50, 16] rows at ", DTypeName(index), " [3, 7]"),
                     kFloatsAndInts,
                     [index](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({50, 16}, dtype, gen), Indices({3, 7}, 50, gen, index)};
                     },
                     [](const Tensors& in) -> Tensors { return {Embedding(in[0], in[1])}; },
                     &ExactTol()});
  }
  rows->push_back(
      {"EmbeddingBackward", "[3, 7, 16] into 12 rows (repeated indices)", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({3, 7, 16}, dtype, gen), Indices({3, 7}, 10, gen)};
       },
       [](const Tensors& in) -> Tensors { return {EmbeddingBackward(in[0], in[1], 12)}; },
       &AccumulateTol()});
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    const std::string what =
        absl::StrCat(ReductionName(reduction), ", [9, 1000] logits, two rows ignored");
    rows->push_back({"CrossEntropy", what, kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({9, 1000}, dtype, gen, 3), Targets(9, 1000, gen)};
                     },
                     [reduction](const Tensors& in) -> Tensors {
                       return {CrossEntropy(in[0], in[1], -100, reduction)};
                     },
                     &SoftmaxTol()});
    rows->push_back({"CrossEntropyBackward", what, kFloats,
                     [reduction](DType dtype, Generator& gen) -> Tensors {
                       const Shape grad_shape = reduction == Reduction::kNone ? Shape{9} : Shape{};
                       return {Normal({9, 1000}, dtype, gen, 3), Targets(9, 1000, gen, kI32),
                               Normal(grad_shape, dtype, gen)};
                     },
                     [reduction](const Tensors& in) -> Tensors {
                       return {CrossEntropyBackward(in[0], in[1], in[2], -100, reduction)};
                     },
                     &SoftmaxTol()});
    rows->push_back({"CrossEntropyWithGrad", what + ", grad_scale 1024", kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({9, 1000}, dtype, gen, 3), Targets(9, 1000, gen)};
                     },
                     [reduction](const Tensors& in) -> Tensors {
                       const CrossEntropyResult r =
                           CrossEntropyWithGrad(in[0], in[1], -100, reduction, 1024);
                       return {r.loss, r.grad_logits};
                     },
                     &SoftmaxTol()});
  }
  rows->push_back(
      {"CrossEntropyWithGrad", "all rows ignored (NaN mean, zero gradient)", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({3, 10}, dtype, gen), RawTensor::FromVector<int64_t>({-1, -1, -1}, {3})};
       },
       [](const Tensors& in) -> Tensors {
         const CrossEntropyResult r = CrossEntropyWithGrad(in[0], in[1], -1);
         return {r.loss, r.grad_logits};
       },
       &SoftmaxTol()});
}

void AddIndexRows(std::vector<OpRow>* rows) {
  for (DType index : {kI64, kI32}) {
    const std::string idx = DTypeName(index);
    rows->push_back(
        {"Gather", absl::StrCat("dim 1 of [5, 7, 6] at ", idx, " [5, 4, 6]"), kFloatsAndInts,
         [index](DType dtype, Generator& gen) -> Tensors {
           return {Normal({5, 7, 6}, dtype, gen), Indices({5, 4, 6}, 7, gen, index)};
         },
         [](const Tensors& in) -> Tensors { return {Gather(in[0], 1, in[1])}; }, &ExactTol()});
    rows->push_back(
        {"ScatterAdd", absl::StrCat("[5, 9, 6] into dim 1 of [5, 7, 6] at ", idx, " (repeats)"),
         kFloatsAndInts,
         [index](DType dtype, Generator& gen) -> Tensors {
           return {Normal({5, 7, 6}, dtype, gen), Indices({5, 9, 6}, 7, gen, index),
                   Normal({5, 9, 6}, dtype, gen)};
         },
         [](const Tensors& in) -> Tensors { return {ScatterAdd(in[0], 1, in[1], in[2])}; },
         &AccumulateTol()});
    rows->push_back({"IndexSelect", absl::StrCat("dim 2 of a transposed [5, 7, 6] at ", idx),
                     kFloatsAndInts,
                     [index](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({5, 6, 7}, dtype, gen), Indices({8}, 6, gen, index)};
                     },
                     [](const Tensors& in) -> Tensors {
                       return {IndexSelect(in[0].transpose(1, 2), 2, in[1])};
                     },
                     &ExactTol()});
    rows->push_back(
        {"IndexAdd", absl::StrCat("[9, 7, 6] into dim 0 of [5, 7, 6] at ", idx), kFloatsAndInts,
         [index](DType dtype, Generator& gen) -> Tensors {
           return {Normal({5, 7, 6}, dtype, gen), Indices({9}, 5, gen, index),
                   Normal({9, 7, 6}, dtype, gen)};
         },
         [](const Tensors& in) -> Tensors { return {IndexAdd(in[0], 0, in[1], in[2])}; },
         &AccumulateTol()});
  }
}

void AddWindowRows(std::vector<OpRow>* rows) {
  struct ConvCase {
    std::string name;
    Shape x, w;
    bool bias;
    Conv2dParams p;
  };
  const ConvCase cases[] = {
      {"[2, 3, 9, 10] * [4, 3, 3, 3] + bias, stride 2, padding 1",
       {2, 3, 9, 10},
       {4, 3, 3, 3},
       true,
       {{2, 2}, {1, 1}, {1, 1}}},
      {"[2, 3, 9, 10] * [5, 3, 3, 2], dilation [2, 1], padding [2, 0]",
       {2, 3, 9, 10},
       {5, 3, 3, 2},
       false,
       {{1, 1}, {2, 0}, {2, 1}}},
  };
  for (const ConvCase& c : cases) {
    rows->push_back(
        {"Conv2d", c.name, kFloats,
         [c](DType dtype, Generator& gen) -> Tensors {
           return {Normal(c.x, dtype, gen), Normal(c.w, dtype, gen),
                   c.bias ? Normal({c.w[0]}, dtype, gen) : RawTensor()};
         },
         [c](const Tensors& in) -> Tensors { return {Conv2d(in[0], in[1], in[2], c.p)}; },
         c.bias ? &ConvBiasTol() : &ConvTol()});
    rows->push_back({"Conv2dBackward", c.name, kFloats,
                     [c](DType dtype, Generator& gen) -> Tensors {
                       const RawTensor x = Normal(c.x, dtype, gen), w = Normal(c.w, dtype, gen);
                       return {Normal(Conv2d(x, w, RawTensor(), c.p).shape(), dtype, gen), x, w};
                     },
                     [c](const Tensors& in) -> Tensors {
                       const Conv2dGrads g = Conv2dBackward(in[0], in[1], in[2], c.p);
                       return {g.grad_input, g.grad_weight, g.grad_bias};
                     },
                     &ConvTol()});
  }
  rows->push_back({"Conv2dBackward", "only the weight gradient", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({2, 4, 7, 8}, dtype, gen), Normal({2, 3, 9, 10}, dtype, gen),
                             Normal({4, 3, 3, 3}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const Conv2dGrads g =
                         Conv2dBackward(in[0], in[1], in[2], {}, false, true, false);
                     return {g.grad_input, g.grad_weight, g.grad_bias};
                   },
                   &ConvTol()});
  rows->push_back({"MaxPool2d", "[2, 3, 9, 10], kernel 3, stride 2, padding 1, with ties", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Grid({2, 3, 9, 10}, dtype, gen, 6)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const MaxPool2dResult r = MaxPool2d(in[0], {3, 3}, {2, 2}, {1, 1});
                     return {r.output, r.indices};
                   },
                   &ExactTol()});
  rows->push_back({"MaxPool2d", "NaN and infinities in the windows", kFloats,
                   [](DType dtype, Generator&) -> Tensors {
                     return {Specials(dtype).reshape({1, 1, 4, 4})};
                   },
                   [](const Tensors& in) -> Tensors {
                     const MaxPool2dResult r = MaxPool2d(in[0], {2, 2}, {1, 1});
                     return {r.output, r.indices};
                   },
                   &ExactTol()});
  rows->push_back({"MaxPool2dBackward", "overlapping windows (kernel 3, stride 2)", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     const RawTensor x = Normal({2, 3, 9, 10}, dtype, gen);
                     const MaxPool2dResult fwd = MaxPool2d(x, {3, 3}, {2, 2}, {1, 1});
                     return {Normal(fwd.output.shape(), dtype, gen), fwd.indices};
                   },
                   [](const Tensors& in) -> Tensors {
                     return {MaxPool2dBackward(in[0], in[1], {2, 3, 9, 10})};
                   },
                   &AccumulateTol()});
}

void AddMixedPrecisionRows(std::vector<OpRow>* rows) {
  for (bool finite : {true, false}) {
    const std::string what = finite ? "finite tensors" : "an inf in the second tensor";
    rows->push_back({"AnyNonFinite", what + " and an integer one", kFloats,
                     [finite](DType dtype, Generator& gen) -> Tensors {
                       RawTensor b = Normal({5, 3}, dtype, gen);
                       if (!finite) b = WithValueAt(b, 7, kInf);
                       return {Normal({37}, dtype, gen), b, Grid({4}, kI32, gen)};
                     },
                     [](const Tensors& in) -> Tensors {
                       // The host answer, as a tensor on the inputs' device.
                       return {
                           RawTensor::Scalar(AnyNonFinite(in) ? 1 : 0, kI64).to(in[0].device())};
                     },
                     &ExactTol()});
    rows->push_back({"NonFiniteCheckAndUnscale", what + ", inv_scale 1/1024", kFloats,
                     [finite](DType dtype, Generator& gen) -> Tensors {
                       RawTensor b = Normal({5, 3}, dtype, gen);
                       if (!finite) b = WithValueAt(b, 7, kInf);
                       return {Normal({37}, dtype, gen), b, RawTensor::Zeros({}, kF32),
                               RawTensor::Full({}, 1.0 / 1024, kF32)};
                     },
                     [](const Tensors& in) -> Tensors {
                       const RawTensor a = in[0].clone(), b = in[1].clone(), found = in[2].clone();
                       NonFiniteCheckAndUnscale({a, b}, found, in[3]);
                       return {a, b, found};
                     },
                     &ScaleTol()});
  }
  // The loss-scale state machine where the state lives: PyTorch's dynamic scaler (f32 scale,
  // growth 2 every 2 clean steps, backoff 0.5) through a sequence of found_inf flags; every step's
  // scale and 1/scale, then the state read back. One row covers the four loss-scale ops.
  for (const char* op :
       {"StepLossScale", "WriteLossScale", "LossScaleStateTensor", "ReadLossScaleState"}) {
    rows->push_back(
        {op,
         "PyTorch-like dynamic scaler over 10 steps with 3 overflows",
         {kU8},
         [](DType, Generator&) -> Tensors {
           return {RawTensor::FromVector<double>({0, 0, 1, 0, 0, 0, 1, 1, 0, 0}, {10}).to(kU8)};
         },
         [](const Tensors& in) -> Tensors {
           const Device device = in[0].device();
           LossScaleState init{};
           init.growth_factor = 2;
           init.backoff_factor = 0.5;
           init.min_scale = 0;
           init.max_scale = 0x1.fffffep127;
           init.growth_interval = 2;
           init.hysteresis = 1;
           init.dynamic = true;
           init.f32_scale = true;
           init.skip_nonfinite_growth = true;
           init.scale = 65536;
           const RawTensor state = LossScaleStateTensor(init, device);
           const RawTensor flags = in[0].to(Device()),
                           scales = RawTensor::Zeros({11}, kF32, device),
                           invs = RawTensor::Zeros({11}, kF32, device);
           WriteLossScale(state, scales.narrow(0, 0, 1), invs.narrow(0, 0, 1));
           for (int64_t i = 0; i < 10; ++i) {
             const RawTensor found = RawTensor::Full({}, flags.data<uint8_t>()[i], kF32, device);
             StepLossScale(state, found, scales.narrow(0, i + 1, 1), invs.narrow(0, i + 1, 1));
           }
           const LossScaleState end = ReadLossScaleState(state);
           // The state read back, as a tensor on the state's device like the other outputs.
           return {
               scales, invs,
               RawTensor::FromVector<double>({end.scale, static_cast<double>(end.growth_tracker),
                                              static_cast<double>(end.iteration)},
                                             {3})
                   .to(device)};
         },
         &ExactTol()});
  }
  rows->push_back({"MulScalarInPlace", "two tensors times 0.37, one a transposed view", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({37}, dtype, gen), Normal({6, 5}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const RawTensor a = in[0].clone(), b = in[1].clone();
                     MulScalarInPlace({a, b.transpose(0, 1)}, 0.37);
                     return {a, b};
                   },
                   &ScaleTol()});
}

// The FP8 ops (tensor/cuda/fp8.cu, fp8_gemm.cc; their own test, fp8_kernels_test, covers every
// case): amaxes, scales and casts bit-exact, the GEMM within f32 accumulation differences.
const Tols& Fp8GemmTol() {
  static const Tols* t = new Tols(Computed(
      0, 1e-2,
      "FP8 GEMM with k = 256: exact FP8 products summed in f32 on the CPU (oneDNN bf16) and by "
      "cuBLASLt's FP8 tensor cores, whose MMA keeps about 13 mantissa bits between cuBLASLt's "
      "promotions to f32 (fp8_kernels_test allows 2^-8 of sum |a b| for it): sum |a b| is about "
      "2.5x the largest output here, so 1e-2 of it (the fallback, [33, 200] x [17, 200], is f32 "
      "throughout and far inside)"));
  return *t;
}

// x [37, 300] of `dtype` with NaN, inf and -0 in it (edge tiles in both dims).
RawTensor Fp8Input(DType dtype, Generator& gen) {
  RawTensor x = Normal({37, 300}, kF32, gen, 4);
  x = WithValueAt(x, 0, kNaN);
  x = WithValueAt(x, 301, kInf);
  x = WithValueAt(x, 5000, -0.0);
  return x.to(dtype);
}

void AddFp8Rows(std::vector<OpRow>* rows) {
  const std::vector<DType> inputs = {kF32, kF16, kBF16};
  const Fp8Tiling tilings[] = {Fp8Tiling::kTensor, Fp8Tiling::k1x128, Fp8Tiling::k128x128};
  rows->push_back({"Fp8Amax", "[37, 300] with NaN and inf, every tiling", inputs,
                   [](DType dtype, Generator& gen) -> Tensors { return {Fp8Input(dtype, gen)}; },
                   [tilings](const Tensors& in) -> Tensors {
                     Tensors out;
                     for (Fp8Tiling t : tilings) out.push_back(Fp8Amax(in[0], t));
                     return out;
                   },
                   &ExactTol()});
  rows->push_back(
      {"Fp8ScaleFromAmax", "zero, inf, NaN, tiny and huge amaxes, E4M3 and E5M2, power of 2",
       inputs,
       [](DType dtype, Generator& gen) -> Tensors {
         // The amax is f32 whatever the row's dtype; the dtype picks the draw.
         std::vector<double> v = Abs(Normal({8}, dtype, gen)).to_vector<double>();
         v.insert(v.end(), {0, kInf, kNaN, 1, 3.5, 448, 1e-30, 1e-45, 1e30, 57344, 2.5e-3, 3e38});
         return {RawTensor::FromVector<double>(v, {20}, kF32)};
       },
       [](const Tensors& in) -> Tensors {
         Fp8ScaleOptions e5m2;
         e5m2.fp8_max = 57344;
         Fp8ScaleOptions pow2;
         pow2.force_pow_2_scales = true;
         pow2.amax_epsilon = 1e-3f;
         const Fp8Scales a = Fp8ScaleFromAmax(in[0], Fp8ScaleOptions());
         const Fp8Scales b = Fp8ScaleFromAmax(in[0], e5m2);
         const Fp8Scales c = Fp8ScaleFromAmax(in[0], pow2);
         return {a.scale, a.scale_inv, b.scale, b.scale_inv, c.scale, c.scale_inv};
       },
       &ExactTol()});
  rows->push_back(
      {"Fp8Cast", "[37, 300] to E4M3 and E5M2, every tiling, with transpose and amax", inputs,
       [](DType dtype, Generator& gen) -> Tensors { return {Fp8Input(dtype, gen)}; },
       [tilings](const Tensors& in) -> Tensors {
         Tensors out;
         for (Fp8Tiling t : tilings) {
           for (DType format : {kF8E4M3, kF8E5M2}) {
             Fp8ScaleOptions o;
             o.fp8_max = format == kF8E4M3 ? 448.0f : 57344.0f;
             // 2x TE's scale: each tile's largest values saturate.
             const RawTensor scale = MulScalar(Fp8ScaleFromAmax(Fp8Amax(in[0], t), o).scale, 2);
             const Fp8CastResult r = Fp8Cast(in[0], scale, t, format, true, true);
             out.insert(out.end(), {r.data, r.data_t, r.amax});
           }
         }
         return out;
       },
       &ExactTol()});
  // [64, 256] x [32, 256]: cuBLASLt's FP8 matmul on sm_89 / sm_90; [33, 200] x [17, 200]: the
  // bf16 fallback. Out (and bias) in the row's dtype.
  rows->push_back(
      {"Fp8Gemm", "E4M3 x E5M2, per-tensor and 1x128 x 128x128 scales, with bias", inputs,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({64, 256}, kF32, gen, 8).to(kF8E4M3),
                 Normal({32, 256}, kF32, gen, 8).to(kF8E5M2),
                 Uniform({64, 2}, kF32, gen, 0.05, 2),
                 Uniform({1, 2}, kF32, gen, 0.05, 2),
                 Normal({32}, dtype, gen),
                 Normal({33, 200}, kF32, gen, 8).to(kF8E4M3),
                 Normal({17, 200}, kF32, gen, 8).to(kF8E4M3)};
       },
       [](const Tensors& in) -> Tensors {
         const DType out = in[4].dtype();
         const RawTensor s1 = in[2].narrow(0, 0, 1).narrow(1, 0, 1).contiguous();
         const RawTensor s2 = in[3].narrow(1, 0, 1).contiguous();
         return {Fp8Gemm(in[0], s1, Fp8Tiling::kTensor, in[1], s2, Fp8Tiling::kTensor, in[4], out),
                 Fp8Gemm(in[0], in[2], Fp8Tiling::k1x128, in[1], in[3], Fp8Tiling::k128x128, in[4],
                         out),
                 Fp8Gemm(in[5], s1, Fp8Tiling::kTensor, in[6], s2, Fp8Tiling::kTensor, RawTensor(),
                         out)};
       },
       &Fp8GemmTol()});
}

void AddFusedRows(std::vector<OpRow>* rows) {
  struct LinearCase {
    std::string name;
    int64_t out;
    bool bias;
    Activation act;
    bool transposed_x;
  };
  const LinearCase cases[] = {
      {"[2, 5, 64] -> 48 with bias", 48, true, Activation::kNone, false},
      {"[2, 5, 64] -> 48 with bias and GELU", 48, true, Activation::kGeluTanh, false},
      {"[2, 5, 64] -> 20 with GELU, no bias (padded pre-activation rows)", 20, false,
       Activation::kGeluTanh, false},
      {"transposed [10, 64] -> 20, no bias", 20, false, Activation::kNone, true},
  };
  for (const LinearCase& c : cases) {
    rows->push_back({"Linear", c.name, kFloats,
                     [c](DType dtype, Generator& gen) -> Tensors {
                       return {Normal(c.transposed_x ? Shape{64, 10} : Shape{2, 5, 64}, dtype, gen),
                               Normal({c.out, 64}, dtype, gen, 0.125),
                               c.bias ? Normal({c.out}, dtype, gen) : RawTensor()};
                     },
                     [c](const Tensors& in) -> Tensors {
                       const RawTensor x = c.transposed_x ? in[0].transpose(0, 1) : in[0];
                       const LinearResult r = Linear(x, in[1], in[2], c.act);
                       return {r.output, r.pre_activation};
                     },
                     &LinearTol()});
    for (bool all : {true, false}) {
      rows->push_back(
          {"LinearBackward", c.name + (all ? "" : ", only the bias and input gradients"), kFloats,
           [c](DType dtype, Generator& gen) -> Tensors {
             const RawTensor x =
                 Normal(c.transposed_x ? Shape{64, 10} : Shape{2, 5, 64}, dtype, gen);
             const RawTensor w = Normal({c.out, 64}, dtype, gen, 0.125);
             const RawTensor xv = c.transposed_x ? x.transpose(0, 1) : x;
             const LinearResult fwd =
                 Linear(xv, w, c.bias ? Normal({c.out}, dtype, gen) : RawTensor(), c.act);
             return {Normal(fwd.output.shape(), dtype, gen), x, w, fwd.pre_activation};
           },
           [c, all](const Tensors& in) -> Tensors {
             const RawTensor x = c.transposed_x ? in[1].transpose(0, 1) : in[1];
             const LinearGrads g = LinearBackward(in[0], x, in[2], in[3], c.act, true, all, true);
             return {g.grad_input, g.grad_weight, g.grad_bias};
           },
           &LinearBackwardTol()});
    }
  }
  struct AttentionCase {
    std::string name;
    int64_t b, h, tq, tk, d;
    bool causal;
    bool packed;  // heads sliced out of a [B, T, 3, H, D] projection
  };
  const AttentionCase attention[] = {
      {"[2, 3, 16, 64] causal (cuDNN-eligible in f16/bf16)", 2, 3, 16, 16, 64, true, false},
      {"[2, 3, 16, 64] full", 2, 3, 16, 16, 64, false, false},
      {"[1, 2, 7, 12] queries over 9 keys (head size 12: composed)", 1, 2, 7, 9, 12, false, false},
      {"heads sliced from a packed [2, 16, 3, 2, 64] projection, causal", 2, 2, 16, 16, 64, true,
       true},
  };
  for (const AttentionCase& c : attention) {
    // q, k, v (and, for the backward, grad_out) from one set of CPU tensors.
    const auto heads = [c](DType dtype, Generator& gen) -> Tensors {
      if (c.packed) return {Normal({c.b, c.tq, 3, c.h, c.d}, dtype, gen)};
      return {Normal({c.b, c.h, c.tq, c.d}, dtype, gen), Normal({c.b, c.h, c.tk, c.d}, dtype, gen),
              Normal({c.b, c.h, c.tk, c.d}, dtype, gen)};
    };
    const auto qkv = [c](const Tensors& in) -> Tensors {
      if (!c.packed) return {in[0], in[1], in[2]};
      return {in[0].select(2, 0).permute({0, 2, 1, 3}), in[0].select(2, 1).permute({0, 2, 1, 3}),
              in[0].select(2, 2).permute({0, 2, 1, 3})};
    };
    const double scale = 1 / std::sqrt(static_cast<double>(c.d));
    rows->push_back({"ScaledDotProductAttention", c.name, kFloats, heads,
                     [c, qkv, scale](const Tensors& in) -> Tensors {
                       const Tensors h = qkv(in);
                       const AttentionResult r =
                           ScaledDotProductAttention(h[0], h[1], h[2], c.causal, scale);
                       return {r.output, r.stats};
                     },
                     &AttentionTol()});
    rows->push_back({"ScaledDotProductAttentionBackward", c.name, kFloats,
                     [c, heads, qkv, scale](DType dtype, Generator& gen) -> Tensors {
                       Tensors in = heads(dtype, gen);
                       const Tensors h = qkv(in);
                       const AttentionResult fwd =
                           ScaledDotProductAttention(h[0], h[1], h[2], c.causal, scale);
                       in.push_back(Normal(fwd.output.shape(), dtype, gen));
                       in.push_back(fwd.output);
                       in.push_back(fwd.stats);
                       return in;
                     },
                     [c, qkv, scale](const Tensors& in) -> Tensors {
                       const Tensors h = qkv(in);
                       const size_t n = in.size();
                       const AttentionGrads g = ScaledDotProductAttentionBackward(
                           in[n - 3], h[0], h[1], h[2], in[n - 2], in[n - 1], c.causal, scale);
                       return {g.grad_q, g.grad_k, g.grad_v};
                     },
                     &AttentionTol()});
  }
}

// The optimizer ops: two parameters (one a transposed view) of the row's dtype; the state in the
// compute dtype, created on the inputs' device. CUDA's Adam kernel takes f32 parameters without
// L2 decay; the other rows run the composed ops there, with the same roundings.
void AddOptimizerRows(std::vector<OpRow>* rows) {
  for (WeightDecay decay : {WeightDecay::kDecoupled, WeightDecay::kL2}) {
    const std::string what = decay == WeightDecay::kL2 ? "L2 decay" : "decoupled decay";
    rows->push_back(
        {"FusedAdam", "two steps, amsgrad, " + what + ", one transposed parameter", kFloats,
         [](DType dtype, Generator& gen) -> Tensors {
           return {Normal({37}, dtype, gen), Normal({6, 5}, dtype, gen), Normal({37}, dtype, gen),
                   Normal({5, 6}, dtype, gen)};
         },
         [decay](const Tensors& in) -> Tensors {
           const Device device = in[0].device();
           const DType cd = in[0].dtype() == kF64 ? kF64 : kF32;
           AdamTensorLists l;
           l.params = {in[0].clone(), in[1].clone().transpose(0, 1)};
           l.grads = {in[2], in[3]};
           for (const RawTensor& p : l.params) {
             l.exp_avgs.push_back(RawTensor::Zeros(p.shape(), cd, device));
             l.exp_avg_sqs.push_back(RawTensor::Zeros(p.shape(), cd, device));
             l.max_exp_avg_sqs.push_back(RawTensor::Zeros(p.shape(), cd, device));
           }
           FusedAdamOptions o;
           o.lr = 1e-2;
           o.weight_decay = 0.1;
           o.decay = decay;
           o.amsgrad = true;
           for (int64_t step = 1; step <= 2; ++step) {
             o.step = step;
             FusedAdam(l, o);
           }
           return {l.params[0], l.params[1], l.exp_avgs[1], l.exp_avg_sqs[1], l.max_exp_avg_sqs[1]};
         },
         &ExactTol()});
  }
  rows->push_back({"FusedSgd", "two steps, Nesterov momentum and weight decay", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({37}, dtype, gen), Normal({6, 5}, dtype, gen),
                             Normal({37}, dtype, gen), Normal({6, 5}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors {
                     const DType cd = in[0].dtype() == kF64 ? kF64 : kF32;
                     SgdTensorLists l;
                     l.params = {in[0].clone(), in[1].clone()};
                     l.grads = {in[2], in[3]};
                     for (const RawTensor& p : l.params) {
                       l.momentum_buffers.push_back(RawTensor::Empty(p.shape(), cd, p.device()));
                     }
                     FusedSgdOptions o;
                     o.lr = 0.1;
                     o.weight_decay = 0.01;
                     o.momentum = 0.9;
                     o.nesterov = true;
                     for (bool init : {true, false}) {
                       o.init_momentum_buffers = init;
                       FusedSgd(l, o);
                     }
                     return {l.params[0], l.params[1], l.momentum_buffers[1]};
                   },
                   &ExactTol()});
  const struct {
    double p;
    const Tols* tol;
  } norms[] = {{2, &SumTol()}, {kInf, &ExactTol()}, {3, &SumTol()}};
  for (const auto& n : norms) {
    rows->push_back({"GlobalGradNorm", absl::StrCat("norm_type ", n.p, ", one transposed tensor"),
                     kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({70000}, dtype, gen), Normal({6, 5}, dtype, gen)};
                     },
                     [p = n.p](const Tensors& in) -> Tensors {
                       return {GlobalGradNorm({in[0], in[1].transpose(0, 1)}, p),
                               GlobalGradNorm({in[0]}, p, kF32)};
                     },
                     n.tol});
  }
  rows->push_back({"AddScaled", "[3, 70] + -0.37 x [3, 70]", kFloats,
                   [](DType dtype, Generator& gen) -> Tensors {
                     return {Normal({3, 70}, dtype, gen), Normal({3, 70}, dtype, gen)};
                   },
                   [](const Tensors& in) -> Tensors { return {AddScaled(in[0], in[1], -0.37)}; },
                   &ExactTol()});
  for (double w : {0.1, 0.9}) {
    rows->push_back(
        {"Lerp", "lerp([3, 70], [3, 70], " + std::to_string(w).substr(0, 3) + ")", kFloats,
         [](DType dtype, Generator& gen) -> Tensors {
           return {Normal({3, 70}, dtype, gen), Normal({3, 70}, dtype, gen)};
         },
         [w](const Tensors& in) -> Tensors { return {Lerp(in[0], in[1], w)}; }, &ExactTol()});
  }
  rows->push_back(
      {"Addcmul", "[3, 70] + 0.001 x [3, 70] x [3, 70]", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({3, 70}, dtype, gen), Normal({3, 70}, dtype, gen),
                 Normal({3, 70}, dtype, gen)};
       },
       [](const Tensors& in) -> Tensors { return {Addcmul(in[0], in[1], in[2], 0.001)}; },
       &ExactTol()});
  {
    static const Tols* ns_tol = new Tols(RoundedIntermediate(
        Computed(1e-12, 1e-5,
                 "Newton-Schulz: products of 70 and 100 terms summed in other orders (CPU blocks "
                 "of oneDNN/OpenBLAS, CUDA batched cuBLAS), one step"),
        2, 2, "G and U are rounded to the dtype before the products that use them"));
    rows->push_back({"NewtonSchulz", "[2, 70, 100], one step, torch.optim.Muon's coefficients",
                     kFloats,
                     [](DType dtype, Generator& gen) -> Tensors {
                       return {Normal({2, 70, 100}, dtype, gen)};
                     },
                     [](const Tensors& in) -> Tensors {
                       return {NewtonSchulz(in[0], 3.4445, -4.775, 2.0315, 1, 1e-7)};
                     },
                     ns_tol});
  }
  rows->push_back(
      {"ClipByNorm", "norm 40, max_norm 3 (clipped) and 50 (not clipped)", kFloats,
       [](DType dtype, Generator& gen) -> Tensors {
         return {Normal({37}, dtype, gen), Normal({6, 5}, dtype, gen), RawTensor::Scalar(40, kF64)};
       },
       [](const Tensors& in) -> Tensors {
         const RawTensor a = in[0].clone(), b = in[1].clone(), c = in[0].clone();
         ClipByNorm({a, b.transpose(0, 1)}, in[2], 3);
         ClipByNorm({c}, in[2], 50);
         return {a, b, c};
       },
       &ScaleTol()});
}

const std::vector<OpRow>& Table() {
  static const auto* table = [] {
    auto* rows = new std::vector<OpRow>;
    AddElementwiseRows(rows);
    AddReductionRows(rows);
    AddMatmulRows(rows);
    AddNnRows(rows);
    AddIndexRows(rows);
    AddWindowRows(rows);
    AddMixedPrecisionRows(rows);
    AddFusedRows(rows);
    AddByteRows(rows);
    AddOptimizerRows(rows);
    AddFp8Rows(rows);
    return rows;
  }();
  return *table;
}

// ---- Comparison -------------------------------------------------------------------------------

Tensors ToDevice(const Tensors& in, Device device) {
  Tensors out;
  for (const RawTensor& t : in) out.push_back(t.defined() ? t.to(device) : t);
  return out;
}

// Checks one device output against the CPU's; returns a description of the first mismatches.
std::string Mismatches(const RawTensor& cpu, const RawTensor& out, Device device,
                       const Tols& tols) {
  const std::string name = DeviceTypeDisplayName(device.type);
  if (cpu.defined() != out.defined()) {
    return absl::StrCat("defined on the CPU: ", cpu.defined(), ", on ", name, ": ", out.defined());
  }
  if (!cpu.defined()) return "";
  if (out.device() != device) {
    return absl::StrCat("the ", name, " run returned a tensor on ", out.device().ToString());
  }
  if (cpu.shape() != out.shape() || cpu.dtype() != out.dtype()) {
    return absl::StrCat("CPU ", ShapeToString(cpu.shape()), " ", DTypeName(cpu.dtype()), ", ", name,
                        " ", ShapeToString(out.shape()), " ", DTypeName(out.dtype()));
  }
  // atol is relative to max(1, the output's largest |CPU value|).
  return testing::ValueMismatches(cpu, out, tols.For(cpu.dtype()), 1, "CPU", name);
}

TEST(OpTableTest, EveryOpOnEveryDeviceMatchesTheCpu) {
  const std::vector<Device> devices = DevicesToTestAgainstTheCpu();
  if (devices.empty()) {
    std::string registered;
    for (DeviceType type : RegisteredDeviceTypes()) {
      absl::StrAppend(&registered, registered.empty() ? "" : ", ", DeviceTypeName(type), " (",
                      DeviceCount(type), ")");
    }
    GTEST_SKIP() << "no device besides the CPU; registered (devices): " << registered;
  }
  const std::vector<OpRow>& table = Table();
  for (const Device device : devices) {
    for (size_t r = 0; r < table.size(); ++r) {
      const OpRow& row = table[r];
      for (DType dtype : row.dtypes) {
        const std::string what = absl::StrCat(device.ToString(), ": ", row.op, ": ", row.name, " (",
                                              DTypeName(dtype), ")");
        try {
          Generator gen(1000 + r);
          const Tensors in = row.inputs(dtype, gen);
          const Tensors cpu = row.run(in);
          const Tensors out = row.run(ToDevice(in, device));
          ASSERT_EQ(cpu.size(), out.size()) << what;
          for (size_t i = 0; i < cpu.size(); ++i) {
            const std::string m = Mismatches(cpu[i], out[i], device, *row.tol);
            EXPECT_TRUE(m.empty())
                << what << ", output " << i << ": " << m << "\n  tolerance: " << row.tol->why;
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << what << " threw: " << e.what();
        }
      }
    }
  }
}

// ---- The table itself (runs without a GPU)
// -------------------------------------------------------

// Every row builds its inputs and runs on the CPU, twice from the same seed with the same result
// (a row that throws or draws differently would make the CUDA comparison meaningless).
TEST(OpTableTest, EveryRowRunsOnTheCpu) {
  const std::vector<OpRow>& table = Table();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    for (DType dtype : row.dtypes) {
      const std::string what = absl::StrCat(row.op, ": ", row.name, " (", DTypeName(dtype), ")");
      try {
        Generator gen(1000 + r), again(1000 + r);
        const Tensors first = row.run(row.inputs(dtype, gen));
        const Tensors second = row.run(row.inputs(dtype, again));
        ASSERT_EQ(first.size(), second.size()) << what;
        for (size_t i = 0; i < first.size(); ++i) {
          ASSERT_EQ(first[i].defined(), second[i].defined()) << what;
          if (!first[i].defined()) continue;
          const std::vector<double> a = first[i].to_vector<double>(),
                                    b = second[i].to_vector<double>();
          for (size_t j = 0; j < a.size(); ++j) {
            EXPECT_TRUE(a[j] == b[j] || (std::isnan(a[j]) && std::isnan(b[j])))
                << what << ", output " << i << " [" << j << "]";
          }
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << " threw: " << e.what();
      }
    }
  }
}

// ---- Coverage (runs without a GPU) ------------------------------------------------------------

// Every tensor op of the op list has a row, and every row names one (the check itself is tested
// on a fabricated list by //tests/autograd:op_table_test).
TEST(OpTableTest, CoversExactlyTheTensorOpsOfTheOpList) {
  const std::vector<std::string> listed = testing::ListedOps(&OpInfo::tensor_op);
  EXPECT_GE(listed.size(), 30u);
  std::vector<std::string> rows;
  for (const OpRow& row : Table()) rows.push_back(row.op);
  for (const std::string& error :
       testing::CoverageErrors(listed, rows, "tensor op table", "tensor op")) {
    ADD_FAILURE() << error;
  }
}

TEST(OpTableTest, EveryFloatingRowRunsF32F16AndBf16) {
  for (const OpRow& row : Table()) {
    const std::set<DType> dtypes(row.dtypes.begin(), row.dtypes.end());
    EXPECT_TRUE(row.tol != nullptr && !row.tol->why.empty()) << row.op << ": " << row.name;
    if (row.name.find("promoted") != std::string::npos) continue;  // one fixed dtype pair
    // The rows of the 1-byte dtypes (AddByteRows) take no floating dtype.
    if (std::none_of(dtypes.begin(), dtypes.end(), IsFloating)) continue;
    for (DType dtype : {kF32, kF16, kBF16}) {
      EXPECT_TRUE(dtypes.count(dtype) > 0)
          << row.op << ": " << row.name << " does not run " << DTypeName(dtype);
    }
  }
}

}  // namespace
}  // namespace tg
