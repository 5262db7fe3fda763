// Prints the f32 parameters and optimizer state that optim::Muon, Adam or AdamW reach after
// `steps` steps from the inputs of tests/optim/torch_trace_inputs.h, which
// tests/optim/torch_trace_compare.py gives torch's optimizer too before comparing the two bit for
// bit:
//
//   torch_trace muon STEPS NESTEROV(0|1) ADJUST_LR(original|match_rms_adamw) NS_DTYPE(bf16|f64)
//   torch_trace adam|adamw STEPS WEIGHT_DECAY AMSGRAD(0|1)      (lr 0.01, torch's other defaults)
//
// Output: one line per tensor, "param K", or the state tensor's torch name and K
// ("momentum_buffer K", "exp_avg K", ...), followed by the f32 bit patterns of its elements in
// row-major order (8 hex digits each).
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "optim/adam.h"
#include "optim/muon.h"
#include "tensor/error.h"
#include "tensor/tensor.h"
#include "tests/optim/torch_trace_inputs.h"

namespace {

constexpr char kUsage[] =
    "usage: torch_trace muon STEPS NESTEROV(0|1) ADJUST_LR(original|match_rms_adamw) "
    "NS_DTYPE(bf16|f64)\n       torch_trace adam|adamw STEPS WEIGHT_DECAY AMSGRAD(0|1)";

void Print(const std::string& what, size_t k, const tg::RawTensor& t) {
  std::printf("%s %zu", what.c_str(), k);
  for (uint32_t bits : tg::optim::testing::F32Bits(t)) std::printf(" %08x", bits);
  std::printf("\n");
}

bool Flag(const std::string& value, const char* name) {
  TG_CHECK(value == "0" || value == "1", "torch_trace: ", name, " must be 0 or 1, got ", value);
  return value == "1";
}

std::unique_ptr<tg::optim::Optimizer> MakeMuon(const std::vector<tg::Tensor>& params, int argc,
                                               char** argv) {
  TG_CHECK(argc == 6, kUsage);
  const bool nesterov = Flag(argv[3], "NESTEROV");
  const std::string adjust = argv[4], ns = argv[5];
  TG_CHECK(adjust == "original" || adjust == "match_rms_adamw",
           "torch_trace: ADJUST_LR must be original or match_rms_adamw, got ", adjust);
  TG_CHECK(ns == "bf16" || ns == "f64", "torch_trace: NS_DTYPE must be bf16 or f64, got ", ns);
  return std::make_unique<tg::optim::Muon>(
      params, tg::optim::MuonOptions(0.02)
                  .nesterov(nesterov)
                  .adjust_lr_fn(adjust == "original" ? tg::optim::MuonAdjustLr::kOriginal
                                                     : tg::optim::MuonAdjustLr::kMatchRmsAdamW)
                  .ns_dtype(ns == "bf16" ? tg::kBF16 : tg::kF64));
}

std::unique_ptr<tg::optim::Optimizer> MakeAdam(const std::vector<tg::Tensor>& params,
                                               bool decoupled, int argc, char** argv) {
  TG_CHECK(argc == 5, kUsage);
  char* end = nullptr;
  const double weight_decay = std::strtod(argv[3], &end);
  TG_CHECK(*argv[3] != '\0' && *end == '\0' && std::isfinite(weight_decay) && weight_decay >= 0,
           "torch_trace: WEIGHT_DECAY must be a number >= 0, got ", argv[3]);
  const bool amsgrad = Flag(argv[4], "AMSGRAD");
  if (decoupled) {
    return std::make_unique<tg::optim::AdamW>(
        params, tg::optim::AdamWOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
  }
  return std::make_unique<tg::optim::Adam>(
      params, tg::optim::AdamOptions(0.01).weight_decay(weight_decay).amsgrad(amsgrad));
}

int Run(int argc, char** argv) {
  TG_CHECK(argc >= 3, kUsage);
  const std::string kind = argv[1];
  TG_CHECK(kind == "muon" || kind == "adam" || kind == "adamw",
           "torch_trace: the optimizer must be muon, adam or adamw, got ", kind);
  char* end = nullptr;
  errno = 0;
  const long steps = std::strtol(argv[2], &end, 10);
  TG_CHECK(*argv[2] != '\0' && *end == '\0' && errno == 0 && steps >= 0 && steps <= 1000000,
           "torch_trace: STEPS must be an integer in [0, 1000000], got ", argv[2]);
  const std::vector<tg::Tensor> params = tg::optim::testing::TorchTraceParams();
  const std::unique_ptr<tg::optim::Optimizer> opt =
      kind == "muon" ? MakeMuon(params, argc, argv) : MakeAdam(params, kind == "adamw", argc, argv);
  tg::optim::testing::RunTorchTrace(*opt, params, static_cast<int>(steps));
  for (size_t k = 0; k < params.size(); ++k) {
    Print("param", k, params[k].data());
    for (const auto& [name, tensor] : opt->param_state(params[k])->tensors) Print(name, k, tensor);
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
