#include "tools/bench/core_latency.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

namespace tg::bench {
namespace {

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// One run: the calling thread (pinned by the caller) sets the line to an odd value, a partner on
// cpu_b answers with the next even one. ns per round trip, or NaN when cpu_b could not be pinned.
// A run stops after kRunBudget (then over the trips made): on a machine whose CPUs other
// processes hold, a trip can wait for a scheduler slice.
double OneRun(int cpu_b, int trips) {
  constexpr std::chrono::milliseconds kRunBudget(50);
  constexpr int kStop = -1;  // the calling thread's "no more trips"
  // The counter alone in a 128-byte block (the adjacent-line prefetcher fetches lines in pairs).
  struct alignas(128) Line {
    std::atomic<int> value{0};
    char padding[128 - sizeof(std::atomic<int>)];
  };
  const auto line = std::make_unique<Line>();
  std::atomic<int>* const counter = &line->value;
  std::atomic<bool> partner_pinned{false}, partner_failed{false};
  std::thread partner([counter, &partner_pinned, &partner_failed, cpu_b, trips] {
    if (!PinTo(cpu_b)) {
      partner_failed.store(true);
      return;
    }
    partner_pinned.store(true);
    for (int i = 0; i < trips; ++i) {
      int seen;
      while ((seen = counter->load(std::memory_order_acquire)) != 2 * i + 1) {
        if (seen == kStop) return;
      }
      counter->store(2 * i + 2, std::memory_order_release);
    }
  });
  while (!partner_pinned.load() && !partner_failed.load()) std::this_thread::yield();
  if (partner_failed.load()) {
    partner.join();
    return std::numeric_limits<double>::quiet_NaN();
  }
  const auto start = std::chrono::steady_clock::now();
  int done = 0;
  while (done < trips) {
    counter->store(2 * done + 1, std::memory_order_release);
    while (counter->load(std::memory_order_acquire) != 2 * done + 2) {
    }
    ++done;
    if (done % 256 == 0 && std::chrono::steady_clock::now() - start > kRunBudget) break;
  }
  const std::chrono::duration<double, std::nano> elapsed =
      std::chrono::steady_clock::now() - start;
  if (done < trips) counter->store(kStop, std::memory_order_release);
  partner.join();
  return elapsed.count() / done;
}

}  // namespace

double CoreRoundTripNs(int trips) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  cpu_set_t saved;
  if (sched_getaffinity(0, sizeof(saved), &saved) != 0) return nan;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &saved)) cpus.push_back(c);
  }
  if (cpus.size() < 2 || trips < 1) return nan;
  // The calling thread is pinned for the runs and given its mask back after.
  std::vector<double> runs;
  if (PinTo(cpus[0])) {
    for (int r = 0; r < 5; ++r) runs.push_back(OneRun(cpus[1], trips));
  }
  pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  if (runs.empty() || std::any_of(runs.begin(), runs.end(), [](double x) { return std::isnan(x); }))
    return nan;
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

bool SameCorePhase(const std::vector<double>& ns) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (double x : ns) {
    if (std::isnan(x)) continue;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  return hi <= 2 * lo;  // also with no figures: lo is infinite
}

}  // namespace tg::bench
