#include "tensor/cpu/thread_governor.h"

#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

#include "tensor/kernel_options.h"

namespace tg::cpu {
namespace {

constexpr std::chrono::milliseconds kWindow(50);
constexpr int kUpVotes = 2;  // windows in a row that must ask for more threads

// The non-idle time (seconds) of the CPUs in this process's affinity mask, from /proc/stat's
// "cpuN user nice system idle iowait irq softirq steal" lines (USER_HZ ticks); steal counts as
// busy (the hypervisor gave the CPU to someone else). -1 if it cannot be read.
double BusySecondsOfOwnCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return -1;
  const int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  // The cpuN lines come first; the rest of the file (interrupt counts) is not needed, but a
  // machine with many CPUs needs more than one read for them.
  std::string text;
  char buf[16384];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.find("\nintr") != std::string::npos) break;
  }
  close(fd);
  static const long ticks_per_second = sysconf(_SC_CLK_TCK);
  if (ticks_per_second <= 0) return -1;
  double busy_ticks = 0;
  bool any = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const char* line = text.c_str() + pos;
    if (std::strncmp(line, "cpu", 3) == 0 && line[3] >= '0' && line[3] <= '9') {
      char* p = nullptr;
      const long cpu = std::strtol(line + 3, &p, 10);
      if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mask)) {
        unsigned long long v[8] = {};
        for (int i = 0; i < 8; ++i) v[i] = std::strtoull(p, &p, 10);
        // user nice system [idle iowait] irq softirq steal
        busy_ticks += static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
        any = true;
      }
    } else if (std::strncmp(line, "cpu", 3) != 0) {
      break;
    }
    pos = end + 1;
  }
  return any ? busy_ticks / static_cast<double>(ticks_per_second) : -1;
}

double OwnCpuSeconds() {
  timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int OwnCpuCount() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return 1;
  return std::max(1, CPU_COUNT(&mask));
}

struct Governor {
  std::atomic<bool> on{true};
  std::atomic<int> threads{1 << 20};  // no cap until the first window
  std::atomic<int64_t> next_sample_ns{0};
  std::mutex mu;  // the sampler's state below
  bool have_last = false;
  std::chrono::steady_clock::time_point last_time;
  double last_busy = 0, last_own = 0;
  int up_votes = 0;

  Governor() {
    if (BusySecondsOfOwnCpus() < 0 || OwnCpuSeconds() < 0) on = false;
  }

  void Sample(std::chrono::steady_clock::time_point now) {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    if (!lock.owns_lock()) return;
    const double busy = BusySecondsOfOwnCpus(), own = OwnCpuSeconds();
    if (busy < 0 || own < 0) return;
    if (have_last) {
      LoadWindow w;
      w.wall = std::chrono::duration<double>(now - last_time).count();
      w.busy = busy - last_busy;
      w.own = own - last_own;
      const int max_threads = omp_get_max_threads();
      const int current = std::min(threads.load(std::memory_order_relaxed), max_threads);
      threads.store(NextRegionThreads(max_threads, OwnCpuCount(), current, w, &up_votes),
                    std::memory_order_relaxed);
    }
    have_last = true;
    last_time = now;
    last_busy = busy;
    last_own = own;
  }
};

Governor& TheGovernor() {
  static Governor* g = new Governor;
  return *g;
}

}  // namespace

int NextRegionThreads(int max_threads, int cpus, int current, const LoadWindow& window,
                      int* up_votes) {
  if (window.wall <= 0) return current;
  const double others = std::max(0.0, window.busy - window.own) / window.wall;
  const double free_cores = static_cast<double>(std::max(cpus, 1)) - others;
  const int target = std::clamp(static_cast<int>(std::floor(free_cores + 0.5)), 1, max_threads);
  if (target < current) {
    *up_votes = 0;
    return target;
  }
  if (target > current) {
    if (++*up_votes >= kUpVotes) {
      *up_votes = 0;
      return target;
    }
    return current;
  }
  *up_votes = 0;
  return current;
}

int RegionThreads() {
  const int max_threads = omp_get_max_threads();
  Governor& g = TheGovernor();
  if (max_threads <= 1 || !g.on.load(std::memory_order_relaxed) ||
      !GetKernelOptions().cpu_thread_governor) {
    return max_threads;
  }
  // The coarse clock (a few ms of resolution, half the cost of steady_clock) is enough to
  // start 50 ms windows; a window's own length is measured with steady_clock.
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const int64_t now_ns = int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
  int64_t next = g.next_sample_ns.load(std::memory_order_relaxed);
  if (now_ns >= next && g.next_sample_ns.compare_exchange_strong(
                            next, now_ns + std::chrono::nanoseconds(kWindow).count())) {
    g.Sample(std::chrono::steady_clock::now());
  }
  return std::min(max_threads, g.threads.load(std::memory_order_relaxed));
}

void SetThreadGovernor(bool on) {
  KernelOptions options = GetKernelOptions();
  options.cpu_thread_governor = on;
  SetKernelOptions(options);
  Governor& g = TheGovernor();
  std::lock_guard<std::mutex> lock(g.mu);
  g.on = BusySecondsOfOwnCpus() >= 0;
  g.threads = 1 << 20;
  g.have_last = false;
  g.up_votes = 0;
}

bool ThreadGovernorOn() {
  return TheGovernor().on.load() && GetKernelOptions().cpu_thread_governor;
}

}  // namespace tg::cpu
