// What the two op tables share: tests/tensor/op_table_test.cc (every op of tensor/ops.h,
// CUDA against the CPU) and tests/autograd/op_table.h (every differentiable op of autograd/ops.h:
// f64 gradcheck, f16/bf16 against f64, autocast policy, CUDA against the CPU). Tolerances are per
// dtype and always carry their reason. Both tables enumerate the op list (tensor/op_list.inc):
// ListedOps gives the ops a table must cover and CoverageErrors what its rows miss or add, so
// that an op without a row fails.
//
//   const Tols tols = {{1e-12, 0}, {1e-6, 0}, {kF16Ulp, 0}, {kBF16Ulp, 0}, "rounded once"};
//   const std::string m = ValueMismatches(cpu, gpu, tols.For(cpu.dtype()), 1, "CPU", "CUDA");
//   EXPECT_TRUE(m.empty()) << m << "\n  tolerance: " << tols.why;
#ifndef TAPEGRAD_TESTS_TENSOR_OP_TABLE_SUPPORT_H_
#define TAPEGRAD_TESTS_TENSOR_OP_TABLE_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tensor/op_list.h"
#include "tensor/tensor.h"

namespace tg {
namespace testing {

// An element `got` matches `want` when |got - want| <= rtol * |want| + atol * scale, where scale
// is the output's largest finite |want| (at least a floor the caller chooses): rtol covers
// rounding relative to the element itself, atol covers sums and products whose terms cancel.
struct Tol {
  double rtol = 0;
  double atol = 0;
};

struct Tols {
  Tol f64, f32, f16, bf16;  // integer and bool outputs are always exact
  std::string why;

  Tol For(DType dtype) const {
    switch (dtype) {
      case DType::kF64:
        return f64;
      case DType::kF32:
        return f32;
      case DType::kF16:
        return f16;
      case DType::kBF16:
        return bf16;
      default:
        return Tol{};
    }
  }
};

// One ulp of the 16-bit types relative to the value (at most: the spacing is 2^-11..2^-10 of a
// normal f16 value and 2^-8..2^-7 of a bf16 one), and f16's subnormal spacing.
constexpr double kF16Ulp = 1.0 / 1024;
constexpr double kBF16Ulp = 1.0 / 128;
constexpr double kF16Subnormal = 5.960464477539063e-08;  // 2^-24

// The elements of `got` that do not match `want` within `tol` (see Tol; scale = max(min_scale,
// largest finite |want|)), described for the first five ("" when all match). NaN matches NaN
// (any payload), infinities match exactly. Compares values only: the caller checks shapes and
// dtypes (`want` may be an f64 reference of a 16-bit `got`).
inline std::string ValueMismatches(const RawTensor& want, const RawTensor& got, const Tol& tol,
                                   double min_scale, const std::string& want_name,
                                   const std::string& got_name) {
  const std::vector<double> w = want.to_vector<double>(), g = got.to_vector<double>();
  if (w.size() != g.size()) {
    return absl::StrCat(want_name, " has ", w.size(), " elements, ", got_name, " ", g.size());
  }
  double scale = min_scale;
  for (double v : w) {
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  }
  std::string out;
  int reported = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    bool ok;
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      ok = std::isnan(w[i]) && std::isnan(g[i]);
    } else if (std::isinf(w[i]) || std::isinf(g[i])) {
      ok = w[i] == g[i];
    } else {
      ok = std::abs(g[i] - w[i]) <= tol.rtol * std::abs(w[i]) + tol.atol * scale;
    }
    if (!ok && reported++ < 5) {
      absl::StrAppend(&out, "\n  [", i, "] ", want_name, " ", w[i], ", ", got_name, " ", g[i],
                      " (rtol ", tol.rtol, ", atol ", tol.atol, " x ", scale, ")");
    }
  }
  if (reported > 5) absl::StrAppend(&out, "\n  ... ", reported - 5, " more");
  return out;
}

// The names of the ops of the op list (tensor/op_list.inc) that have `attribute`
// (&OpInfo::differentiable: the autograd table's ops; &OpInfo::tensor_op: the tensor table's), in
// the list's order.
inline std::vector<std::string> ListedOps(bool OpInfo::*attribute) {
  std::vector<std::string> names;
  for (const OpInfo& op : kOpList) {
    if (op.*attribute) names.push_back(op.name);
  }
  return names;
}

// What is wrong with a table's coverage of the ops it must cover, one line per problem (empty
// when none): an op of `listed` without a row, and a row whose op is not in `listed` (an op the
// list does not have, or has without the table's attribute). `row_ops` is the op of every row
// (repeats allowed); `table` names the table and `kind` the listed ops in the messages, e.g.
// "Silu (a differentiable op of tensor/op_list.inc) has no row in the autograd op table".
inline std::vector<std::string> CoverageErrors(const std::vector<std::string>& listed,
                                               const std::vector<std::string>& row_ops,
                                               const std::string& table, const std::string& kind) {
  const std::set<std::string> listed_set(listed.begin(), listed.end());
  const std::set<std::string> covered(row_ops.begin(), row_ops.end());
  std::vector<std::string> errors;
  for (const std::string& op : listed) {
    if (covered.count(op) == 0) {
      errors.push_back(
          absl::StrCat(op, " (a ", kind, " of tensor/op_list.inc) has no row in the ", table));
    }
  }
  std::set<std::string> reported;
  for (const std::string& op : row_ops) {
    if (listed_set.count(op) == 0 && reported.insert(op).second) {
      errors.push_back(absl::StrCat("the ", table, " has a row for ", op, ", which is not a ", kind,
                                    " of tensor/op_list.inc"));
    }
  }
  return errors;
}

}  // namespace testing
}  // namespace tg

#endif  // TAPEGRAD_TESTS_TENSOR_OP_TABLE_SUPPORT_H_
