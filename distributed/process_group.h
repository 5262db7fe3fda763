// ProcessGroup: the collectives of data-parallel and sharded training, on a fixed set of ranks.
// Gloo implements it on CPU tensors (gloo_process_group.h), NCCL on CUDA tensors
// (nccl_process_group.h). Every collective is asynchronous: it is queued in call order and
// returns a Work; the tensors it names must not be touched until the Work is waited on.
//
//   auto pg = tg::dist::InitProcessGroup(env).value();           // init.h
//   auto work = pg->all_reduce(grads, tg::dist::ReduceOp::kAvg);  // in place
//   ... more compute ...
//   TG_DIST_CHECK_OK(work->wait());                               // or inspect the Status
//
// Contracts (both backends):
// - Every rank must issue the same collectives in the same order with the same dtypes and
//   sizes (as with every collective library). Tensors must be contiguous, on the group's
//   device type, of a dtype the backend supports; a violation throws tg::Error naming the op,
//   the argument and its shape/dtype/device, before anything is queued.
// - all_reduce(t, op) is in place; kAvg is the sum divided by size() (floating dtypes only).
//   f16 sums and averages (all_reduce and reduce_scatter) are reduced in f32 and rounded to f16
//   once on both backends: an average of finite f16 values is finite, a sum overflows only where
//   the exact sum leaves f16's range (the reductions of NCCL and gloo in f16 round every partial
//   sum; NCCL's f16 average premultiplies by f16(1/size): both overflowed where no value did).
//   reduce_scatter(output, input, op): input holds size() chunks of output.numel() elements,
//   rank r receives the reduction of every rank's chunk r. all_gather(output, input): output
//   holds size() chunks of input.numel() elements, chunk r is rank r's input. broadcast(t,
//   root): t becomes root's t. Shapes are free; only element counts matter. The small tensor may
//   be a view into the big one (ZeRO's shard of a flat buffer).
// - Work::wait() returns once the result can be used by the caller: Gloo blocks the calling
//   thread until the data is in place; NCCL makes the caller's current CUDA stream wait for the
//   communication stream (no host synchronisation) and returns. It fails with a Status that
//   names the op, the group, the rank and the cause when the collective failed or did not
//   complete within the timeout (a peer exited, hung or never joined). After a failure the
//   group is broken: every later collective fails with the first error.
#ifndef TAPEGRAD_DISTRIBUTED_PROCESS_GROUP_H_
#define TAPEGRAD_DISTRIBUTED_PROCESS_GROUP_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace tg::dist {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
// "sum", "avg", "max", "min".
const char* ReduceOpName(ReduceOp op);

class Work {
 public:
  virtual ~Work() = default;
  // Waits up to the group's timeout.
  absl::Status wait() { return wait(default_timeout_); }
  virtual absl::Status wait(absl::Duration timeout) = 0;
  // Whether the collective has finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;

 protected:
  explicit Work(absl::Duration default_timeout) : default_timeout_(default_timeout) {}

 private:
  absl::Duration default_timeout_;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's name in errors ("default", "zero", ...).
  const std::string& name() const { return name_; }
  // The timeout of every collective and of Work::wait().
  absl::Duration timeout() const { return timeout_; }
  // The device every tensor of this group's collectives must be on (cpu for Gloo, the rank's
  // cuda:N for NCCL).
  Device device() const { return device_; }
  // "gloo" or "nccl".
  virtual const char* backend() const = 0;

  virtual std::shared_ptr<Work> all_reduce(const RawTensor& tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> reduce_scatter(const RawTensor& output, const RawTensor& input,
                                               ReduceOp op) = 0;
  virtual std::shared_ptr<Work> all_gather(const RawTensor& output, const RawTensor& input) = 0;
  virtual std::shared_ptr<Work> broadcast(const RawTensor& tensor, int root) = 0;
  virtual std::shared_ptr<Work> barrier() = 0;

 protected:
  ProcessGroup(int rank, int size, std::string name, absl::Duration timeout, Device device)
      : rank_(rank), size_(size), name_(std::move(name)), timeout_(timeout), device_(device) {}

  // Argument checks shared by the backends (throw tg::Error naming `op` and the argument):
  // contiguous, on device(), a dtype the backend supports (f32, f64, f16, bf16, i32, i64).
  void CheckTensor(const char* op, const char* arg, const RawTensor& t) const;
  void CheckReduceOp(const char* op, const RawTensor& t, ReduceOp reduce) const;
  // `big` must hold size() chunks of small.numel() elements, same dtype.
  void CheckChunks(const char* op, const char* big_arg, const RawTensor& big, const char* small_arg,
                   const RawTensor& small) const;
  // "all_reduce on group 'default' (rank 1 of 4)" for error messages.
  std::string Describe(const char* op) const;

 private:
  int rank_;
  int size_;
  std::string name_;
  absl::Duration timeout_;
  Device device_;
};

// Throws tg::Error with the status message when `status` is not OK: for training loops, where a
// failed collective ends the step (inside backward it propagates out of backward()).
void ThrowIfError(const absl::Status& status);

}  // namespace tg::dist

#define TG_DIST_CHECK_OK(expr) ::tg::dist::ThrowIfError(expr)

#endif  // TAPEGRAD_DISTRIBUTED_PROCESS_GROUP_H_
