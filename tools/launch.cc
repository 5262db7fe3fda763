// Starts N local processes of a binary with the torchrun-style environment and supervises them:
// the launcher of multi-process (distributed) training.
//
//   bazel run //tools:launch -- --nproc=4 -- bazel-bin/tools/train_gpt --data=...
//   bazel run //tools:launch -- --nproc=2 --timeout_s=60 -- ./my_binary --flag=1
//   launch --nnodes=2 --node_rank=1 --nproc=8 --rdzv=redis://head:6379 --job_id=run7 -- bin ...
//   launch --nnodes=2 --node_rank=1 --nproc=8 --master_addr=head --master_port=29500 -- bin ...
//
// Rank r of local rank l gets RANK = node_rank * nproc + l, WORLD_SIZE = nnodes * nproc,
// LOCAL_RANK = l, LOCAL_WORLD_SIZE = nproc, TG_RDZV, TG_JOB_ID (and TG_DIST_TIMEOUT_S with
// --timeout_s) on top of the launcher's own environment; distributed/init.h reads them. With
// --master_addr/--master_port (torchrun's names) the ranks get MASTER_ADDR/MASTER_PORT, GROUP_RANK
// = node_rank and GROUP_WORLD_SIZE = nnodes instead of TG_RDZV (removed from their environment),
// and TG_JOB_ID only with --job_id: global rank 0 hosts the TCP store there. Unless
// set already, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS give each rank cores / nproc threads
// (at least 1), so that the ranks' BLAS pools do not oversubscribe the machine. On one
// node the rendezvous defaults to a fresh file store directory (file://$TMPDIR/tg_launch_XXXXXX,
// removed at the end); several nodes need --master_addr (+ --master_port, default 29500), or
// --rdzv (redis://host:port or a shared file:///dir) and an explicit --job_id that every node
// agrees on.
//
// A binary with a '/' is relative to the user's directory (BUILD_WORKING_DIRECTORY under
// `bazel run`, where the ranks also run); one without is looked up on PATH. Every line a rank
// writes is printed with a "[rank N] " prefix, stdout to stdout and stderr to stderr, whole lines
// only. Ranks read stdin from /dev/null and run in their own process groups (so a signal reaches
// whatever they start, and a rank cannot stop itself by reading the terminal).
//
// The first rank that exits non-zero or is killed by a signal decides the exit status (its exit
// code, or 128 + the signal): the launcher says so, sends SIGTERM to the other ranks, SIGKILL
// after --grace_s, reaps them and exits. SIGINT/SIGTERM/SIGHUP sent to the launcher are
// forwarded to the ranks (exit status 128 + that signal); a second one kills them at once.
// Nothing left in the ranks' process groups survives the launcher. Bad flags exit with status 2;
// a binary that cannot be started makes its ranks exit with 127.
//
// --max_restarts=N (one node): torchrun's elastic restarts. After a failure has stopped every rank
// (as above), the launcher starts all of them again, at most N times, with
// TORCHELASTIC_RESTART_COUNT = the restart (0 on the first attempt; TORCHELASTIC_MAX_RESTARTS = N)
// and a fresh rendezvous: the job id gets "-restart<k>" (TG_JOB_ID), a tcp:// store is hosted
// anew by the new rank 0. The training binaries resume with --resume=auto (from the checkpoint
// when there is one). A stop the launcher was asked for (SIGINT/SIGTERM/SIGHUP) is not
// restarted; the exit status is that of the last attempt.
//
// Several nodes: each node runs its own launcher; a failure on another node reaches this one
// through the distributed library's timeouts (--timeout_s), not through the launcher.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

ABSL_FLAG(int, nproc, 0, "processes (ranks) to start on this node (required, >= 1)");
ABSL_FLAG(int, nnodes, 1, "nodes in the job (one launcher per node)");
ABSL_FLAG(int, node_rank, 0, "this node's index in [0, nnodes)");
ABSL_FLAG(std::string, rdzv, "",
          "rendezvous: file:///dir or redis://host:port (empty: a fresh temporary file store "
          "directory, one node only)");
ABSL_FLAG(std::string, job_id, "",
          "job id shared by every rank (empty: job-<pid>-<time>, one node only)");
ABSL_FLAG(std::string, master_addr, "",
          "host of global rank 0, which hosts the TCP store (MASTER_ADDR); instead of --rdzv");
ABSL_FLAG(int, master_port, 0,
          "port of the TCP store on --master_addr (MASTER_PORT; 0: 29500 with --master_addr)");
ABSL_FLAG(double, timeout_s, 0,
          "TG_DIST_TIMEOUT_S of the ranks: rendezvous and collective timeout (0: not set)");
ABSL_FLAG(double, grace_s, 30,
          "seconds between SIGTERM and SIGKILL when stopping the ranks (torchrun's agent waits 30 s "
          "too): room for rank 0 to finish writing a checkpoint");
ABSL_FLAG(int, max_restarts, 0,
          "restart all ranks after a failure at most N >= 0 times, as torchrun --max-restarts "
          "(TORCHELASTIC_RESTART_COUNT; one node only)");

extern char** environ;

namespace tg {
namespace {

constexpr int kUsageError = 2;
constexpr const char* kUsage =
    "usage: launch --nproc=N [--nnodes=M --node_rank=I (--master_addr=HOST --master_port=P | "
    "--rdzv=URL --job_id=ID) --timeout_s=S --grace_s=S --max_restarts=N] -- BINARY [ARGS...]";
constexpr const char* kOwnFlags[] = {"nproc",       "nnodes",      "node_rank", "rdzv",
                                     "master_addr", "master_port", "job_id",    "timeout_s",
                                     "grace_s",     "max_restarts"};
// A line longer than this is printed in pieces (a rank cannot make the launcher buffer without
// bound by never writing a newline).
constexpr size_t kMaxLine = 64 << 10;
constexpr size_t kReadChunk = 64 << 10;

using Clock = std::chrono::steady_clock;

// Writes all of `data` to `fd`; gives up silently when the reader is gone (EPIPE).
void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void Say(absl::string_view message) {
  WriteAll(STDERR_FILENO, absl::StrCat("launch: ", message, "\n"));
}

[[noreturn]] void UsageError(absl::string_view message) {
  WriteAll(STDERR_FILENO, absl::StrCat("launch: ", message, "\n", kUsage, "\n"));
  std::exit(kUsageError);
}

// Parses the launcher's flags (everything before the first "--") and returns the command after
// it. Unlike absl::ParseCommandLine, every mistake exits with status 2 and names the flag; help
// flags (--help, --helpfull, ...) still go to absl.
std::vector<std::string> ParseArgs(int argc, char** argv) {
  int separator = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      separator = i;
      break;
    }
  }
  for (int i = 1; i < separator; ++i) {
    absl::string_view name = argv[i];
    while (absl::ConsumePrefix(&name, "-")) {
    }
    if (absl::StartsWith(name, "help") || absl::StartsWith(name, "version") ||
        absl::StartsWith(name, "only_check_args")) {
      absl::ParseCommandLine(separator, argv);  // prints and exits
      std::exit(kUsageError);
    }
  }
  for (int i = 1; i < separator; ++i) {
    absl::string_view arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') {
      UsageError(absl::StrCat("unexpected argument '", arg,
                              "' before '--' (the binary and its arguments come after '--')"));
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    std::string name(arg), value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
      has_value = true;
    }
    bool known = false;
    for (const char* own : kOwnFlags) known = known || name == own;
    absl::CommandLineFlag* flag = known ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr) UsageError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (i + 1 >= separator) UsageError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      UsageError(absl::StrCat("--", name, "='", value, "': ", error));
    }
  }
  if (separator + 1 >= argc) {
    UsageError("no binary to run: put it and its arguments after '--'");
  }
  return std::vector<std::string>(argv + separator + 1, argv + argc);
}

struct Config {
  int nproc = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string rdzv;
  std::string master_addr;
  int master_port = 0;
  std::string job_id;
  double timeout_s = 0;
  double grace_s = 30;
  int max_restarts = 0;
  int attempt = 0;  // TORCHELASTIC_RESTART_COUNT of the ranks
  std::vector<std::string> command;
};

// Reads and checks the flags; exits with status 2 naming the flag on a bad value.
Config CheckFlags(std::vector<std::string> command) {
  Config c;
  c.nproc = absl::GetFlag(FLAGS_nproc);
  c.nnodes = absl::GetFlag(FLAGS_nnodes);
  c.node_rank = absl::GetFlag(FLAGS_node_rank);
  c.rdzv = absl::GetFlag(FLAGS_rdzv);
  c.job_id = absl::GetFlag(FLAGS_job_id);
  c.master_addr = absl::GetFlag(FLAGS_master_addr);
  c.master_port = absl::GetFlag(FLAGS_master_port);
  c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  c.grace_s = absl::GetFlag(FLAGS_grace_s);
  c.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  c.command = std::move(command);
  if (c.nproc < 1) UsageError(absl::StrCat("--nproc must be >= 1, got ", c.nproc));
  if (c.nnodes < 1) UsageError(absl::StrCat("--nnodes must be >= 1, got ", c.nnodes));
  if (c.node_rank < 0 || c.node_rank >= c.nnodes) {
    UsageError(absl::StrCat("--node_rank must be in [0, ", c.nnodes, ") for --nnodes=", c.nnodes,
                            ", got ", c.node_rank));
  }
  if (int64_t{c.nproc} * c.nnodes > (int64_t{1} << 30)) {
    UsageError(absl::StrCat("--nproc=", c.nproc, " times --nnodes=", c.nnodes, " is too large"));
  }
  if (!(c.timeout_s >= 0) || std::isinf(c.timeout_s)) {
    UsageError(absl::StrCat("--timeout_s must be a positive number of seconds (0: not set), got ",
                            c.timeout_s));
  }
  if (!(c.grace_s >= 0) || c.grace_s > 1e6) {
    UsageError(absl::StrCat("--grace_s must be in [0, 1e6] seconds, got ", c.grace_s));
  }
  if (c.max_restarts < 0) {
    UsageError(absl::StrCat("--max_restarts must be >= 0, got ", c.max_restarts));
  }
  if (c.max_restarts > 0 && c.nnodes > 1) {
    // torchrun's agents agree on a restart through their rendezvous; these launchers do not
    // talk to each other, so one node cannot restart the job's other ranks.
    UsageError(absl::StrCat("--max_restarts restarts one node's ranks; with --nnodes=", c.nnodes,
                            " use torchrun (whose agents restart every node together)"));
  }
  if (!c.rdzv.empty() && !absl::StartsWith(c.rdzv, "file:///") &&
      !absl::StartsWith(c.rdzv, "redis://")) {
    UsageError(absl::StrCat("--rdzv must be file:///absolute/dir or redis://host:port, got '",
                            c.rdzv, "'"));
  }
  if (c.master_port < 0 || c.master_port > 65535) {
    UsageError(absl::StrCat("--master_port must be in [1, 65535], got ", c.master_port));
  }
  if (c.master_port != 0 && c.master_addr.empty()) {
    if (c.nnodes > 1) {
      UsageError(absl::StrCat("--master_addr is required with --master_port and --nnodes=",
                              c.nnodes, " (the host of node 0)"));
    }
    c.master_addr = "127.0.0.1";  // torchrun's default on one node
  }
  if (!c.master_addr.empty()) {
    if (!c.rdzv.empty()) {
      UsageError("--rdzv and --master_addr/--master_port are two rendezvous; pass one");
    }
    if (c.master_port == 0) c.master_port = 29500;  // torchrun's default
  }
  if (c.nnodes > 1 && c.rdzv.empty() && c.master_addr.empty()) {
    UsageError(
        absl::StrCat("--master_addr (and --master_port) or --rdzv is required with "
                     "--nnodes=",
                     c.nnodes, " (redis://host:port, or file:///dir on a shared filesystem)"));
  }
  if (c.nnodes > 1 && c.master_addr.empty() && c.job_id.empty()) {
    UsageError(absl::StrCat("--job_id is required with --nnodes=", c.nnodes,
                            " (every node must pass the same id)"));
  }
  return c;
}

// The fds of the self-pipe: signal handlers write the signal number, the poll loop reads it.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// One end of a rank's stdout or stderr pipe and the part of a line not printed yet.
struct Stream {
  int fd = -1;    // read end, non-blocking; -1 once closed
  int dest = -1;  // STDOUT_FILENO or STDERR_FILENO
  std::string partial;
};

struct Rank {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  Stream out, err;
  std::string prefix;  // "[rank N] "
};

class Launcher {
 public:
  explicit Launcher(Config config) : config_(std::move(config)) {}

  // Starts the ranks, supervises them and returns the launcher's exit status.
  int Run() {
    const int world = config_.nproc * config_.nnodes;
    ranks_.resize(config_.nproc);
    for (int l = 0; l < config_.nproc; ++l) {
      Rank& r = ranks_[l];
      r.local_rank = l;
      r.rank = config_.node_rank * config_.nproc + l;
      r.prefix = absl::StrCat("[rank ", r.rank, "] ");
      r.out.dest = STDOUT_FILENO;
      r.err.dest = STDERR_FILENO;
    }
    for (Rank& r : ranks_) {
      std::string error;
      if (!Start(r, world, &error)) {
        Say(absl::StrCat("cannot start rank ", r.rank, ": ", error));
        SetExitCode(1);
        BeginStop(SIGTERM);
        break;
      }
    }
    Supervise();
    // Orphans left in the ranks' process groups (the groups outlive their leaders).
    for (const Rank& r : ranks_) {
      if (r.pid > 0) kill(-r.pid, SIGKILL);
    }
    return exit_code_.value_or(0);
  }

  // Whether the launcher itself was asked to stop (a forwarded signal): not a failure to restart.
  bool signalled() const { return signalled_; }

 private:
  // Forks and execs one rank with its pipes and environment. False (and `error`) when the
  // pipes or the process cannot be created; a failing exec shows up as the rank's exit 127.
  bool Start(Rank& r, int world, std::string* error) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      *error = absl::StrCat("pipe: ", std::strerror(errno));
      return false;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      *error = absl::StrCat("pipe: ", std::strerror(errno));
      close(out[0]);
      close(out[1]);
      return false;
    }
    // Everything the child needs is built before fork: it only calls async-signal-safe
    // functions until exec.
    std::vector<std::string> env_strings;
    const std::vector<std::pair<std::string, std::string>> vars = Tensors(r, world);
    for (char** e = environ; *e != nullptr; ++e) {
      bool overridden = false;
      for (const auto& [name, value] : vars) {
        overridden = overridden || absl::StartsWith(*e, absl::StrCat(name, "="));
      }
      if (!overridden) env_strings.emplace_back(*e);
    }
    for (const auto& [name, value] : vars) {
      if (!value.empty()) env_strings.push_back(absl::StrCat(name, "=", value));  // "": unset
    }
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = config_.command;
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      for (int sig : kForwardedSignals) signal(sig, SIG_DFL);
      signal(SIGCHLD, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      sigprocmask(SIG_SETMASK, &old, nullptr);
      const int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      environ = envp.data();
      execvp(argv[0], argv.data());
      const char* reason = std::strerror(errno);
      const char* parts[] = {"launch: cannot run '", argv[0], "': ", reason, "\n"};
      for (const char* p : parts) (void)!write(STDERR_FILENO, p, std::strlen(p));
      _exit(127);
    }
    const int fork_errno = errno;
    if (pid > 0) setpgid(pid, pid);  // also here, so that kill(-pid) works before the child runs
    sigprocmask(SIG_SETMASK, &old, nullptr);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      close(out[0]);
      close(err[0]);
      *error = absl::StrCat("fork: ", std::strerror(fork_errno));
      return false;
    }
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    fcntl(err[0], F_SETFL, fcntl(err[0], F_GETFL) | O_NONBLOCK);
    r.pid = pid;
    r.running = true;
    r.out.fd = out[0];
    r.err.fd = err[0];
    ++running_;
    return true;
  }

  std::vector<std::pair<std::string, std::string>> Tensors(const Rank& r, int world) const {
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RANK", absl::StrCat(r.rank)},
        {"WORLD_SIZE", absl::StrCat(world)},
        {"LOCAL_RANK", absl::StrCat(r.local_rank)},
        {"LOCAL_WORLD_SIZE", absl::StrCat(config_.nproc)},
    };
    if (!config_.master_addr.empty()) {  // torchrun's variables; rank 0 hosts the TCP store
      vars.emplace_back("MASTER_ADDR", config_.master_addr);
      vars.emplace_back("MASTER_PORT", absl::StrCat(config_.master_port));
      vars.emplace_back("GROUP_RANK", absl::StrCat(config_.node_rank));
      vars.emplace_back("GROUP_WORLD_SIZE", absl::StrCat(config_.nnodes));
      vars.emplace_back("TG_RDZV", "");  // dropped: the launcher's own must not win
      if (!config_.job_id.empty()) vars.emplace_back("TG_JOB_ID", config_.job_id);
    } else {
      vars.emplace_back("TG_RDZV", config_.rdzv);
      vars.emplace_back("TG_JOB_ID", config_.job_id);
    }
    if (config_.timeout_s > 0)
      vars.emplace_back("TG_DIST_TIMEOUT_S", absl::StrCat(config_.timeout_s));
    // torchrun's: which attempt this is (the binaries refuse a fresh start over a checkpoint on
    // a restart, and resume with --resume=auto).
    vars.emplace_back("TORCHELASTIC_RESTART_COUNT", absl::StrCat(config_.attempt));
    vars.emplace_back("TORCHELASTIC_MAX_RESTARTS", absl::StrCat(config_.max_restarts));
    // N ranks each starting one BLAS/OpenMP thread per core would oversubscribe the machine N
    // times over: unless the user set them, give each rank its share of the cores.
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string share = absl::StrCat(std::max<int64_t>(1, cores / config_.nproc));
    for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (std::getenv(name) == nullptr) vars.emplace_back(name, share);
    }
    return vars;
  }

  // The poll loop: output, child exits, the launcher's own signals, the SIGKILL deadline.
  void Supervise() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, Stream*>> owners;
    while (running_ > 0) {
      fds.clear();
      owners.clear();
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      owners.emplace_back(nullptr, nullptr);
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&r, s);
        }
      }
      int timeout_ms = -1;
      if (stopping_ && !killed_) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now());
        timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count() + 1));
      }
      const int n = poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        Say(absl::StrCat("poll: ", std::strerror(errno)));
        SetExitCode(1);
        KillAll();
        break;
      }
      if (n > 0) {
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) ReadOnce(*owners[i].first, *owners[i].second);
        }
        if (fds[0].revents != 0) HandleSignals();
      }
      if (stopping_ && !killed_ && Clock::now() >= kill_at_) {
        std::vector<int> left;
        for (const Rank& r : ranks_) {
          if (r.running) left.push_back(r.rank);
        }
        if (!left.empty()) {
          Say(absl::StrCat(left.size() == 1 ? "rank " : "ranks ", absl::StrJoin(left, ", "),
                           " still running after ", config_.grace_s, " s; sending SIGKILL"));
        }
        KillAll();
      }
    }
    if (running_ > 0) {  // poll failed: wait for the killed ranks without reading their output
      while (running_ > 0) {
        int status;
        const pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) break;
        for (Rank& r : ranks_) {
          if (r.pid == pid && r.running) Exited(r, status);
        }
      }
    }
  }

  void HandleSignals() {
    unsigned char buf[64];
    ssize_t n;
    bool child = false;
    while ((n = read(g_signal_pipe[0], buf, sizeof(buf))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] == SIGCHLD) {
          child = true;
        } else if (!stopping_) {
          Say(absl::StrCat("got signal ", int{buf[i]}, " (", strsignal(buf[i]),
                           "); forwarding it to the ranks"));
          SetExitCode(128 + buf[i]);
          signalled_ = true;
          BeginStop(buf[i]);
        } else if (!killed_) {
          signalled_ = true;
          Say(absl::StrCat("got signal ", int{buf[i]}, " (", strsignal(buf[i]),
                           ") while stopping; killing the ranks"));
          KillAll();
        }
      }
    }
    if (child) Reap();
  }

  void Reap() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Rank& r : ranks_) {
        if (r.pid == pid && r.running) Exited(r, status);
      }
    }
  }

  // A rank has exited: print the rest of its output, and start stopping the others when it is
  // the first to fail.
  void Exited(Rank& r, int status) {
    r.running = false;
    --running_;
    for (Stream* s : {&r.out, &r.err}) {
      // What the rank wrote is in the pipe by now; a process it left behind may still hold the
      // write end, so read what is there (bounded) instead of waiting for EOF.
      for (int i = 0; i < 64 && s->fd >= 0; ++i) {
        if (!ReadOnce(r, *s)) break;
      }
      Close(r, *s);
    }
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (!failed || exit_code_.has_value()) return;
    std::string what;
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      what = absl::StrCat("was killed by signal ", sig, " (", strsignal(sig), ")");
      SetExitCode(128 + sig);
    } else {
      what = absl::StrCat("exited with status ", WEXITSTATUS(status));
      SetExitCode(WEXITSTATUS(status));
    }
    Say(absl::StrCat("rank ", r.rank, " ", what, running_ > 0 ? "; stopping the other ranks" : ""));
    BeginStop(SIGTERM);
  }

  // Reads once from `s` and prints its whole lines. False when nothing more can be read now
  // (EAGAIN, or EOF which also closes the stream).
  bool ReadOnce(Rank& r, Stream& s) {
    char buf[kReadChunk];
    ssize_t n;
    do {
      n = read(s.fd, buf, sizeof(buf));
    } while (n < 0 && errno == EINTR);
    if (n > 0) {
      Print(r, s, absl::string_view(buf, static_cast<size_t>(n)));
      return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    Close(r, s);  // EOF or a read error
    return false;
  }

  void Print(const Rank& r, Stream& s, absl::string_view data) {
    s.partial.append(data.data(), data.size());
    std::string text;
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      absl::StrAppend(&text, r.prefix, absl::string_view(s.partial).substr(start, nl + 1 - start));
    }
    s.partial.erase(0, start);
    if (s.partial.size() >= kMaxLine) {
      absl::StrAppend(&text, r.prefix, s.partial, "\n");
      s.partial.clear();
    }
    WriteAll(s.dest, text);
  }

  // Prints a trailing partial line (with a newline) and closes the stream.
  void Close(const Rank& r, Stream& s) {
    if (s.fd < 0) return;
    close(s.fd);
    s.fd = -1;
    if (!s.partial.empty()) {
      WriteAll(s.dest, absl::StrCat(r.prefix, s.partial, "\n"));
      s.partial.clear();
    }
  }

  void SetExitCode(int code) {
    if (!exit_code_.has_value()) exit_code_ = code;
  }

  // Sends `sig` to every running rank's process group and arms the SIGKILL deadline.
  void BeginStop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(config_.grace_s));
    for (const Rank& r : ranks_) {
      if (r.running) kill(-r.pid, sig);
    }
  }

  void KillAll() {
    stopping_ = true;
    killed_ = true;
    for (const Rank& r : ranks_) {
      if (r.running) kill(-r.pid, SIGKILL);
    }
  }

  const Config config_;
  std::vector<Rank> ranks_;
  int running_ = 0;
  bool stopping_ = false;  // SIGTERM (or the launcher's signal) sent to the ranks
  bool killed_ = false;    // SIGKILL sent
  bool signalled_ = false;  // the launcher got SIGINT/SIGTERM/SIGHUP
  Clock::time_point kill_at_;
  std::optional<int> exit_code_;  // set by the first failure (or the launcher's own signal)
};

bool InstallSignalHandlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kForwardedSignals) {
    if (sigaction(sig, &sa, nullptr) != 0) return false;
  }
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, nullptr) != 0) return false;
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
  return true;
}

int Main(Config config) {
  // Under `bazel run` the working directory is the runfiles tree; the user's is this one.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && *dir != '\0') {
    if (chdir(dir) != 0) {
      Say(absl::StrCat("cannot change to BUILD_WORKING_DIRECTORY '", dir,
                       "': ", std::strerror(errno)));
      return 1;
    }
  }
  std::string temp_dir;
  if (config.rdzv.empty() && config.master_addr.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp", "/tg_launch_XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      Say(absl::StrCat("cannot create a rendezvous directory from '", pattern,
                       "': ", std::strerror(errno)));
      return 1;
    }
    temp_dir = pattern;
    config.rdzv = absl::StrCat("file://", temp_dir);
  }
  if (config.job_id.empty() && config.master_addr.empty()) {
    config.job_id = absl::StrCat("job-", getpid(), "-", static_cast<int64_t>(std::time(nullptr)));
  }
  if (!InstallSignalHandlers()) {
    Say(absl::StrCat("cannot install signal handlers: ", std::strerror(errno)));
    return 1;
  }
  const std::string job_id = config.job_id;
  int code = 0;
  for (int attempt = 0;; ++attempt) {
    config.attempt = attempt;
    // A fresh rendezvous per attempt: the keys of the failed one stay in a file or Redis store.
    if (attempt > 0 && !job_id.empty()) config.job_id = absl::StrCat(job_id, "-restart", attempt);
    Launcher launcher(config);
    code = launcher.Run();
    if (code == 0 || launcher.signalled() || attempt >= config.max_restarts) break;
    Say(absl::StrCat("restarting all ranks (restart ", attempt + 1, " of ", config.max_restarts,
                     ")"));
  }
  if (!temp_dir.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir, ignored);
  }
  return code;
}

}  // namespace
}  // namespace tg

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Starts --nproc processes of a binary with RANK/WORLD_SIZE/LOCAL_RANK/TG_RDZV set and "
      "supervises them.\n  launch --nproc=N [flags] -- BINARY [ARGS...]\nFlags:");
  std::vector<std::string> command = tg::ParseArgs(argc, argv);
  return tg::Main(tg::CheckFlags(std::move(command)));
}
