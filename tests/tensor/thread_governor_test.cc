// The CPU thread governor (tensor/cpu/thread_governor.h): its decision on given windows of load
// (exact counts), and, live, that it lowers the count while busy processes hold this process's
// CPUs and gives omp_get_max_threads() when turned off.
#include "tensor/cpu/thread_governor.h"

#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cpu/parallel.h"
#include "tensor/kernel_options.h"

namespace tg::cpu {
namespace {

// A window of `wall` seconds in which this process used `own` CPU-seconds and others `others`.
LoadWindow Window(double wall, double own, double others) {
  LoadWindow w;
  w.wall = wall;
  w.own = own;
  w.busy = own + others;
  return w;
}

TEST(NextRegionThreadsTest, AQuietMachineKeepsEveryThread) {
  int votes = 0;
  EXPECT_EQ(NextRegionThreads(2, 2, 2, Window(0.05, 0.1, 0.0), &votes), 2);
  // Background noise below half a core does not take a thread away.
  EXPECT_EQ(NextRegionThreads(2, 2, 2, Window(0.05, 0.1, 0.02), &votes), 2);
  EXPECT_EQ(NextRegionThreads(8, 16, 8, Window(0.05, 0.4, 0.0), &votes), 8);
  EXPECT_EQ(votes, 0);
}

TEST(NextRegionThreadsTest, OneBusyProcessOnTwoCoresLeavesOneThreadAtOnce) {
  int votes = 0;
  // At 2 threads beside one busy process, each of the three runs 2/3 of the time: others use
  // 0.67 cores, 1.33 are free, which rounds to 1.
  EXPECT_EQ(NextRegionThreads(2, 2, 2, Window(0.05, 0.0667, 0.0333), &votes), 1);
  // At 1 thread the busy process has a core to itself: still 1.
  EXPECT_EQ(NextRegionThreads(2, 2, 1, Window(0.05, 0.05, 0.05), &votes), 1);
  EXPECT_EQ(votes, 0);
}

TEST(NextRegionThreadsTest, MoreThreadsOnlyAfterTwoWindowsInARowAskForThem) {
  int votes = 0;
  EXPECT_EQ(NextRegionThreads(4, 4, 1, Window(0.05, 0.05, 0.0), &votes), 1);
  EXPECT_EQ(votes, 1);
  // A window that asks for no more breaks the streak.
  EXPECT_EQ(NextRegionThreads(4, 4, 1, Window(0.05, 0.05, 0.15), &votes), 1);
  EXPECT_EQ(votes, 0);
  EXPECT_EQ(NextRegionThreads(4, 4, 1, Window(0.05, 0.05, 0.05), &votes), 1);  // 3 free
  EXPECT_EQ(NextRegionThreads(4, 4, 1, Window(0.05, 0.05, 0.05), &votes), 3);
  EXPECT_EQ(votes, 0);
}

TEST(NextRegionThreadsTest, BoundsAndDegenerateWindows) {
  int votes = 0;
  // Never more than omp_get_max_threads(), never fewer than 1.
  EXPECT_EQ(NextRegionThreads(2, 8, 2, Window(0.05, 0.1, 0.0), &votes), 2);
  EXPECT_EQ(NextRegionThreads(2, 2, 2, Window(0.05, 0.1, 0.5), &votes), 1);
  // More threads than CPUs are capped at the CPUs: they would only wait for each other.
  EXPECT_EQ(NextRegionThreads(4, 2, 4, Window(0.05, 0.1, 0.0), &votes), 2);
  // The own time can exceed the busy ticks by their rounding: no negative load.
  EXPECT_EQ(NextRegionThreads(2, 2, 2, Window(0.05, 0.1, -0.02), &votes), 2);
  // An empty window changes nothing.
  EXPECT_EQ(NextRegionThreads(2, 2, 1, Window(0.0, 0.0, 0.0), &votes), 1);
}

int OwnCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  sched_getaffinity(0, sizeof(mask), &mask);
  return CPU_COUNT(&mask);
}

TEST(ThreadGovernorTest, OffMeansOmpMaxThreads) {
  omp_set_num_threads(3);
  SetThreadGovernor(false);
  EXPECT_FALSE(ThreadGovernorOn());
  EXPECT_EQ(RegionThreads(), 3);
  SetThreadGovernor(true);
  omp_set_num_threads(1);
  EXPECT_EQ(RegionThreads(), 1);
}

// The governor's switch is the kernel option (no environment variable).
TEST(ThreadGovernorTest, TheKernelOptionSwitchesIt) {
  omp_set_num_threads(3);
  SetThreadGovernor(true);
  const bool available = ThreadGovernorOn();  // false where /proc/stat cannot be read
  KernelOptions options = GetKernelOptions();
  EXPECT_TRUE(options.cpu_thread_governor);
  options.cpu_thread_governor = false;
  SetKernelOptions(options);
  EXPECT_FALSE(ThreadGovernorOn());
  EXPECT_EQ(RegionThreads(), 3);
  options.cpu_thread_governor = true;
  SetKernelOptions(options);
  EXPECT_EQ(ThreadGovernorOn(), available);
  omp_set_num_threads(1);
}

// Busy processes on every CPU this process may use: the count drops to 1 within a few windows.
// (Only the drop is checked: raising it again needs a machine nobody else uses, which a test run
// beside other tests does not have; NextRegionThreads' tests hold the rule.)
TEST(ThreadGovernorTest, BusyProcessesOnEveryCpuLowerTheCount) {
  const int cpus = OwnCpus();
  if (cpus < 2) GTEST_SKIP() << "one CPU: nothing to lower";
  SetThreadGovernor(true);
  if (!ThreadGovernorOn()) GTEST_SKIP() << "/proc/stat is not readable here";
  omp_set_num_threads(cpus);
  std::vector<pid_t> busy;
  for (int i = 0; i < cpus; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (volatile unsigned long x = 0;; x = x + 1) {
      }
    }
    ASSERT_GT(pid, 0);
    busy.push_back(pid);
  }
  int lowest = cpus;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline && lowest > 1) {
    lowest = std::min(lowest, RegionThreads());
    usleep(1000);
  }
  for (pid_t pid : busy) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  EXPECT_EQ(lowest, 1);
}

}  // namespace
}  // namespace tg::cpu
