// Every row of the differentiable-op table (tests/autograd/op_table.h) through the f64
// gradcheck (first and second order), f16/bf16 against f64 and the autocast policy of the op
// list (tensor/op_list.inc), on the CPU; and the table against the op list, so a differentiable
// op without a row fails here. The same rows on every registered device against the CPU:
// op_table_devices_test.cc. The tensor-level ops have
// tests/tensor/op_table_test.cc.
#include "tests/autograd/op_table.h"

#include <algorithm>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/dispatch_mode.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/op_list.h"
#include "tests/tensor/op_table_support.h"

namespace tg {

// gtest prints a DType by name ("f16"), not as a byte (found by argument-dependent lookup).
static void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }

namespace {

using testing::CoverageErrors;
using testing::Describe;
using testing::ErrorOf;
using testing::ListedOps;
using testing::MakeInputs;
using testing::OpRow;
using testing::OpTable;
using testing::OutputAndGrads;
using testing::SeedOf;
using testing::Tol;
using testing::ValueMismatches;
using Fn = std::function<Tensor(const VariableList&)>;

// ---- (a) f64 gradcheck -------------------------------------------------------------------------

TEST(OpTableGradcheck, EveryRow) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    SCOPED_TRACE(Describe(row));
    GradcheckResult result;
    const std::string error = ErrorOf(
        [&] { result = Gradcheck(row.run, MakeInputs(row, SeedOf(row)), row.gradcheck.options); });
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
    const Tensor out = fn(in);
    std::vector<double> w(static_cast<size_t>(out.numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5 + 0.25 * static_cast<double>(i % 5);
    const Tensor loss =
        Sum(Mul(Mul(out, out), Tensor(RawTensor::FromVector<double>(w, out.shape()))));
    GradOptions options;
    options.create_graph = true;
    VariableList grads = Engine::Grad({loss}, in, {}, options);
    VariableList flat;
    for (const Tensor& g : grads) flat.push_back(Reshape(g, {g.numel()}));
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
      result = Gradcheck(GradientOf(row.run), MakeInputs(row, SeedOf(row)), row.gradcheck.options);
    });
    EXPECT_EQ(error, "");
    EXPECT_TRUE(result.ok) << Describe(row) << ": " << result.message
                           << "\n  tolerance: " << row.gradcheck.why;
  }
}

// ---- (b) f16 / bf16 against f64 ----------------------------------------------------------------

// `got` has `dtype` and want's shape and is within tol (atol of want's largest magnitude, at
// least 1e-4) of want.
void ExpectClose(const Tensor& got, const Tensor& want, DType dtype, const Tol& tol,
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
      const VariableList low = MakeInputs(row, SeedOf(row), dtype);
      VariableList ref;  // the same rounded values in f64
      for (const Tensor& v : low) ref.emplace_back(v.data().to(kF64), true);
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
  for (size_t i = 0; i < in.size(); ++i) in[i] = Tensor(in[i].data().to(dtypes[i]), true);
  Tensor out;
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

// The policy is the op list's (AutocastPolicyOf): the table states none of its own, so the
// policy lives once, and a list entry whose op does not apply it fails here.
TEST(OpTableAutocast, EveryRowFollowsTheOpListPolicy) {
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    const OpInfo* op = FindOp(row.op);
    if (op == nullptr) continue;  // OpTableTest.CoversExactlyTheDifferentiableOpsOfTheOpList
    const CastPolicy policy = op->autocast;
    const size_t n = row.inputs.size();
    for (DType low : {kF16, kBF16}) {
      const std::string what = absl::StrCat(Describe(row), " under ", DTypeName(low),
                                            " autocast, policy ", CastPolicyName(policy));
      SCOPED_TRACE(what);
      const std::string error = ErrorOf([&] {
        // f32 inputs: only low-precision ops compute in the autocast dtype.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(row), low, std::vector<DType>(n, kF32),
                                           what + ", f32 inputs"),
                  policy == CastPolicy::kLowPrecision ? low : kF32);
        // 16-bit inputs: only f32 ops leave the autocast dtype.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(row), low, std::vector<DType>(n, low),
                                           what + ", " + DTypeName(low) + " inputs"),
                  policy == CastPolicy::kFloat32 ? kF32 : low);
        // f64 is never cast.
        EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(row), low, std::vector<DType>(n, kF64),
                                           what + ", f64 inputs"),
                  kF64);
        // Mixed inputs promote to the widest.
        if (policy == CastPolicy::kPromote && n >= 2) {
          std::vector<DType> mixed(n, kF32);
          mixed[0] = low;
          EXPECT_EQ(OutputDTypeUnderAutocast(row, SeedOf(row), low, mixed, what + ", mixed inputs"),
                    kF32);
        }
      });
      EXPECT_EQ(error, "");
    }
  }
}

// ---- (d) Dispatch and selective checkpointing -------------------------------------------------

// Records the ops of the calls that reach it and runs them.
class RecordingMode : public OpDispatchMode {
 public:
  DispatchResult Call(OpId op, const VariableList&,
                      const std::function<DispatchResult()>& run) override {
    ops.push_back(op);
    return run();
  }
  std::vector<OpId> ops;
};

// Every row of a dispatched op (its checkpoint column is not kNone) reaches a mode with that op:
// the column is what a selective checkpoint policy can name, so an op that forgot Dispatch fails.
TEST(OpTableDispatch, EveryDispatchedOpReachesTheMode) {
  for (const OpRow& row : OpTable()) {
    const OpInfo* op = FindOp(row.op);
    if (op == nullptr || op->checkpoint == CheckpointDefault::kNone) continue;
    SCOPED_TRACE(Describe(row));
    const VariableList inputs = MakeInputs(row, SeedOf(row));
    RecordingMode mode;
    {
      const OpDispatchModeGuard guard(&mode);
      row.run(inputs);
    }
    EXPECT_NE(std::find(mode.ops.begin(), mode.ops.end(), op->id), mode.ops.end());
  }
}

// Every row inside a non-reentrant checkpoint, with every dispatched call kept and with every one
// recomputed, gives the bits of the row without checkpointing; when everything is kept, the
// recomputation runs no dispatched kernel at all. A row of an in-place op modifies an output it
// keeps, which the recomputation refuses (as PyTorch does) unless allow_cache_entry_mutation,
// or, when it stops on the inputs of the op that made that output, never takes it (PyTorch does
// not run that op).
TEST(OpTableSelectiveCheckpoint, KeepAllAndRecomputeAllMatchNoCheckpointBitForBit) {
  for (const OpRow& row : OpTable()) {
    if (FindOp(row.op) == nullptr) continue;
    for (const bool keep : {true, false}) {
      SCOPED_TRACE(absl::StrCat(Describe(row), keep ? ", every call kept" : ", none kept"));
      const std::string error = ErrorOf([&] {
        const VariableList plain = OutputAndGrads(row.run, MakeInputs(row, SeedOf(row)));
        RecordingMode recomputed;  // below the selective mode in each recomputation
        CheckpointOptions options;
        options.reentrant = false;
        options.context_fn = [keep, &recomputed] {
          CheckpointContexts selective = CreateSelectiveCheckpointContexts(
              [keep](const SelectiveCheckpointContext&, OpId, const VariableList&) {
                return keep ? CheckpointPolicy::kMustSave : CheckpointPolicy::kMustRecompute;
              });
          CheckpointContexts c;
          c.forward = selective.forward;
          c.recompute = [selective, &recomputed]() -> std::shared_ptr<void> {
            struct Entered {
              OpDispatchModeGuard below;
              std::shared_ptr<void> inner;
            };
            return std::shared_ptr<Entered>(
                new Entered{OpDispatchModeGuard(&recomputed), selective.recompute()});
          };
          return c;
        };
        const Fn checkpointed = [&row, &options](const VariableList& in) {
          return Checkpoint(row.run, in, options);
        };
        const VariableList selective = OutputAndGrads(checkpointed, MakeInputs(row, SeedOf(row)));
        ASSERT_EQ(selective.size(), plain.size());
        for (size_t i = 0; i < plain.size(); ++i) {
          SCOPED_TRACE(i == 0 ? std::string("output") : absl::StrCat("gradient ", i - 1));
          ASSERT_EQ(selective[i].defined(), plain[i].defined());
          if (!plain[i].defined()) continue;
          EXPECT_EQ(selective[i].data().to_vector<double>(), plain[i].data().to_vector<double>());
        }
        if (keep) {
          EXPECT_EQ(recomputed.ops.size(), 0u);
        }
      });
      if (keep && row.op.find("InPlace") != std::string::npos && !error.empty()) {
        EXPECT_NE(error.find("kept by the selective checkpoint policy, was modified in place"),
                  std::string::npos)
            << error;
      } else {
        EXPECT_EQ(error, "");
      }
    }
  }
}

// ---- (e) The table itself ----------------------------------------------------------------------

std::vector<std::string> RowOps() {
  std::vector<std::string> ops;
  for (const OpRow& row : OpTable()) ops.push_back(row.op);
  return ops;
}

// Every differentiable op of the op list has a row, and every row names one: the list, not the
// text of autograd/ops.h, decides what the table must cover.
TEST(OpTableTest, CoversExactlyTheDifferentiableOpsOfTheOpList) {
  const std::vector<std::string> listed = ListedOps(&OpInfo::differentiable);
  EXPECT_GE(listed.size(), 50u);
  for (const std::string& error :
       CoverageErrors(listed, RowOps(), "autograd op table", "differentiable op")) {
    ADD_FAILURE() << error;
  }
}

// The check itself, on a fabricated list: a listed op without a row and a row for an op that is
// not listed (here one the list has, but not with the table's attribute) are both reported, once
// each, in the list's and then the rows' order.
TEST(OpTableTest, CoverageErrorsReportsAMissingRowAndAnUnlistedRow) {
  const std::vector<std::string> listed = {"Add", "Silu", "Matmul"};
  const std::vector<std::string> rows = {"Add", "Matmul", "Argmax", "Add", "Argmax"};
  EXPECT_EQ(CoverageErrors(listed, rows, "autograd op table", "differentiable op"),
            (std::vector<std::string>{
                "Silu (a differentiable op of tensor/op_list.inc) has no row in the autograd op "
                "table",
                "the autograd op table has a row for Argmax, which is not a differentiable op of "
                "tensor/op_list.inc"}));
  EXPECT_EQ(
      CoverageErrors(listed, {"Add", "Silu", "Matmul"}, "autograd op table", "differentiable op"),
      std::vector<std::string>{});
}

// ListedOps reads the product's list: the attribute selects the ops, in the list's order.
TEST(OpTableTest, ListedOpsSelectsByAttribute) {
  const std::vector<std::string> differentiable = ListedOps(&OpInfo::differentiable);
  const std::vector<std::string> tensor = ListedOps(&OpInfo::tensor_op);
  auto has = [](const std::vector<std::string>& v, const std::string& op) {
    return std::find(v.begin(), v.end(), op) != v.end();
  };
  EXPECT_EQ(differentiable.front(), "Add");
  EXPECT_TRUE(has(differentiable, "Matmul") && has(tensor, "Matmul"));
  EXPECT_TRUE(has(differentiable, "FusedCrossEntropy") && !has(tensor, "FusedCrossEntropy"));
  EXPECT_TRUE(!has(differentiable, "Argmax") && has(tensor, "Argmax"));
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
