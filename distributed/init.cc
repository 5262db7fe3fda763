#include "distributed/init.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "distributed/gloo_process_group.h"
#ifdef TAPEGRAD_HAS_NCCL
#include "distributed/nccl_process_group.h"
#endif

namespace tg::dist {
namespace {

const char* GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// An integer from the first of `names` that is set; `fallback` when none is. InvalidArgument
// names the variable when its value is not an integer.
absl::StatusOr<int> IntFromEnv(std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    const char* v = GetEnv(name);
    if (v == nullptr) continue;
    int value;
    if (!absl::SimpleAtoi(v, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed init: ", name, "='", v, "' is not an integer"));
    }
    return value;
  }
  return fallback;
}

// Where rank / world size / local rank come from when no option gives them: the first launcher
// whose rank variable is set, in this order.
struct Launcher {
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;  // nullptr: see LocalWorldSize
};
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

// SLURM_TASKS_PER_NODE ("2(x3),1": 2 tasks on each of 3 nodes, then 1) when every node runs the
// same number of tasks, else -1.
int UniformSlurmTasksPerNode(absl::string_view text) {
  int common = -1;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (const size_t paren = part.find('('); paren != absl::string_view::npos) {
      part = part.substr(0, paren);  // "2(x3)": the count repeats, the repeat does not matter
    }
    int v;
    if (!absl::SimpleAtoi(part, &v) || v < 1 || (common != -1 && v != common)) return -1;
    common = v;
  }
  return common;
}

// SLURM's tasks on this node: SLURM_NTASKS_PER_NODE when it is one number (srun
// --ntasks-per-node), SLURM_TASKS_PER_NODE when every node runs as many, the whole step on one
// node, else unknown (-1; uneven layouts).
int SlurmLocalWorldSize(int world_size) {
  int v;
  if (const char* n = GetEnv("SLURM_NTASKS_PER_NODE"); n != nullptr && absl::SimpleAtoi(n, &v)) {
    return v;
  }
  if (const char* n = GetEnv("SLURM_TASKS_PER_NODE"); n != nullptr) {
    if (const int uniform = UniformSlurmTasksPerNode(n); uniform > 0) return uniform;
  }
  for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}) {
    if (const char* n = GetEnv(name); n != nullptr && absl::SimpleAtoi(n, &v)) {
      return v == 1 ? world_size : -1;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<DistEnv> ResolveDistEnv(const DistOptions& options) {
  DistEnv env;
  const Launcher* from = nullptr;
  for (const Launcher& l : kLaunchers) {
    if (GetEnv(l.rank) != nullptr) {
      from = &l;
      break;
    }
  }
  int rank = 0, world = 1, local = -1, local_world = -1;
  if (from != nullptr) {
    auto r = IntFromEnv({from->rank}, 0);
    if (!r.ok()) return r.status();
    auto w = IntFromEnv({from->world_size}, 1);
    if (!w.ok()) return w.status();
    auto l = IntFromEnv({from->local_rank}, -1);
    if (!l.ok()) return l.status();
    rank = *r;
    world = *w;
    local = *l;
    if (from->local_world_size != nullptr) {
      auto lw = IntFromEnv({from->local_world_size}, -1);
      if (!lw.ok()) return lw.status();
      local_world = *lw;
    } else {
      local_world = SlurmLocalWorldSize(world);
    }
    env.launcher = from->name;
  }
  env.rank = options.rank >= 0 ? options.rank : rank;
  env.world_size = options.world_size >= 0 ? options.world_size : world;
  env.local_rank = options.local_rank >= 0 ? options.local_rank : (local >= 0 ? local : env.rank);
  env.local_world_size = options.world_size >= 0 ? -1 : local_world;
  if (env.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed init: world size must be at least 1, got ", env.world_size));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed init: rank ", env.rank, " is out of range for world size ", env.world_size));
  }
  if (env.local_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed init: local rank must be >= 0, got ", env.local_rank));
  }
  env.rdzv = options.rdzv;
  if (env.rdzv.empty() && GetEnv("TG_RDZV") != nullptr) env.rdzv = GetEnv("TG_RDZV");
  const char* master_addr = GetEnv("MASTER_ADDR");
  const char* master_port = GetEnv("MASTER_PORT");
  if (env.rdzv.empty() && (master_addr != nullptr || master_port != nullptr)) {
    if (master_addr == nullptr || master_port == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed init: ", master_addr == nullptr ? "MASTER_PORT" : "MASTER_ADDR",
                       " is set but ", master_addr == nullptr ? "MASTER_ADDR" : "MASTER_PORT",
                       " is not (the TCP store hosted by rank 0 needs both)"));
    }
    int port;
    if (!absl::SimpleAtoi(master_port, &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("distributed init: MASTER_PORT='", master_port,
                                                     "' is not a port number in [1, 65535]"));
    }
    const std::string host = absl::StrContains(master_addr, ':')
                                 ? absl::StrCat("[", master_addr, "]")
                                 : std::string(master_addr);
    // torchrun's agent hosts PyTorch's TCPStore on MASTER_ADDR:MASTER_PORT and says so: every
    // rank connects to it as a client. Otherwise rank 0 hosts tapegrad's TCP store there.
    const char* agent = GetEnv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent != nullptr && (absl::EqualsIgnoreCase(agent, "true") || std::string(agent) == "1")) {
      env.rdzv = absl::StrCat("torch-tcp://", host, ":", port);
      // The agent's store outlives a restart of the workers: each attempt meets under its own
      // prefix, so that keys of a failed attempt are never read as this one's.
      auto attempt = IntFromEnv({"TORCHELASTIC_RESTART_COUNT"}, 0);
      if (!attempt.ok()) return attempt.status();
      env.attempt = *attempt;
    } else {
      env.rdzv = absl::StrCat("tcp://", host, ":", port);
    }
  }
  if (env.rdzv.empty() && env.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed init: world size ", env.world_size,
        " needs a rendezvous: pass --rdzv=file:///dir or redis://host:port, set TG_RDZV or "
        "MASTER_ADDR and MASTER_PORT, or start the processes with tools:launch"));
  }
  env.job_id = options.job_id;
  if (env.job_id.empty()) env.job_id = GetEnv("TG_JOB_ID") ? GetEnv("TG_JOB_ID") : "tapegrad";
  env.timeout = options.timeout;
  if (const char* t = GetEnv("TG_DIST_TIMEOUT_S")) {
    double seconds;
    if (!absl::SimpleAtod(t, &seconds) || !(seconds > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed init: TG_DIST_TIMEOUT_S='", t, "' is not a positive number"));
    }
    env.timeout = absl::Seconds(seconds);
  }
  // Gloo's address: an interface (option > GLOO_SOCKET_IFNAME), else a host name
  // (TG_GLOO_HOSTNAME), else loopback on one machine and this host's name on several.
  env.gloo_iface = options.gloo_iface;
  if (env.gloo_iface.empty() && GetEnv("GLOO_SOCKET_IFNAME") != nullptr) {
    env.gloo_iface = GetEnv("GLOO_SOCKET_IFNAME");
  }
  if (absl::StrContains(env.gloo_iface, ',')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed init: gloo interface '", env.gloo_iface,
        "' names several interfaces; tapegrad's Gloo groups use one (name one, e.g. eth0)"));
  }
  if (const char* host = GetEnv("TG_GLOO_HOSTNAME")) {
    env.gloo_hostname = host;
  } else {
    bool several_nodes = env.local_world_size > 0 && env.local_world_size < env.world_size;
    int nodes;
    if (const char* n = GetEnv("SLURM_STEP_NUM_NODES");
        env.launcher == "SLURM" && n != nullptr && absl::SimpleAtoi(n, &nodes)) {
      several_nodes = several_nodes || nodes > 1;
    }
    if (several_nodes) {
      char name[256] = {};
      if (gethostname(name, sizeof(name) - 1) == 0) env.gloo_hostname = name;
    }
  }
  return env;
}

absl::StatusOr<std::shared_ptr<Store>> OpenJobStore(const DistEnv& env) {
  if (env.rdzv.empty()) return Store::InMemory()->WithPrefix(env.job_id);
  StoreOptions options;
  // tcp:// only: rank 0 hosts, everyone connects (torch-tcp://: the agent hosts).
  options.host_tcp_store = env.rank == 0 && absl::StartsWith(env.rdzv, "tcp://");
  options.tcp_timeout = env.timeout;
  auto store = Store::Open(env.rdzv, options);
  if (!store.ok()) return store.status();
  if (absl::StartsWith(env.rdzv, "torch-tcp://")) {
    return (*store)->WithPrefix(env.job_id)->WithPrefix(absl::StrCat("attempt", env.attempt));
  }
  return (*store)->WithPrefix(env.job_id);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> NewProcessGroup(const DistEnv& env,
                                                              std::shared_ptr<Store> job_store,
                                                              const std::string& group_name,
                                                              const std::string& backend) {
  std::shared_ptr<Store> group_store = job_store->WithPrefix(group_name);
  if (backend == "gloo") {
    GlooOptions gloo;
    gloo.iface = env.gloo_iface;
    if (!env.gloo_hostname.empty()) gloo.hostname = env.gloo_hostname;
    return GlooProcessGroup::Create(env.rank, env.world_size, group_name, env.timeout,
                                    std::move(group_store), gloo);
  }
  if (backend == "nccl") {
#ifdef TAPEGRAD_HAS_NCCL
    return NewNcclProcessGroup(env.rank, env.world_size, group_name, env.timeout,
                               std::move(group_store), Device::Cuda(env.local_rank));
#else
    return absl::FailedPreconditionError(
        "distributed init: backend 'nccl' needs CUDA, and this build has none (--config=cpu)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("distributed init: unknown backend '", backend, "' (gloo or nccl)"));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> InitProcessGroup(const DistOptions& options) {
  auto env = ResolveDistEnv(options);
  if (!env.ok()) return env.status();
  if (options.backend == "gloo") {
    GlooOptions gloo;
    gloo.iface = env->gloo_iface;
    absl::Status iface = GlooProcessGroup::CheckInterface(env->rank, options.group_name, gloo);
    if (!iface.ok()) return iface;
  }
  auto store = OpenJobStore(*env);
  if (!store.ok()) return store.status();
  return NewProcessGroup(*env, *store, options.group_name, options.backend);
}

}  // namespace tg::dist
