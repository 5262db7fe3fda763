#include "tests/autograd/op_table.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "autograd/engine.h"
#include "autograd/ops.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace testing {

OpRow& OpRow::WithGradcheck(double eps, double atol, double rtol, std::string why) {
  gradcheck.options.eps = eps;
  gradcheck.options.atol = atol;
  gradcheck.options.rtol = rtol;
  gradcheck.why = std::move(why);
  return *this;
}

OpRow& OpRow::WithLowPrecision(Tol f16, Tol bf16, std::string why) {
  low_precision.f16 = f16;
  low_precision.bf16 = bf16;
  low_precision.why = std::move(why);
  return *this;
}

OpRow& OpRow::WithCuda(Tols tols) {
  cuda = std::move(tols);
  return *this;
}

OpRow& OpRow::FirstOrderOnly(std::string why) {
  first_order_only = std::move(why);
  return *this;
}

namespace {

using In = const VariableList&;  // the parameter of the rows' lambdas

// ---- Default tolerances ------------------------------------------------------------------------

GradcheckTol DefaultGradcheck() {
  return {GradcheckOptions{},
          "f64 central differences with step 1e-6: truncation (~1e-12 x the third derivative) "
          "and rounding (~1e-10) errors, far below atol 1e-5 + rtol 1e-3"};
}

Tols DefaultLowPrecision() {
  Tols t;
  t.f16 = {0, 1e-2};
  t.bf16 = {0, 2e-2};
  t.why =
      "the same rounded inputs on both sides; the 16-bit run computes each op in f32 and rounds "
      "its result, so a chain of a few ops is a few 16-bit ulp (2^-10 f16, 2^-7 bf16) of the "
      "largest magnitude off: 1e-2 (f16) and 2e-2 (bf16) of it";
  return t;
}

Tols DefaultCuda() {
  Tols t;
  t.f64 = {1e-12, 1e-12};
  t.f32 = {1e-5, 1e-5};
  t.f16 = {kF16Ulp + 1e-5, 2 * kF16Ulp};
  t.bf16 = {kBF16Ulp + 1e-5, 2 * kBF16Ulp};
  t.why =
      "forward and backward are compositions of tensor ops whose CUDA kernels match the CPU's "
      "within 1e-5 in f32 (tests/tensor/op_table_test.cc: the matmul, softmax and norm "
      "bounds); 16-bit results of those f32 values may round to neighbouring values once per "
      "op: one ulp relative plus two of the largest magnitude";
  return t;
}

Tols ReductionCuda(double f32, const std::string& why) {
  Tols t = DefaultCuda();
  t.f32 = {f32, f32};
  t.why = why + "; 16-bit: as the default";
  return t;
}

OpRow Row(std::string op, std::string name, std::vector<InputSpec> inputs,
          std::function<Tensor(const VariableList&)> run) {
  OpRow row;
  row.op = std::move(op);
  row.name = std::move(name);
  row.inputs = std::move(inputs);
  row.run = std::move(run);
  row.gradcheck = DefaultGradcheck();
  row.low_precision = DefaultLowPrecision();
  row.cuda = DefaultCuda();
  return row;
}

// ---- Constants of the rows, made on the inputs' device ------------------------------------------

RawTensor I64(const std::vector<int64_t>& values, const Shape& shape, const Tensor& like) {
  return RawTensor::FromVector<int64_t>(values, shape).to(like.data().device());
}

RawTensor WhereCond(const Tensor& like) {
  return RawTensor::FromVector<double>({1, 0, 1, 0, 0, 1}, {2, 3})
      .to(kBool)
      .to(like.data().device());
}

// A fresh non-leaf copy of x (in-place ops may not modify a leaf that requires grad).
Tensor NonLeaf(const Tensor& x) { return MulScalar(x, 1.0); }

Conv2dParams Params(std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                    std::array<int64_t, 2> dilation) {
  Conv2dParams p;
  p.stride = stride;
  p.padding = padding;
  p.dilation = dilation;
  return p;
}

// ---- The rows, in the order of autograd/ops.h ---------------------------------------------------

void AddElementwiseRows(std::vector<OpRow>& t) {
  const double kAway = 0.1;  // distance from kinks at 0
  // Binary ops with broadcasting inputs.
  t.push_back(
      Row("Add", "[2, 3] + [3]", {{{2, 3}}, {{3}}}, [](In in) { return Add(in[0], in[1]); }));
  t.push_back(
      Row("Add", "operator, [2, 3] + 0-d", {{{2, 3}}, {{}}}, [](In in) { return in[0] + in[1]; }));
  t.push_back(Row("Sub", "[2, 1, 3] - [4, 1]", {{{2, 1, 3}}, {{4, 1}}},
                  [](In in) { return Sub(in[0], in[1]); }));
  t.push_back(
      Row("Sub", "operator, [3] - [2, 3]", {{{3}}, {{2, 3}}}, [](In in) { return in[0] - in[1]; }));
  t.push_back(
      Row("Mul", "[2, 3] * [2, 1]", {{{2, 3}}, {{2, 1}}}, [](In in) { return Mul(in[0], in[1]); }));
  t.push_back(Row("Mul", "operator, x * x", {{{4}}}, [](In in) { return in[0] * in[0]; }));
  t.push_back(Row("Div", "[2, 3] / [3]", {{{2, 3}}, {{3}, 0.5, 2}},
                  [](In in) { return Div(in[0], in[1]); }));
  t.push_back(Row("Div", "operator, [2, 1] / [3]", {{{2, 1}, 0.5, 2}, {{3}, 0.5, 2}},
                  [](In in) { return in[0] / in[1]; }));
  t.push_back(Row("Pow", "tensor exponent", {{{2, 3}, 0.5, 2}, {{3}, -1, 2}},
                  [](In in) { return Pow(in[0], in[1]); }));
  t.push_back(Row("Pow", "2.5", {{{2, 3}, 0.5, 2}}, [](In in) { return Pow(in[0], 2.5); }));
  t.push_back(Row("Pow", "3", {{{2, 3}}}, [](In in) { return Pow(in[0], 3.0); }));
  t.push_back(Row("Pow", "-1", {{{4}, 0.5, 2}}, [](In in) { return Pow(in[0], -1.0); }));
  t.push_back(Row("AddScalar", "(x + 0.75) * x", {{{2, 3}}}, [](In in) {
    return Mul(AddScalar(in[0], 0.75), in[0]);  // nonlinear: the second order is nonzero
  }));
  t.push_back(Row("MulScalar", "-1.5", {{{2, 3}}}, [](In in) { return MulScalar(in[0], -1.5); }));
  t.push_back(Row("Neg", "", {{{2, 3}}}, [](In in) { return Neg(in[0]); }));
  t.push_back(Row("Neg", "operator", {{{3}}}, [](In in) { return -in[0]; }));
  t.push_back(Row("Exp", "", {{{2, 3}}}, [](In in) { return Exp(in[0]); }));
  t.push_back(Row("Log", "", {{{2, 3}, 0.5, 2}}, [](In in) { return Log(in[0]); }));
  t.push_back(Row("Sqrt", "", {{{2, 3}, 0.5, 2}}, [](In in) { return Sqrt(in[0]); }));
  t.push_back(Row("Tanh", "", {{{2, 3}, -2, 2}}, [](In in) { return Tanh(in[0]); }));
  t.push_back(Row("Sigmoid", "", {{{2, 3}, -2, 2}}, [](In in) { return Sigmoid(in[0]); }));
  t.push_back(Row("Silu", "", {{{2, 3}, -3, 3}}, [](In in) { return Silu(in[0]); }));
  t.push_back(Row("Swiglu", "", {{{2, 3}, -3, 3}, {{2, 3}, -2, 2}},
                  [](In in) { return Swiglu(in[0], in[1]); }));
  t.push_back(Row("Relu", "", {{{2, 3}, -1, 1, kAway}}, [](In in) { return Relu(in[0]); }));
  // y's own gradient through ReluBackward is 0 (not an edge); the product makes y an input.
  t.push_back(Row("ReluBackward", "times y", {{{2, 3}}, {{2, 3}, -1, 1, kAway}},
                  [](In in) { return Mul(ReluBackward(in[0], in[1]), in[1]); }));
  t.push_back(Row("Gelu", "", {{{2, 3}, -2, 2}}, [](In in) { return Gelu(in[0]); }));
  t.push_back(Row("GeluTanh", "", {{{2, 3}, -2, 2}}, [](In in) { return GeluTanh(in[0]); }));
  t.push_back(Row("Abs", "", {{{2, 3}, -1, 1, kAway}}, [](In in) { return Abs(in[0]); }));
  t.push_back(Row("Erf", "", {{{2, 3}, -1.5, 1.5}}, [](In in) { return Erf(in[0]); }));
  t.push_back(Row("Where", "[2, 3] and [3]", {{{2, 3}}, {{3}}},
                  [](In in) { return Where(WhereCond(in[0]), in[0], in[1]); }));
  t.push_back(Row("Cast", "through f32 and back", {{{2, 3}}},
                  [](In in) { return Cast(Cast(in[0], kF32), in[0].dtype()); })
                  .WithGradcheck(1.0 / 1024, 1e-5, 1e-3,
                                 "the f64 values pass through f32 (2^-24 relative): a step of "
                                 "2^-10 keeps that rounding 2^-14 of the difference quotient"));
}

void AddReductionRows(std::vector<OpRow>& t) {
  t.push_back(Row("Sum", "all", {{{2, 3}}}, [](In in) { return Sum(in[0]); }));
  t.push_back(Row("Sum", "all, keepdim", {{{2, 3}}}, [](In in) { return Sum(in[0], {}, true); }));
  t.push_back(
      Row("Sum", "dim 1, keepdim", {{{2, 3, 2}}}, [](In in) { return Sum(in[0], {1}, true); }));
  t.push_back(Row("Sum", "dims 0 and -1", {{{2, 3, 2}}}, [](In in) {
    return Sum(in[0], {0, -1});
  }));
  t.push_back(Row("Mean", "all", {{{2, 3}}}, [](In in) { return Mean(in[0]); }));
  t.push_back(Row("Mean", "dim -2", {{{2, 3, 2}}}, [](In in) { return Mean(in[0], {-2}); }));
  t.push_back(Row("Mean", "dims 0 and 2, keepdim", {{{2, 3, 2}}}, [](In in) {
    return Mean(in[0], {0, 2}, true);
  }));
  t.push_back(Row("Max", "dim 1", {{{3, 4}}}, [](In in) { return Max(in[0], 1); }));
  t.push_back(Row("Max", "dim 0, keepdim", {{{3, 4}}}, [](In in) { return Max(in[0], 0, true); }));
  t.push_back(Row("SumTo", "[2, 3, 4] to [3, 1]", {{{2, 3, 4}}}, [](In in) {
    return SumTo(in[0], {3, 1});
  }));
}

void AddLinearAlgebraRows(std::vector<OpRow>& t) {
  auto matmul = [](In in) { return Matmul(in[0], in[1]); };
  t.push_back(Row("Matmul", "2-D @ 2-D", {{{2, 3}}, {{3, 4}}}, matmul));
  t.push_back(Row("Matmul", "1-D @ 2-D", {{{3}}, {{3, 2}}}, matmul));
  t.push_back(Row("Matmul", "2-D @ 1-D", {{{2, 3}}, {{3}}}, matmul));
  t.push_back(Row("Matmul", "1-D @ 1-D", {{{3}}, {{3}}}, matmul));
  t.push_back(
      Row("Matmul", "batched, broadcast batch dims", {{{2, 1, 2, 3}}, {{3, 3, 2}}}, matmul));
  t.push_back(Row("Matmul", "1-D @ batched", {{{3}}, {{2, 3, 2}}}, matmul));
  t.push_back(Row("Bmm", "", {{{2, 2, 3}}, {{2, 3, 2}}}, [](In in) { return Bmm(in[0], in[1]); }));
  t.push_back(Row("Linear", "with bias", {{{2, 4, 3}}, {{5, 3}}, {{5}}},
                  [](In in) { return Linear(in[0], in[1], in[2]); }));
  t.push_back(Row("Linear", "without bias, 1-D", {{{3}}, {{2, 3}}},
                  [](In in) { return Linear(in[0], in[1]); }));
  // The fused Linear (CUDA's path of Linear and Mlp; on the CPU the same composition).
  t.push_back(Row("Linear", "fused, no activation", {{{2, 4, 3}}, {{5, 3}}, {{5}}},
                  [](In in) { return Linear(in[0], in[1], in[2], Activation::kNone); }));
  t.push_back(Row("Linear", "fused GELU", {{{2, 4, 3}, -2, 2}, {{5, 3}}, {{5}}},
                  [](In in) { return Linear(in[0], in[1], in[2], Activation::kGeluTanh); }));
  t.push_back(Row("Linear", "fused GELU, no bias, 1-D", {{{3}, -2, 2}, {{4, 3}}},
                  [](In in) { return Linear(in[0], in[1], Tensor(), Activation::kGeluTanh); }));
}

void AddShapeRows(std::vector<OpRow>& t) {
  t.push_back(Row("Reshape", "[2, 3] to [3, 2]", {{{2, 3}}}, [](In in) {
    return Reshape(in[0], {3, 2});
  }));
  t.push_back(
      Row("Transpose", "0 and -1", {{{2, 3, 2}}}, [](In in) { return Transpose(in[0], 0, -1); }));
  t.push_back(Row("Permute", "{2, 0, 1}", {{{2, 3, 2}}}, [](In in) {
    return Permute(in[0], {2, 0, 1});
  }));
  t.push_back(Row("Expand", "[3, 1] to [2, 3, 4]", {{{3, 1}}}, [](In in) {
    return Expand(in[0], {2, 3, 4});
  }));
  t.push_back(
      Row("Slice", "with a step", {{{5, 3}}}, [](In in) { return Slice(in[0], 0, 1, 5, 2); }));
  t.push_back(Row("Slice", "negative dim and start, clamped end", {{{2, 6}}},
                  [](In in) { return Slice(in[0], -1, -4, 100, 2); }));
  t.push_back(
      Row("Select", "negative index", {{{3, 4}}}, [](In in) { return Select(in[0], 1, -2); }));
  t.push_back(Row("Unsqueeze", "-1", {{{2, 3}}}, [](In in) { return Unsqueeze(in[0], -1); }));
  t.push_back(Row("Squeeze", "1", {{{2, 1, 3}}}, [](In in) { return Squeeze(in[0], 1); }));
  t.push_back(Row("Cat", "dim -1", {{{2, 1}}, {{2, 3}}, {{2, 2}}}, [](In in) {
    return Cat({in[0], in[1], in[2]}, -1);
  }));
  t.push_back(Row("Cat", "dim 0, an input twice", {{{1, 3}}, {{2, 3}}}, [](In in) {
    return Cat({in[0], in[1], in[0]}, 0);
  }));
  t.push_back(Row("Stack", "dim 1", {{{2, 3}}, {{2, 3}}}, [](In in) {
    return Stack({in[0], in[1]}, 1);
  }));
  t.push_back(Row("Stack", "dim -1, an input twice", {{{3}}, {{3}}}, [](In in) {
    return Stack({in[0], in[1], in[0]}, -1);
  }));
  t.push_back(Row("Split", "uneven chunks", {{{7, 2}}}, [](In in) {
    VariableList s = Split(in[0], 3, 0);  // [3, 2], [3, 2], [1, 2]
    return Cat({Mul(s[0], s[1]), Tanh(s[2])}, 0);
  }));
  t.push_back(Row("Split", "unused chunks", {{{2, 5}}}, [](In in) {
    return Tanh(Split(in[0], 2, -1)[1]);  // the others get zero gradients
  }));
  t.push_back(Row("Gather", "dim 1, repeated indices", {{{3, 4}}}, [](In in) {
    return Gather(in[0], 1, I64({0, 3, 3, 1, 2, 2, 0, 0, 1}, {3, 3}, in[0]));
  }));
  t.push_back(Row("Gather", "dim 0", {{{3, 2}}}, [](In in) {
    return Gather(in[0], 0, I64({2, 2, 0, 1}, {2, 2}, in[0]));
  }));
  t.push_back(Row("IndexSelect", "repeated rows", {{{4, 2}}}, [](In in) {
    return IndexSelect(in[0], I64({3, 0, 3, 1, 3}, {5}, in[0]));
  }));
}

void AddNnRows(std::vector<OpRow>& t) {
  t.push_back(Row("Softmax", "[3, 4]", {{{3, 4}, -2, 2}}, [](In in) { return Softmax(in[0]); }));
  t.push_back(Row("Softmax", "1-D", {{{5}, -2, 2}}, [](In in) { return Softmax(in[0]); }));
  t.push_back(Row("LogSoftmax", "", {{{3, 4}, -2, 2}}, [](In in) { return LogSoftmax(in[0]); }));
  t.push_back(Row("LayerNorm", "affine", {{{2, 2, 4}, -2, 2}, {{4}, 0.5, 1.5}, {{4}}},
                  [](In in) { return LayerNorm(in[0], in[1], in[2]); }));
  t.push_back(Row("LayerNorm", "no affine", {{{3, 4}, -2, 2}},
                  [](In in) { return LayerNorm(in[0], Tensor(), Tensor()); }));
  t.push_back(Row("LayerNorm", "weight only, 1-D, eps 1e-3", {{{5}, -2, 2}, {{5}, 0.5, 1.5}},
                  [](In in) { return LayerNorm(in[0], in[1], Tensor(), 1e-3); }));
  t.push_back(Row("LlamaRmsNorm", "", {{{2, 2, 4}, -2, 2}, {{4}, 0.5, 1.5}},
                  [](In in) { return LlamaRmsNorm(in[0], in[1], 1e-6); }));
  t.push_back(Row("LlamaRmsNorm", "1-D, eps 1e-2", {{{5}, -2, 2}, {{5}, 0.5, 1.5}},
                  [](In in) { return LlamaRmsNorm(in[0], in[1], 1e-2); }));
  t.push_back(Row("RotaryEmbedding", "[2, 3, 4]", {{{2, 3, 4}, -2, 2}}, [](In in) {
    // Positions 0, 1, 2 at frequencies 0.3 and 0.7, as RopeCosSin lays them out.
    std::vector<double> c, s;
    for (int t = 0; t < 3; ++t) {
      for (double f : {0.3, 0.7, 0.3, 0.7}) {
        c.push_back(std::cos(t * f));
        s.push_back(std::sin(t * f));
      }
    }
    return RotaryEmbedding(in[0], RawTensor::FromVector(c, {3, 4}).to(in[0].dtype()),
                           RawTensor::FromVector(s, {3, 4}).to(in[0].dtype()));
  }));
  t.push_back(Row("Embedding", "repeated indices", {{{5, 3}}}, [](In in) {
    return Embedding(in[0], I64({4, 0, 4, 2, 1, 4}, {2, 3}, in[0]));
  }));
  t.push_back(Row("CrossEntropy", "mean, an ignored row", {{{4, 5}, -2, 2}}, [](In in) {
    return CrossEntropy(in[0], I64({1, -100, 4, 1}, {4}, in[0]));
  }));
  t.push_back(Row("CrossEntropy", "sum", {{{4, 5}, -2, 2}}, [](In in) {
    return CrossEntropy(in[0], I64({1, 0, -100, 3}, {4}, in[0]), -100, Reduction::kSum);
  }));
  t.push_back(Row("CrossEntropy", "none", {{{4, 5}, -2, 2}}, [](In in) {
    return CrossEntropy(in[0], I64({2, 0, 4, -100}, {4}, in[0]), -100, Reduction::kNone);
  }));
  t.push_back(Row("CrossEntropy", "ignore_index 3", {{{4, 5}, -2, 2}}, [](In in) {
    return CrossEntropy(in[0], I64({3, 0, 3, 2}, {4}, in[0]), /*ignore_index=*/3);
  }));
  const std::string fused_first_order =
      "the node keeps d loss / d logits, not the logits: a create_graph backward throws "
      "(ops_test pins the message)";
  t.push_back(Row("FusedCrossEntropy", "mean, an ignored row", {{{4, 5}, -2, 2}}, [](In in) {
                return FusedCrossEntropy(in[0], I64({1, -100, 4, 0}, {4}, in[0]));
              }).FirstOrderOnly(fused_first_order));
  t.push_back(
      Row("FusedCrossEntropy", "sum", {{{4, 5}, -2, 2}}, [](In in) {
        return FusedCrossEntropy(in[0], I64({1, -100, 4, 0}, {4}, in[0]), -100, Reduction::kSum);
      }).FirstOrderOnly(fused_first_order));
  t.push_back(
      Row("FusedCrossEntropy", "none", {{{4, 5}, -2, 2}}, [](In in) {
        return FusedCrossEntropy(in[0], I64({1, -100, 4, 0}, {4}, in[0]), -100, Reduction::kNone);
      }).FirstOrderOnly(fused_first_order));
  // Attention over [B, H, T, D] heads (CUDA's path of CausalSelfAttention).
  Tols attention = DefaultCuda();
  attention.f32 = {2e-5, 2e-5};
  attention.f16.atol += 2 * kF16Ulp;
  attention.bf16.atol += 2 * kBF16Ulp;
  attention.why =
      "as tests/tensor/op_table_test.cc's attention rows: f32 sums in different orders "
      "(2e-5); in 16 bits cuDNN rounds the probabilities blockwise: two more ulp per term";
  t.push_back(Row("ScaledDotProductAttention", "causal",
                  {{{2, 2, 3, 4}}, {{2, 2, 3, 4}}, {{2, 2, 3, 4}}},
                  [](In in) { return ScaledDotProductAttention(in[0], in[1], in[2], true, 0.5); })
                  .WithCuda(attention));
  t.push_back(Row("ScaledDotProductAttention", "grouped-query, 4 query heads on 2",
                  {{{1, 4, 3, 4}}, {{1, 2, 3, 4}}, {{1, 2, 3, 4}}},
                  [](In in) { return ScaledDotProductAttention(in[0], in[1], in[2], true, 0.5); })
                  .WithCuda(attention));
  t.push_back(Row("ScaledDotProductAttention", "cross, Tq 2 and Tk 4",
                  {{{1, 2, 2, 3}}, {{1, 2, 4, 3}}, {{1, 2, 4, 3}}},
                  [](In in) { return ScaledDotProductAttention(in[0], in[1], in[2], false, 0.7); })
                  .WithCuda(attention));
  // Convolution and pooling.
  const Tols conv = ReductionCuda(
      2e-5,
      "convolution: cuDNN engines vs im2col + OpenBLAS, f32 accumulation over up to 162 terms in "
      "different orders (tests/tensor/op_table_test.cc's bound)");
  struct ConvCase {
    std::string name;
    Shape x, w;
    Conv2dParams p;
    bool bias;
  };
  const std::vector<ConvCase> convs = {
      {"3x3", {2, 2, 5, 5}, {3, 2, 3, 3}, Params({1, 1}, {0, 0}, {1, 1}), true},
      {"3x3 pad 1", {2, 2, 5, 4}, {3, 2, 3, 3}, Params({1, 1}, {1, 1}, {1, 1}), true},
      {"stride 2, pad 2 x 1, 2x3 kernel",
       {1, 3, 6, 7},
       {2, 3, 2, 3},
       Params({2, 2}, {2, 1}, {1, 1}),
       true},
      {"dilation 2, no bias", {2, 2, 7, 6}, {2, 2, 3, 2}, Params({1, 2}, {1, 0}, {2, 2}), false},
      {"1x1", {2, 3, 3, 3}, {2, 3, 1, 1}, Params({1, 1}, {0, 0}, {1, 1}), true},
  };
  for (const ConvCase& c : convs) {
    std::vector<InputSpec> inputs = {{c.x}, {c.w}};
    if (c.bias) inputs.push_back({{c.w[0]}});
    t.push_back(Row("Conv2d", c.name, inputs, [c](In in) {
                  return Conv2d(in[0], in[1], c.bias ? in[2] : Tensor(), c.p);
                }).WithCuda(conv));
  }
  struct PoolCase {
    std::string name;
    Shape x;
    std::array<int64_t, 2> k, s, p;
  };
  const std::vector<PoolCase> pools = {
      {"2x2 stride 2", {2, 2, 4, 4}, {2, 2}, {2, 2}, {0, 0}},
      {"3x3 stride 2 pad 1", {1, 2, 5, 6}, {3, 3}, {2, 2}, {1, 1}},
      {"overlapping 3x2 windows", {2, 1, 5, 5}, {3, 2}, {1, 1}, {1, 0}},
  };
  for (const PoolCase& c : pools) {
    InputSpec x{c.x};
    x.distinct = true;  // no ties: the arg-max is stable under the finite-difference step
    t.push_back(
        Row("MaxPool2d", c.name, {x}, [c](In in) { return MaxPool2d(in[0], c.k, c.s, c.p); }));
  }
  t.push_back(Row("Dropout", "p 0.4, seeded", {{{4, 5}}}, [](In in) {
    Generator gen(1234);  // the same mask on every evaluation and on every device
    return Dropout(in[0], 0.4, gen);
  }));
}

void AddInPlaceRows(std::vector<OpRow>& t) {
  const double kAway = 0.1;
  // On non-leaf copies (a leaf that requires grad may not be modified in place).
  t.push_back(Row("AddInPlace", "broadcast other, then squared", {{{2, 3}}, {{3}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    AddInPlace(y, in[1]);
    return Mul(y, y);
  }));
  t.push_back(Row("MulInPlace", "broadcast other", {{{2, 3}}, {{2, 1}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    return MulInPlace(y, in[1]);
  }));
  t.push_back(Row("MulInPlace", "aliasing self", {{{4}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    return MulInPlace(y, y);
  }));
  t.push_back(Row("MulScalarInPlace", "of a product", {{{2, 3}}}, [](In in) {
    Tensor y = Mul(in[0], in[0]);  // saves its inputs, not y
    return MulScalarInPlace(y, -2.5);
  }));
  t.push_back(Row("ReluInPlace", "times its input", {{{2, 3}, -1, 1, kAway}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    return Mul(ReluInPlace(y), in[0]);
  }));
  t.push_back(Row("AddInPlace", "chain of every in-place op",
                  {{{2, 3}, -1, 1, kAway}, {{3}}, {{2, 1}}}, [](In in) {
                    Tensor y = MulScalar(in[0], 2);
                    AddInPlace(y, in[1]);
                    MulInPlace(y, in[2]);
                    MulScalarInPlace(y, 1.5);
                    ReluInPlace(y);
                    return y;
                  }));
  t.push_back(Row("CopyInPlace", "broadcast src, then squared", {{{2, 3}}, {{3}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    CopyInPlace(y, in[1]);
    return Mul(y, in[0]);
  }));
  t.push_back(Row("FillInPlace", "then times the input", {{{2, 3}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    return Mul(FillInPlace(y, 1.5), in[0]);
  }));
  t.push_back(
      Row("Narrow", "negative start", {{{4, 3}}}, [](In in) { return Narrow(in[0], 0, -3, 2); }));
  // On views of a non-leaf base (CopySlices rewrites the base's history; the base is returned).
  t.push_back(Row("MulInPlace", "on a slice of the base", {{{4, 3}}, {{2, 3}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    MulInPlace(Slice(y, 0, 1, 3), in[1]);
    return Mul(y, y);
  }));
  t.push_back(Row("AddInPlace", "on a select of a transposed view", {{{3, 4}}, {{3}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    AddInPlace(Select(Transpose(y, 0, 1), 0, 2), in[1]);
    return Mul(y, in[0]);
  }));
  t.push_back(Row("CopyInPlace", "into a narrowed view", {{{5}}, {{2}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    CopyInPlace(Narrow(y, 0, 1, 2), in[1]);
    return Mul(y, y);
  }));
  t.push_back(Row("FillInPlace", "on a slice, base used", {{{6}}}, [](In in) {
    Tensor y = NonLeaf(in[0]);
    FillInPlace(Slice(y, 0, 0, 6, 2), 0.5);
    return Mul(y, in[0]);
  }));
  t.push_back(Row("ReluInPlace", "on a slice taken before the base's in-place op",
                  {{{4}, -1, 1, kAway}}, [](In in) {
                    Tensor y = NonLeaf(in[0]);
                    Tensor v = Slice(y, 0, 1, 4);
                    MulScalarInPlace(y, 2);  // v's grad_fn is remade from the base
                    ReluInPlace(v);
                    return Mul(Slice(y, 0, 0, 3), Add(v, v));
                  }));
}

// A shuffled grid of values 0.01 apart from -1 up (Fisher-Yates with the row's generator).
RawTensor DistinctValues(const Shape& shape, Generator& gen) {
  const int64_t n = NumElements(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.01 * static_cast<double>(i) - 1;
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(gen.NextUniformDouble() * static_cast<double>(i + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(std::min(j, i))]);
  }
  return RawTensor::FromVector<double>(v, shape);
}

RawTensor Draw(const InputSpec& spec, Generator& gen) {
  if (spec.distinct) return DistinctValues(spec.shape, gen);
  std::vector<double> v = RandUniform(spec.shape, gen, spec.lo, spec.hi, kF64).to_vector<double>();
  if (spec.min_abs > 0) {
    for (double& x : v) x = x >= 0 ? x + spec.min_abs : x - spec.min_abs;
  }
  return RawTensor::FromVector<double>(v, spec.shape);
}

}  // namespace

const std::vector<OpRow>& OpTable() {
  static const auto* table = [] {
    auto* rows = new std::vector<OpRow>;
    AddElementwiseRows(*rows);
    AddReductionRows(*rows);
    AddLinearAlgebraRows(*rows);
    AddShapeRows(*rows);
    AddNnRows(*rows);
    AddInPlaceRows(*rows);
    return rows;
  }();
  return *table;
}

VariableList MakeInputs(const OpRow& row, uint64_t seed, DType dtype, Device device) {
  Generator gen(seed);
  VariableList in;
  for (const InputSpec& spec : row.inputs) {
    in.emplace_back(Draw(spec, gen).to(device, dtype), /*requires_grad=*/true);
  }
  return in;
}

std::string Describe(const OpRow& row) {
  return row.name.empty() ? row.op : absl::StrCat(row.op, " (", row.name, ")");
}

uint64_t SeedOf(const OpRow& row) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : Describe(row)) h = (h ^ c) * 1099511628211ull;
  return h;
}

VariableList OutputAndGrads(const std::function<Tensor(const VariableList&)>& fn,
                            const VariableList& inputs) {
  const Tensor out = fn(inputs);
  std::vector<double> c(static_cast<size_t>(out.numel()));
  for (size_t i = 0; i < c.size(); ++i) c[i] = 0.5 + 0.125 * static_cast<double>(i % 7);
  const Tensor weights(
      RawTensor::FromVector<double>(c, out.shape(), out.dtype()).to(out.data().device()));
  VariableList result = {out};
  for (const Tensor& g : Engine::Grad({Sum(Mul(out, weights))}, inputs)) result.push_back(g);
  return result;
}

}  // namespace testing
}  // namespace tg
