// Initialisation of a process's distributed state: who am I (rank, world size, local rank),
// where do we meet (the rendezvous store), and the default process group.
//
// Resolution order for rank / world size / local rank: explicit options (flags) > RANK /
// WORLD_SIZE / LOCAL_RANK (torchrun style, set by tools:launch) > OMPI_COMM_WORLD_RANK /
// OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK (mpirun) > a single process (0, 1, 0).
// The rendezvous: options.rdzv > TG_RDZV ("file:///dir" or "redis://host:port"); required
// when the world size is above 1. Gloo listens on 127.0.0.1 unless TG_GLOO_HOSTNAME is set or
// LOCAL_WORLD_SIZE < WORLD_SIZE (several machines: the host name). Keys live under "<job>/<group>/" where the job id comes from
// options.job_id > TG_JOB_ID > "tapegrad".
//
//   tg::dist::DistOptions o;                     // from the environment
//   auto pg = tg::dist::InitProcessGroup(o);     // absl::StatusOr<std::shared_ptr<ProcessGroup>>
//   if (!pg.ok()) { std::cerr << pg.status() << "\n"; return 1; }
#ifndef TAPEGRAD_DISTRIBUTED_INIT_H_
#define TAPEGRAD_DISTRIBUTED_INIT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace tg::dist {

struct DistOptions {
  int rank = -1;  // -1: from the environment (see the file comment)
  int world_size = -1;
  int local_rank = -1;
  std::string rdzv;  // "": TG_RDZV
  std::string job_id;  // "": TG_JOB_ID or "tapegrad"
  std::string group_name = "default";
  std::string backend = "gloo";  // "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  // Rendezvous and every collective. TG_DIST_TIMEOUT_S overrides it (launch --timeout_s).
  absl::Duration timeout = absl::Seconds(300);
};

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string rdzv;
  std::string job_id;
  absl::Duration timeout;
};

// Resolves DistOptions against the environment. InvalidArgument names the variable or option
// that is malformed or out of range (rank >= world size, a missing rendezvous for world > 1).
absl::StatusOr<DistEnv> ResolveDistEnv(const DistOptions& options);

// The job's store under "<job_id>" (InMemory for a single process without a rendezvous).
absl::StatusOr<std::shared_ptr<Store>> OpenJobStore(const DistEnv& env);

// Resolves the environment, opens the store, and builds a process group of every rank under
// "<job_id>/<group_name>". Every rank announces itself; when some rank does not within the
// timeout, DeadlineExceeded names the missing ranks ("ranks 3 of world size 4 did not join").
absl::StatusOr<std::shared_ptr<ProcessGroup>> InitProcessGroup(const DistOptions& options = {});
// The same on an already opened job store (several groups over one store). A group name is
// used once per job (its keys stay in the store).
absl::StatusOr<std::shared_ptr<ProcessGroup>> NewProcessGroup(const DistEnv& env,
                                                              std::shared_ptr<Store> job_store,
                                                              const std::string& group_name,
                                                              const std::string& backend);

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_INIT_H_
