#include "distributed/init.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<DistEnv> ResolveDistEnv(const DistOptions& options) {
  DistEnv env;
  auto rank = IntFromEnv({"RANK", "OMPI_COMM_WORLD_RANK"}, 0);
  auto world = IntFromEnv({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}, 1);
  auto local = IntFromEnv({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}, -1);
  if (!rank.ok()) return rank.status();
  if (!world.ok()) return world.status();
  if (!local.ok()) return local.status();
  env.rank = options.rank >= 0 ? options.rank : *rank;
  env.world_size = options.world_size >= 0 ? options.world_size : *world;
  env.local_rank = options.local_rank >= 0 ? options.local_rank : (*local >= 0 ? *local : env.rank);
  if (env.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed init: world size must be at least 1, got ", env.world_size));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("distributed init: rank ", env.rank,
                                                   " is out of range for world size ",
                                                   env.world_size));
  }
  if (env.local_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed init: local rank must be >= 0, got ", env.local_rank));
  }
  env.rdzv = options.rdzv;
  if (env.rdzv.empty() && GetEnv("TG_RDZV") != nullptr) env.rdzv = GetEnv("TG_RDZV");
  if (env.rdzv.empty() && env.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed init: world size ", env.world_size,
        " needs a rendezvous: pass --rdzv=file:///dir or redis://host:port, set TG_RDZV, or "
        "start the processes with tools:launch"));
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
  return env;
}

absl::StatusOr<std::shared_ptr<Store>> OpenJobStore(const DistEnv& env) {
  if (env.rdzv.empty()) return Store::InMemory()->WithPrefix(env.job_id);
  auto store = Store::Open(env.rdzv);
  if (!store.ok()) return store.status();
  return (*store)->WithPrefix(env.job_id);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> NewProcessGroup(const DistEnv& env,
                                                              std::shared_ptr<Store> job_store,
                                                              const std::string& group_name,
                                                              const std::string& backend) {
  std::shared_ptr<Store> group_store = job_store->WithPrefix(group_name);
  if (backend == "gloo") {
    GlooOptions gloo;
    // One machine unless the launcher says the job spans several (LOCAL_WORLD_SIZE < WORLD_SIZE):
    // then peers must reach this host by name.
    if (const char* host = GetEnv("TG_GLOO_HOSTNAME")) {
      gloo.hostname = host;
    } else {
      auto local_world = IntFromEnv({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}, -1);
      if (local_world.ok() && *local_world > 0 && *local_world < env.world_size) {
        char name[256] = {};
        if (gethostname(name, sizeof(name) - 1) == 0) gloo.hostname = name;
      }
    }
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
  return absl::InvalidArgumentError(absl::StrCat("distributed init: unknown backend '", backend,
                                                 "' (gloo or nccl)"));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> InitProcessGroup(const DistOptions& options) {
  auto env = ResolveDistEnv(options);
  if (!env.ok()) return env.status();
  auto store = OpenJobStore(*env);
  if (!store.ok()) return store.status();
  return NewProcessGroup(*env, *store, options.group_name, options.backend);
}

}  // namespace tg::dist
