// Multi-process tests: RunRanks runs a test body in `world_size` real processes that meet over
// Gloo on loopback. The processes are this test binary itself, re-executed with a gtest filter
// for the current test and the torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK,
// TG_RDZV=file://<fresh dir>, TG_JOB_ID, TG_DIST_TIMEOUT_S). In a rank process RunRanks calls
// `body` with that rank and returns an empty vector; in the parent it starts the ranks, waits
// (killing them all after options.deadline), and returns one result per rank, with its output.
//
//   TEST(Collectives, AllReduce) {
//     auto results = tg::dist::testing::RunRanks(3, [](const tg::dist::testing::Rank& r) {
//       auto pg = tg::dist::testing::JoinDefaultGroup();
//       ...EXPECT_*...                       // a failure makes that rank's process exit non-zero
//     });
//     tg::dist::testing::ExpectAllSucceeded(results);
//   }
//
// Code outside the body runs in every process (keep it deterministic); IsRankProcess() tells
// them apart. A test may call RunRanks several times (e.g. for world sizes 1..4): each call is
// numbered, and a rank process runs only the body of its own call.
#ifndef TAPEGRAD_TESTS_DISTRIBUTED_MULTIPROCESS_H_
#define TAPEGRAD_TESTS_DISTRIBUTED_MULTIPROCESS_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "distributed/process_group.h"

namespace tg::dist::testing {

struct Rank {
  int rank = 0;
  int world_size = 1;
};

struct RunOptions {
  // Ranks that are not started (to test rendezvous timeouts); the others still get world_size.
  std::set<int> absent_ranks;
  // TG_DIST_TIMEOUT_S of the ranks.
  absl::Duration dist_timeout = absl::Seconds(60);
  // The parent kills every rank still running after this long (the result says so).
  absl::Duration deadline = absl::Seconds(240);
  // Extra environment variables of every rank.
  std::map<std::string, std::string> env;
  // Overrides TG_RDZV (e.g. redis://127.0.0.1:port); default: a fresh file store directory.
  std::string rdzv;
  // Rendezvous through the TCP store hosted by rank 0: no TG_RDZV or TG_JOB_ID, MASTER_ADDR =
  // 127.0.0.1 and MASTER_PORT = a free port (bound to 0, read back, released).
  bool tcp_store = false;
  // With tcp_store: torchrun's agent store listens here (a PyTorch TCPStore, or the fake of
  // torch_tcp_store_test): MASTER_PORT = it and TORCHELASTIC_USE_AGENT_STORE=True (0: False, and
  // rank 0 hosts tapegrad's store on a free port).
  int agent_store_port = 0;
  // Ranks per "node" (0: all of them): LOCAL_RANK = rank % it, GROUP_RANK = rank / it.
  int local_world_size = 0;
  // Whose variables say who is who: "torchrun" (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  // GROUP_RANK, ... as torchrun sets them) or "slurm" (SLURM_PROCID, SLURM_NTASKS,
  // SLURM_LOCALID, SLURM_NNODES, SLURM_NTASKS_PER_NODE, as srun sets them).
  std::string launcher = "torchrun";
};

struct RankResult {
  int rank = 0;
  bool started = false;
  bool exited = false;  // exited normally (exit_code valid)
  int exit_code = -1;
  int signal = 0;  // killed by this signal (exited false)
  bool deadline_hit = false;
  bool body_ran = false;  // the process reached the body (it prints a marker line)
  std::string output;     // stdout + stderr of the rank process
  bool ok() const { return started && body_ran && exited && exit_code == 0; }
};

bool IsRankProcess();

// A TCP port on loopback that nothing listens on now (bound to 0, read back, released).
int FreePort();

std::vector<RankResult> RunRanks(int world_size, const std::function<void(const Rank&)>& body,
                                 const RunOptions& options = {});

// ADD_FAILURE for every rank that did not exit 0, with the tail of its output.
void ExpectAllSucceeded(const std::vector<RankResult>& results);

// For a rank body: InitProcessGroup() from the rank's environment; on failure the rank reports
// the Status as a test failure and exits with status 3.
std::shared_ptr<ProcessGroup> JoinDefaultGroup();

}  // namespace tg::dist::testing

#endif  // TAPEGRAD_TESTS_DISTRIBUTED_MULTIPROCESS_H_
