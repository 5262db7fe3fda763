// The 10-step trace shared by the formula tests (sgd_test, adam_test): a 3-element parameter
// starting at {0.5, -1.25, 2} and fixed gradients per step. tests/optim/reference_traces.py
// computes the expected values independently (Python, every f32 operation rounded with
// struct.pack) and prints them as the literals the tests hold.
//
//   ExpectTrace<SGD>(o, kSgdPlain);   // both paths, every step, exact equality
#ifndef TAPEGRAD_TESTS_OPTIM_TRACE_H_
#define TAPEGRAD_TESTS_OPTIM_TRACE_H_

#include <vector>

#include "autograd/variable.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace tg::optim::testing {

inline constexpr int kTraceSteps = 10;

// Gradient element j at step k; shrinks after step 4 so that amsgrad's maximum matters.
inline float TraceGrad(int k, int j) {
  return static_cast<float>(((k * 3 + j * 5) % 7) - 3) * (k < 4 ? 0.37f : 0.001f);
}

inline Tensor TraceParam(DType dtype = kF32) {
  return Tensor(RawTensor::FromVector<float>({0.5f, -1.25f, 2.0f}, {3}).to(dtype), true);
}

// Sets p's grad for step k (the f32 values converted to `dtype`).
inline void SetTraceGrad(const Tensor& p, int k, DType dtype) {
  std::vector<float> g;
  for (int j = 0; j < 3; ++j) g.push_back(TraceGrad(k, j));
  p.set_grad(Tensor(RawTensor::FromVector<float>(g, {3}).to(dtype)));
}

// Runs the trace on both paths and expects every step's parameter to equal `expected` exactly.
// Exact equality is the right tolerance: the reference performs the same f32 operations in the
// same order, and f32 +, -, *, / and sqrt are correctly rounded, so any difference in formula or
// operation order shows up as a different bit pattern.
template <typename Opt, typename Options>
void ExpectTrace(Options options, const float (&expected)[kTraceSteps][3], DType dtype = kF32) {
  for (bool fused : {true, false}) {
    options.fused(fused);
    Tensor p = TraceParam(dtype);
    Opt opt(std::vector<Tensor>{p}, options);
    for (int k = 0; k < kTraceSteps; ++k) {
      SetTraceGrad(p, k, dtype);
      opt.step();
      const std::vector<float> got = p.data().to_vector<float>();
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ(got[j], expected[k][j])
            << (fused ? "fused" : "per-tensor") << " step " << k << " element " << j;
      }
    }
  }
}

}  // namespace tg::optim::testing

#endif  // TAPEGRAD_TESTS_OPTIM_TRACE_H_
