// Prints the cache-line round trip between the first two CPUs of the affinity mask in ns
// (core_latency.h), or "nan" with one CPU. train_step_pytorch.py runs it next to its timings.
//
//   bazel run -c opt //tools/bench:core_round_trip        ->  68.4
#include <cstdio>

#include "tools/bench/core_latency.h"

int main() {
  std::printf("%.1f\n", tg::bench::CoreRoundTripNs());
  return 0;
}
