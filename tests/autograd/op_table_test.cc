// Every row of the differentiable-op table (tests/autograd/op_table.h) through the f64
// gradcheck (first and second order), f16/bf16 against f64 and the autocast policy, on the CPU;
// and the table against the declarations of autograd/ops.h, so an op without a row fails here.
// CUDA against the CPU: op_table_cuda_test.cc. The tensor-level ops have
// tests/tensor/cuda/op_table_test.cc.
#include "tests/autograd/op_table.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/autocast.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tests/tensor/op_table_support.h"

namespace tg {
namespace {

using testing::AutocastPolicy;
using testing::Describe;
using testing::ErrorOf;
using testing::MakeInputs;
using testing::OpRow;
using testing::OpTable;
using testing::OutputAndGrads;
using testing::SeedOf;
using testing::Tol;
using testing::ValueMismatches;
using Fn = std::function<Variable(const VariableList&)>;

// ---- (a) f64 gradcheck -------------------------------------------------------------------------

TEST(OpTableGradcheck, EveryRow) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    SCOPED_TRACE(Describe(row));
    GradcheckResult result;
    const std::string error = ErrorOf(
        [&] { result = Gradcheck(row.run, MakeInputs(row, SeedOf(r)), row.gradcheck.options); });
    EXPECT_EQ(error, "");
    EXPECT_TRUE(result.ok) << Describe(row) << ": " << result.message
                           << "\n  tolerance: " << row.gradcheck.why;
  }
}

// The gradient of sum(w * fn(in)^2) with respect to every input, flattened and concatenated,
// computed with create_graph so that it is differentiable itself (a gradient penalty). The
// square makes the gradient depend on the inputs even for linear ops.
Fn GradientOf(const Fn& fn) {
  return [fn](const VariableList& in) {
    EnableGradGuard grad_mode;  // gradcheck evaluates under no-grad; this backward needs a graph
    const Variable out = fn(in);
    std::vector<double> w(static_cast<size_t>(out.numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + 0.25 * static_cast<double>(i % 5);
    const Variable loss =
        Sum(Mul(Mul(out, out), Variable(Tensor::FromVector<double>(w, out.shape()))));
    GradOptions options;
    options.create_graph = true;
    VariableList grads = Engine::Grad({loss}, in, {}, options);
    VariableList flat;
    for (const Variable& g : grads) flat.push_back(Reshape(g, {g.numel()}));
    return Cat(flat, 0);
  };
}

TEST(OpTableGradcheck, SecondOrderOfEveryRowWithADifferentiableBackward) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    if (!row.first_order_only.empty()) continue;
    SCOPED_TRACE(Describe(row));
    GradcheckResult result;
    const std::string error = ErrorOf([&] {
      result = Gradcheck(GradientOf(row.run), MakeInputs(row, SeedOf(r)), row.gradcheck.options);
    });
    EXPECT_EQ(error, "");
    EXPECT_TRUE(result.ok) << Describe(row) << ": " << result.message
                           << "\n  tolerance: " << row.gradcheck.why;
  }
}

// ---- (b) f16 / bf16 against f64 ----------------------------------------------------------------

// `got` has `dtype` and want's shape and is within tol (atol of want's largest magnitude, at
// least 1e-4) of want.
void ExpectClose(const Variable& got, const Variable& want, DType dtype, const Tol& tol,
                 const std::string& what, const std::string& why) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(want.defined()) << what;
  EXPECT_EQ(got.dtype(), dtype) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::string m =
      ValueMismatches(want.data(), got.data(), tol, 1e-4, "f64", DTypeName(dtype));
  EXPECT_TRUE(m.empty()) << what << ":" << m << "\n  tolerance: " << why;
}

TEST(OpTableLowPrecision, EveryRowForwardAndGradientsMatchF64) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    for (DType dtype : {kF16, kBF16}) {
      const std::string what = absl::StrCat(Describe(row), " [", DTypeName(dtype), "]");
      SCOPED_TRACE(what);
      const VariableList low = MakeInputs(row, SeedOf(r), dtype);
      VariableList ref;  // the same rounded values in f64
      for (const Variable& v : low) ref.emplace_back(v.data().to(kF64), true);
      VariableList got, want;
      const std::string error = ErrorOf([&] {
        got = OutputAndGrads(row.run, low);
        want = OutputAndGrads(row.run, ref);
      });
      ASSERT_EQ(error, "");
      const Tol tol = row.low_precision.For(dtype);
      ExpectClose(got[0], want[0], dtype, tol, what + " output", row.low_precision.why);
      for (size_t i = 0; i < low.size(); ++i) {
        ExpectClose(got[i + 1], want[i + 1], dtype, tol,
                    absl::StrCat(what, " gradient of input ", i), row.low_precision.why);
      }
    }
  }
}

// ---- (c) autocast ------------------------------------------------------------------------------

// The row's output dtype under autocast to `low` for inputs of `dtypes` (one per input);
// gradients (taken outside the guard, as in PyTorch) must come back in the inputs' dtypes.
DType OutputDTypeUnderAutocast(const OpRow& row, uint64_t seed, DType low,
                               const std::vector<DType>& dtypes, const std::string& what) {
  VariableList in = MakeInputs(row, seed);
  for (size_t i = 0; i < in.size(); ++i) in[i] = Variable(in[i].data().to(dtypes[i]), true);
  Variable out;
  {
    amp::AutocastGuard autocast(low);
    out = row.run(in);
  }
  const VariableList grads = Engine::Grad({Sum(Cast(out, kF64))}, in);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(grads[i].dtype(), dtypes[i]) << what << ": gradient of input " << i;
  }
  return out.dtype();
}

TEST(OpTableAutocast, EveryRowFollowsItsPolicy) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    const size_t n = row.inputs.size();
    for (DType low : {kF16, kBF16}) {
      const std::string what = absl::StrCat(Describe(row), " under ", DTypeName(low),
                                            " autocast, policy ", AutocastPolicyName(row.autocast));
      SCOPED_TRACE(what);
      const std::string error = ErrorOf([&] {
        // f32 inputs: only low-precision ops compute in the autocast dtype.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(r), low, std::vector<DType>(n, kF32),
                                           what + ", f32 inputs"),
                  row.autocast == AutocastPolicy::kLowPrecision ? low : kF32);
        // 16-bit inputs: only f32 ops leave the autocast dtype.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(r), low, std::vector<DType>(n, low),
                                           what + ", " + DTypeName(low) + " inputs"),
                  row.autocast == AutocastPolicy::kFloat32 ? kF32 : low);
        // f64 is never cast.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(r), low, std::vector<DType>(n, kF64),
                                           what + ", f64 inputs"),
                  kF64);
        // Mixed inputs promote to the widest.
        if (row.autocast == AutocastPolicy::kPromote && n >= 2) {
          std::vector<DType> mixed(n, kF32);
          mixed[0] = low;
          EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(r), low, mixed, what + ", mixed inputs"),
                    kF32);
        }
      });
      EXPECT_EQ(error, "");
    }
  }
}

// ---- (e) The table itself ----------------------------------------------------------------------

// Declared in autograd/ops.h but not ops of their own, with the reason.
const std::set<std::string>& NotOps() {
  static const auto* names = new std::set<std::string>{};
  return *names;
}

TEST(OpTableTest, HasARowForEveryOpInAutogradOpsH) {
  const std::set<std::string> declared = ::tg::testing::DeclaredOps("autograd/ops.h");
  EXPECT_GE(declared.size(), 40u) << "the declarations of autograd/ops.h were not recognised";
  std::set<std::string> covered;
  for (const OpRow& row : OpTable()) covered.insert(row.op);
  for (const std::string& op : declared) {
    if (NotOps().count(op) > 0) continue;
    EXPECT_TRUE(covered.count(op) > 0) << op << " (autograd/ops.h) has no row in the op table";
  }
  for (const std::string& op : covered) {
    EXPECT_TRUE(declared.count(op) > 0) << "the table names " << op << ", not in autograd/ops.h";
  }
  for (const std::string& op : NotOps()) {
    EXPECT_TRUE(declared.count(op) > 0) << op << " is exempted but no longer declared";
  }
}

TEST(OpTableTest, EveryToleranceHasAReason) {
  for (const OpRow& row : OpTable()) {
    EXPECT_FALSE(row.gradcheck.why.empty()) << Describe(row);
    EXPECT_FALSE(row.low_precision.why.empty()) << Describe(row);
    EXPECT_FALSE(row.cuda.why.empty()) << Describe(row);
    EXPECT_FALSE(row.inputs.empty()) << Describe(row);
  }
}

}  // namespace
}  // namespace tg
