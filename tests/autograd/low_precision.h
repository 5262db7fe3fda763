// ExpectCloseToF32: the check shared by the f16/bf16 op tests: `got` (low precision) has `dtype`,
// ref's shape, and is within 2e-2 of ref's (f32) largest magnitude everywhere; the first three
// failing elements are reported.
#ifndef TAPEGRAD_TESTS_AUTOGRAD_LOW_PRECISION_H_
#define TAPEGRAD_TESTS_AUTOGRAD_LOW_PRECISION_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/variable.h"

namespace tg::testing {

inline void ExpectCloseToF32(const Tensor& got, const Tensor& ref, DType dtype,
                             const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_TRUE(ref.defined()) << what;
  EXPECT_EQ(got.dtype(), dtype) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const std::vector<double> g = got.data().to_vector<double>();
  const std::vector<double> r = ref.data().to_vector<double>();
  double scale = 0;
  for (double v : r) scale = std::max(scale, std::abs(v));
  const double tol = 2e-2 * scale + 1e-6;
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::abs(g[i] - r[i]) <= tol) && ++failures <= 3) {
      ADD_FAILURE() << what << " [" << DTypeName(dtype) << "]: element " << i << " is " << g[i]
                    << ", f32 gives " << r[i] << " (tolerance " << tol << ")";
    }
  }
}

}  // namespace tg::testing

#endif  // TAPEGRAD_TESTS_AUTOGRAD_LOW_PRECISION_H_
