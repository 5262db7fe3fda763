// The CPU thread pool of a training binary's rank when OMP_NUM_THREADS is not set. tools:launch
// and torchrun set OMP_NUM_THREADS for each rank; srun and mpirun do not, and libgomp then gives
// every rank one thread per core, so N ranks on a node oversubscribe it N times (two ranks under
// srun on a busy machine: 444-592 img/s against 13,058 under tools:launch). The binaries size the
// pool from what the launcher says instead:
//   OMP_NUM_THREADS set: left alone (the user's, tools:launch's or torchrun's choice);
//   SLURM_CPUS_PER_TASK set: that many (srun --cpus-per-task is per task already), at most the
//     CPUs this process may run on;
//   otherwise: the CPUs this process may run on (sched_getaffinity: a cgroup or a launcher's
//     binding shrinks it) / the ranks on this node (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
//     SLURM's tasks per node; distributed/init.h), at least 1.
// It is the binaries' glue (train/): the library reads no variable for the pool's size
// (tensor/cpu's pool is whatever OpenMP's is), and while other processes hold some of the cores
// its regions use fewer threads (tensor/cpu/thread_governor.h).
//
//   tg::train::ThreadChoice c = tg::train::ChooseThreads(tg::train::ReadThreadEnv(local_world));
//   if (c.set) omp_set_num_threads(c.threads);   // and print c.reason
#ifndef TAPEGRAD_TRAIN_THREADS_H_
#define TAPEGRAD_TRAIN_THREADS_H_

#include <string>

namespace tg::train {

// What the choice depends on (read by ReadThreadEnv; given directly in tests).
struct ThreadEnv {
  bool omp_num_threads_set = false;
  std::string omp_num_threads;      // its value when set
  int cpus = 1;                     // CPUs in this process's affinity mask
  std::string slurm_cpus_per_task;  // "": not set
  int local_world_size = -1;        // ranks on this node; -1: unknown (taken as 1)
};

struct ThreadChoice {
  bool set = false;  // false: OMP_NUM_THREADS decides (threads is then its value, or 0)
  int threads = 0;
  // For the binary's first output line, e.g. "threads: 4 (OMP_NUM_THREADS unset: 8 CPUs / 2 ranks
  // on this node)" or "threads: 3 (OMP_NUM_THREADS=3)".
  std::string reason;
};

ThreadChoice ChooseThreads(const ThreadEnv& env);

// The process's environment and affinity mask.
ThreadEnv ReadThreadEnv(int local_world_size);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_THREADS_H_
