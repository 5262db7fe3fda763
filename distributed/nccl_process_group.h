// NcclProcessGroup: the ProcessGroup of CUDA tensors, on NCCL. One communicator per group, one
// rank per process and GPU (the rank's cuda:N), collectives queued on a communication stream of
// the group's own, ordered with the caller's compute stream by events: nothing on the hot path
// synchronises the host.
//
//   auto store = job_store->WithPrefix("default");   // a store view private to the group
//   auto pg = tg::dist::NewNcclProcessGroup(rank, size, "default", absl::Seconds(300), store,
//                                           tg::Device::Cuda(local_rank)).value();
//   auto work = pg->all_reduce(grads, tg::dist::ReduceOp::kAvg);   // [n] bf16 on cuda:N
//   ... more compute on the current stream (it does not wait for the all-reduce) ...
//   TG_DIST_CHECK_OK(work->wait());   // the current stream now waits for it; the host does not
//
// Rendezvous: rank 0 creates the ncclUniqueId and Sets it (hex) in the group's store under
// "nccl_unique_id"; the others Get it within the timeout (a store failure comes back with the
// store's code, prefixed with the group). The communicator is created non-blocking
// (ncclCommInitRankConfig, blocking = 0) and polled, so that a peer that never joins makes
// init fail with DeadlineExceeded after the timeout instead of hanging (the communicator is
// aborted). A consequence of non-blocking mode: when NCCL defers the enqueue of a collective
// (ncclInProgress, e.g. while it connects to peers on first use), the issuing thread polls
// until the enqueue is done (bounded by the timeout); the device work itself is never awaited.
//
// Streams: each collective makes the communication stream wait for an event recorded on the
// caller's current stream (tg::cuda::CurrentStream of the group's device), so its inputs are
// ready, and records an end event on the communication stream. Work::wait() makes the caller's
// current stream wait for the end event (cudaStreamWaitEvent) and checks the communicator for
// asynchronous errors (ncclCommGetAsyncError); is_completed() queries the end event.
//
// Host waits, only where asked for: with NcclOptions::blocking_wait, Work::wait(timeout) polls
// the end event and the communicator until the collective finished or the timeout passed; on
// timeout it aborts the communicator (ncclCommAbort) and returns DeadlineExceeded naming the
// op, group and rank. barrier()'s Work always waits this way (as PyTorch's does): a barrier
// that returned before the peers arrived would not be one. Without blocking_wait a hung
// collective is still detected, lazily (wait()'s timeout argument is then not used): when a
// collective is issued, or a Work waited on or queried, and the oldest unfinished one was
// issued more than timeout() ago, the group breaks with DeadlineExceeded naming that one.
//
// Failures: an NCCL call that fails, an asynchronous communicator error or a timeout aborts the
// communicator and breaks the group: from then on every collective returns a Work that fails
// with that first error, and so does wait() on any Work not seen complete before. NCCL
// failures read "<file>:<line>: <call> failed: ncclRemoteError: <NCCL's text> (last error:
// <ncclGetLastError>)" after the Describe() prefix; CUDA failures throw tg::Error through
// TG_CUDA_CHECK; argument errors throw tg::Error (ProcessGroup's checks) before anything is
// queued.
//
// RawTensor lifetime: tapegrad's caching allocator hands a freed block out again at once, which
// is safe only for memory used on one stream. The tensors of a collective are used on the
// communication stream, so the group keeps a reference to each of them until the collective's
// end event has completed, whatever the caller does with its handles or the Work. They are
// released lazily, without host synchronisation: when a later collective is issued, or when
// wait() / is_completed() observe completion; the destructor waits for what is left.
// reduce_scatter / all_gather in place are allowed only in NCCL's layout (the small buffer is
// chunk rank() of the big one); other overlaps are undefined.
//
// f16 sums and averages go through an f32 buffer on the communication stream (widened, summed
// by NCCL in f32, kAvg scaled by f32(1/size), rounded to f16 once): NCCL's f16 ncclAvg overflows
// where no rank's value does (nccl_process_group.cc says when and why); the cost is twice the
// bytes on the wire for them. bf16 and the other dtypes use NCCL's reductions as they are.
//
// Zero-element collectives enqueue nothing and return a completed Work. The group's tensors
// must be on its device (cuda:N); rank r of a job normally uses cuda:LOCAL_RANK. The group may
// be used from several threads (issue order is the order of the calls; keep it the same on
// every rank).
#ifndef TAPEGRAD_DISTRIBUTED_NCCL_PROCESS_GROUP_H_
#define TAPEGRAD_DISTRIBUTED_NCCL_PROCESS_GROUP_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace tg::dist {

struct NcclOptions {
  // Work::wait(timeout) polls on the host until the collective finished or the timeout passed
  // (then aborts the communicator and returns DeadlineExceeded); PyTorch's
  // TORCH_NCCL_BLOCKING_WAIT. Off: wait() only orders the caller's stream (the hot path).
  bool blocking_wait = false;
};

// Creates the group's communicator on `device` (a CUDA device; every tensor of the group must
// be on it). Errors: InvalidArgument for rank/size/device/store misuse, FailedPrecondition
// without a CUDA device, the store's Status (annotated) when rank 0's id does not arrive,
// DeadlineExceeded when ncclCommInitRankConfig does not complete within `timeout`, and the
// NCCL error otherwise. Blocks until every rank has joined.
absl::StatusOr<std::shared_ptr<ProcessGroup>> NewNcclProcessGroup(
    int rank, int size, const std::string& name, absl::Duration timeout,
    std::shared_ptr<Store> group_store, Device device, const NcclOptions& options = {});

class NcclProcessGroup final : public ProcessGroup {
 public:
  ~NcclProcessGroup() override;

  const char* backend() const override { return "nccl"; }
  std::shared_ptr<Work> all_reduce(const RawTensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter(const RawTensor& output, const RawTensor& input,
                                       ReduceOp op) override;
  std::shared_ptr<Work> all_gather(const RawTensor& output, const RawTensor& input) override;
  // root must be in [0, size()) (tg::Error otherwise).
  std::shared_ptr<Work> broadcast(const RawTensor& tensor, int root) override;
  // An all_reduce of a 1-element device buffer; its Work's wait() blocks the host (see above).
  std::shared_ptr<Work> barrier() override;

  // The communication stream (on device()).
  cudaStream_t stream() const;
  // Collectives whose tensors the group still holds (their end event was not yet seen
  // complete); for tests and diagnostics.
  int64_t held_collectives() const;
  // The first error, OK while the group works.
  absl::Status error() const;

  struct State;

 private:
  friend absl::StatusOr<std::shared_ptr<ProcessGroup>> NewNcclProcessGroup(
      int, int, const std::string&, absl::Duration, std::shared_ptr<Store>, Device,
      const NcclOptions&);
  NcclProcessGroup(int rank, int size, std::string name, absl::Duration timeout, Device device,
                   const NcclOptions& options);
  absl::Status Init(Store& store);

  std::shared_ptr<State> state_;
};

// The Status of a failed NCCL call: "<file>:<line>: <call> failed: <result name>: <NCCL's
// error string>", then " (last error: <ncclGetLastError(comm)>)" when NCCL has one. Codes:
// Unavailable for ncclRemoteError / ncclSystemError (a peer or the network), Internal
// otherwise. OK for ncclSuccess.
absl::Status NcclCallStatus(ncclResult_t result, const char* call, const char* file, int line,
                            ncclComm_t comm);
// "ncclRemoteError" etc.
const char* NcclResultName(ncclResult_t result);

}  // namespace tg::dist

// The Status of an NCCL call (ncclInProgress counts as a failure here: callers that use a
// non-blocking communicator resolve it first).
#define TG_NCCL_STATUS(call, comm) \
  ::tg::dist::NcclCallStatus((call), #call, __FILE__, __LINE__, (comm))

#endif  // TAPEGRAD_DISTRIBUTED_NCCL_PROCESS_GROUP_H_
