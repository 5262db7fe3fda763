#include "distributed/nccl_process_group.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device_backend.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace tg::dist {
namespace {

// The stream the caller's tensor ops enqueue on for `device`, asked of the CUDA device backend
// (tensor/device_backend.h) that runs those ops.
cudaStream_t CallerStream(int device) {
  return static_cast<cudaStream_t>(GetDeviceBackend(DeviceType::kCuda)->CurrentStream(device));
}

// The ops of a group, for the Describe() prefixes computed once per group (no string is built
// on the hot path).
enum Op { kInit, kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kNumOps };
constexpr const char* kOpNames[kNumOps] = {"init",       "all_reduce", "reduce_scatter",
                                           "all_gather", "broadcast",  "barrier"};

constexpr char kUniqueIdKey[] = "nccl_unique_id";

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:
      // CheckTensor rejected every other dtype before.
      throw Error(absl::StrCat("nccl: dtype ", DTypeName(dtype), " has no NCCL type"));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // sum, then divided by the rank count on the device (floating only)
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw Error("nccl: unknown ReduceOp");
}

std::string ToHex(const char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    const auto byte = static_cast<unsigned char>(data[i]);
    hex[2 * i] = kDigits[byte >> 4];
    hex[2 * i + 1] = kDigits[byte & 15];
  }
  return hex;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The ncclUniqueId of its hex form; InvalidArgument unless exactly 2 * NCCL_UNIQUE_ID_BYTES
// lowercase hex digits (the value comes from a peer through the store).
absl::StatusOr<ncclUniqueId> UniqueIdFromHex(const std::string& hex) {
  ncclUniqueId id;
  if (hex.size() != 2 * sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", 2 * sizeof(id.internal),
                                                   " hex digits under '", kUniqueIdKey,
                                                   "', found a value of ", hex.size(), " bytes"));
  }
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    const int hi = HexDigit(hex[2 * i]);
    const int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("expected hex digits under '", kUniqueIdKey,
                                                     "', found a non-hex character at ",
                                                     hi < 0 ? 2 * i : 2 * i + 1));
    }
    id.internal[i] = static_cast<char>(hi * 16 + lo);
  }
  return id;
}

absl::Status Annotate(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// Calls `done` until it returns true or `deadline` passes (it is called once more then). Yields
// first (most polls end within microseconds), then sleeps 50 us, then 1 ms between calls.
template <typename Fn>
bool PollUntil(absl::Time deadline, Fn&& done) {
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (absl::Now() >= deadline) return done();
    if (i < 64) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(i < 1000 ? absl::Microseconds(50) : absl::Milliseconds(1));
    }
  }
}

// Events without timing on one device, reused: a collective records one and its Work waits on
// it, so a training step would otherwise create and destroy one per bucket.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  // The caller holds a DeviceGuard of the pool's device (events are created on it).
  std::shared_ptr<cuda::Event> Get() {
    std::unique_ptr<cuda::Event> event;
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        event = std::move(free_.back());
        free_.pop_back();
      }
    }
    if (event == nullptr) event = std::make_unique<cuda::Event>();
    std::shared_ptr<EventPool> self = shared_from_this();
    return std::shared_ptr<cuda::Event>(event.release(), [self](cuda::Event* e) {
      absl::MutexLock lock(&self->mu_);
      self->free_.emplace_back(e);
    });
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<cuda::Event>> free_ ABSL_GUARDED_BY(mu_);
};

// A collective whose tensors the group holds until its end event has completed.
struct Held {
  std::shared_ptr<cuda::Event> end;
  absl::InlinedVector<RawTensor, 4> tensors;
  Op op;
  absl::Time issued;
};

}  // namespace

// ---- NCCL errors --------------------------------------------------------------------------

const char* NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclUnknownResult";
  }
}

absl::Status NcclCallStatus(ncclResult_t result, const char* call, const char* file, int line,
                            ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(file, ":", line, ": ", call, " failed: ", NcclResultName(result), ": ",
                   ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, " (last error: ", last, ")");
  const bool peer = result == ncclRemoteError || result == ncclSystemError;
  return absl::Status(peer ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal, message);
}

// ---- The shared state of a group and its Works ----------------------------------------------

// Owned by the group and by every Work it returned, so that a Work may outlive the group: the
// communicator, the communication stream and the held tensors go away with the last owner.
struct NcclProcessGroup::State {
  State(int device, absl::Duration timeout, bool blocking_wait)
      : device(device), timeout(timeout), blocking_wait(blocking_wait) {}
  ~State();

  const int device;
  const absl::Duration timeout;
  const bool blocking_wait;
  std::string what[kNumOps];  // Describe(op) of each op

  std::unique_ptr<cuda::Stream> stream;  // the communication stream
  std::unique_ptr<cuda::Event> ready;    // recorded on the caller's stream (under mu)
  std::shared_ptr<EventPool> events = std::make_shared<EventPool>();
  void* barrier_buffer = nullptr;  // [1] f32 zeros; used on `stream` only

  mutable absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;  // nullptr before init and once aborted
  absl::Status error ABSL_GUARDED_BY(mu);         // the first failure
  std::deque<Held> held ABSL_GUARDED_BY(mu);      // in issue order = completion order

  // The Status of an NCCL call on `comm`. ncclInProgress (non-blocking communicator: NCCL
  // finishes the call in the background) is polled with ncclCommGetAsyncError until it
  // resolves, or until `deadline` (DeadlineExceeded). Failures carry what[op].
  absl::Status ResolveLocked(ncclResult_t result, const char* call, const char* file, int line,
                             absl::Time deadline, Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The communicator's asynchronous error (a peer exited, a CUDA error in NCCL's kernels), as
  // a Status naming `op`; OK while there is none (or no communicator).
  absl::Status AsyncErrorLocked(Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records the first error and aborts the communicator (its kernels return, nothing more is
  // enqueued on it).
  void BreakLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops the tensors of collectives whose end event completed (never waits). Breaks the group
  // when the communicator reports an asynchronous error (named after the oldest unfinished
  // collective, else after `current`, the op at hand), or when the oldest unfinished
  // collective was issued more than `timeout` ago.
  void ReleaseLocked(Op current) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // DeadlineExceeded for `op`, not finished within `limit`.
  absl::Status Timeout(Op op, absl::Duration limit) const;
};

#define TG_NCCL_RESOLVE(state, call, deadline, op) \
  (state).ResolveLocked((call), #call, __FILE__, __LINE__, (deadline), (op))

absl::Status NcclProcessGroup::State::ResolveLocked(ncclResult_t result, const char* call,
                                                    const char* file, int line, absl::Time deadline,
                                                    Op op) {
  if (result == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    const bool resolved = PollUntil(deadline, [&] {
      const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
      if (query != ncclSuccess) state = query;
      return state != ncclInProgress;
    });
    if (!resolved) {
      return absl::DeadlineExceededError(absl::StrCat(
          what[op], ": ", call, " did not complete within ", absl::FormatDuration(timeout),
          " (a peer did not join, exited or hung); the communicator was aborted"));
    }
    result = state;
  }
  if (result == ncclSuccess) return absl::OkStatus();
  return Annotate(NcclCallStatus(result, call, file, line, comm), what[op] + ": ");
}

absl::Status NcclProcessGroup::State::AsyncErrorLocked(Op op) {
  if (comm == nullptr) return absl::OkStatus();
  ncclResult_t async = ncclSuccess;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &async);
  if (query != ncclSuccess) {
    return Annotate(
        NcclCallStatus(query, "ncclCommGetAsyncError(comm, &async)", __FILE__, __LINE__, comm),
        what[op] + ": ");
  }
  if (async == ncclSuccess || async == ncclInProgress) return absl::OkStatus();
  return Annotate(
      NcclCallStatus(async, "the communicator (asynchronous error)", __FILE__, __LINE__, comm),
      what[op] + ": ");
}

void NcclProcessGroup::State::BreakLocked(const absl::Status& status) {
  if (error.ok()) error = status;
  if (comm != nullptr) {
    // Frees the communicator whatever its state; its kernels on `stream` return, so the end
    // events of the collectives it had complete (their Works report `error`, see NcclWork).
    ncclCommAbort(comm);
    comm = nullptr;
  }
}

absl::Status NcclProcessGroup::State::Timeout(Op op, absl::Duration limit) const {
  return absl::DeadlineExceededError(absl::StrCat(
      what[op], ": did not complete within ", absl::FormatDuration(limit),
      " (a peer exited, hung or did not issue the same collective); the NCCL communicator was "
      "aborted"));
}

void NcclProcessGroup::State::ReleaseLocked(Op current) {
  while (!held.empty() && held.front().end->Query()) held.pop_front();
  if (!error.ok()) return;
  absl::Status async = AsyncErrorLocked(held.empty() ? current : held.front().op);
  if (!async.ok()) {
    BreakLocked(async);
    return;
  }
  if (!held.empty() && absl::Now() - held.front().issued > timeout) {
    BreakLocked(Timeout(held.front().op, timeout));
  }
}

NcclProcessGroup::State::~State() {
  // A destructor must not throw: CUDA errors here are dropped (the process is past using the
  // group), NCCL errors end in an abort.
  try {
    cuda::DeviceGuard guard(device);
    {
      absl::MutexLock lock(&mu);
      if (comm != nullptr) {
        // Finalize flushes the issued collectives; it may need the peers, so it is bounded by
        // the timeout and aborted after.
        const absl::Status finalized =
            TG_NCCL_RESOLVE(*this, ncclCommFinalize(comm), absl::Now() + timeout, kInit);
        if (finalized.ok()) {
          ncclCommDestroy(comm);
          comm = nullptr;
        } else {
          BreakLocked(finalized);
        }
      }
    }
    // The communicator is gone, so nothing on the stream waits for a peer any more: what is
    // left finishes, and then the held tensors and the barrier buffer may be reused.
    if (stream != nullptr) cudaStreamSynchronize(stream->get());
    absl::MutexLock lock(&mu);
    held.clear();
    if (barrier_buffer != nullptr) cuda::DeviceAllocator(device)->Deallocate(barrier_buffer, 4);
  } catch (const std::exception&) {
  }
}

// ---- Work ---------------------------------------------------------------------------------

namespace {

class NcclWork final : public Work {
 public:
  // A queued collective: `end` is recorded on the communication stream after it.
  NcclWork(std::shared_ptr<NcclProcessGroup::State> state, Op op, std::shared_ptr<cuda::Event> end,
           bool host_wait)
      : Work(state->timeout),
        state_(std::move(state)),
        op_(op),
        end_(std::move(end)),
        host_wait_(host_wait) {}
  // A collective that never reached the device: failed (`status` not OK) or empty.
  NcclWork(absl::Duration timeout, absl::Status status)
      : Work(timeout), op_(kAllReduce), status_(std::move(status)) {}

  absl::Status wait(absl::Duration timeout) override {
    if (state_ == nullptr) return status_;
    NcclProcessGroup::State& s = *state_;
    cuda::DeviceGuard guard(s.device);
    if (host_wait_) {
      const absl::Time start = absl::Now();
      bool failed = false;
      const bool done = PollUntil(start + timeout, [&] {
        if (end_->Query()) return true;
        absl::MutexLock lock(&s.mu);
        if (!s.error.ok()) return failed = true;
        const absl::Status async = s.AsyncErrorLocked(op_);
        if (!async.ok()) {
          s.BreakLocked(async);
          return failed = true;
        }
        return false;
      });
      if (!done && !failed) {
        absl::MutexLock lock(&s.mu);
        s.BreakLocked(s.Timeout(op_, timeout));
        return s.error;
      }
    }
    // Query before looking at the error: an event that completed before the group broke
    // belongs to a collective that succeeded; one that completes after may have been aborted.
    const bool completed = seen_complete_ || end_->Query();
    absl::MutexLock lock(&s.mu);
    s.ReleaseLocked(op_);  // asynchronous errors, overdue collectives, finished tensors
    if (!seen_complete_) {
      if (!s.error.ok()) return s.error;
      seen_complete_ = completed;
    }
    // The caller's stream waits for the collective (a no-op on the device once it completed).
    end_->Block(CallerStream(s.device));
    return absl::OkStatus();
  }

  bool is_completed() override {
    if (state_ == nullptr || seen_complete_) return true;
    NcclProcessGroup::State& s = *state_;
    const bool completed = end_->Query();
    absl::MutexLock lock(&s.mu);
    s.ReleaseLocked(op_);
    if (!s.error.ok()) return true;
    seen_complete_ = completed;
    return completed;
  }

 private:
  const std::shared_ptr<NcclProcessGroup::State> state_;
  const Op op_;
  const std::shared_ptr<cuda::Event> end_;
  const bool host_wait_ = false;
  const absl::Status status_;
  // Set once the end event was seen complete while the group was healthy: later waits succeed
  // even after the group broke.
  std::atomic<bool> seen_complete_{false};
};

}  // namespace

// ---- The group ----------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<ProcessGroup>> NewNcclProcessGroup(
    int rank, int size, const std::string& name, absl::Duration timeout,
    std::shared_ptr<Store> group_store, Device device, const NcclOptions& options) {
  const std::string who = absl::StrCat("NewNcclProcessGroup('", name, "', rank ", rank, " of ",
                                       size, ", ", device.ToString(), "): ");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "rank must be in [0, size) and size at least 1"));
  }
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(who, "NCCL needs a CUDA device"));
  }
  if (group_store == nullptr) return absl::InvalidArgumentError(who + "no store");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "the timeout must be positive, got ", absl::FormatDuration(timeout)));
  }
  const int count = cuda::DeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        who + "no CUDA device is available (DeviceCount() = 0: no CUDA driver or no GPU)");
  }
  if (device.index < 0 || device.index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "CUDA device ", device.index, " does not exist (DeviceCount() = ", count, ")"));
  }
  std::shared_ptr<NcclProcessGroup> group(
      new NcclProcessGroup(rank, size, name, timeout, device, options));
  absl::Status init = group->Init(*group_store);
  if (!init.ok()) return init;
  return std::shared_ptr<ProcessGroup>(std::move(group));
}

NcclProcessGroup::NcclProcessGroup(int rank, int size, std::string name, absl::Duration timeout,
                                   Device device, const NcclOptions& options)
    : ProcessGroup(rank, size, std::move(name), timeout, device),
      state_(std::make_shared<State>(device.index, timeout, options.blocking_wait)) {
  for (int op = 0; op < kNumOps; ++op) state_->what[op] = Describe(kOpNames[op]);
}

NcclProcessGroup::~NcclProcessGroup() = default;

absl::Status NcclProcessGroup::Init(Store& store) {
  State& s = *state_;
  const std::string& what = s.what[kInit];
  const absl::Time deadline = absl::Now() + timeout();

  ncclUniqueId id;
  if (rank() == 0) {
    absl::Status created = TG_NCCL_STATUS(ncclGetUniqueId(&id), nullptr);
    if (!created.ok()) return Annotate(created, what + ": ");
    absl::Status set = store.Set(kUniqueIdKey, ToHex(id.internal, sizeof(id.internal)));
    if (!set.ok()) return Annotate(set, what + ": publishing the ncclUniqueId: ");
  } else {
    absl::StatusOr<std::string> hex = store.Get(kUniqueIdKey, timeout());
    if (!hex.ok()) return Annotate(hex.status(), what + ": waiting for rank 0's ncclUniqueId: ");
    absl::StatusOr<ncclUniqueId> parsed = UniqueIdFromHex(*hex);
    if (!parsed.ok()) return Annotate(parsed.status(), what + ": ");
    id = *parsed;
  }

  cuda::DeviceGuard guard(s.device);
  s.stream = std::make_unique<cuda::Stream>();
  s.ready = std::make_unique<cuda::Event>();
  s.barrier_buffer = cuda::DeviceAllocator(s.device)->Allocate(4);
  TG_CUDA_CHECK(cudaMemsetAsync(s.barrier_buffer, 0, 4, s.stream->get()));

  // Non-blocking, so that init (which waits for every rank) and the first collectives (which
  // connect to the peers) can be bounded by the timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  absl::MutexLock lock(&s.mu);
  ncclComm_t comm = nullptr;
  const int init_line = __LINE__ + 1;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size(), id, rank(), &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    // Failed before a communicator existed (bad arguments, no usable device): nothing to abort.
    s.error =
        Annotate(NcclCallStatus(started, "ncclCommInitRankConfig(&comm, size, id, rank, &config)",
                                __FILE__, init_line, comm),
                 what + ": ");
    return s.error;
  }
  s.comm = comm;
  absl::Status done =
      s.ResolveLocked(started, "ncclCommInitRankConfig(&comm, size, id, rank, &config)", __FILE__,
                      init_line, deadline, kInit);
  if (!done.ok()) {
    s.BreakLocked(done);
    return done;
  }
  return absl::OkStatus();
}

cudaStream_t NcclProcessGroup::stream() const { return state_->stream->get(); }

int64_t NcclProcessGroup::held_collectives() const {
  absl::MutexLock lock(&state_->mu);
  return static_cast<int64_t>(state_->held.size());
}

absl::Status NcclProcessGroup::error() const {
  absl::MutexLock lock(&state_->mu);
  return state_->error;
}

namespace {

// Kernels that a collective runs on the communication stream around its NCCL call (the f32
// staging of f16 averages): `before` after the stream waited for the caller's, `after` once
// NCCL has enqueued its kernels. Their tensors must be among the collective's held tensors.
struct Staging {
  std::function<void()> before;
  std::function<void()> after;
};

// Issues one collective on the group's communication stream: orders it after the caller's
// current stream, enqueues `call(comm, stream)` (an ncclResult_t), records the end event and
// holds `tensors` until it has completed.
template <typename Call>
std::shared_ptr<Work> Launch(const std::shared_ptr<NcclProcessGroup::State>& state, Op op,
                             absl::InlinedVector<RawTensor, 4> tensors, int64_t count,
                             const char* call_text, int line, Call&& call,
                             const Staging& staging = {}) {
  NcclProcessGroup::State& s = *state;
  cuda::DeviceGuard guard(s.device);
  absl::MutexLock lock(&s.mu);
  s.ReleaseLocked(op);
  if (!s.error.ok()) return std::make_shared<NcclWork>(s.timeout, s.error);
  if (count == 0) return std::make_shared<NcclWork>(s.timeout, absl::OkStatus());

  const cudaStream_t comm_stream = s.stream->get();
  s.ready->Record(CallerStream(s.device));  // the inputs as the caller's stream leaves them
  s.ready->Block(comm_stream);
  if (staging.before) {
    cuda::StreamGuard on_comm(*s.stream);  // tensor ops enqueue on the communication stream
    staging.before();
  }
  const absl::Time issued = absl::Now();
  const absl::Status enqueued =
      s.ResolveLocked(call(s.comm, comm_stream), call_text, __FILE__, line, issued + s.timeout, op);
  if (!enqueued.ok()) {
    s.BreakLocked(enqueued);
    // An enqueue that NCCL left in progress until the deadline may have put kernels on the
    // stream before the abort: hold the tensors until the stream has passed them, as for a
    // queued collective (nothing waits on the host; the destructor synchronises the stream).
    std::shared_ptr<cuda::Event> end = s.events->Get();
    end->Record(comm_stream);
    s.held.push_back(Held{std::move(end), std::move(tensors), op, issued});
    return std::make_shared<NcclWork>(s.timeout, s.error);
  }
  std::shared_ptr<cuda::Event> end = s.events->Get();
  if (staging.after) {
    // After the enqueue resolved: a non-blocking communicator may put NCCL's kernels on the
    // stream only then. Should a kernel launch throw, NCCL's kernels still hold the tensors.
    cuda::StreamGuard on_comm(*s.stream);
    try {
      staging.after();
    } catch (...) {
      end->Record(comm_stream);
      s.held.push_back(Held{std::move(end), std::move(tensors), op, issued});
      throw;
    }
  }
  end->Record(comm_stream);
  s.held.push_back(Held{end, std::move(tensors), op, issued});
  return std::make_shared<NcclWork>(state, op, std::move(end), s.blocking_wait || op == kBarrier);
}

// f16 sums and averages (all_reduce and reduce_scatter with kSum or kAvg) go through f32: the
// f16 values are widened into an f32 buffer on the communication stream, NCCL sums them in f32
// (ncclSum), and the sum (kAvg: scaled by f32(1/size) in f32) is rounded to f16 once. NCCL's own
// ncclAvg on f16 multiplies every value by __float2half(1/size) in f16 and sums in f16, rounding
// every partial sum, and that overflows where no rank's value does: 10 ranks of 65504 give 6548
// each, and the ring's partial sums round up to 65524 -> inf (of the world sizes 2..1024, 438
// overflow so in the ring's order; f16(1/size) itself exceeds 1/size for 17, 19, 23, ...
// ranks), so f16 DDP and ZeRO would skip steps that one process does not, and values up to
// size * 2^-25 vanish; an f16 ncclSum overflows in a partial sum where the whole sum does not
// (60000 + 60000 - 60000). Here |sum| <= size * 65504, which f32 holds exactly (size <= 8192;
// f32 additions in any order are monotone), so |sum * f32(1/size)| <= 65504 (1 + 2^-24) rounds
// to at most 65504 in f16: an average is non-finite exactly where some rank's value is, a sum
// where the exact sum leaves f16's range. The cost: twice the bytes on the wire for f16 sums and
// averages, an f32 buffer of the tensor (of the input and the output for reduce_scatter) and two
// or three elementwise kernels on the communication stream. bf16 (the range of f32) and the
// other dtypes keep NCCL's reductions.
bool ReduceThroughF32(DType dtype, ReduceOp op) {
  return dtype == kF16 && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

}  // namespace

std::shared_ptr<Work> NcclProcessGroup::all_reduce(const RawTensor& tensor, ReduceOp op) {
  CheckTensor("all_reduce", "tensor", tensor);
  CheckReduceOp("all_reduce", tensor, op);
  if (ReduceThroughF32(tensor.dtype(), op)) {
    const RawTensor wide = RawTensor::Empty(tensor.shape(), kF32, device());
    void* data = wide.raw_data();
    const size_t count = static_cast<size_t>(tensor.numel());
    const double inv_size = 1.0 / size();
    Staging staging;
    staging.before = [&] { wide.copy_(tensor); };
    staging.after = [&] {
      if (op == ReduceOp::kAvg) MulScalarInPlace({wide}, inv_size);
      tensor.copy_(wide);
    };
    return Launch(
        state_, kAllReduce, {tensor, wide}, tensor.numel(),
        "ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream)", __LINE__ + 1,
        [&](ncclComm_t comm, cudaStream_t stream) {
          return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, stream);
        },
        staging);
  }
  void* data = tensor.raw_data();
  const size_t count = static_cast<size_t>(tensor.numel());
  const ncclDataType_t type = NcclType(tensor.dtype());
  const ncclRedOp_t reduce = NcclOp(op);
  return Launch(state_, kAllReduce, {tensor}, tensor.numel(),
                "ncclAllReduce(data, data, count, type, reduce, comm, stream)", __LINE__ + 1,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllReduce(data, data, count, type, reduce, comm, stream);
                });
}

std::shared_ptr<Work> NcclProcessGroup::reduce_scatter(const RawTensor& output,
                                                       const RawTensor& input, ReduceOp op) {
  CheckTensor("reduce_scatter", "output", output);
  CheckTensor("reduce_scatter", "input", input);
  CheckChunks("reduce_scatter", "input", input, "output", output);
  CheckReduceOp("reduce_scatter", input, op);
  if (ReduceThroughF32(input.dtype(), op)) {
    const RawTensor wide_in = RawTensor::Empty(input.shape(), kF32, device());
    const RawTensor wide_out = RawTensor::Empty(output.shape(), kF32, device());
    const void* send = wide_in.raw_data();
    void* recv = wide_out.raw_data();
    const size_t count = static_cast<size_t>(output.numel());
    const double inv_size = 1.0 / size();
    Staging staging;
    staging.before = [&] { wide_in.copy_(input); };
    staging.after = [&] {
      if (op == ReduceOp::kAvg) MulScalarInPlace({wide_out}, inv_size);
      output.copy_(wide_out);
    };
    return Launch(
        state_, kReduceScatter, {output, input, wide_in, wide_out}, output.numel(),
        "ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm, stream)", __LINE__ + 1,
        [&](ncclComm_t comm, cudaStream_t stream) {
          return ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm, stream);
        },
        staging);
  }
  const void* send = input.raw_data();
  void* recv = output.raw_data();
  const size_t count = static_cast<size_t>(output.numel());
  const ncclDataType_t type = NcclType(input.dtype());
  const ncclRedOp_t reduce = NcclOp(op);
  return Launch(state_, kReduceScatter, {output, input}, output.numel(),
                "ncclReduceScatter(send, recv, count, type, reduce, comm, stream)", __LINE__ + 1,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclReduceScatter(send, recv, count, type, reduce, comm, stream);
                });
}

std::shared_ptr<Work> NcclProcessGroup::all_gather(const RawTensor& output,
                                                   const RawTensor& input) {
  CheckTensor("all_gather", "output", output);
  CheckTensor("all_gather", "input", input);
  CheckChunks("all_gather", "output", output, "input", input);
  const void* send = input.raw_data();
  void* recv = output.raw_data();
  const size_t count = static_cast<size_t>(input.numel());
  const ncclDataType_t type = NcclType(input.dtype());
  return Launch(state_, kAllGather, {output, input}, input.numel(),
                "ncclAllGather(send, recv, count, type, comm, stream)", __LINE__ + 1,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllGather(send, recv, count, type, comm, stream);
                });
}

std::shared_ptr<Work> NcclProcessGroup::broadcast(const RawTensor& tensor, int root) {
  CheckTensor("broadcast", "tensor", tensor);
  TG_CHECK(root >= 0 && root < size(), Describe("broadcast"), ": root ", root,
           " is not a rank of the group (size ", size(), ")");
  void* data = tensor.raw_data();
  const size_t count = static_cast<size_t>(tensor.numel());
  const ncclDataType_t type = NcclType(tensor.dtype());
  return Launch(state_, kBroadcast, {tensor}, tensor.numel(),
                "ncclBroadcast(data, data, count, type, root, comm, stream)", __LINE__ + 1,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclBroadcast(data, data, count, type, root, comm, stream);
                });
}

std::shared_ptr<Work> NcclProcessGroup::barrier() {
  void* data = state_->barrier_buffer;
  return Launch(state_, kBarrier, {}, 1,
                "ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream)", __LINE__ + 1,
                [&](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream);
                });
}

}  // namespace tg::dist
