// Timing helpers shared by the benchmarks under tools/bench.
#ifndef TAPEGRAD_TOOLS_BENCH_TIMING_H_
#define TAPEGRAD_TOOLS_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <functional>

namespace tg::bench {

// Best of `reps` runs of fn, in seconds, after one untimed warm-up run.
inline double BestSeconds(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
    best = std::min(best, d.count());
  }
  return best;
}

}  // namespace tg::bench

#endif  // TAPEGRAD_TOOLS_BENCH_TIMING_H_
