// Prints the f32 parameters and momentum buffers optim::Muon reaches after `steps` steps from the
// inputs of tests/optim/muon_trace_compare.py, which runs torch.optim.Muon on the same inputs
// and compares the two bit for bit:
//
//   muon_trace STEPS NESTEROV(0|1) ADJUST_LR(original|match_rms_adamw) NS_DTYPE(bf16|f64)
//
// Output: one line per tensor, "param K" or "momentum K" followed by the f32 bit patterns of its
// elements in row-major order (8 hex digits each).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "optim/muon.h"
#include "tensor/error.h"
#include "tensor/tensor.h"

namespace {

// The trace's shapes: one wide, one tall (its iteration runs on the transpose).
const std::vector<std::vector<int64_t>> kShapes = {{16, 40}, {48, 24}};

// f(i, j) of a [rows, cols] matrix in f64, rounded to f32.
template <typename F>
tg::RawTensor Matrix(int64_t rows, int64_t cols, F f) {
  std::vector<double> v;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      v.push_back(f(static_cast<double>(i), static_cast<double>(j)));
  }
  return tg::RawTensor::FromVector(v, {rows, cols}).to(tg::kF32);
}

void Print(const char* what, size_t k, const tg::RawTensor& t) {
  std::printf("%s %zu", what, k);
  for (float f : t.to_vector<float>()) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    std::printf(" %08x", bits);
  }
  std::printf("\n");
}

int Run(int argc, char** argv) {
  TG_CHECK(argc == 5,
           "usage: muon_trace STEPS NESTEROV(0|1) ADJUST_LR(original|match_rms_adamw) "
           "NS_DTYPE(bf16|f64)");
  const int steps = std::atoi(argv[1]);
  TG_CHECK(steps >= 0, "muon_trace: STEPS must be >= 0, got ", argv[1]);
  const std::string nesterov = argv[2], adjust = argv[3], ns = argv[4];
  TG_CHECK(nesterov == "0" || nesterov == "1", "muon_trace: NESTEROV must be 0 or 1, got ",
           nesterov);
  TG_CHECK(adjust == "original" || adjust == "match_rms_adamw",
           "muon_trace: ADJUST_LR must be original or match_rms_adamw, got ", adjust);
  TG_CHECK(ns == "bf16" || ns == "f64", "muon_trace: NS_DTYPE must be bf16 or f64, got ", ns);
  std::vector<tg::Tensor> params;
  for (size_t k = 0; k < kShapes.size(); ++k) {
    params.emplace_back(Matrix(kShapes[k][0], kShapes[k][1],
                               [k](double i, double j) {
                                 return 0.5 * std::sin(1.3 * i + 0.7 * j + static_cast<double>(k));
                               }),
                        true);
  }
  tg::optim::Muon opt(
      params, tg::optim::MuonOptions(0.02)
                  .nesterov(nesterov == "1")
                  .adjust_lr_fn(adjust == "original" ? tg::optim::MuonAdjustLr::kOriginal
                                                     : tg::optim::MuonAdjustLr::kMatchRmsAdamW)
                  .ns_dtype(ns == "bf16" ? tg::kBF16 : tg::kF64));
  for (int t = 0; t < steps; ++t) {
    for (size_t k = 0; k < params.size(); ++k) {
      params[k].set_grad(
          tg::Tensor(Matrix(kShapes[k][0], kShapes[k][1], [k, t](double i, double j) {
            return std::cos(0.9 * i - 1.1 * j + 0.5 * t + static_cast<double>(k));
          })));
    }
    opt.step();
  }
  for (size_t k = 0; k < params.size(); ++k) {
    Print("param", k, params[k].data());
    Print("momentum", k, opt.param_state(params[k])->tensors.at("momentum_buffer"));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
