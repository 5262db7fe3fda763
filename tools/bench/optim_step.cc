// AdamW step throughput over 10^7 f32 parameters on the CPU: the fused multi-tensor path (one
// pass over memory per parameter) against the per-tensor path (composed tensor ops, several
// passes), each in GB/s of the minimal memory traffic of an AdamW step (read p, g, m, v; write
// p, m, v: 28 bytes per parameter) and as a fraction of a memcpy measured in the same run.
// Ratios, not timings, are what to compare across machines.
//
//   bazel run -c opt //tools/bench:optim_step
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "autograd/variable.h"
#include "optim/adam.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"
#include "tools/bench/timing.h"

namespace {

using tg::bench::BestSeconds;

// 10^7 parameters as a GPT-like mix of tensor sizes: 9 x 10^6 plus 10 x 10^5.
std::vector<tg::Variable> MakeParams(tg::Generator& gen) {
  std::vector<tg::Variable> params;
  for (int i = 0; i < 9; ++i) params.emplace_back(tg::RandNormal({1000, 1000}, gen, 0, 0.02), true);
  for (int i = 0; i < 10; ++i) params.emplace_back(tg::RandNormal({100000}, gen, 0, 0.02), true);
  for (const tg::Variable& p : params) p.set_grad(tg::Variable(tg::RandNormal(p.shape(), gen)));
  return params;
}

}  // namespace

int main() {
  tg::Generator gen(0);
  const int64_t n = 10000000;
  const double adamw_bytes = 28.0 * n;

  std::vector<float> src(n, 1.0f), dst(n);
  const double copy_s =
      BestSeconds(10, [&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); });
  const double copy_gbs = 2.0 * n * sizeof(float) / copy_s * 1e-9;

  std::printf("AdamW step, 10^7 f32 params in 19 tensors (GB/s of the 28 B/param minimum)\n");
  std::printf("  %-24s %8.2f GB/s  %6.1f ms  (baseline)\n", "memcpy (read + write)", copy_gbs,
              copy_s * 1e3);
  for (bool fused : {true, false}) {
    const std::vector<tg::Variable> params = MakeParams(gen);
    tg::optim::AdamWOptions o;
    o.lr = 1e-4;
    o.weight_decay = 0.1;
    o.fused = fused;
    tg::optim::AdamW opt(params, o);
    const double s = BestSeconds(fused ? 10 : 3, [&] { opt.step(); });
    const double gbs = adamw_bytes / s * 1e-9;
    std::printf("  %-24s %8.2f GB/s  %6.1f ms  %.2f of memcpy\n",
                fused ? "AdamW fused" : "AdamW per-tensor", gbs, s * 1e3, gbs / copy_gbs);
  }
  return 0;
}
