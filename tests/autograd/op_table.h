// The op table of the differentiable ops (autograd/ops.h): one row per case of an op, with its
// sample inputs (shapes and ranges, drawn from a seeded generator), the op call, its f64
// gradcheck tolerances, its f16/bf16 tolerances and its CUDA-vs-CPU tolerances; its autocast
// policy is its op's entry in the op list (tensor/op_list.inc), not the row's.
// tests/autograd/op_table_test.cc runs every row through
//   - an f64 finite-difference gradcheck, and a second-order one (the gradient of
//     sum(w * f(x)^2), taken with create_graph, gradchecked again) where the backward is
//     differentiable;
//   - an f16 and a bf16 run, forward and gradients against f64 on the same rounded inputs;
//   - autocast (f16 and bf16): the output dtype the op list's policy says, gradients in the
//     inputs' dtypes;
//   - CUDA against the CPU, forward and gradients (skips without a GPU);
// and checks that every differentiable op of the op list has a row and every row names one, so a
// new op is one row here.
// The tensor-level ops (tensor/ops.h) have their own table, tests/tensor/op_table_test.cc;
// both use the tolerance types of tests/tensor/op_table_support.h.
//
//   for (const OpRow& row : OpTable()) {
//     const VariableList in = MakeInputs(row, /*seed=*/1, kF64);
//     GradcheckResult r = Gradcheck(row.run, in, row.gradcheck.options);
//   }
#ifndef TAPEGRAD_TESTS_AUTOGRAD_OP_TABLE_H_
#define TAPEGRAD_TESTS_AUTOGRAD_OP_TABLE_H_

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/variable.h"
#include "tensor/tensor.h"
#include "tests/tensor/op_table_support.h"

namespace tg {
namespace testing {

// An input of a row: uniform in [lo, hi), pushed away from 0 by min_abs (|x| >= min_abs) for
// ops with a kink there (relu, abs); or, with `distinct`, a shuffled grid of values 0.01 apart
// from -1 up (no ties, not even within a finite-difference step: max pooling).
struct InputSpec {
  Shape shape;
  double lo = -1;
  double hi = 1;
  double min_abs = 0;
  bool distinct = false;
};

struct GradcheckTol {
  GradcheckOptions options;
  std::string why;
};

struct OpRow {
  std::string op;    // the op of the op list (its differentiable function) this row exercises
  std::string name;  // what the row runs
  std::vector<InputSpec> inputs;
  // The op on the inputs (leaves that require grad, all of one dtype and device); any constant
  // it needs (indices, masks) is made on the inputs' device.
  std::function<Tensor(const VariableList&)> run;
  GradcheckTol gradcheck;
  // The backward is made of differentiable ops (create_graph works); "" when it is, else why not.
  std::string first_order_only;
  // f16/bf16 forward and gradients against f64 on the same rounded inputs (f16 and bf16 fields;
  // atol relative to the largest |f64 value|).
  Tols low_precision;
  // CUDA against the CPU, forward and gradients, in f32/f16/bf16 (atol relative to
  // max(1, largest |CPU value|), as in tests/tensor/op_table_test.cc).
  Tols cuda;

  OpRow& WithGradcheck(double eps, double atol, double rtol, std::string why);
  OpRow& WithLowPrecision(Tol f16, Tol bf16, std::string why);
  OpRow& WithCuda(Tols tols);
  OpRow& FirstOrderOnly(std::string why);
};

// Every row, in the order of autograd/ops.h.
const std::vector<OpRow>& OpTable();

// The row's inputs: drawn in f64 from Generator(seed), then converted to `dtype` and moved to
// `device`, as leaves that require grad (so the 16-bit inputs are the rounded f64 draws).
VariableList MakeInputs(const OpRow& row, uint64_t seed, DType dtype = kF64,
                        Device device = Device::Cpu());

// "op (case)" for messages.
std::string Describe(const OpRow& row);
// The seed of a row, from its description (FNV-1a): every driver draws the same inputs for a
// row, and adding a row anywhere leaves the other rows' inputs as they were.
uint64_t SeedOf(const OpRow& row);
// The output of fn and the gradients of sum(c * output) with respect to every input, with c a
// fixed weighting (exact in every floating dtype).
VariableList OutputAndGrads(const std::function<Tensor(const VariableList&)>& fn,
                            const VariableList& inputs);

// The message of the exception fn throws ("" when it throws none).
template <typename F>
std::string ErrorOf(F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace testing
}  // namespace tg

#endif  // TAPEGRAD_TESTS_AUTOGRAD_OP_TABLE_H_
