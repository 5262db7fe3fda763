// Initialisation of a process's distributed state: who am I (rank, world size, local rank),
// where do we meet (the rendezvous store), and the default process group.
//
// Resolution order for rank / world size / local rank: explicit options (flags) > the first
// launcher whose rank variable is set, all three values from that launcher:
//   torchrun (and tools:launch): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI (mpirun):           OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   SLURM (srun):                SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (tasks per node from
//                                SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE when even ("4(x2)"),
//                                or SLURM_STEP_NUM_NODES / SLURM_NNODES)
// > a single process (0, 1, 0). A missing world size is 1; a missing local rank is the rank.
// The rendezvous: options.rdzv > TG_RDZV ("file:///dir", "redis://host:port" or
// "tcp://host:port") > MASTER_ADDR + MASTER_PORT (the TCP store, tcp://MASTER_ADDR:MASTER_PORT,
// as torchrun and torchrun-under-SLURM scripts set them); required when the world size is
// above 1. A tcp:// store is hosted by rank 0 (it listens on the port on every interface) and
// every rank, rank 0 included, connects to it; it stops when rank 0's last group and store
// view are destroyed. Under torchrun's own agent store (TORCHELASTIC_USE_AGENT_STORE=True, which
// torchrun's static and c10d rendezvous set) the agent hosts PyTorch's TCPStore on that port:
// every rank connects to it as a client (torch-tcp://MASTER_ADDR:MASTER_PORT, store.h) and no
// rank hosts a store; keys then live under "tapegrad/<job>/attempt<TORCHELASTIC_RESTART_COUNT>/",
// apart from the agent's own keys and from those of earlier attempts.
// Gloo's address: options.gloo_iface > GLOO_SOCKET_IFNAME (an interface, e.g. eth0 or lo) >
// TG_GLOO_HOSTNAME > 127.0.0.1 on one machine, the host name when the job spans several
// (LOCAL_WORLD_SIZE < WORLD_SIZE, or a SLURM step on several nodes). Keys live under
// "<job>/<group>/" where the job id comes from options.job_id > TG_JOB_ID > "tapegrad".
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
  std::string rdzv;        // "": TG_RDZV
  std::string job_id;      // "": TG_JOB_ID or "tapegrad"
  std::string gloo_iface;  // "": GLOO_SOCKET_IFNAME (see the file comment)
  std::string group_name = "default";
  std::string backend = "gloo";  // "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  // Rendezvous and every collective. TG_DIST_TIMEOUT_S overrides it (launch --timeout_s).
  absl::Duration timeout = absl::Seconds(300);
};

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = -1;  // -1: unknown
  std::string launcher;       // "torchrun", "Open MPI", "SLURM", or "" (options / one process)
  std::string rdzv;
  std::string job_id;
  int attempt = 0;  // torch-tcp:// only: torchrun's TORCHELASTIC_RESTART_COUNT
  absl::Duration timeout;
  std::string gloo_iface;     // "": use gloo_hostname
  std::string gloo_hostname;  // "": 127.0.0.1
};

// Resolves DistOptions against the environment. InvalidArgument names the variable or option
// that is malformed or out of range (rank >= world size, a missing rendezvous for world > 1).
absl::StatusOr<DistEnv> ResolveDistEnv(const DistOptions& options);

// The job's store under "<job_id>" (InMemory for a single process without a rendezvous; under
// "tapegrad/<job_id>/attempt<attempt>" on a torch-tcp:// store).
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
