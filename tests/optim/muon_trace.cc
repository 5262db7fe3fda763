// Prints the f32 parameters and momentum buffers optim::Muon reaches after `steps` steps from the
// inputs of tests/optim/muon_trace_inputs.h, which tests/optim/muon_trace_compare.py gives
// torch.optim.Muon too before comparing the two bit for bit:
//
//   muon_trace STEPS NESTEROV(0|1) ADJUST_LR(original|match_rms_adamw) NS_DTYPE(bf16|f64)
//
// Output: one line per tensor, "param K" or "momentum K" followed by the f32 bit patterns of its
// elements in row-major order (8 hex digits each).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "optim/muon.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#include "tests/optim/muon_trace_inputs.h"

namespace {

void Print(const char* what, size_t k, const tg::RawTensor& t) {
  std::printf("%s %zu", what, k);
  for (uint32_t bits : tg::optim::testing::F32Bits(t)) std::printf(" %08x", bits);
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
  const std::vector<tg::Tensor> params = tg::optim::testing::MuonTraceParams();
  tg::optim::Muon opt(
      params, tg::optim::MuonOptions(0.02)
                  .nesterov(nesterov == "1")
                  .adjust_lr_fn(adjust == "original" ? tg::optim::MuonAdjustLr::kOriginal
                                                     : tg::optim::MuonAdjustLr::kMatchRmsAdamW)
                  .ns_dtype(ns == "bf16" ? tg::kBF16 : tg::kF64));
  tg::optim::testing::RunMuonTrace(opt, params, steps);
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
