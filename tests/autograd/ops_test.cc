// Tests of the differentiable ops (autograd/ops.h) that pin semantics: exact second derivatives,
// broadcast gradients, Cast dtypes, cat promotion, split chunks, repeated indices, dropout masks,
// in-place version counters and history rebasing, the fused cross-entropy, and the error text
// for bad input. The per-op f64 gradcheck (first and second order), the f16/bf16 checks, the
// autocast policy and the CUDA comparison of every op run from one table:
// tests/autograd/op_table.h, driven by tests/autograd/op_table_test.cc.
#include "autograd/ops.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tests/autograd/low_precision.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using ::tg::testing::ExpectCloseToF32;

using testing::ThrowsError;
using testing::ThrowsErrorExactly;

#define EXPECT_ERROR(stmt, text) EXPECT_TRUE(ThrowsErrorExactly([&] { (void)(stmt); }, text))
#define EXPECT_ERROR_CONTAINS(stmt, text) EXPECT_TRUE(ThrowsError([&] { (void)(stmt); }, text))

Tensor Leaf(const std::vector<double>& values, const Shape& shape, DType dtype = kF64) {
  return Tensor(RawTensor::FromVector<double>(values, shape, dtype), /*requires_grad=*/true);
}

std::vector<double> Values(const Tensor& v) { return v.data().to_vector<double>(); }

// The message of the tg::Error that fn throws ("" when it throws none).
template <typename F>
std::string ErrorOf(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::vector<double> Values(const RawTensor& t) { return t.to_vector<double>(); }

RawTensor I64(const std::vector<int64_t>& values, const Shape& shape) {
  return RawTensor::FromVector<int64_t>(values, shape);
}

const RawTensor& WhereCond() {
  static const RawTensor cond = RawTensor::FromVector<double>({1, 0, 1, 0, 0, 1}, {2, 3}).to(kBool);
  return cond;
}

// ---- Second order ------------------------------------------------------------------------------

TEST(SecondOrder, SumOfCubesHasSecondDerivativeSixX) {
  const Tensor x = Leaf({1, -2, 3}, {3});
  GradOptions create;
  create.create_graph = true;
  const Tensor g = Engine::Grad({Sum(Pow(x, 3.0))}, {x}, {}, create)[0];
  EXPECT_TRUE(g.requires_grad());
  EXPECT_EQ(Values(g), (std::vector<double>{3, 12, 27}));
  const Tensor gg = Engine::Grad({Sum(g)}, {x}, {}, create)[0];
  EXPECT_EQ(Values(gg), (std::vector<double>{6, -12, 18}));
  const Tensor ggg = Engine::Grad({Sum(gg)}, {x})[0];
  EXPECT_EQ(Values(ggg), (std::vector<double>{6, 6, 6}));

  // The same through products, with backward(create_graph) accumulating into .grad.
  BackwardOptions backward_create;
  backward_create.create_graph = true;
  Sum(Mul(Mul(x, x), x)).backward(Tensor(), backward_create);
  const Tensor first = x.grad();
  EXPECT_EQ(Values(first), (std::vector<double>{3, 12, 27}));
  ASSERT_TRUE(first.requires_grad()) << "create_graph must record the backward";
  x.set_grad(Tensor());
  Sum(first).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{6, -12, 18}));
}

TEST(SecondOrder, MatmulHessianVectorProductIsExact) {
  // f(A) = sum((A B)^2) / 2: grad = A B B^T, and d/dA <grad, V> = V B B^T.
  const Tensor a = Leaf({1, 2, 3, 4}, {2, 2});
  const Tensor b(RawTensor::FromVector<double>({1, 0, 2, 1}, {2, 2}));  // B B^T = [[1, 2], [2, 5]]
  const Tensor v(RawTensor::FromVector<double>({1, 0, 0, 1}, {2, 2}));
  GradOptions create;
  create.create_graph = true;
  const Tensor ab = Matmul(a, b);
  const Tensor g = Engine::Grad({MulScalar(Sum(Mul(ab, ab)), 0.5)}, {a}, {}, create)[0];
  EXPECT_EQ(Values(g), (std::vector<double>{5, 12, 11, 26}));  // A B B^T
  const Tensor hv = Engine::Grad({Sum(Mul(g, v))}, {a})[0];
  EXPECT_EQ(Values(hv), (std::vector<double>{1, 2, 2, 5}));
}

TEST(SecondOrder, ReductionsAndElementwiseExact) {
  // d/dx of the gradient of mean(exp(x)) is diag(exp(x)) / n.
  const Tensor x = Leaf({0, 1, -1, 2}, {4});
  GradOptions create;
  create.create_graph = true;
  const Tensor g = Engine::Grad({Mean(Exp(x))}, {x}, {}, create)[0];
  const Tensor gg = Engine::Grad({Sum(g)}, {x})[0];
  const std::vector<double> got = Values(gg);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_DOUBLE_EQ(got[i], std::exp(Values(x)[i]) / 4) << i;
  }
  // max over a dim: the gradient is a one-hot mask, so its derivative is zero but defined.
  const Tensor m = Leaf({1, 5, 2, 7, 3, 0}, {2, 3});
  const Tensor gm = Engine::Grad({Sum(Pow(Max(m, 1), 2.0))}, {m}, {}, create)[0];
  EXPECT_EQ(Values(gm), (std::vector<double>{0, 10, 0, 14, 0, 0}));
  const Tensor ggm = Engine::Grad({Sum(gm)}, {m})[0];
  EXPECT_EQ(Values(ggm), (std::vector<double>{0, 2, 0, 2, 0, 0}));
}

// ---- f16 / bf16 -------------------------------------------------------------------------------

// A small model: matmul -> gelu -> layer_norm -> matmul -> cross_entropy + softmax term.
VariableList SmallModelGrads(DType dtype, const std::vector<RawTensor>& params, const RawTensor& x,
                             const RawTensor& targets, const RawTensor& c) {
  VariableList p;
  for (const RawTensor& t : params) p.emplace_back(t.to(dtype), true);
  const Tensor input(x.to(dtype));
  Tensor h = Gelu(Matmul(input, p[0]));
  h = LayerNorm(h, p[1], p[2]);
  const Tensor logits = Matmul(h, p[3]);
  const Tensor loss =
      Add(CrossEntropy(logits, targets), Sum(Mul(Softmax(logits), Tensor(c.to(dtype)))));
  EXPECT_EQ(loss.dtype(), dtype);
  loss.backward();
  VariableList grads;
  for (const Tensor& v : p) grads.push_back(v.grad());
  return grads;
}

TEST(LowPrecision, SmallModelBackwardIsCloseToF32) {
  Generator gen(7);
  for (DType dtype : {kF16, kBF16}) {
    // Parameters and inputs rounded to the low dtype first, so only the computation differs.
    auto rounded = [&](RawTensor t) { return t.to(dtype).to(kF32); };
    const std::vector<RawTensor> params = {
        rounded(RandNormal({8, 16}, gen, 0, 0.5)), rounded(RandUniform({16}, gen, 0.5, 1.5)),
        rounded(RandNormal({16}, gen, 0, 0.1)), rounded(RandNormal({16, 5}, gen, 0, 0.5))};
    const RawTensor x = rounded(RandNormal({4, 8}, gen));
    const RawTensor c = rounded(RandUniform({4, 5}, gen, -1, 1));
    const RawTensor targets = I64({1, 4, 0, 2}, {4});
    const VariableList low = SmallModelGrads(dtype, params, x, targets, c);
    const VariableList ref = SmallModelGrads(kF32, params, x, targets, c);
    const char* names[] = {"w1", "ln weight", "ln bias", "w2"};
    for (size_t i = 0; i < low.size(); ++i) ExpectCloseToF32(low[i], ref[i], dtype, names[i]);
  }
}

// ---- Exact gradients: broadcasting, cast, cat promotion ---------------------------------------

TEST(Broadcasting, GradientsAreSummedToTheInputShapes) {
  const Tensor a = Leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = Leaf({10, 20, 30}, {3});
  const Tensor c = Leaf({2, 3}, {2, 1});
  const Tensor s = Leaf({0.5}, {});
  Sum(Mul(Add(Add(a, b), s), c)).backward();
  EXPECT_EQ(a.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  EXPECT_EQ(Values(b.grad()), (std::vector<double>{5, 5, 5}));
  EXPECT_EQ(c.grad().shape(), (Shape{2, 1}));
  EXPECT_EQ(Values(c.grad()), (std::vector<double>{67.5, 76.5}));  // rows of a + b + s
  EXPECT_EQ(s.grad().shape(), (Shape{}));
  EXPECT_EQ(Values(s.grad()), (std::vector<double>{15}));  // sum of c over the broadcast

  // Sub, Div and Where broadcast too.
  const Tensor d = Leaf({2, 4}, {2, 1});
  const Tensor e = Leaf({1, 2, 4}, {1, 3});
  Sum(Sub(Div(e, d), Where(WhereCond(), d, e))).backward();
  EXPECT_EQ(d.grad().shape(), (Shape{2, 1}));
  EXPECT_EQ(e.grad().shape(), (Shape{1, 3}));
  // d(e/d)/dd = -e/d^2 summed over the row; -1 for each cond position.
  EXPECT_EQ(Values(d.grad()), (std::vector<double>{-7.0 / 4 - 2, -7.0 / 16 - 1}));
  // d(e/d)/de = 1/2 + 1/4 per column; -1 for each false cond in the column (1, 2 and 0).
  EXPECT_EQ(Values(e.grad()), (std::vector<double>{0.75 - 1, 0.75 - 2, 0.75}));

  // Matmul with a broadcast batch dim sums the weight gradient over the batch.
  const Tensor x = Leaf({1, 2, 3, 4}, {2, 1, 2});
  const Tensor w = Leaf({1, 1, 1, 1}, {2, 2});
  Sum(Matmul(x, w)).backward();
  EXPECT_EQ(w.grad().shape(), (Shape{2, 2}));
  EXPECT_EQ(Values(w.grad()), (std::vector<double>{4, 4, 6, 6}));
}

TEST(Cast, GradientsComeBackInTheInputDtype) {
  const Tensor x = Leaf({0.5, -1.25, 2}, {3});
  const Tensor y = Cast(Cast(Cast(x, kF32), kF16), kBF16);
  EXPECT_EQ(y.dtype(), kBF16);
  Sum(MulScalar(Cast(y, kF32), 3)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), kF64);
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{3, 3, 3}));
  // The same dtype is the identity; an integer dtype carries no gradient.
  EXPECT_TRUE(Cast(x, kF64).is_same(x));
  EXPECT_FALSE(Cast(x, kI64).requires_grad());
  // Gradcheck through an f32 round trip: inputs and step are exact in f32, so the finite
  // differences are exact too.
  GradcheckOptions options;
  options.eps = 1.0 / 1024;
  const Tensor a = Leaf({0.5, -1.25, 1.875}, {3});
  const Tensor b = Leaf({-0.75, 1.5, 0.125}, {3});
  GradcheckResult r = Gradcheck(
      [](const VariableList& in) { return Cast(Mul(Cast(in[0], kF32), Cast(in[1], kF32)), kF64); },
      {a, b}, options);
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Cat, PromotesDtypesAndReturnsGradientsInEachInputDtype) {
  const Tensor a = Leaf({1, 2}, {2}, kF32);
  const Tensor b = Leaf({3}, {1}, kF64);
  const Tensor y = Cat({a, b}, 0);
  EXPECT_EQ(y.dtype(), kF64);
  EXPECT_EQ(Values(y), (std::vector<double>{1, 2, 3}));
  Sum(Mul(y, Tensor(RawTensor::FromVector<double>({1, 2, 3}, {3})))).backward();
  EXPECT_EQ(a.grad().dtype(), kF32);
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{1, 2}));
  EXPECT_EQ(b.grad().dtype(), kF64);
  EXPECT_EQ(Values(b.grad()), (std::vector<double>{3}));
}

TEST(Split, ChunksAndGradients) {
  const Tensor x = Leaf({0, 1, 2, 3, 4}, {5});
  VariableList chunks = Split(x, 2, 0);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(Values(chunks[2]), (std::vector<double>{4}));
  Sum(MulScalar(chunks[1], 3)).backward();  // the other chunks get no gradient: zeros
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{0, 0, 3, 3, 0}));
  // An empty dim gives one empty chunk, as in PyTorch.
  EXPECT_EQ(Split(Tensor(RawTensor::Zeros({0, 2})), 3, 0).size(), 1u);
}

TEST(IndexOps, RepeatedIndicesAccumulate) {
  const Tensor w = Leaf({0, 1, 10, 11, 20, 21}, {3, 2});
  Sum(Embedding(w, I64({2, 0, 2, 2}, {2, 2}))).backward();
  EXPECT_EQ(Values(w.grad()), (std::vector<double>{1, 1, 0, 0, 3, 3}));
  const Tensor x = Leaf({1, 2, 3}, {3});
  Sum(Gather(x, 0, I64({2, 2, 0}, {3}))).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<double>{1, 0, 2}));
  const Tensor r = Leaf({1, 2, 3, 4}, {2, 2});
  const Tensor sel = IndexSelect(r, I64({1, 1, 1}, {3}));
  EXPECT_EQ(Values(sel), (std::vector<double>{3, 4, 3, 4, 3, 4}));
  Sum(sel).backward();
  EXPECT_EQ(Values(r.grad()), (std::vector<double>{0, 0, 3, 3}));
}

TEST(CrossEntropy, AllIgnoredMeanIsNaNWithZeroGradient) {
  const Tensor logits = Leaf({1, 2, 3, 4}, {2, 2});
  const Tensor loss = CrossEntropy(logits, I64({-100, -100}, {2}));
  EXPECT_TRUE(std::isnan(loss.item()));
  loss.backward();
  EXPECT_EQ(Values(logits.grad()), (std::vector<double>{0, 0, 0, 0}));
}

// FusedCrossEntropy (CUDA's path of nn::CrossEntropyLoss): the CPU computes the same loss and
// gradient as the composed loss, bit for bit (its gradcheck rows are in tests/autograd/op_table).
TEST(FusedCrossEntropy, MatchesTheComposedLossInEveryReductionWithIgnoredRows) {
  const RawTensor targets = I64({1, -100, 4, 0}, {4});
  Generator gen(3);
  for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    SCOPED_TRACE(static_cast<int>(reduction));
    const RawTensor logits = RandUniform({4, 5}, gen, -2, 2, kF64);
    const Tensor a(logits, true), b(logits, true);
    const Tensor fused = FusedCrossEntropy(a, targets, -100, reduction);
    const Tensor composed = CrossEntropy(b, targets, -100, reduction);
    EXPECT_EQ(Values(fused), Values(composed));
    Sum(fused).backward();
    Sum(composed).backward();
    EXPECT_EQ(Values(a.grad()), Values(b.grad()));
  }
}

TEST(FusedCrossEntropy, HasNoSecondDerivative) {
  const Tensor logits = Leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor loss = FusedCrossEntropy(logits, I64({0, 2}, {2}));
  GradOptions create;
  create.create_graph = true;
  EXPECT_ERROR_CONTAINS(Engine::Grad({loss}, {logits}, {}, create),
                        "FusedCrossEntropyBackward: a create_graph backward needs the logits");
  // Without logits that require grad it is the plain loss (nothing is recorded).
  const Tensor plain = FusedCrossEntropy(Tensor(logits.data()), I64({0, 2}, {2}));
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_EQ(plain.item(), CrossEntropy(logits, I64({0, 2}, {2})).item());
}

// ---- Dropout -----------------------------------------------------------------------------------

TEST(Dropout, SeededMaskScalesKeptElements) {
  std::vector<double> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 1 + static_cast<double>(i % 10);
  const Tensor x = Leaf(values, {100, 10});
  Generator gen(42), ref(42);
  const double p = 0.25;
  const Tensor y = Dropout(x, p, gen);
  Sum(y).backward();
  const std::vector<double> out = Values(y), grad = Values(x.grad());
  int dropped = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const bool drop = ref.NextUniform() < p;  // the documented draw order: one per element
    dropped += drop;
    EXPECT_DOUBLE_EQ(out[i], drop ? 0.0 : values[i] / (1 - p)) << i;
    EXPECT_DOUBLE_EQ(grad[i], drop ? 0.0 : 1 / (1 - p)) << i;
  }
  EXPECT_EQ(gen.state(), ref.state()) << "one draw per element";
  EXPECT_GT(dropped, 200);
  EXPECT_LT(dropped, 300);

  // Evaluation mode and p == 0 are the identity and draw nothing.
  const Generator::State before = gen.state();
  EXPECT_TRUE(Dropout(x, 0.5, gen, /*training=*/false).is_same(x));
  EXPECT_TRUE(Dropout(x, 0.0, gen).is_same(x));
  EXPECT_EQ(gen.state(), before);

  // The same seed gives the same mask, in every dtype.
  for (DType dtype : {kF32, kF16, kBF16}) {
    Generator g1(9), g2(9);
    const Tensor a = Dropout(Tensor(RawTensor::Ones({50}, dtype)), 0.5, g1);
    const Tensor b = Dropout(Tensor(RawTensor::Ones({50}, kF64)), 0.5, g2);
    EXPECT_EQ(a.dtype(), dtype);
    EXPECT_EQ(Values(a), Values(b)) << DTypeName(dtype);  // 0 or 2, exact in every dtype
  }
}

// ---- In place ----------------------------------------------------------------------------------

TEST(InPlace, BumpsTheVersionAndWritesIntoTheStorage) {
  const Tensor x(RawTensor::FromVector<double>({1, -2, 3}, {3}));
  const RawTensor alias = x.data();  // shares the storage
  const uint64_t v0 = x.version();
  AddInPlace(x, Tensor(RawTensor::Scalar(1, kF64)));
  EXPECT_EQ(x.version(), v0 + 1);
  MulInPlace(x, Tensor(RawTensor::FromVector<double>({2, 2, 0.5}, {3})));
  EXPECT_EQ(x.version(), v0 + 2);
  MulScalarInPlace(x, 3);
  EXPECT_EQ(x.version(), v0 + 3);
  ReluInPlace(x);
  EXPECT_EQ(x.version(), v0 + 4);
  EXPECT_EQ(Values(x), (std::vector<double>{12, 0, 6}));
  EXPECT_EQ(Values(alias), (std::vector<double>{12, 0, 6}));
  EXPECT_TRUE(x.is_leaf()) << "nothing required grad: no history";
  // The result keeps self's dtype: an f32 tensor plus an f64 one stays f32.
  const Tensor f(RawTensor::Ones({2}, kF32));
  AddInPlace(f, Tensor(RawTensor::Full({2}, 0.5, kF64)));
  EXPECT_EQ(f.dtype(), kF32);
  EXPECT_EQ(Values(f), (std::vector<double>{1.5, 1.5}));
}

TEST(InPlace, OnALeafThatRequiresGradThrowsUnlessGradModeIsOff) {
  const Tensor w = Leaf({1, 2}, {2});
  w.set_name("w");
  const Tensor one(RawTensor::Ones({2}, kF64));
  EXPECT_ERROR(AddInPlace(w, one),
               "add_: a leaf variable that requires grad (w) cannot be modified in place while "
               "grad mode is on; modify it under NoGradGuard, or apply the op to a clone");
  EXPECT_ERROR_CONTAINS(MulInPlace(w, one), "mul_: a leaf variable that requires grad");
  EXPECT_ERROR_CONTAINS(MulScalarInPlace(w, 2), "mul_: a leaf variable that requires grad");
  EXPECT_ERROR_CONTAINS(ReluInPlace(w), "relu_: a leaf variable that requires grad");
  EXPECT_EQ(Values(w), (std::vector<double>{1, 2})) << "unchanged after the error";
  {
    NoGradGuard no_grad;  // an optimizer step
    const uint64_t v = w.version();
    AddInPlace(w, one);
    EXPECT_EQ(w.version(), v + 1);
  }
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(Values(w), (std::vector<double>{2, 3}));
}

TEST(InPlace, OnANonLeafRebasesItsHistory) {
  const Tensor a = Leaf({1, -2, 3}, {3});
  const Tensor b = Leaf({0.5, 0.5, 0.5}, {3});
  Tensor h = MulScalar(a, 2);  // [2, -4, 6]
  const std::shared_ptr<Node> old_fn = h.grad_fn();
  AddInPlace(h, b);  // [2.5, -3.5, 6.5]
  ASSERT_FALSE(h.is_leaf());
  EXPECT_NE(h.grad_fn(), old_fn);
  EXPECT_EQ(h.grad_fn()->name(), "AddInPlaceBackward");
  MulInPlace(h, b);  // [1.25, -1.75, 3.25]: d/db = (2a + b) + b, d/da = 2b
  EXPECT_EQ(h.grad_fn()->name(), "MulInPlaceBackward");
  Sum(h).backward();
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(Values(b.grad()), (std::vector<double>{3, -3, 7}));

  // A leaf that does not require grad becomes a non-leaf when `other` requires grad.
  const Tensor c(RawTensor::FromVector<double>({1, 2, 3}, {3}));
  const Tensor d = Leaf({4, 5, 6}, {3});
  MulInPlace(c, d);
  EXPECT_FALSE(c.is_leaf());
  EXPECT_TRUE(c.requires_grad());
  Sum(c).backward();
  EXPECT_EQ(Values(d.grad()), (std::vector<double>{1, 2, 3}));  // the values before the write

  // x.mul_(x) squares, with the gradient 2x.
  const Tensor e = Leaf({1.5, -2}, {2});
  Tensor sq = MulScalar(e, 1.0);
  MulInPlace(sq, sq);
  Sum(sq).backward();
  EXPECT_EQ(Values(e.grad()), (std::vector<double>{3, -4}));
}

TEST(InPlace, RetainGradFollowsTheLatestValue) {
  const Tensor a = Leaf({1, 2}, {2});
  Tensor h = MulScalar(a, 2);
  h.retain_grad();
  MulScalarInPlace(h, 3);
  Sum(h).backward();
  EXPECT_EQ(Values(h.grad()), (std::vector<double>{1, 1}));  // d sum / d (new h)
  EXPECT_EQ(Values(a.grad()), (std::vector<double>{6, 6}));
}

TEST(InPlace, ModifyingASavedTensorMakesBackwardThrow) {
  const Tensor a = Leaf({1, 2, 3}, {3});
  Tensor h = MulScalar(a, 2);
  const Tensor z = Mul(h, h);  // MulBackward saves h
  MulScalarInPlace(h, 3);
  std::string error = ErrorOf([&] { Sum(z).backward(); });
  EXPECT_NE(error.find("MulBackward: saved tensor 0"), std::string::npos) << error;
  EXPECT_NE(error.find("was modified in place"), std::string::npos) << error;

  // An op that saves its output (exp) detects a relu_ of that output.
  Tensor y = Exp(a);
  const Tensor kept = MulScalar(y, 1.0);
  ReluInPlace(y);
  error = ErrorOf([&] { Sum(Add(kept, y)).backward(); });
  EXPECT_NE(error.find("ExpBackward: saved tensor 0"), std::string::npos) << error;
  EXPECT_NE(error.find("modified in place"), std::string::npos) << error;

  // relu_ saves its result: modifying it again before backward is caught too.
  Tensor r = MulScalar(a, -1.0);
  AddInPlace(r, Tensor(RawTensor::Full({3}, 2.5, kF64)));
  ReluInPlace(r);
  MulScalarInPlace(r, 2);
  EXPECT_ERROR_CONTAINS(Sum(r).backward(), "ReluInPlaceBackward: saved tensor 0");

  // Under no-grad a non-leaf may be modified; a node that saved it still refuses to run.
  Tensor n = MulScalar(a, 1.0);
  const Tensor uses_n = Mul(n, a);
  {
    NoGradGuard no_grad;
    AddInPlace(n, Tensor(RawTensor::Ones({3}, kF64)));
  }
  EXPECT_ERROR_CONTAINS(Sum(uses_n).backward(), "modified in place");
}

// ---- Error text --------------------------------------------------------------------------------

TEST(OpsErrors, BadInputsOfTheShapeAndNnOps) {
  const Tensor x(RawTensor::Zeros({2, 3}));
  EXPECT_ERROR(Cat({x, Tensor(RawTensor::Zeros({2, 4}))}, 0),
               "cat: tensor 1 has shape [2, 4] but tensor 0 has shape [2, 3]; shapes must match "
               "except in dim 0");
  EXPECT_ERROR(Cat({x, Tensor(RawTensor::Zeros({6}))}, 1),
               "cat: tensor 1 has shape [6] but tensor 0 has shape [2, 3]; shapes must match "
               "except in dim 1");
  EXPECT_ERROR(Cat({}, 0), "cat: expected a non-empty list of tensors");
  EXPECT_ERROR(Linear(x, Tensor(RawTensor::Zeros({5, 4}))),
               "linear: expected x [..., in] and weight [out, in], got [2, 3] and [5, 4]");
  EXPECT_ERROR(Linear(x, Tensor(RawTensor::Zeros({5, 3})), Tensor(RawTensor::Zeros({4}))),
               "linear: expected bias [5], got [4]");
  EXPECT_ERROR(Cat({Tensor(RawTensor::Scalar(1))}, 0),
               "cat: tensor 0 is 0-d; 0-d tensors cannot be concatenated");
  EXPECT_ERROR(Cat({x}, 2), "cat: dim 2 is out of range for a tensor with 2 dims");
  EXPECT_ERROR(Stack({x, Tensor(RawTensor::Zeros({3, 2}))}, 0),
               "stack: tensor 1 has shape [3, 2] but tensor 0 has shape [2, 3]; stacked tensors "
               "must have equal shapes");
  EXPECT_ERROR(Split(x, 0, 1), "split: split_size must be positive, got 0");
  EXPECT_ERROR(Split(x, -2, 1), "split: split_size must be positive, got -2");
  EXPECT_ERROR(Split(Tensor(RawTensor::Scalar(1)), 1, 0), "split: cannot split a 0-d tensor");
  EXPECT_ERROR(Slice(x, 1, 0, 3, 0), "slice: step must be positive, got 0");
  EXPECT_ERROR(Select(x, 0, 2), "select: index 2 is out of range for dim 0 of size 2");
  EXPECT_ERROR(Gather(x, 1, I64({0, 3}, {1, 2})),
               "gather: index 3 at position [0, 1] is out of range for dim 1 of size 3");
  EXPECT_ERROR(Gather(x, 1, I64({0, 1}, {2})),
               "gather: index of shape [2] and input of shape [2, 3] differ in rank");
  EXPECT_ERROR(IndexSelect(x, I64({1, 2}, {2})),
               "index_select: index 2 at position 1 is out of range for dim 0 of size 2");
  Generator gen(1);
  EXPECT_ERROR(Dropout(x, 1.0, gen), "dropout: p must be in [0, 1), got 1");
  EXPECT_ERROR(Dropout(x, -0.1, gen), "dropout: p must be in [0, 1), got -0.1");
  EXPECT_ERROR(Dropout(x, std::numeric_limits<double>::quiet_NaN(), gen),
               "dropout: p must be in [0, 1), got nan");
  EXPECT_ERROR(Dropout(x, 2.0, gen, /*training=*/false),  // validated in eval mode too
               "dropout: p must be in [0, 1), got 2");
  EXPECT_ERROR(Dropout(Tensor(RawTensor::Zeros({2}, kI64)), 0.5, gen),
               "dropout: expected a floating dtype (f32, f64, f16, bf16), got i64");
  EXPECT_ERROR(Embedding(Tensor(RawTensor::Zeros({4, 2})), I64({4}, {1})),
               "embedding: index 4 at position 0 is out of range for 4 rows");
  EXPECT_ERROR(CrossEntropy(x, I64({0, 3}, {2})),
               "cross_entropy: target 3 at position 1 is out of range for 3 classes");
  EXPECT_ERROR(LayerNorm(x, Tensor(RawTensor::Ones({2})), Tensor()),
               "layer_norm: weight of shape [2] does not match the last dim of input [2, 3]");
}

TEST(OpsErrors, BadInputsOfTheInPlaceOps) {
  const Tensor x(RawTensor::Zeros({3}));
  EXPECT_ERROR(AddInPlace(x, Tensor(RawTensor::Zeros({2, 3}))),
               "add_: the result of shape [2, 3] does not fit self of shape [3]");
  EXPECT_ERROR(MulInPlace(x, Tensor(RawTensor::Zeros({2}))),
               "mul: shapes [3] and [2] cannot be broadcast");
  EXPECT_ERROR(AddInPlace(Tensor(RawTensor::Zeros({3}, kI64)), x),
               "add_: the f32 result cannot be written into self of dtype i64");
  EXPECT_ERROR(AddInPlace(x, Tensor()), "add_: other is undefined");
  EXPECT_ERROR(ReluInPlace(Tensor()), "relu_: self is undefined");
}

}  // namespace
}  // namespace tg

namespace tg {
namespace {

TEST(InPlaceViewsTest, InPlaceOnARecordedViewOrItsBaseRewritesTheBaseHistory) {
  // Formerly refused; now PyTorch's view semantics (tests/autograd/views_test.cc has the rest).
  Tensor x(RawTensor::FromVector<double>({1, 2, 3, 4}, {4}), true);
  Tensor b(RawTensor::FromVector<double>({10, 20}, {2}), true);
  Tensor y = MulScalar(x, 2);
  Tensor v = Slice(y, 0, 0, 2);
  AddInPlace(v, b);  // y's history becomes CopySlices over AddInPlaceBackward
  EXPECT_EQ(y.grad_fn()->name(), "CopySlices");
  AddInPlace(y, y);
  EXPECT_EQ(y.data().to_vector<double>(), (std::vector<double>{24, 48, 12, 16}));
  Sum(y).backward();
  EXPECT_EQ(x.grad().data().to_vector<double>(), (std::vector<double>{4, 4, 4, 4}));
  EXPECT_EQ(b.grad().data().to_vector<double>(), (std::vector<double>{2, 2}));
  // Views that copy (reshape of a transposed tensor) share nothing and are not views.
  x.set_grad(Tensor());
  Tensor m = Reshape(Transpose(Reshape(MulScalar(x, 1), {2, 2}), 0, 1), {4});
  Tensor t = Reshape(Transpose(Reshape(MulScalar(x, 1), {2, 2}), 0, 1), {4});
  EXPECT_FALSE(m.is_view());
  AddInPlace(m, t);
  Sum(m).backward();
  EXPECT_EQ(x.grad().data().to_vector<double>(), (std::vector<double>{2, 2, 2, 2}));
  // Without grad nothing is recorded and views may be written.
  NoGradGuard no_grad;
  AddInPlace(v, b);
  EXPECT_EQ(y.data().to_vector<double>(), (std::vector<double>{34, 68, 12, 16}));
}

}  // namespace
}  // namespace tg
