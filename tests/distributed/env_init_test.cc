// Environment-based init (distributed/init.h): which launcher's variables win (flags > torchrun >
// Open MPI > SLURM), MASTER_ADDR/MASTER_PORT selecting the TCP store hosted by rank 0, the
// errors; and real runs of 2 "nodes" x 2 ranks over Gloo on loopback whose environment is set
// exactly as torchrun sets it, and as srun sets it, each checking an all_reduce.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "distributed/init.h"
#include "distributed/process_group.h"
#include "gtest/gtest.h"
#include "tensor/tensor.h"
#include "tests/distributed/multiprocess.h"

namespace tg::dist {
namespace {

using testing::Rank;
using testing::RunOptions;
using testing::RunRanks;

// Sets the variables for the scope and clears every launcher variable around it.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars)
      : vars_(vars) {
    Clear();
    for (auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() { Clear(); }

 private:
  static void Clear() {
    for (const char* name : {"RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "SLURM_NTASKS_PER_NODE",
                             "SLURM_TASKS_PER_NODE",
                             "SLURM_NNODES",
                             "SLURM_STEP_NUM_NODES",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "TG_RDZV",
                             "TG_JOB_ID",
                             "TG_DIST_TIMEOUT_S",
                             "GLOO_SOCKET_IFNAME",
                             "TG_GLOO_HOSTNAME",
                             "TORCHELASTIC_USE_AGENT_STORE",
                             "TORCHELASTIC_RESTART_COUNT"}) {
      unsetenv(name);
    }
  }
  std::vector<std::pair<std::string, std::string>> vars_;
};

TEST(EnvInit, LauncherPrecedenceTorchrunOverOpenMpiOverSlurm) {
  const std::pair<std::string, std::string> slurm[] = {{"SLURM_PROCID", "3"},
                                                       {"SLURM_NTASKS", "8"},
                                                       {"SLURM_LOCALID", "1"},
                                                       {"SLURM_NTASKS_PER_NODE", "2"}};
  {
    ScopedEnv env({slurm[0], slurm[1], slurm[2], slurm[3], {"TG_RDZV", "file:///tmp/x"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->launcher, "SLURM");
    EXPECT_EQ(e->rank, 3);
    EXPECT_EQ(e->world_size, 8);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->local_world_size, 2);
  }
  {  // Open MPI beats SLURM (mpirun inside an allocation), every value from Open MPI.
    ScopedEnv env({slurm[0],
                   slurm[1],
                   slurm[2],
                   {"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                   {"TG_RDZV", "file:///tmp/x"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->launcher, "Open MPI");
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->world_size, 2);
    EXPECT_EQ(e->local_rank, 0);
    EXPECT_EQ(e->local_world_size, 1);
  }
  {  // torchrun under SLURM (one srun task per node running torchrun): torchrun's variables.
    ScopedEnv env({slurm[0],
                   slurm[1],
                   slurm[2],
                   {"OMPI_COMM_WORLD_RANK", "1"},
                   {"RANK", "5"},
                   {"WORLD_SIZE", "16"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"MASTER_ADDR", "node7"},
                   {"MASTER_PORT", "29500"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->launcher, "torchrun");
    EXPECT_EQ(e->rank, 5);
    EXPECT_EQ(e->world_size, 16);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->local_world_size, 4);
    EXPECT_EQ(e->rdzv, "tcp://node7:29500");
    EXPECT_EQ(e->job_id, "tapegrad");
    // Flags beat every launcher.
    DistOptions flags;
    flags.rank = 0;
    flags.world_size = 2;
    flags.rdzv = "file:///tmp/f";
    e = ResolveDistEnv(flags);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->rank, 0);
    EXPECT_EQ(e->world_size, 2);
    EXPECT_EQ(e->rdzv, "file:///tmp/f");
  }
  {  // SLURM on one node: its tasks are the local world; several nodes: unknown unless given.
    ScopedEnv env({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_NNODES", "1"},
                   {"MASTER_ADDR", "::1"},
                   {"MASTER_PORT", "1234"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->local_world_size, 2);
    EXPECT_EQ(e->local_rank, 0);
    EXPECT_EQ(e->rdzv, "tcp://[::1]:1234");
  }
  // sbatch/srun's SLURM_TASKS_PER_NODE: the tasks on this node when every node runs as many
  // (the training binaries size their thread pools by it), else unknown.
  for (const auto& [tasks, local] : std::vector<std::pair<std::string, int>>{
           {"4(x2)", 4}, {"3", 3}, {"2,2(x3)", 2}, {"2(x2),1", -1}, {"x", -1}}) {
    ScopedEnv env({{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "8"},
                   {"SLURM_NNODES", "2"},
                   {"SLURM_TASKS_PER_NODE", tasks},
                   {"TG_RDZV", "file:///tmp/x"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->local_world_size, local) << tasks;
  }
}

TEST(EnvInit, RendezvousPrecedenceAndErrors) {
  {  // TG_RDZV beats MASTER_ADDR/MASTER_PORT.
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"TG_RDZV", "redis://r:1"},
                   {"MASTER_ADDR", "m"},
                   {"MASTER_PORT", "2"}});
    EXPECT_EQ(ResolveDistEnv({})->rdzv, "redis://r:1");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: MASTER_ADDR is set but MASTER_PORT is not (the TCP store hosted "
              "by rank 0 needs both)");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: MASTER_PORT is set but MASTER_ADDR is not (the TCP store hosted "
              "by rank 0 needs both)");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "0"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: MASTER_PORT='0' is not a port number in [1, 65535]");
  }
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "m"},
                   {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    // torchrun's agent hosts PyTorch's TCPStore there: every rank is a client of it.
    auto resolved = ResolveDistEnv({});
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_EQ(resolved->rdzv, "torch-tcp://m:29500");
    EXPECT_EQ(resolved->attempt, 0);
  }
  {
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "::1"},
                   {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_RESTART_COUNT", "2"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    auto resolved = ResolveDistEnv({});
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    EXPECT_EQ(resolved->rdzv, "torch-tcp://[::1]:29500");
    EXPECT_EQ(resolved->attempt, 2);
  }
  {
    ScopedEnv env({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "m"},
                   {"MASTER_PORT", "29500"},
                   {"TORCHELASTIC_RESTART_COUNT", "x"},
                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: TORCHELASTIC_RESTART_COUNT='x' is not an integer");
  }
  {
    ScopedEnv env({{"SLURM_PROCID", "one"}, {"SLURM_NTASKS", "2"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: SLURM_PROCID='one' is not an integer");
  }
  {
    ScopedEnv env({{"GLOO_SOCKET_IFNAME", "eth0,eth1"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: gloo interface 'eth0,eth1' names several interfaces; "
              "tapegrad's Gloo groups use one (name one, e.g. eth0)");
  }
  {  // The interface: option > GLOO_SOCKET_IFNAME.
    ScopedEnv env({{"GLOO_SOCKET_IFNAME", "lo"}});
    EXPECT_EQ(ResolveDistEnv({})->gloo_iface, "lo");
    DistOptions o;
    o.gloo_iface = "eth3";
    EXPECT_EQ(ResolveDistEnv(o)->gloo_iface, "eth3");
  }
}

// The all_reduce every run below checks: sum over ranks of (rank + 1) * [1, 2, 3].
void AllReduceAndCheck(const Rank& me) {
  auto pg = testing::JoinDefaultGroup();
  EXPECT_EQ(pg->rank(), me.rank);
  EXPECT_EQ(pg->size(), me.world_size);
  RawTensor t = RawTensor::FromVector(
      std::vector<float>{1.f * (me.rank + 1), 2.f * (me.rank + 1), 3.f * (me.rank + 1)}, {3}, kF32);
  TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kSum)->wait());
  const float s = me.world_size * (me.world_size + 1) / 2.f;
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>({s, 2 * s, 3 * s}));
}

// 2 nodes x 2 ranks with the variables torchrun gives its workers (RANK, LOCAL_RANK = rank % 2,
// GROUP_RANK, LOCAL_WORLD_SIZE = 2, MASTER_ADDR/MASTER_PORT, TORCHELASTIC_*): rank 0 hosts the
// TCP store; Gloo binds loopback by GLOO_SOCKET_IFNAME (several "nodes" would otherwise use the
// host name).
TEST(EnvInit, TorchrunEnvironmentTwoNodesTwoRanks) {
  RunOptions o;
  o.tcp_store = true;
  o.local_world_size = 2;
  o.env["GLOO_SOCKET_IFNAME"] = "lo";
  auto results = RunRanks(
      4,
      [](const Rank& me) {
        EXPECT_EQ(std::getenv("TG_RDZV"), nullptr);
        auto env = ResolveDistEnv({});
        ASSERT_TRUE(env.ok()) << env.status();
        EXPECT_EQ(env->launcher, "torchrun");
        EXPECT_EQ(env->local_rank, me.rank % 2);
        EXPECT_TRUE(absl::StartsWith(env->rdzv, "tcp://127.0.0.1:")) << env->rdzv;
        AllReduceAndCheck(me);
      },
      o);
  testing::ExpectAllSucceeded(results);
}

// The same through srun's variables (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...) with
// MASTER_ADDR/MASTER_PORT exported by the batch script.
TEST(EnvInit, SlurmEnvironmentTwoNodesTwoRanks) {
  RunOptions o;
  o.tcp_store = true;
  o.local_world_size = 2;
  o.launcher = "slurm";
  o.env["GLOO_SOCKET_IFNAME"] = "lo";
  auto results = RunRanks(
      4,
      [](const Rank& me) {
        EXPECT_EQ(std::getenv("RANK"), nullptr);
        auto env = ResolveDistEnv({});
        ASSERT_TRUE(env.ok()) << env.status();
        EXPECT_EQ(env->launcher, "SLURM");
        EXPECT_EQ(env->local_rank, me.rank % 2);
        EXPECT_EQ(env->local_world_size, 2);
        AllReduceAndCheck(me);
      },
      o);
  testing::ExpectAllSucceeded(results);
}

// An interface that does not exist: every rank fails with the reason, none hangs.
TEST(EnvInit, UnknownGlooInterfaceIsAClearError) {
  RunOptions o;
  o.tcp_store = true;
  o.env["GLOO_SOCKET_IFNAME"] = "tg_no_such_if0";
  o.dist_timeout = absl::Seconds(20);
  auto results = RunRanks(
      2,
      [](const Rank& me) {
        auto pg = InitProcessGroup();
        ASSERT_FALSE(pg.ok());
        EXPECT_EQ(pg.status().message(),
                  absl::StrCat("gloo group 'default': rank ", me.rank,
                               " has no network interface 'tg_no_such_if0' (GLOO_SOCKET_IFNAME "
                               "or DistOptions::gloo_iface; see `ip link`)"));
      },
      o);
  testing::ExpectAllSucceeded(results);
}

}  // namespace
}  // namespace tg::dist
