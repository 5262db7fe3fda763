// Views and in-place ops on them (docs/semantics.md, "Views"): gradients, values, grad_fn names, version
// counters, hook events and error texts printed by tests/autograd/views_reference.py
// (torch 2.15) for the same float64 graphs. x = a * 1 plays PyTorch's a.clone() (a non-leaf
// base whose history leads to the leaf a).
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/variable.h"
#include "gtest/gtest.h"
#include "tests/autograd/reference_values.h"
#include "tests/tensor/throws.h"

namespace tg {
namespace {

using testing::Events;
using testing::Fmt;
using testing::Leaf;

Tensor Leaf2d(std::vector<double> values, const Shape& shape) {
  return Tensor(RawTensor::FromVector<double>(values, shape, kF64), /*requires_grad=*/true);
}

Tensor Constant(std::vector<double> values, const Shape& shape) {
  return Tensor(RawTensor::FromVector<double>(values, shape, kF64));
}

// A tensor hook that appends "<label> hook <grad>" to `events`.
TensorHook Rec(Events& events, const std::string& label) {
  return [&events, label](const Tensor& g) {
    events.push_back(label + " hook " + Fmt(g));
    return Tensor();
  };
}

TEST(Views, AViewKnowsItsRootBaseAndSharesItsVersionCounter) {
  const Tensor a = Leaf({1, 2, 3, 4, 5, 6});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 5);
  const Tensor u = Transpose(Reshape(v, {2, 2}), 0, 1);
  EXPECT_FALSE(x.is_view());
  EXPECT_TRUE(v.is_view());
  EXPECT_TRUE(u.is_view());
  EXPECT_TRUE(v.base().is_same(x));
  EXPECT_TRUE(u.base().is_same(x));         // the root base, not the intermediate view
  EXPECT_FALSE(Reshape(u, {4}).is_view());  // a reshape that copies is not a view (as in PyTorch)
  EXPECT_FALSE(x.detach().is_view());
  EXPECT_EQ(v.version(), 0u);
  MulScalarInPlace(x, 2);  // the base bumps the views' version
  EXPECT_EQ(v.version(), 1u);
  EXPECT_EQ(u.version(), 1u);
  AddInPlace(u, Tensor(RawTensor::Ones({2, 2}, kF64)));  // a view bumps the base's and siblings'
  EXPECT_EQ(x.version(), 2u);
  EXPECT_EQ(v.version(), 2u);
}

// SliceMul: a.grad = "[10, 40, 60, 40]", w.grad = "[1, 4, 6, 4]", x = "[1, 4, 6, 4]",
// x.grad_fn = "CopySlices", x.version = v.version = 1.
TEST(Views, SliceMulRewritesTheBaseHistory) {
  const Tensor a = Leaf({1, 2, 3, 4}), w = Leaf({10, 20, 30, 40});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  MulScalarInPlace(v, 2);
  EXPECT_EQ(x.grad_fn()->name(), "CopySlices");
  EXPECT_EQ(x.version(), 1u);
  EXPECT_EQ(v.version(), 1u);
  Sum(Mul(x, w)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[10, 40, 60, 40]");
  EXPECT_EQ(Fmt(w.grad()), "[1, 4, 6, 4]");
  EXPECT_EQ(Fmt(x), "[1, 4, 6, 4]");
}

// SelectAdd: a.grad = "[2, 4, 6, 9, 8, 16]", b.grad = "[9, 8, 16]", x = "[1, 2, 3, 4.5, 4, 8]".
TEST(Views, SelectAdd) {
  const Tensor a = Leaf2d({1, 2, 3, 4, 5, 6}, {2, 3}), b = Leaf({0.5, -1, 2});
  const Tensor x = MulScalar(a, 1);
  AddInPlace(Select(x, 0, 1), b);
  Sum(Mul(x, x)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[2, 4, 6, 9, 8, 16]");
  EXPECT_EQ(Fmt(b.grad()), "[9, 8, 16]");
  EXPECT_EQ(Fmt(x), "[1, 2, 3, 4.5, 4, 8]");
}

// TransposeMulThenBase: a.grad = "[1, 4, 9, -4, 2.5, -12]", m.grad = "[1, 16, 4, 25, 9, 36]",
// x = "[1, 4, 9, -4, 2.5, -12]".
TEST(Views, TransposeMulThenUseOfTheBase) {
  const Tensor a = Leaf2d({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor m = Leaf2d({1, -1, 2, 0.5, 3, -2}, {3, 2});
  const Tensor c = Constant({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor x = MulScalar(a, 1);
  MulInPlace(Transpose(x, 0, 1), m);
  Sum(Mul(x, c)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[1, 4, 9, -4, 2.5, -12]");
  EXPECT_EQ(Fmt(m.grad()), "[1, 16, 4, 25, 9, 36]");
  EXPECT_EQ(Fmt(x), "[1, 4, 9, -4, 2.5, -12]");
}

// ChainOfTwoViews: a.grad = "[2, 4, 6, 8, 13, 102, 17, 19, 21, 351, 25, 27]",
// s.grad = "[306, -1170]", x = "[1, 2, 3, 4, 5, 12, 7, 8, 9, -30, 11, 12]", v.version = 1.
TEST(Views, ChainOfTwoViewsAndTheIntermediateViewAfterwards) {
  std::vector<double> values;
  for (int i = 1; i <= 12; ++i) values.push_back(i);
  const Tensor a = Leaf2d(values, {3, 4}), s = Leaf({2, -3});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  const Tensor u = Select(v, 1, 1);
  MulInPlace(u, s);
  EXPECT_EQ(v.version(), 1u);
  const Tensor loss = Add(Add(Sum(Mul(x, x)), Sum(MulScalar(v, 3))), Sum(Mul(u, u)));
  loss.backward();
  EXPECT_EQ(Fmt(a.grad()), "[2, 4, 6, 8, 13, 102, 17, 19, 21, 351, 25, 27]");
  EXPECT_EQ(Fmt(s.grad()), "[306, -1170]");
  EXPECT_EQ(Fmt(x), "[1, 2, 3, 4, 5, 12, 7, 8, 9, -30, 11, 12]");
}

// BaseInPlaceThenView: a.grad = "[0, 30, 60, 0]", w.grad = "[6, 9]", v = "[6, 9]",
// v.version 0 before, 1 after.
TEST(Views, InPlaceOnTheBaseRemakesTheViewsGradFn) {
  const Tensor a = Leaf({1, 2, 3, 4}), w = Leaf({10, 20});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  const std::shared_ptr<Node> old_fn = v.grad_fn();
  EXPECT_EQ(v.version(), 0u);
  MulScalarInPlace(x, 3);
  EXPECT_EQ(v.version(), 1u);
  EXPECT_NE(v.grad_fn(), old_fn);  // SliceBackward over the base's MulScalarInPlaceBackward
  EXPECT_EQ(v.grad_fn()->next_edges()[0].fn, x.grad_fn());
  Sum(Mul(v, w)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[0, 30, 60, 0]");
  EXPECT_EQ(Fmt(w.grad()), "[6, 9]");
  EXPECT_EQ(Fmt(v), "[6, 9]");
}

// NarrowZero: a.grad = "[8, 16, 0, 0, 40]", x = "[2, 4, 0, 0, 10]".
TEST(Views, NarrowZero) {
  const Tensor a = Leaf({1, 2, 3, 4, 5});
  const Tensor x = MulScalar(a, 2);
  FillInPlace(Narrow(x, 0, -3, 2), 0);
  Sum(Mul(x, x)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[8, 16, 0, 0, 40]");
  EXPECT_EQ(Fmt(x), "[2, 4, 0, 0, 10]");
}

// CopyIntoSlice: a.grad = "[0, 0, 3, 4]", src.grad = "[3]", x = "[7, 7, 3, 4]".
TEST(Views, CopyIntoSliceWithBroadcast) {
  const Tensor a = Leaf({1, 2, 3, 4}), src = Leaf({7});
  const Tensor w = Constant({1, 2, 3, 4}, {4});
  const Tensor x = MulScalar(a, 1);
  CopyInPlace(Slice(x, 0, 0, 2), src);
  Sum(Mul(x, w)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[0, 0, 3, 4]");
  EXPECT_EQ(Fmt(src.grad()), "[3]");
  EXPECT_EQ(Fmt(x), "[7, 7, 3, 4]");
}

// ReluOnSlice: a.grad = "[1, 2, 0, 4]", x = "[-1, 2, 0, 4]".
TEST(Views, ReluOnSlice) {
  const Tensor a = Leaf({-1, 2, -3, 4});
  const Tensor w = Constant({1, 2, 3, 4}, {4});
  const Tensor x = MulScalar(a, 1);
  ReluInPlace(Slice(x, 0, 1, 4));
  Sum(Mul(x, w)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[1, 2, 0, 4]");
  EXPECT_EQ(Fmt(x), "[-1, 2, 0, 4]");
}

// BaseWithoutGrad: a.grad = "[40, 108]", x = "[1, 10, 18, 4]", x.grad_fn = "CopySlices",
// before = "(False, False)", after = "(True, True)".
TEST(Views, ABaseWithoutGradStartsRequiringGrad) {
  const Tensor x(RawTensor::FromVector<double>({1, 2, 3, 4}, {4}, kF64));
  const Tensor a = Leaf({5, 6});
  const Tensor v = Slice(x, 0, 1, 3), v2 = Slice(x, 0, 2, 4);
  EXPECT_FALSE(x.requires_grad());
  EXPECT_FALSE(v2.requires_grad());
  MulInPlace(v, a);
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(v2.requires_grad());  // a sibling view follows its base
  EXPECT_EQ(x.grad_fn()->name(), "CopySlices");
  Sum(Mul(x, x)).backward();
  EXPECT_EQ(Fmt(a.grad()), "[40, 108]");
  EXPECT_EQ(Fmt(x), "[1, 10, 18, 4]");
}

// HooksAroundInPlaceOnView: a.grad = "[10, 46, 66, 40]", x.grad = "[10, 23, 33, 40]",
// v.grad = "[3, 3]". The view's hook registered before its in-place op stays on its old grad_fn,
// which is no longer in the graph; the base's stays on the base's old history.
TEST(Views, HooksAroundInPlaceOnView) {
  const Events kHooksAroundInPlaceOnViewEvents = {
      "v after hook [3, 3]",
      "x after hook [10, 23, 33, 40]",
      "x before hook [10, 46, 66, 40]",
  };
  Events events;
  const Tensor a = Leaf({1, 2, 3, 4});
  const Tensor w = Constant({10, 20, 30, 40}, {4});
  const Tensor x = MulScalar(a, 1);
  x.register_hook(Rec(events, "x before"));
  x.retain_grad();
  const Tensor v = Slice(x, 0, 1, 3);
  v.register_hook(Rec(events, "v before"));
  v.retain_grad();
  MulScalarInPlace(v, 2);
  x.register_hook(Rec(events, "x after"));
  v.register_hook(Rec(events, "v after"));
  Add(Sum(Mul(x, w)), Sum(MulScalar(v, 3))).backward();
  EXPECT_EQ(events, kHooksAroundInPlaceOnViewEvents);
  EXPECT_EQ(Fmt(a.grad()), "[10, 46, 66, 40]");
  EXPECT_EQ(Fmt(x.grad()), "[10, 23, 33, 40]");
  EXPECT_EQ(Fmt(v.grad()), "[3, 3]");
}

// ViewHookThenBaseInPlace: a.grad = "[0, 20, 40, 0]"; only the hook registered after the base's
// in-place op fires (the view's grad_fn was remade).
TEST(Views, ViewHookThenBaseInPlace) {
  const Events kViewHookThenBaseInPlaceEvents = {
      "v after hook [10, 20]",
  };
  Events events;
  const Tensor a = Leaf({1, 2, 3, 4});
  const Tensor w = Constant({10, 20}, {2});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  v.register_hook(Rec(events, "v before"));
  MulScalarInPlace(x, 2);
  v.register_hook(Rec(events, "v after"));
  Sum(Mul(v, w)).backward();
  EXPECT_EQ(events, kViewHookThenBaseInPlaceEvents);
  EXPECT_EQ(Fmt(a.grad()), "[0, 20, 40, 0]");
}

// LeafViewError, SavedViewModified, NoGradViewError: PyTorch's texts for the first and last;
// the saved-tensor check keeps tapegrad's text (same facts: the versions).
TEST(Views, Errors) {
  const Tensor a = Leaf({1, 2, 3, 4});
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { MulScalarInPlace(Slice(a, 0, 1, 3), 2); },
      "mul_: a view of a leaf Variable that requires grad is being used in an in-place "
      "operation."));
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  const Tensor y = Mul(v, v);  // saves v
  MulScalarInPlace(x, 2);
  EXPECT_TRUE(testing::ThrowsError([&] { Sum(y).backward(); },
                                   "MulBackward: saved tensor 0 (f64 [2]) was modified in place "
                                   "after it was saved (version 0, now 1)"));
  Tensor nv;
  {
    NoGradGuard no_grad;
    nv = Slice(x, 0, 0, 2);
  }
  EXPECT_TRUE(testing::ThrowsError(
      [&] { MulInPlace(nv, MulScalar(Slice(a, 0, 0, 2), 1)); },
      "mul_: a view was created in no_grad mode and is being modified inplace with grad mode "
      "enabled. Given that this use case is ambiguous and error-prone, it is forbidden."));
  // Without grad mode nothing records and every view may be written.
  NoGradGuard no_grad;
  MulScalarInPlace(nv, 0);
  MulScalarInPlace(Slice(a, 0, 1, 3), 2);
  EXPECT_EQ(Fmt(a), "[1, 4, 6, 4]");
}

// SplitOutputInPlace, SplitOutputAfterBaseInPlace: PyTorch's texts.
TEST(Views, OutputsOfSplitAreViewsThatCannotBeModifiedInPlace) {
  const Tensor a = Leaf({1, 2, 3, 4});
  const Tensor x = MulScalar(a, 1);
  const VariableList c = Split(x, 2, 0);
  EXPECT_TRUE(c[1].is_view());
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { MulScalarInPlace(c[1], 2); },
      "mul_: Output 1 of Split is a view and is being modified inplace. This view is the output "
      "of a function that returns multiple views. Such functions do not allow the output views "
      "to be modified inplace. You should replace the inplace operation by an out-of-place "
      "one."));
  MulScalarInPlace(x, 2);
  EXPECT_TRUE(testing::ThrowsErrorExactly(
      [&] { Sum(MulScalar(c[0], 1)).backward(); },
      "Output 0 of Split is a view and its base or another view of its base has been modified "
      "inplace. This view is the output of a function that returns multiple views. Such "
      "functions do not allow the output views to be modified inplace. You should replace the "
      "inplace operation by an out-of-place one."));
}

// An expanded view cannot be written (PyTorch: "unsupported operation: more than one element of
// the written-to tensor refers to a single memory location").
TEST(Views, InPlaceOnAnExpandedViewIsRefused) {
  const Tensor x = MulScalar(Leaf({1}), 1);
  EXPECT_TRUE(testing::ThrowsError([&] { MulScalarInPlace(Expand(x, {3}), 2); }, "expanded view"));
}

// create_graph through CopySlices: the second derivative of sum((x with x[1:3] *= x[1:3])^2)
// over the leaf, against the closed form (d/da of 2*y*dy/da: 2 outside, 12*a^2 inside).
TEST(Views, SecondOrderThroughCopySlices) {
  const Tensor a = Leaf({1, 2, 3, 4});
  const Tensor x = MulScalar(a, 1);
  const Tensor v = Slice(x, 0, 1, 3);
  MulInPlace(v, MulScalar(Slice(a, 0, 1, 3), 1));  // y = a^2 in the region
  const Tensor loss = Sum(Mul(x, x));              // sum a^2 outside, a^4 inside
  BackwardOptions options;
  options.create_graph = true;
  loss.backward(Tensor(), options);
  EXPECT_EQ(Fmt(a.grad()), "[2, 32, 108, 8]");  // 2a outside, 4a^3 inside
  const Tensor g = a.grad();
  a.set_grad(Tensor());
  Sum(g).backward();
  EXPECT_EQ(Fmt(a.grad()), "[2, 48, 108, 2]");  // 2 outside, 12a^2 inside
}

}  // namespace
}  // namespace tg
