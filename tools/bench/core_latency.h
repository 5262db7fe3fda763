// The round-trip time of a cache line between two CPUs: one thread on each of the first two CPUs
// of this process's affinity mask hands a counter back and forth through one atomic. It is short
// when the two CPUs share a last-level cache and several times longer across chips or core
// complexes.
//
// Why a benchmark needs it: a virtual machine's vCPUs are host threads the host moves. On the
// 2-vCPU EPYC of 2026-11-29 this probe read 100-140 ns for a while and then 350-430 ns for seconds
// to minutes, and every 2-thread training step -- PyTorch's more than ours -- was slower in the
// far phase (docs/performance.md). Two timings compare only when taken in the same phase, so the
// benchmarks record this figure next to each timing.
//
//   double ns = tg::bench::CoreRoundTripNs();   // NaN on a machine with one CPU
#ifndef TAPEGRAD_TOOLS_BENCH_CORE_LATENCY_H_
#define TAPEGRAD_TOOLS_BENCH_CORE_LATENCY_H_

#include <vector>

namespace tg::bench {

// Median of 5 runs of `trips` round trips (each run cut at 50 ms, for a machine other processes
// keep busy), in ns per round trip; NaN when the affinity mask has fewer than two CPUs (or the
// threads cannot be pinned).
double CoreRoundTripNs(int trips = 20000);

// Whether round-trip figures come from one placement of the CPUs: the largest at most twice the
// smallest (the two placements above differ by 3-4x; the noise within one is under 1.5x). NaN
// figures (one CPU) are left out; fewer than two figures are one phase.
bool SameCorePhase(const std::vector<double>& ns);

}  // namespace tg::bench

#endif  // TAPEGRAD_TOOLS_BENCH_CORE_LATENCY_H_
