#include "train/threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tg::train {

ThreadChoice ChooseThreads(const ThreadEnv& env) {
  ThreadChoice c;
  if (env.omp_num_threads_set) {
    int n = 0;
    (void)absl::SimpleAtoi(env.omp_num_threads, &n);  // libgomp's to parse; shown as given
    c.threads = std::max(n, 0);
    c.reason = absl::StrCat("threads: OMP_NUM_THREADS=", env.omp_num_threads);
    return c;
  }
  const int cpus = std::max(env.cpus, 1);
  c.set = true;
  int per_task = 0;
  if (!env.slurm_cpus_per_task.empty() && absl::SimpleAtoi(env.slurm_cpus_per_task, &per_task) &&
      per_task >= 1) {
    c.threads = std::min(per_task, cpus);
    c.reason = absl::StrCat("threads: ", c.threads,
                            " (OMP_NUM_THREADS unset: SLURM_CPUS_PER_TASK=", per_task, ", ", cpus,
                            " CPUs available)");
    return c;
  }
  const int local = env.local_world_size >= 1 ? env.local_world_size : 1;
  c.threads = std::max(1, cpus / local);
  c.reason = absl::StrCat("threads: ", c.threads, " (OMP_NUM_THREADS unset: ", cpus, " CPUs / ",
                          local, local == 1 ? " rank" : " ranks", " on this node",
                          env.local_world_size >= 1 ? "" : ", unknown: taken as 1", ")");
  return c;
}

ThreadEnv ReadThreadEnv(int local_world_size) {
  ThreadEnv env;
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v != nullptr && *v != '\0') {
    env.omp_num_threads_set = true;
    env.omp_num_threads = v;
  }
  if (const char* v = std::getenv("SLURM_CPUS_PER_TASK"); v != nullptr) {
    env.slurm_cpus_per_task = v;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  env.cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  env.local_world_size = local_world_size;
  return env;
}

}  // namespace tg::train
