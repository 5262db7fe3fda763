// GlooProcessGroup: the ProcessGroup of CPU tensors, on gloo's TCP transport.
//
// Collectives run on one worker thread per group, in call order (so every rank's sequence
// matches), and their Work completes when the data is in place. gloo's algorithms: ring
// all-reduce, all-gather and broadcast, and a dissemination barrier. reduce_scatter is an
// all-to-all of the chunks followed by a local reduction in rank order: correct for any world
// size (gloo's halving-doubling reduce-scatter needs extra care off powers of two), as little
// traffic as a ring reduce-scatter, and its results do not depend on the arrival order.
// f16 and bf16 travel as 2-byte values: all_reduce adds pairs in f32 and rounds each partial
// sum (as NCCL does), except for f16 sums and averages; reduce_scatter reduces all chunks in f32
// and rounds once. kAvg divides the sum by the world size. all_reduce of f16 with kSum or kAvg
// is an all-to-all, the reduction in f32 in rank order with one rounding, and an all-gather (the
// same traffic as the ring): an average of finite f16 values is then always finite (|avg| <=
// max |value|) and a sum overflows only where the exact sum leaves f16's range, so DDP's f16
// gradients overflow exactly where some rank's local gradient (or their sum) does.
//
// Ranks that issue different collectives (op, element count, dtype, reduction or root, or one
// rank a collective more) never exchange data: every collective's gloo messages carry a tag of
// its number in the group and its arguments, so that gloo's transport neither aborts the process
// (a message bigger than the buffer posted for it) nor completes with wrong data. The ranks time
// out instead; a rank whose collective failed or timed out then writes its arguments to the
// group's store and reads the others' (waiting up to min(timeout / 2, 5s)), and when they differ
// the Work fails with InvalidArgument naming them:
//   "all_reduce on group 'default' (rank 0 of 2, gloo) of 10 f32 elements (sum) failed: the ranks
//   issued different collectives as the group's collective #3: rank 1 issued all_reduce of 12
//   f32 elements (sum) (...)"
// No exchange happens while collectives succeed.
//
//   auto pg = tg::dist::GlooProcessGroup::Create(rank, size, "default", timeout, store).value();
#ifndef TAPEGRAD_DISTRIBUTED_GLOO_PROCESS_GROUP_H_
#define TAPEGRAD_DISTRIBUTED_GLOO_PROCESS_GROUP_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "distributed/process_group.h"
#include "distributed/store.h"

namespace tg::dist {

struct GlooOptions {
  // The address this rank listens on: 127.0.0.1 for one machine, the host's name or address
  // otherwise.
  std::string hostname = "127.0.0.1";
  // The network interface to bind (gloo's attr.iface, e.g. "eth0" or "lo"); when set it wins
  // over `hostname`.
  std::string iface;
};

class GlooProcessGroup final : public ProcessGroup {
 public:
  // Meets the other ranks through `group_store` (a store view private to this group): every
  // rank announces itself under "rank/<r>"; when some rank does not within `timeout`,
  // DeadlineExceeded names the missing ranks. Then gloo connects a full TCP mesh. An interface
  // that does not exist is refused first (CheckInterface), before any store traffic.
  static absl::StatusOr<std::shared_ptr<ProcessGroup>> Create(int rank, int size,
                                                              const std::string& name,
                                                              absl::Duration timeout,
                                                              std::shared_ptr<Store> group_store,
                                                              const GlooOptions& options = {});
  ~GlooProcessGroup() override;

  // InvalidArgument naming the group and rank when `options.iface` is set and this machine has
  // no such interface. A local check: InitProcessGroup runs it before it opens the job's store,
  // so a rank that fails it never takes the store (hosted by rank 0) away from the others.
  static absl::Status CheckInterface(int rank, const std::string& name, const GlooOptions& options);

  const char* backend() const override { return "gloo"; }
  std::shared_ptr<Work> all_reduce(const RawTensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter(const RawTensor& output, const RawTensor& input,
                                       ReduceOp op) override;
  std::shared_ptr<Work> all_gather(const RawTensor& output, const RawTensor& input) override;
  std::shared_ptr<Work> broadcast(const RawTensor& tensor, int root) override;
  std::shared_ptr<Work> barrier() override;

  struct Impl;

 private:
  GlooProcessGroup(int rank, int size, std::string name, absl::Duration timeout);
  std::shared_ptr<Impl> impl_;  // shared with the Works (a timed-out wait breaks the group)
};

}  // namespace tg::dist

#endif  // TAPEGRAD_DISTRIBUTED_GLOO_PROCESS_GROUP_H_
