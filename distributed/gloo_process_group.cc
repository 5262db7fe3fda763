#include "distributed/gloo_process_group.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
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
      return ReduceChunksNative(op, static_cast<const float*>(chunks), static_cast<float*>(out),
                                n, ranks);
    case kF64:
      return ReduceChunksNative(op, static_cast<const double*>(chunks),
                                static_cast<double*>(out), n, ranks);
    case kI32:
      return ReduceChunksNative(op, static_cast<const int32_t*>(chunks),
                                static_cast<int32_t*>(out), n, ranks);
    case kI64:
      return ReduceChunksNative(op, static_cast<const int64_t*>(chunks),
                                static_cast<int64_t*>(out), n, ranks);
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

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// One queued collective's completion.
class GlooWork final : public Work {
 public:
  // `on_timeout` breaks the group when a wait gives up.
  GlooWork(absl::Duration timeout, std::string what,
           std::function<void(const absl::Status&)> on_timeout)
      : Work(timeout), what_(std::move(what)), on_timeout_(std::move(on_timeout)) {}

  absl::Status wait(absl::Duration timeout) override {
    absl::Status timed_out;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) return status_;
      timed_out = absl::DeadlineExceededError(absl::StrCat(
          what_, " did not complete within ", absl::FormatDuration(timeout),
          " (a peer process exited, hung or fell behind)"));
    }
    on_timeout_(timed_out);
    return timed_out;
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
  const std::function<void(const absl::Status&)> on_timeout_;
  absl::Mutex mu_;
  bool done_ = false;
  absl::Status status_;
};

}  // namespace

struct GlooProcessGroup::Impl : std::enable_shared_from_this<GlooProcessGroup::Impl> {
  std::shared_ptr<Store> store;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::chrono::milliseconds timeout;

  absl::Mutex mu;
  struct Job {
    std::shared_ptr<GlooWork> work;
    std::function<void()> run;
  };
  std::deque<Job> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Status broken ABSL_GUARDED_BY(mu);  // the first failure; OK while healthy
  std::thread worker;

  void Loop() {
    for (;;) {
      Job job;
      absl::Status broken_now;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Impl* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return self->stop || !self->queue.empty();
            },
            this));
        if (queue.empty()) return;  // stop requested and nothing left
        job = std::move(queue.front());
        queue.pop_front();
        broken_now = broken;
      }
      if (!broken_now.ok()) {
        job.work->Complete(absl::Status(
            broken_now.code(), absl::StrCat(job.work->what(), " failed: the group is broken by an "
                                            "earlier failure: ", broken_now.message())));
        continue;
      }
      absl::Status status;
      try {
        job.run();
      } catch (const std::exception& e) {
        status = absl::UnavailableError(
            absl::StrCat(job.work->what(), " failed: ", e.what(),
                         " (a peer process exited or is unreachable)"));
        Break(status);
      }
      job.work->Complete(std::move(status));
    }
  }

  void Break(const absl::Status& status) {
    absl::MutexLock lock(&mu);
    if (broken.ok()) broken = status;
  }

  std::shared_ptr<Work> Enqueue(std::string what, absl::Duration timeout,
                                std::function<void()> run) {
    std::weak_ptr<Impl> self = weak_from_this();
    auto work = std::make_shared<GlooWork>(timeout, std::move(what),
                                           [self](const absl::Status& status) {
                                             if (auto impl = self.lock()) impl->Break(status);
                                           });
    absl::MutexLock lock(&mu);
    queue.push_back(Job{work, std::move(run)});
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

absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooProcessGroup::Create(
    int rank, int size, const std::string& name, absl::Duration timeout,
    std::shared_ptr<Store> group_store, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("gloo group '", name, "': rank ", rank,
                                                   " is out of range for world size ", size));
  }
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
        " on rank ", rank, ": rank", missing.size() == 1 ? " " : "s ",
        absl::StrJoin(missing, ", "), " of world size ", size, missing.size() == 1 ? " has" : " have",
        " not joined (", joined.message(), ")"));
  }

  auto group = std::shared_ptr<GlooProcessGroup>(new GlooProcessGroup(rank, size, name, timeout));
  Impl& impl = *group->impl_;
  impl.store = group_store;
  impl.timeout = ToMillis(timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
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

std::shared_ptr<Work> GlooProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  CheckTensor("all_reduce", "tensor", tensor);
  CheckReduceOp("all_reduce", tensor, op);
  const ReduceFn fn = ReduceFor(tensor.dtype(), op);
  Impl* impl = impl_.get();
  const int world = size();
  return impl->Enqueue(
      absl::StrCat(Describe("all_reduce"), " of ", tensor.numel(), " ",
                   DTypeName(tensor.dtype()), " elements (", ReduceOpName(op), ")"),
      timeout(), [impl, tensor, op, fn, world] {
        const size_t n = tensor.numel();
        if (n == 0) return;
        gloo::AllreduceOptions opts(impl->context);
        opts.setTimeout(impl->timeout);
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

std::shared_ptr<Work> GlooProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input,
                                                       ReduceOp op) {
  CheckTensor("reduce_scatter", "output", output);
  CheckTensor("reduce_scatter", "input", input);
  CheckChunks("reduce_scatter", "input", input, "output", output);
  CheckReduceOp("reduce_scatter", input, op);
  Impl* impl = impl_.get();
  const int world = size();
  return impl->Enqueue(
      absl::StrCat(Describe("reduce_scatter"), " of ", input.numel(), " ",
                   DTypeName(input.dtype()), " elements (", ReduceOpName(op), ")"),
      timeout(), [impl, output, input, op, world] {
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
          opts.setInput(static_cast<char*>(input.raw_data()), bytes);
          opts.setOutput(chunks.data(), bytes);
          gloo::alltoall(opts);
        }
        ReduceChunks(input.dtype(), op, chunks.data(), output.raw_data(), n, world);
      });
}

std::shared_ptr<Work> GlooProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  CheckTensor("all_gather", "output", output);
  CheckTensor("all_gather", "input", input);
  CheckChunks("all_gather", "output", output, "input", input);
  Impl* impl = impl_.get();
  const int world = size();
  return impl->Enqueue(absl::StrCat(Describe("all_gather"), " of ", input.numel(), " ",
                                    DTypeName(input.dtype()), " elements per rank"),
                       timeout(), [impl, output, input, world] {
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
                         opts.setInput(staged.data(), bytes);
                         opts.setOutput(out, bytes * world);
                         gloo::allgather(opts);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::broadcast(const Tensor& tensor, int root) {
  CheckTensor("broadcast", "tensor", tensor);
  TG_CHECK(root >= 0 && root < size(), Describe("broadcast"), ": root ", root,
           " is out of range for world size ", size());
  Impl* impl = impl_.get();
  return impl->Enqueue(absl::StrCat(Describe("broadcast"), " of ", tensor.numel(), " ",
                                    DTypeName(tensor.dtype()), " elements from rank ", root),
                       timeout(), [impl, tensor, root] {
                         const size_t bytes = tensor.numel() * tensor.element_size();
                         if (bytes == 0) return;
                         gloo::BroadcastOptions opts(impl->context);
                         opts.setTimeout(impl->timeout);
                         opts.setOutput(static_cast<char*>(tensor.raw_data()), bytes);
                         opts.setRoot(root);
                         gloo::broadcast(opts);
                       });
}

std::shared_ptr<Work> GlooProcessGroup::barrier() {
  Impl* impl = impl_.get();
  return impl->Enqueue(Describe("barrier"), timeout(), [impl] {
    gloo::BarrierOptions opts(impl->context);
    opts.setTimeout(impl->timeout);
    gloo::barrier(opts);
  });
}

}  // namespace tg::dist
