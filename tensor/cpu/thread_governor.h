// The CPU thread governor: the number of threads a parallel region uses, lowered while other
// processes hold the cores this process may run on, and raised again when they let go.
//
// Why: an OpenMP region of T threads on a machine where some cores are taken finishes when its
// slowest thread does, and a thread waiting for a core waits a scheduler time slice (milliseconds)
// at every barrier, while its peers spin. A training step has hundreds of regions, so a process at
// 2 threads beside one or two busy processes on 2 cores ran 1-45x slower than its fair share
// (docs/performance.md, "A busy machine"); no libgomp wait policy alone fixed it. With fewer
// threads than free cores, no region waits for a descheduled thread.
//
// How: every 50 ms (checked by the parallel regions themselves: one clock read per region) the
// governor reads the CPU time the other processes used on this process's CPUs in the last window
// (/proc/stat's per-CPU non-idle time, minus this process's CPU time) and sets the count to the
// cores they left free, rounded to the nearest, between 1 and omp_get_max_threads(). It lowers the
// count at once and raises it after two windows in a row agree. Results do not depend on the
// count: every kernel gives the same bits at any thread count (docs/cpu.md, Determinism).
//
// It is on by default; KernelOptions::cpu_thread_governor = false (tensor/kernel_options.h) turns
// it off, and the count is then omp_get_max_threads() as before.
// Where /proc/stat cannot be read it stays off. What it cannot see: a CPU quota (cgroup cpu.max)
// without other processes on the CPUs, which throttles without showing their time.
#ifndef TAPEGRAD_TENSOR_CPU_THREAD_GOVERNOR_H_
#define TAPEGRAD_TENSOR_CPU_THREAD_GOVERNOR_H_

namespace tg::cpu {

// The threads a parallel region started now uses: omp_get_max_threads(), capped by the governor.
int RegionThreads();

// Sets KernelOptions::cpu_thread_governor (off: RegionThreads() == omp_get_max_threads()) and
// starts the governor's windows afresh (for tests).
void SetThreadGovernor(bool on);
bool ThreadGovernorOn();

// One window of load on this process's CPUs, in seconds.
struct LoadWindow {
  double wall = 0;  // the window's length
  double busy = 0;  // non-idle time summed over this process's CPUs (/proc/stat)
  double own = 0;   // this process's CPU time (all its threads)
};

// The governor's decision, given separately for tests: the thread count after `window`, from the
// count before it (`current`) and the number of windows in a row that asked for more
// (`*up_votes`, updated).
int NextRegionThreads(int max_threads, int cpus, int current, const LoadWindow& window,
                      int* up_votes);

}  // namespace tg::cpu

#endif  // TAPEGRAD_TENSOR_CPU_THREAD_GOVERNOR_H_
