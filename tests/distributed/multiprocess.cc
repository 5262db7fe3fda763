#include "tests/distributed/multiprocess.h"

#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/init.h"
#include "gtest/gtest.h"

extern char** environ;

namespace tg::dist::testing {
namespace {

constexpr const char* kCallEnv = "TG_MP_CALL";
constexpr const char* kBodyMarker = "RunRanks: running the body of rank ";

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int value = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &value)) {
    ADD_FAILURE() << "rank process: " << name << " is not set to an integer";
    return -1;
  }
  return value;
}

// The number of this RunRanks call within the running test.
int NextCallIndex() {
  static std::string test;
  static int calls = 0;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info == nullptr ? "" : absl::StrCat(info->test_suite_name(), ".", info->name());
  if (name != test) {
    test = name;
    calls = 0;
  }
  return calls++;
}

// Tensors the rank processes must not inherit: test outputs of the parent (gtest would
// overwrite them), sharding (the filter picks the test) and our own.
bool Dropped(const std::string& entry) {
  for (const char* prefix : {"XML_OUTPUT_FILE=",
                             "GTEST_OUTPUT=",
                             "TEST_PREMATURE_EXIT_FILE=",
                             "GTEST_SHARD_",
                             "TEST_SHARD_",
                             "GTEST_TOTAL_SHARDS=",
                             "TEST_TOTAL_SHARDS=",
                             "GTEST_FILTER=",
                             "RANK=",
                             "WORLD_SIZE=",
                             "LOCAL_RANK=",
                             "LOCAL_WORLD_SIZE=",
                             "TG_RDZV=",
                             "TG_JOB_ID=",
                             "TG_DIST_TIMEOUT_S=",
                             "TG_MP_CALL=",
                             "TG_MP_RANK=",
                             "TG_MP_WORLD=",
                             "MASTER_ADDR=",
                             "MASTER_PORT=",
                             "GROUP_RANK=",
                             "SLURM_",
                             "OMPI_COMM_WORLD_",
                             "TORCHELASTIC_"}) {
    if (absl::StartsWith(entry, prefix)) return true;
  }
  return false;
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path);
}

}  // namespace

bool IsRankProcess() { return std::getenv(kCallEnv) != nullptr; }

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "FreePort: " << std::strerror(errno);
  }
  if (fd >= 0) close(fd);
  return ntohs(addr.sin_port);
}

std::vector<RankResult> RunRanks(int world_size, const std::function<void(const Rank&)>& body,
                                 const RunOptions& options) {
  const int call = NextCallIndex();
  if (IsRankProcess()) {
    if (EnvInt(kCallEnv) == call) {
      const Rank me{EnvInt("TG_MP_RANK"), EnvInt("TG_MP_WORLD")};
      // The parent checks for this line: a rank process that exits 0 without running the body
      // (a filter that matched nothing) must not pass.
      std::printf("%s%d\n", kBodyMarker, me.rank);
      std::fflush(stdout);
      body(me);
    }
    return {};
  }

  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter =
      absl::StrCat("--gtest_filter=", info->test_suite_name(), ".", info->name());
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tg_ranks_XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    ADD_FAILURE() << "RunRanks: mkdtemp failed: " << std::strerror(errno);
    return {};
  }
  const std::string rdzv = options.rdzv.empty() ? absl::StrCat("file://", dir) : options.rdzv;
  const std::string job = absl::StrCat("test-", getpid(), "-", call);

  // Everything the children need is built before fork (only async-signal-safe calls after).
  std::vector<std::string> common;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!Dropped(*e)) common.push_back(*e);
  }
  const int local_world = options.local_world_size > 0 ? options.local_world_size : world_size;
  const bool slurm = options.launcher == "slurm";
  common.push_back(absl::StrCat("TG_MP_WORLD=", world_size));
  if (slurm) {
    common.push_back(absl::StrCat("SLURM_NTASKS=", world_size));
    common.push_back(absl::StrCat("SLURM_NNODES=", (world_size + local_world - 1) / local_world));
    common.push_back(
        absl::StrCat("SLURM_STEP_NUM_NODES=", (world_size + local_world - 1) / local_world));
    common.push_back(absl::StrCat("SLURM_NTASKS_PER_NODE=", local_world));
  } else {
    // What torchrun's agent gives its workers (torch/distributed/elastic/agent/server/
    // local_elastic_agent.py), for one role "default".
    common.push_back(absl::StrCat("WORLD_SIZE=", world_size));
    common.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", local_world));
    common.push_back(absl::StrCat("ROLE_WORLD_SIZE=", world_size));
    common.push_back(
        absl::StrCat("GROUP_WORLD_SIZE=", (world_size + local_world - 1) / local_world));
    common.push_back("ROLE_NAME=default");
    if (options.tcp_store) {
      common.push_back("TORCHELASTIC_RESTART_COUNT=0");
      common.push_back("TORCHELASTIC_MAX_RESTARTS=0");
      common.push_back(absl::StrCat("TORCHELASTIC_RUN_ID=", job));
      common.push_back(absl::StrCat("TORCHELASTIC_USE_AGENT_STORE=",
                                    options.agent_store_port > 0 ? "True" : "False"));
      common.push_back("TORCH_NCCL_ASYNC_ERROR_HANDLING=1");
    }
  }
  if (options.tcp_store) {
    common.push_back("MASTER_ADDR=127.0.0.1");
    common.push_back(absl::StrCat(
        "MASTER_PORT=", options.agent_store_port > 0 ? options.agent_store_port : FreePort()));
  } else {
    common.push_back(absl::StrCat("TG_RDZV=", rdzv));
    common.push_back(absl::StrCat("TG_JOB_ID=", job));
  }
  common.push_back(absl::StrCat("TG_DIST_TIMEOUT_S=", absl::ToDoubleSeconds(options.dist_timeout)));
  common.push_back(absl::StrCat(kCallEnv, "=", call));
  for (const auto& [k, v] : options.env) common.push_back(absl::StrCat(k, "=", v));
  std::string exe(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  if (len <= 0) {
    ADD_FAILURE() << "RunRanks: cannot read /proc/self/exe";
    return {};
  }
  exe.resize(len);

  std::vector<RankResult> results(world_size);
  std::vector<pid_t> pids(world_size, -1);
  std::vector<int> fds(world_size, -1);
  for (int r = 0; r < world_size; ++r) {
    results[r].rank = r;
    if (options.absent_ranks.count(r)) continue;
    std::vector<std::string> env = common;
    env.push_back(absl::StrCat("TG_MP_RANK=", r));
    if (slurm) {
      env.push_back(absl::StrCat("SLURM_PROCID=", r));
      env.push_back(absl::StrCat("SLURM_LOCALID=", r % local_world));
    } else {
      env.push_back(absl::StrCat("RANK=", r));
      env.push_back(absl::StrCat("LOCAL_RANK=", r % local_world));
      env.push_back(absl::StrCat("GROUP_RANK=", r / local_world));
      env.push_back(absl::StrCat("ROLE_RANK=", r));
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string arg0 = exe, arg1 = filter;
    char* argv[] = {arg0.data(), arg1.data(), nullptr};
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "RunRanks: pipe failed: " << std::strerror(errno);
      break;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(pipe_fds[1], 1);
      dup2(pipe_fds[1], 2);
      execve(exe.c_str(), argv, envp.data());
      _exit(127);
    }
    close(pipe_fds[1]);
    if (pid < 0) {
      close(pipe_fds[0]);
      ADD_FAILURE() << "RunRanks: fork failed: " << std::strerror(errno);
      break;
    }
    pids[r] = pid;
    fds[r] = pipe_fds[0];
    results[r].started = true;
  }

  // Collect output until every pipe is closed or the deadline passes.
  const absl::Time deadline = absl::Now() + options.deadline;
  bool killed = false;
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<int> owner;
    for (int r = 0; r < world_size; ++r) {
      if (fds[r] >= 0) {
        polled.push_back(pollfd{fds[r], POLLIN, 0});
        owner.push_back(r);
      }
    }
    if (polled.empty()) break;
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0 && !killed) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          results[r].deadline_hit = true;
        }
      }
      killed = true;
    }
    const int ready = poll(polled.data(), polled.size(),
                           killed ? 1000 : static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) break;
    for (size_t i = 0; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(polled[i].fd, buf, sizeof(buf));
      if (n > 0) {
        results[owner[i]].output.append(buf, n);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        close(polled[i].fd);
        fds[owner[i]] = -1;
      }
    }
  }
  for (int r = 0; r < world_size; ++r) {
    if (pids[r] <= 0) continue;
    int status = 0;
    while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) {
      results[r].exited = true;
      results[r].exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      results[r].signal = WTERMSIG(status);
    }
    // A deadline kill of a process that had already finished is not a deadline hit.
    if (results[r].deadline_hit && results[r].signal != SIGKILL) results[r].deadline_hit = false;
    results[r].body_ran = absl::StrContains(results[r].output, absl::StrCat(kBodyMarker, r, "\n"));
  }
  nftw(dir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  return results;
}

std::shared_ptr<ProcessGroup> JoinDefaultGroup() {
  auto pg = InitProcessGroup();
  if (!pg.ok()) {
    ADD_FAILURE() << "rank " << std::getenv("TG_MP_RANK") << ": " << pg.status();
    std::fflush(stdout);
    std::_Exit(3);
  }
  return *pg;
}

void ExpectAllSucceeded(const std::vector<RankResult>& results) {
  for (const RankResult& r : results) {
    if (r.ok()) continue;
    const std::string tail =
        r.output.size() > 6000 ? r.output.substr(r.output.size() - 6000) : r.output;
    ADD_FAILURE() << "rank " << r.rank << " of " << results.size()
                  << (!r.started       ? " was not started"
                      : !r.body_ran    ? " did not run the test body"
                      : r.deadline_hit ? " was killed at the deadline"
                      : r.exited       ? absl::StrCat(" exited with status ", r.exit_code)
                                       : absl::StrCat(" was killed by signal ", r.signal))
                  << "; its output:\n"
                  << tail;
  }
}

}  // namespace tg::dist::testing
