// The CPU pool's size when OMP_NUM_THREADS is unset (train/threads.h), for the environments
// that srun, mpirun, torchrun and a single process give: exact thread counts and lines.
#include "train/threads.h"

#include <gtest/gtest.h>

namespace tg::train {
namespace {

ThreadEnv Env(int cpus, int local_world_size, std::string slurm_cpus_per_task = "") {
  ThreadEnv env;
  env.cpus = cpus;
  env.local_world_size = local_world_size;
  env.slurm_cpus_per_task = std::move(slurm_cpus_per_task);
  return env;
}

TEST(ChooseThreadsTest, OmpNumThreadsIsLeftAlone) {
  ThreadEnv env = Env(16, 2, "4");
  env.omp_num_threads_set = true;
  env.omp_num_threads = "3";
  const ThreadChoice c = ChooseThreads(env);
  EXPECT_FALSE(c.set);
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.reason, "threads: OMP_NUM_THREADS=3");
}

TEST(ChooseThreadsTest, CpusSharedByTheRanksOnThisNode) {
  // mpirun -np 2 / srun -n 2 on one 16-CPU node (OMPI_COMM_WORLD_LOCAL_SIZE=2, SLURM tasks 2).
  ThreadChoice c = ChooseThreads(Env(16, 2));
  EXPECT_TRUE(c.set);
  EXPECT_EQ(c.threads, 8);
  EXPECT_EQ(c.reason, "threads: 8 (OMP_NUM_THREADS unset: 16 CPUs / 2 ranks on this node)");
  // 3 ranks on 8 CPUs: rounded down (never oversubscribed).
  EXPECT_EQ(ChooseThreads(Env(8, 3)).threads, 2);
  // More ranks than CPUs: at least one thread each.
  c = ChooseThreads(Env(2, 4));
  EXPECT_EQ(c.threads, 1);
  EXPECT_EQ(c.reason, "threads: 1 (OMP_NUM_THREADS unset: 2 CPUs / 4 ranks on this node)");
  // One process: all of its CPUs.
  c = ChooseThreads(Env(6, 1));
  EXPECT_EQ(c.threads, 6);
  EXPECT_EQ(c.reason, "threads: 6 (OMP_NUM_THREADS unset: 6 CPUs / 1 rank on this node)");
}

TEST(ChooseThreadsTest, UnknownLocalWorldSizeIsOne) {
  const ThreadChoice c = ChooseThreads(Env(12, -1));
  EXPECT_EQ(c.threads, 12);
  EXPECT_EQ(c.reason,
            "threads: 12 (OMP_NUM_THREADS unset: 12 CPUs / 1 rank on this node, unknown: taken "
            "as 1)");
}

TEST(ChooseThreadsTest, SlurmCpusPerTaskIsPerTask) {
  // srun -n 4 --cpus-per-task=4 on a 32-CPU node whose tasks are not bound: 4 each, not 32 / 4.
  ThreadChoice c = ChooseThreads(Env(32, 4, "4"));
  EXPECT_TRUE(c.set);
  EXPECT_EQ(c.threads, 4);
  EXPECT_EQ(c.reason,
            "threads: 4 (OMP_NUM_THREADS unset: SLURM_CPUS_PER_TASK=4, 32 CPUs available)");
  // Capped by the CPUs this process may run on.
  EXPECT_EQ(ChooseThreads(Env(2, 1, "8")).threads, 2);
  // Not a positive number: ignored, the CPUs / ranks rule applies.
  EXPECT_EQ(ChooseThreads(Env(16, 2, "x")).threads, 8);
  EXPECT_EQ(ChooseThreads(Env(16, 2, "0")).threads, 8);
}

}  // namespace
}  // namespace tg::train
