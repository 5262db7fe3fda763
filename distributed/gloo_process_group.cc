#include "distributed/gloo_process_group.h"

#include <net/if.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "tensor/error.h"
#include "tensor/half.h"

namespace tg::dist {
namespace {

// ---- Element-wise reductions on raw buffers (gloo's reduce function signature) ----

template <class T>
T MaxOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}
template <class T>
T MinOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}

// f32 <-> the 2-byte formats.
struct F16 {
  static float Load(uint16_t b) { return HalfBitsToFloat(b); }
  static uint16_t Store(float f) { return FloatToHalfBits(f); }
};
struct BF16 {
  static float Load(uint16_t b) { return BFloat16BitsToFloat(b); }
  static uint16_t Store(float f) { return FloatToBFloat16Bits(f); }
};

template <class T>
T Combine(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kMax:
      return MaxOf(a, b);
    case ReduceOp::kMin:
      return MinOf(a, b);
    default:
      return static_cast<T>(a + b);  // kSum, and kAvg before its division
  }
}

template <class T, ReduceOp kOp>
void ReduceNative(void* c, const void* a, const void* b, size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = Combine<T>(kOp, x[i], y[i]);
}

template <class Fmt, ReduceOp kOp>
void Reduce16(void* c, const void* a, const void* b, size_t n) {
  uint16_t* out = static_cast<uint16_t*>(c);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = Fmt::Store(Combine<float>(kOp, Fmt::Load(x[i]), Fmt::Load(y[i])));
  }
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <class T>
ReduceFn NativeReduce(ReduceOp op) {
  if (op == ReduceOp::kMax) return &ReduceNative<T, ReduceOp::kMax>;
  if (op == ReduceOp::kMin) return &ReduceNative<T, ReduceOp::kMin>;
  return &ReduceNative<T, ReduceOp::kSum>;
}

template <class Fmt>
ReduceFn HalfReduce(ReduceOp op) {
  if (op == ReduceOp::kMax) return &Reduce16<Fmt, ReduceOp::kMax>;
  if (op == ReduceOp::kMin) return &Reduce16<Fmt, ReduceOp::kMin>;
  return &Reduce16<Fmt, ReduceOp::kSum>;
}

ReduceFn ReduceFor(DType dtype, ReduceOp op) {
  switch (dtype) {
    case kF32:
      return NativeReduce<float>(op);
    case kF64:
      return NativeReduce<double>(op);
    case kI32:
      return NativeReduce<int32_t>(op);
    case kI64:
      return NativeReduce<int64_t>(op);
    case kF16:
      return HalfReduce<F16>(op);
    case kBF16:
      return HalfReduce<BF16>(op);
    default:
      throw Error(absl::StrCat("gloo: no reduction for dtype ", DTypeName(dtype)));
  }
}

// data[i] /= divisor, element-wise in the dtype (f16/bf16 through f32, one rounding).
void DivideInPlace(DType dtype, void* data, size_t n, int divisor) {
  switch (dtype) {
    case kF32: {
      float* p = static_cast<float*>(data);
      for (size_t i = 0; i < n; ++i) p[i] /= static_cast<float>(divisor);
      break;
    }
    case kF64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    case kF16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = F16::Store(F16::Load(p[i]) / divisor);
      break;
    }
    case kBF16: {
      uint16_t* p = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < n; ++i) p[i] = BF16::Store(BF16::Load(p[i]) / divisor);
      break;
    }
    default:
      throw Error("gloo: avg needs a floating dtype");
  }
}

// out[k] = reduce over r of chunks[r * n + k], in rank order; f16/bf16 accumulate in f32 and
// round once. kAvg divides the sum by `ranks`.
template <class T>
void ReduceChunksNative(ReduceOp op, const T* chunks, T* out, size_t n, int ranks) {
  for (size_t k = 0; k < n; ++k) {
    T acc = chunks[k];
    for (int r = 1; r < ranks; ++r) acc = Combine<T>(op, acc, chunks[r * n + k]);
    if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(ranks));
    out[k] = acc;
  }
}

template <class Fmt>
void ReduceChunks16(ReduceOp op, const uint16_t* chunks, uint16_t* out, size_t n, int ranks) {
  for (size_t k = 0; k < n; ++k) {
    float acc = Fmt::Load(chunks[k]);
    for (int r = 1; r < ranks; ++r) acc = Combine<float>(op, acc, Fmt::Load(chunks[r * n + k]));
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(ranks);
    out[k] = Fmt::Store(acc);
  }
}

void ReduceChunks(DType dtype, ReduceOp op, const void* chunks, void* out, size_t n, int ranks) {
  switch (dtype) {
    case kF32:
      return ReduceChunksNative(op, static_cast<const float*>(chunks), static_cast<float*>(out), n,
                                ranks);
    case kF64:
      return ReduceChunksNative(op, static_cast<const double*>(chunks), static_cast<double*>(out),
                                n, ranks);
    case kI32:
      return ReduceChunksNative(op, static_cast<const int32_t*>(chunks), static_cast<int32_t*>(out),
                                n, ranks);
    case kI64:
      return ReduceChunksNative(op, static_cast<const int64_t*>(chunks), static_cast<int64_t*>(out),
                                n, ranks);
    case kF16:
      return ReduceChunks16<F16>(op, static_cast<const uint16_t*>(chunks),
                                 static_cast<uint16_t*>(out), n, ranks);
    case kBF16:
      return ReduceChunks16<BF16>(op, static_cast<const uint16_t*>(chunks),
                                  static_cast<uint16_t*>(out), n, ranks);
    default:
      throw Error(absl::StrCat("gloo: no reduction for dtype ", DTypeName(dtype)));
  }
}

// all_reduce of f16 with kSum or kAvg on `world` > 1 ranks, in place: an alltoall gives this rank
// every rank's chunk of the (zero-padded) tensor, ReduceChunks sums them in f32 in rank order
// (kAvg: divides by `world`) and rounds once, and an allgather returns the reduced chunks.
// gloo's allreduce rounds every partial sum to f16 instead, so it overflowed where the average
// does not (2 ranks of 40000: 80000 -> inf, halved after) or where the sum does not (60000 +
// 60000 - 60000 in the ring's order), and rounded up to `world` times. Here the f32 sum of up
// to 8192 f16 values is at most world * 65504 in magnitude (f32 holds it exactly and its
// additions are monotone), so |average| <= max |value| <= 65504: an average is non-finite
// exactly where some rank's value is, a sum only where it exceeds f16's range. The traffic is
// gloo's ring allreduce's ((world - 1) / world of the tensor out and in, twice), f16 on the
// wire; the cost is two staging copies of the tensor on the host.
void AllReduceF16InF32(const std::shared_ptr<gloo::rendezvous::Context>& context,
                       std::chrono::milliseconds timeout, uint32_t tag, ReduceOp op, uint16_t* data,
                       size_t n, int world) {
  const size_t chunk = (n + world - 1) / world;
  std::vector<uint16_t> staged(chunk * world, 0);  // [world, chunk]: this rank's tensor, padded
  std::memcpy(staged.data(), data, n * sizeof(uint16_t));
  std::vector<uint16_t> chunks(chunk * world);  // [world, chunk]: rank r's part of our chunk
  gloo::AlltoallOptions to_all(context);
  to_all.setTimeout(timeout);
  to_all.setTag(tag);  // gloo's slots differ per collective kind (kAlltoallSlotPrefix)
  to_all.setInput(staged.data(), staged.size());
  to_all.setOutput(chunks.data(), chunks.size());
  gloo::alltoall(to_all);
  std::vector<uint16_t> mine(chunk);
  ReduceChunks16<F16>(op, chunks.data(), mine.data(), chunk, world);
  gloo::AllgatherOptions gather(context);
  gather.setTimeout(timeout);
  gather.setTag(tag);
  gather.setInput(mine.data(), chunk);
  gather.setOutput(staged.data(), staged.size());
  gloo::allgather(gather);
  std::memcpy(data, staged.data(), n * sizeof(uint16_t));
}

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// gloo's tag (a 32-bit part of every message's slot) for collective `seq` with this signature:
// FNV-1a of both, the same in every process. Ranks that issue different collectives (op, size,
// dtype, reduction, root) or fall out of step use different slots, so their messages never meet:
// gloo's TCP transport aborts the process when a message is larger than the buffer posted for it,
// and a smaller one would complete with wrong data. They time out instead, and the failure names
// the difference (Impl::Compare). Two different collectives share a tag with probability 2^-32.
uint32_t Tag(int64_t seq, const std::string& signature) {
  uint32_t h = 2166136261u;
  for (char c : absl::StrCat(seq, " ", signature)) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

// One queued collective's completion.
class GlooWork final : public Work {
 public:
  // `on_timeout` gets the error of a wait that gave up; it breaks the group and returns the
  // error to report (the comparison of the collective with the other ranks' when they differ).
  GlooWork(absl::Duration timeout, std::string what,
           std::function<absl::Status(const absl::Status&)> on_timeout)
      : Work(timeout), what_(std::move(what)), on_timeout_(std::move(on_timeout)) {}

  absl::Status wait(absl::Duration timeout) override {
    absl::Status timed_out;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) return status_;
      timed_out = absl::DeadlineExceededError(
          absl::StrCat(what_, " did not complete within ", absl::FormatDuration(timeout),
                       " (a peer process exited, hung or fell behind)"));
    }
    return on_timeout_(timed_out);
  }
  bool is_completed() override {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  void Complete(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  }
  const std::string& what() const { return what_; }

 private:
  const std::string what_;
  const std::function<absl::Status(const absl::Status&)> on_timeout_;
  absl::Mutex mu_;
  bool done_ = false;
  absl::Status status_;
};

// Serialises the failure comparisons of every group: they use the store from the worker threads
// and the threads that wait, and gloo's stores are not thread-safe (groups may share one).
absl::Mutex compare_mu(absl::kConstInit);

}  // namespace

struct GlooProcessGroup::Impl : std::enable_shared_from_this<GlooProcessGroup::Impl> {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds timeout;

  absl::Mutex mu;
  struct Job {
    std::shared_ptr<GlooWork> work;
    int64_t seq = 0;        // the group's collective number, in call order (as on every rank)
    std::string signature;  // "all_reduce of 10 f32 elements (sum)": compared across ranks
    uint32_t tag = 0;
    std::function<void(uint32_t tag)> run;
  };
  std::deque<Job> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  int64_t next_seq ABSL_GUARDED_BY(mu) = 0;
  absl::Status broken ABSL_GUARDED_BY(mu);      // the first failure; OK while healthy
  int64_t broken_seq ABSL_GUARDED_BY(mu) = -1;  // the collective that failed first
  std::map<int64_t, absl::Status> compared ABSL_GUARDED_BY(compare_mu);  // Compare's results
  std::thread worker;

  void Loop() {
    for (;;) {
      Job job;
      absl::Status broken_now;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Impl* self)
                 ABSL_NO_THREAD_SAFETY_ANALYSIS { return self->stop || !self->queue.empty(); },
            this));
        if (queue.empty()) return;  // stop requested and nothing left
        job = std::move(queue.front());
        queue.pop_front();
        broken_now = broken;
      }
      if (!broken_now.ok()) {
        job.work->Complete(
            absl::Status(broken_now.code(), absl::StrCat(job.work->what(),
                                                         " failed: the group is broken by an "
                                                         "earlier failure: ",
                                                         broken_now.message())));
        continue;
      }
      std::string error;
      try {
        job.run(job.tag);
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "an exception of unknown type";
      }
      absl::Status status;
      if (!error.empty()) {
        // Mismatched collectives meet nobody and time out; a peer that died fails at once, and
        // then the comparison only reads what is already there (dead ranks publish nothing), so
        // a dead rank still stops the others within a fraction of a second.
        const bool timed_out = absl::StrContains(error, "Timed out");
        status =
            Fail(job.seq, job.work->what(), job.signature,
                 absl::UnavailableError(absl::StrCat(job.work->what(), " failed: ", error,
                                                     " (a peer process exited or is unreachable)")),
                 timed_out);
      }
      job.work->Complete(std::move(status));
    }
  }

  // Collective `seq` failed on this rank with `failure` (or its wait timed out): when the ranks
  // issued different collectives, that is the error; it breaks the group and is returned.
  absl::Status Fail(int64_t seq, const std::string& what, const std::string& signature,
                    const absl::Status& failure, bool timed_out) {
    absl::Status mismatch = Compare(seq, what, signature, timed_out);
    const absl::Status status = mismatch.ok() ? failure : mismatch;
    absl::MutexLock lock(&mu);
    // The comparison explains the group's first failure better than a timeout that broke it.
    if (broken.ok() || (!mismatch.ok() && broken_seq == seq)) {
      broken = status;
      broken_seq = seq;
    }
    return status;
  }

  // After collective `seq` failed or timed out on this rank: publishes its signature under
  // "collective/<seq>/rank/<rank>" and reads the other ranks' (those that fail too publish
  // theirs; a rank that does not within min(timeout / 2, 5s) after a timeout, or at once after
  // another failure, is left out). InvalidArgument naming every rank whose collective differs, OK
  // when none does.
  absl::Status Compare(int64_t seq, const std::string& what, const std::string& signature,
                       bool wait_for_peers) {
    if (size == 1) return absl::OkStatus();
    absl::MutexLock lock(&compare_mu);
    auto done = compared.find(seq);
    if (done != compared.end()) return done->second;
    const std::string prefix = absl::StrCat("collective/", seq, "/rank/");
    (void)store->Set(absl::StrCat(prefix, rank), signature);
    const absl::Time deadline =
        absl::Now() + (wait_for_peers ? std::min(absl::FromChrono(timeout) / 2, absl::Seconds(5))
                                      : absl::ZeroDuration());
    std::vector<bool> read(size, false);
    read[rank] = true;
    int left = size - 1;
    std::map<std::string, std::vector<int>> differing;  // signature -> ranks
    try {
      for (;;) {
        for (int r = 0; r < size; ++r) {
          const std::string key = absl::StrCat(prefix, r);
          if (read[r] || !store->Missing({key}).empty()) continue;
          read[r] = true;
          --left;
          absl::StatusOr<std::string> theirs = store->Get(key, absl::ZeroDuration());
          if (theirs.ok() && *theirs != signature) differing[theirs->substr(0, 200)].push_back(r);
        }
        if (left == 0 || absl::Now() >= deadline) break;
        absl::SleepFor(absl::Milliseconds(10));
      }
    } catch (const std::exception&) {
      // The store failed (Missing throws gloo's errors): compare with the ranks read so far.
    }
    absl::Status result;
    if (!differing.empty()) {
      std::vector<std::string> issued;
      for (auto& [theirs, ranks] : differing) {
        std::sort(ranks.begin(), ranks.end());  // read in arrival order
        issued.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                                      absl::StrJoin(ranks, ", "), " issued ", theirs));
      }
      result = absl::InvalidArgumentError(absl::StrCat(
          what, " failed: the ranks issued different collectives as the group's collective #",
          seq + 1, ": ", absl::StrJoin(issued, "; "),
          " (every rank must issue the same collectives in the same order with the same "
          "arguments)"));
    }
    compared.emplace(seq, result);
    return result;
  }

  // `op` and `detail` make the Work's description and the signature that the ranks compare.
  std::shared_ptr<Work> Enqueue(const std::string& described_op, const char* op,
                                const std::string& detail, absl::Duration timeout,
                                std::function<void(uint32_t tag)> run) {
    std::weak_ptr<Impl> self = weak_from_this();
    std::string what = absl::StrCat(described_op, detail.empty() ? "" : " ", detail);
    std::string signature = absl::StrCat(op, detail.empty() ? "" : " ", detail);
    absl::MutexLock lock(&mu);
    const int64_t seq = next_seq++;
    auto work = std::make_shared<GlooWork>(
        timeout, what, [self, seq, what, signature](const absl::Status& timed_out) {
          auto impl = self.lock();
          return impl == nullptr ? timed_out
                                 : impl->Fail(seq, what, signature, timed_out, /*timed_out=*/true);
        });
    const uint32_t tag = Tag(seq, signature);
    queue.push_back(Job{work, seq, std::move(signature), tag, std::move(run)});
    return work;
  }
};

GlooProcessGroup::GlooProcessGroup(int rank, int size, std::string name, absl::Duration timeout)
    : ProcessGroup(rank, size, std::move(name), timeout, Device::Cpu()),
      impl_(std::make_shared<Impl>()) {}

GlooProcessGroup::~GlooProcessGroup() {
  if (impl_->worker.joinable()) {
    {
      absl::MutexLock lock(&impl_->mu);
      impl_->stop = true;
    }
    impl_->worker.join();
  }
}

absl::Status GlooProcessGroup::CheckInterface(int rank, const std::string& name,
                                              const GlooOptions& options) {
  // gloo looks the interface up itself, but leaks getifaddrs' list when it is missing.
  if (options.iface.empty() || if_nametoindex(options.iface.c_str()) != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "gloo group '", name, "': rank ", rank, " has no network interface '", options.iface,
      "' (GLOO_SOCKET_IFNAME or DistOptions::gloo_iface; see `ip link`)"));
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooProcessGroup::Create(
    int rank, int size, const std::string& name, absl::Duration timeout,
    std::shared_ptr<Store> group_store, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo group '", name, "': rank ", rank,
                                                   " is out of range for world size ", size));
  }
  if (absl::Status iface = CheckInterface(rank, name, options); !iface.ok()) return iface;
  // Announce, then wait for everyone: a missing rank is named here, before gloo's own
  // rendezvous (whose store waits use a fixed timeout and name only keys).
  absl::Status set = group_store->Set(absl::StrCat("rank/", rank), "joined");
  if (!set.ok()) return set;
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("rank/", r));
  absl::Status joined = group_store->Wait(keys, timeout);
  if (!joined.ok()) {
    if (joined.code() != absl::StatusCode::kDeadlineExceeded) return joined;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!group_store->Missing({absl::StrCat("rank/", r)}).empty()) missing.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous of group '", name, "' timed out after ", absl::FormatDuration(timeout),
        " on rank ", rank, ": rank", missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
        " of world size ", size, missing.size() == 1 ? " has" : " have", " not joined (",
        joined.message(), ")"));
  }

  auto group = std::shared_ptr<GlooProcessGroup>(new GlooProcessGroup(rank, size, name, timeout));
  Impl& impl = *group->impl_;
  impl.rank = rank;
  impl.size = size;
  impl.store = group_store;
  impl.timeout = ToMillis(timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    attr.iface = options.iface;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    impl.context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    impl.context->setTimeout(impl.timeout);
    impl.context->connectFullMesh(group_store->gloo_store(), device);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo group '", name, "': connecting rank ", rank,
                                               " to its ", size - 1, " peers failed: ", e.what()));
  }
  impl.worker = std::thread([&impl] { impl.Loop(); });
  return std::shared_ptr<ProcessGroup>(group);
}

std::shared_ptr<Work> GlooProcessGroup::all_reduce(const RawTensor& tensor, ReduceOp op) {
  CheckTensor("all_reduce", "tensor", tensor);
  CheckReduceOp("all_reduce", tensor, op);
  const ReduceFn fn = ReduceFor(tensor.dtype(), op);
  Impl* impl = impl_.get();
  const int world = size();
  const bool f16_in_f32 =
      tensor.dtype() == kF16 && world > 1 && (op == ReduceOp::kAvg || op == ReduceOp::kSum);
  return impl->Enqueue(Describe("all_reduce"), "all_reduce",
                       absl::StrCat("of ", tensor.numel(), " ", DTypeName(tensor.dtype()),
                                    " elements (", ReduceOpName(op), ")"),
                       timeout(), [impl, tensor, op, fn, world, f16_in_f32](uint32_t tag) {
                         const size_t n = tensor.numel();
                         if (n == 0) return;
                         if (f16_in_f32) {
                           return AllReduceF16InF32(impl->context, impl->timeout, tag, op,
                                                    static_cast<uint16_t*>(tensor.raw_data()), n,
                                                    world);
                         }
                         gloo::AllreduceOptions opts(impl->context);
                         opts.setTimeout(impl->timeout);
                         opts.setTag(tag);
                         opts.setReduceFunction(fn);
                         void* data = tensor.raw_data();
                         switch (tensor.element_size()) {
                           case 2:
                             opts.setOutput(static_cast<uint16_t*>(data), n);
                             break;
                           case 4:
                             opts.setOutput(static_cast<uint32_t*>(data), n);
                             break;
                           default:
                             opts.setOutput(static_cast<uint64_t*>(data), n);
                             break;
                         }
                         gloo::allreduce(opts);
                         if (op == ReduceOp::kAvg) DivideInPlace(tensor.dtype(), data, n, world);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::reduce_scatter(const RawTensor& output,
                                                       const RawTensor& input, ReduceOp op) {
  CheckTensor("reduce_scatter", "output", output);
  CheckTensor("reduce_scatter", "input", input);
  CheckChunks("reduce_scatter", "input", input, "output", output);
  CheckReduceOp("reduce_scatter", input, op);
  Impl* impl = impl_.get();
  const int world = size();
  return impl->Enqueue(Describe("reduce_scatter"), "reduce_scatter",
                       absl::StrCat("of ", input.numel(), " ", DTypeName(input.dtype()),
                                    " elements (", ReduceOpName(op), ")"),
                       timeout(), [impl, output, input, op, world](uint32_t tag) {
                         const size_t n = output.numel();
                         if (n == 0) return;
                         const size_t bytes = input.numel() * input.element_size();
                         // [world, n]: chunk r is rank r's chunk for this rank.
                         std::vector<char> chunks(bytes);
                         if (world == 1) {
                           std::memcpy(chunks.data(), input.raw_data(), bytes);
                         } else {
                           gloo::AlltoallOptions opts(impl->context);
                           opts.setTimeout(impl->timeout);
                           opts.setTag(tag);
                           opts.setInput(static_cast<char*>(input.raw_data()), bytes);
                           opts.setOutput(chunks.data(), bytes);
                           gloo::alltoall(opts);
                         }
                         ReduceChunks(input.dtype(), op, chunks.data(), output.raw_data(), n,
                                      world);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::all_gather(const RawTensor& output,
                                                   const RawTensor& input) {
  CheckTensor("all_gather", "output", output);
  CheckTensor("all_gather", "input", input);
  CheckChunks("all_gather", "output", output, "input", input);
  Impl* impl = impl_.get();
  const int world = size();
  return impl->Enqueue(
      Describe("all_gather"), "all_gather",
      absl::StrCat("of ", input.numel(), " ", DTypeName(input.dtype()), " elements per rank"),
      timeout(), [impl, output, input, world](uint32_t tag) {
        const size_t bytes = input.numel() * input.element_size();
        if (bytes == 0) return;
        char* out = static_cast<char*>(output.raw_data());
        // The input may be this rank's chunk of the output (in place) or
        // overlap it elsewhere: stage it.
        std::vector<char> staged(bytes);
        std::memcpy(staged.data(), input.raw_data(), bytes);
        if (world == 1) {
          std::memcpy(out, staged.data(), bytes);
          return;
        }
        gloo::AllgatherOptions opts(impl->context);
        opts.setTimeout(impl->timeout);
        opts.setTag(tag);
        opts.setInput(staged.data(), bytes);
        opts.setOutput(out, bytes * world);
        gloo::allgather(opts);
      });
}

std::shared_ptr<Work> GlooProcessGroup::broadcast(const RawTensor& tensor, int root) {
  CheckTensor("broadcast", "tensor", tensor);
  TG_CHECK(root >= 0 && root < size(), Describe("broadcast"), ": root ", root,
           " is out of range for world size ", size());
  Impl* impl = impl_.get();
  return impl->Enqueue(Describe("broadcast"), "broadcast",
                       absl::StrCat("of ", tensor.numel(), " ", DTypeName(tensor.dtype()),
                                    " elements from rank ", root),
                       timeout(), [impl, tensor, root](uint32_t tag) {
                         const size_t bytes = tensor.numel() * tensor.element_size();
                         if (bytes == 0) return;
                         gloo::BroadcastOptions opts(impl->context);
                         opts.setTimeout(impl->timeout);
                         opts.setTag(tag);
                         opts.setOutput(static_cast<char*>(tensor.raw_data()), bytes);
                         opts.setRoot(root);
                         gloo::broadcast(opts);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::barrier() {
  Impl* impl = impl_.get();
  return impl->Enqueue(Describe("barrier"), "barrier", "", timeout(), [impl](uint32_t tag) {
    gloo::BarrierOptions opts(impl->context);
    opts.setTimeout(impl->timeout);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

}  // namespace tg::dist
