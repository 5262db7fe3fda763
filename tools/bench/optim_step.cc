// AdamW step throughput over 10^7 f32 parameters on the CPU: the fused multi-tensor path (one
// pass over memory per parameter) against the per-tensor path (composed tensor ops, several
// passes), each in GB/s of the minimal memory traffic of an AdamW step (read p, g, m, v; write
// p, m, v: 28 bytes per parameter) and as a fraction of a memcpy measured in the same run.
// Ratios, not timings, are what to compare across machines. Then a Muon step (torch.optim.Muon's
// defaults: bf16 Newton-Schulz, 5 iterations, Nesterov) over 8 f32 matrices, 4 x [256, 256] and
// 4 x [256, 1024], against PyTorch's when the file has it.
//
//   bazel run -c opt //tools/bench:optim_step
//   bazel run -c opt //tools/bench:optim_step -- --pytorch_json=FILE   # + PyTorch's fused AdamW
//
// FILE: the JSON lines of tools/bench/optim_step_pytorch.py (same tensors, lr, weight decay); the
// row of this run's thread count (OMP_NUM_THREADS) gives PyTorch's time and the ratio
// tapegrad / PyTorch (below 1: tapegrad is faster).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "autograd/variable.h"
#include "nlohmann/json.hpp"
#include "optim/adam.h"
#include "optim/muon.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"
#include "tools/bench/timing.h"

ABSL_FLAG(std::string, pytorch_json, "",
          "JSON lines of tools/bench/optim_step_pytorch.py: PyTorch's fused AdamW at this run's "
          "thread count, and the ratio");
ABSL_FLAG(std::string, only, "", "run one benchmark only: adamw or muon (default: both)");

namespace {

using tg::bench::BestSeconds;

// PyTorch's ms/step of `optimizer` ("adamw_fused", "muon") at `threads` from
// optim_step_pytorch.py's lines; 0 when absent.
double PyTorchMs(const std::string& path, int threads, const std::string& optimizer) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "optim_step: cannot read --pytorch_json=%s\n", path.c_str());
    std::exit(1);
  }
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("threads", -1) == threads &&
        j.value("optimizer", std::string()) == optimizer && j.contains("ms_per_step") &&
        j["ms_per_step"].is_number()) {
      return j["ms_per_step"].get<double>();
    }
  }
  return 0;
}

// 10^7 parameters as a GPT-like mix of tensor sizes: 9 x 10^6 plus 10 x 10^5.
std::vector<tg::Tensor> MakeParams(tg::Generator& gen) {
  std::vector<tg::Tensor> params;
  for (int i = 0; i < 9; ++i) params.emplace_back(tg::RandNormal({1000, 1000}, gen, 0, 0.02), true);
  for (int i = 0; i < 10; ++i) params.emplace_back(tg::RandNormal({100000}, gen, 0, 0.02), true);
  for (const tg::Tensor& p : params) p.set_grad(tg::Tensor(tg::RandNormal(p.shape(), gen)));
  return params;
}

// AdamW fused and per-tensor over MakeParams' tensors, against a memcpy and PyTorch's fused AdamW
// (`pytorch_ms`, 0: none).
void BenchAdamW(int threads, double pytorch_ms) {
  tg::Generator gen(0);
  const int64_t n = 10000000;
  const double adamw_bytes = 28.0 * n;

  std::vector<float> src(n, 1.0f), dst(n);
  const double copy_s =
      BestSeconds(10, [&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); });
  const double copy_gbs = 2.0 * n * sizeof(float) / copy_s * 1e-9;

  std::printf("AdamW step, 10^7 f32 params in 19 tensors, %d threads (GB/s of the 28 B/param "
              "minimum)\n",
              threads);
  std::printf("  %-24s %8.2f GB/s  %6.1f ms  (baseline)\n", "memcpy (read + write)", copy_gbs,
              copy_s * 1e3);
  for (bool fused : {true, false}) {
    const std::vector<tg::Tensor> params = MakeParams(gen);
    tg::optim::AdamWOptions o;
    o.lr(1e-4);
    o.weight_decay(0.1);
    o.fused(fused);
    tg::optim::AdamW opt(params, o);
    const double s = BestSeconds(fused ? 10 : 3, [&] { opt.step(); });
    const double gbs = adamw_bytes / s * 1e-9;
    std::printf("  %-24s %8.2f GB/s  %6.1f ms  %.2f of memcpy\n",
                fused ? "AdamW fused" : "AdamW per-tensor", gbs, s * 1e3, gbs / copy_gbs);
    if (fused && pytorch_ms > 0) {
      std::printf("  %-24s %8.2f GB/s  %6.1f ms  ratio %.2f (tapegrad fused / PyTorch fused)\n",
                  "PyTorch AdamW fused", adamw_bytes / (pytorch_ms * 1e-3) * 1e-9, pytorch_ms,
                  s * 1e3 / pytorch_ms);
    }
  }
}

// A Muon step over a small transformer's hidden matrices, against torch.optim.Muon's
// (`pytorch_muon_ms`, 0: none).
void BenchMuon(double pytorch_muon_ms) {
  tg::Generator gen(1);
  std::vector<tg::Tensor> matrices;
  for (int i = 0; i < 8; ++i) {
    matrices.emplace_back(tg::RandNormal({256, i < 4 ? 256 : 1024}, gen, 0, 0.02), true);
    matrices.back().set_grad(tg::Tensor(tg::RandNormal(matrices.back().shape(), gen)));
  }
  tg::optim::Muon muon(matrices, tg::optim::MuonOptions(0.02));
  const double muon_s = BestSeconds(10, [&] { muon.step(); });
  std::printf("Muon step, 4 x [256, 256] + 4 x [256, 1024] f32, bf16 Newton-Schulz x5\n");
  std::printf("  %-24s %6.2f ms\n", "Muon", muon_s * 1e3);
  // Of which the iteration itself: the same matrices, one batch per shape, as the step runs it.
  std::vector<tg::RawTensor> directions;
  for (const tg::Tensor& m : matrices) directions.push_back(m.grad().data());
  const double ns_s = BestSeconds(10, [&] {
    tg::optim::MuonNewtonSchulz(directions, 3.4445, -4.775, 2.0315, 5, 1e-7, tg::kBF16);
  });
  std::printf("  %-24s %6.2f ms  (%.0f%% of the step)\n", "of which Newton-Schulz", ns_s * 1e3,
              100 * ns_s / muon_s);
  // The rest: the same step with ns_steps = 0 (momentum, Nesterov, the batches and their
  // normalisation, the decay and the update), on copies of the matrices.
  std::vector<tg::Tensor> copies;
  for (const tg::Tensor& m : matrices) {
    copies.emplace_back(m.data().clone(), true);
    copies.back().set_grad(tg::Tensor(m.grad().data().clone()));
  }
  tg::optim::Muon rest(copies, tg::optim::MuonOptions(0.02).ns_steps(0));
  const double rest_s = BestSeconds(10, [&] { rest.step(); });
  std::printf("  %-24s %6.2f ms  (%.0f%% of the step)\n", "the step with ns_steps 0", rest_s * 1e3,
              100 * rest_s / muon_s);
  if (pytorch_muon_ms > 0) {
    std::printf("  %-24s %6.2f ms  ratio %.2f (tapegrad / torch.optim.Muon)\n", "torch.optim.Muon",
                pytorch_muon_ms, muon_s * 1e3 / pytorch_muon_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int threads = omp_get_max_threads();
  const std::string pytorch_json = absl::GetFlag(FLAGS_pytorch_json);
  const std::string only = absl::GetFlag(FLAGS_only);
  if (!only.empty() && only != "adamw" && only != "muon") {
    std::fprintf(stderr, "optim_step: --only=%s: expected adamw or muon\n", only.c_str());
    return 1;
  }
  const double pytorch_ms =
      pytorch_json.empty() ? 0 : PyTorchMs(pytorch_json, threads, "adamw_fused");
  const double pytorch_muon_ms =
      pytorch_json.empty() ? 0 : PyTorchMs(pytorch_json, threads, "muon");
  if (!pytorch_json.empty() && (only == "muon" ? pytorch_muon_ms : pytorch_ms) <= 0) {
    std::fprintf(stderr, "optim_step: %s has no record at %d threads\n", pytorch_json.c_str(),
                 threads);
    return 1;
  }
  if (only != "muon") BenchAdamW(threads, pytorch_ms);
  if (only != "adamw") BenchMuon(pytorch_muon_ms);
  return 0;
}
