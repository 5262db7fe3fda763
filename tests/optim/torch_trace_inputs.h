// The inputs of the optimizer traces compared with torch's Muon, Adam and AdamW
// (tests/optim/torch_trace.cc, torch_trace_compare.py, and the pinned fingerprints of muon_test.cc
// and adam_test.cc): a [16, 40] and a [48, 24]
// f32 parameter at p[i][j] = 0.5 sin(1.3 i + 0.7 j + k), gradients g_t[i][j] =
// cos(0.9 i - 1.1 j + 0.5 t + k), each computed in f64 and rounded to f32.
#ifndef TAPEGRAD_TESTS_OPTIM_TORCH_TRACE_INPUTS_H_
#define TAPEGRAD_TESTS_OPTIM_TORCH_TRACE_INPUTS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "autograd/variable.h"
#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace tg::optim::testing {

inline const std::vector<std::vector<int64_t>>& TorchTraceShapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{{16, 40}, {48, 24}};
  return *shapes;
}

// f(i, j) of a [rows, cols] matrix in f64, rounded to f32.
template <typename F>
RawTensor TorchTraceMatrix(int64_t rows, int64_t cols, F f) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      v.push_back(f(static_cast<double>(i), static_cast<double>(j)));
  }
  return RawTensor::FromVector(v, {rows, cols}).to(kF32);
}

inline std::vector<Tensor> TorchTraceParams() {
  std::vector<Tensor> params;
  for (size_t k = 0; k < TorchTraceShapes().size(); ++k) {
    const double kd = static_cast<double>(k);
    params.emplace_back(TorchTraceMatrix(TorchTraceShapes()[k][0], TorchTraceShapes()[k][1],
                                         [kd](double i, double j) {
                                           return 0.5 * std::sin(1.3 * i + 0.7 * j + kd);
                                         }),
                        true);
  }
  return params;
}

// `steps` steps of `opt` over `params` with the trace's gradients.
inline void RunTorchTrace(Optimizer& opt, const std::vector<Tensor>& params, int steps) {
  for (int t = 0; t < steps; ++t) {
    for (size_t k = 0; k < params.size(); ++k) {
      const double kd = static_cast<double>(k);
      params[k].set_grad(Tensor(TorchTraceMatrix(
          TorchTraceShapes()[k][0], TorchTraceShapes()[k][1],
          [kd, t](double i, double j) { return std::cos(0.9 * i - 1.1 * j + 0.5 * t + kd); })));
    }
    opt.step();
  }
}

// The f32 bit patterns of a tensor, row-major.
inline std::vector<uint32_t> F32Bits(const RawTensor& t) {
  std::vector<uint32_t> bits;
  for (float f : t.to_vector<float>()) {
    uint32_t b = 0;
    std::memcpy(&b, &f, sizeof(b));
    bits.push_back(b);
  }
  return bits;
}

// FNV-1a (64 bits) over the 4-byte little-endian words of each tensor's bits, in order: the
// fingerprint torch_trace_compare.py --fingerprint prints for torch's tensors.
inline uint64_t Fingerprint(const std::vector<RawTensor>& tensors) {
  uint64_t h = 14695981039346656037ull;
  for (const RawTensor& t : tensors) {
    for (uint32_t w : F32Bits(t)) {
      for (int byte = 0; byte < 4; ++byte) {
        h ^= (w >> (8 * byte)) & 0xff;
        h *= 1099511628211ull;
      }
    }
  }
  return h;
}

}  // namespace tg::optim::testing

#endif  // TAPEGRAD_TESTS_OPTIM_TORCH_TRACE_INPUTS_H_
