// NcclProcessGroup: NCCL error text and factory argument errors (everywhere, no GPU needed);
// with a GPU, every collective and dtype at world size 1 against values computed on the CPU,
// argument errors, stream ordering with the caller's stream, tensor lifetime across the
// communication stream, blocking waits, lazy timeout detection, rendezvous failures; with N
// GPUs, every collective at world sizes 2..N in real processes (rank r on cuda:r) and a rank
// that skips a collective. Tests that abort a communicator run in a child process (RunRanks), so
// that whatever the abort leaves behind on the device cannot affect the other tests.
#include "distributed/nccl_process_group.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/init.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "gtest/gtest.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"
#include "tests/distributed/multiprocess.h"
#include "tests/tensor/throws.h"

namespace tg::dist {
namespace {

using testing::Rank;
using testing::RunOptions;
using testing::RunRanks;
using tg::testing::ThrowsErrorExactly;

#define SKIP_WITHOUT_GPUS(n)     \
  if (cuda::DeviceCount() < (n)) \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << cuda::DeviceCount()

constexpr DType kDTypes[] = {kF32, kF64, kF16, kBF16, kI32, kI64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

std::shared_ptr<ProcessGroup> NewGroup(int rank, int size, const std::string& name,
                                       absl::Duration timeout, std::shared_ptr<Store> store,
                                       int device, const NcclOptions& options = {}) {
  auto pg = NewNcclProcessGroup(rank, size, name, timeout, std::move(store), Device::Cuda(device),
                                options);
  if (!pg.ok()) {
    ADD_FAILURE() << pg.status();
    return nullptr;
  }
  return *pg;
}

// A world-size-1 group in this process on cuda:0.
std::shared_ptr<ProcessGroup> SoloGroup(const std::string& name, const NcclOptions& options = {},
                                        absl::Duration timeout = absl::Seconds(60)) {
  return NewGroup(0, 1, name, timeout, Store::InMemory()->WithPrefix(name), 0, options);
}

// In a rank process of RunRanks: the group of the job, rank r on cuda:LOCAL_RANK.
std::shared_ptr<ProcessGroup> RankGroup(const std::string& name, const NcclOptions& options = {},
                                        absl::Duration timeout = absl::ZeroDuration()) {
  auto env = ResolveDistEnv(DistOptions{});
  if (!env.ok()) {
    ADD_FAILURE() << env.status();
    return nullptr;
  }
  auto store = OpenJobStore(*env);
  if (!store.ok()) {
    ADD_FAILURE() << store.status();
    return nullptr;
  }
  return NewGroup(env->rank, env->world_size, name,
                  timeout > absl::ZeroDuration() ? timeout : env->timeout,
                  (*store)->WithPrefix(name), env->local_rank, options);
}

NcclProcessGroup& Nccl(const std::shared_ptr<ProcessGroup>& pg) {
  return *static_cast<NcclProcessGroup*>(pg.get());
}

// Rank r's value at i: small integers (halves for floating dtypes) so that sums over 8 ranks
// are exact in every dtype, bf16 included; varying signs so that max, min and sum differ.
double Value(int r, int64_t i, DType dtype) {
  const double base = (r + 1) * (i % 7) - 3 * (i % 3) + 2 * r;
  return IsFloating(dtype) ? base * 0.5 : base;
}

RawTensor RankTensor(int r, int64_t n, DType dtype, int device) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(r, i, dtype);
  return RawTensor::FromVector(v, {n}).to(Device::Cuda(device), dtype);
}

double Reduce(ReduceOp op, int world, int64_t i, DType dtype) {
  double acc = Value(0, i, dtype);
  for (int r = 1; r < world; ++r) {
    const double v = Value(r, i, dtype);
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  return op == ReduceOp::kAvg ? acc / world : acc;
}

// Exact except for avg (NCCL scales by 1/size in the element type, before or after summing).
double Tolerance(ReduceOp op, DType dtype) {
  if (op != ReduceOp::kAvg) return 0;
  switch (dtype) {
    case kF64:
      return 1e-12;
    case kF32:
      return 1e-6;
    case kF16:
      return 4e-3;
    default:
      return 3e-2;  // bf16
  }
}

void ExpectValues(const RawTensor& t, const std::function<double(int64_t)>& expected, double tol,
                  const std::string& what) {
  const std::vector<double> got = t.to_vector<double>();
  int reported = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const double e = expected(i);
    if (std::abs(got[i] - e) > tol * std::max(1.0, std::abs(e)) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << e;
    }
  }
}

// Every collective and dtype on `pg`, whose rank r holds Value(r, .) (works for any size).
void CheckAllCollectives(ProcessGroup& pg, int device) {
  const int r = pg.rank();
  const int world = pg.size();
  const int64_t n = 37;  // not a multiple of anything NCCL would like
  for (DType dtype : kDTypes) {
    const std::string dt = DTypeName(dtype);
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::kAvg && !IsFloating(dtype)) continue;
      const std::string what = absl::StrCat(dt, " ", ReduceOpName(op));
      // all_reduce in place, on a view at an offset of its storage.
      RawTensor big = RawTensor::Full({n + 5}, -9, dtype, Device::Cuda(device));
      RawTensor t = big.slice(0, 3, 3 + n);
      t.copy_(RankTensor(r, n, dtype, device));
      ASSERT_TRUE(pg.all_reduce(t, op)->wait().ok()) << what;
      ExpectValues(
          t, [&](int64_t i) { return Reduce(op, world, i, dtype); }, Tolerance(op, dtype),
          "all_reduce " + what);
      ExpectValues(
          big.slice(0, 0, 3), [](int64_t) { return -9; }, 0, "all_reduce head " + what);
      ExpectValues(
          big.slice(0, 3 + n, n + 5), [](int64_t) { return -9; }, 0, "all_reduce tail " + what);

      // reduce_scatter: rank r gets the reduction of chunk r.
      RawTensor input = RankTensor(r, n * world, dtype, device);
      RawTensor output = RawTensor::Full({n}, -9, dtype, Device::Cuda(device));
      ASSERT_TRUE(pg.reduce_scatter(output, input, op)->wait().ok()) << what;
      ExpectValues(
          output, [&](int64_t i) { return Reduce(op, world, r * n + i, dtype); },
          Tolerance(op, dtype), "reduce_scatter " + what);
    }
    // all_gather: chunk q is rank q's input; shapes are free (input [n], output [world, n]).
    RawTensor input = RankTensor(r, n, dtype, device);
    RawTensor output = RawTensor::Full({world, n}, -9, dtype, Device::Cuda(device));
    ASSERT_TRUE(pg.all_gather(output, input)->wait().ok()) << dt;
    ExpectValues(
        output, [&](int64_t i) { return Value(i / n, i % n, dtype); }, 0, "all_gather " + dt);
    // broadcast from every root.
    for (int root = 0; root < world; ++root) {
      RawTensor t = RankTensor(r, n, dtype, device);
      ASSERT_TRUE(pg.broadcast(t, root)->wait().ok()) << dt;
      ExpectValues(
          t, [&](int64_t i) { return Value(root, i, dtype); }, 0,
          absl::StrCat("broadcast from ", root, " ", dt));
    }
  }
  EXPECT_TRUE(pg.barrier()->wait().ok());
  EXPECT_TRUE(static_cast<NcclProcessGroup&>(pg).error().ok());
}

// Blocks `stream` (from the host, cudaLaunchHostFunc) until open() or until `max_hold` passed:
// work enqueued after it waits. The self-release bounds a test that fails midway, and lets an
// ncclCommAbort (which frees device memory, waiting for the device) finish.
class Gate {
 public:
  Gate(cudaStream_t stream, absl::Duration max_hold)
      : state_(std::make_shared<State>(absl::Now() + max_hold)) {
    // The host function owns a reference: it may still run after the Gate is gone.
    auto* ref = new std::shared_ptr<State>(state_);
    TG_CUDA_CHECK(cudaLaunchHostFunc(stream, &Gate::Hold, ref));
  }
  ~Gate() { open(); }
  void open() { state_->open = true; }

 private:
  struct State {
    explicit State(absl::Time until) : until(until) {}
    std::atomic<bool> open{false};
    const absl::Time until;
  };
  static void Hold(void* arg) {
    std::unique_ptr<std::shared_ptr<State>> ref(static_cast<std::shared_ptr<State>*>(arg));
    const State& s = **ref;
    while (!s.open && absl::Now() < s.until) absl::SleepFor(absl::Milliseconds(1));
  }
  std::shared_ptr<State> state_;
};

// ---- Without a GPU --------------------------------------------------------------------------

TEST(NcclErrorTest, CallStatusNamesFileLineCallAndNcclText) {
  const std::string last = ncclGetLastError(nullptr);
  const std::string suffix = last.empty() ? "" : " (last error: " + last + ")";
  const int line = __LINE__ + 1;
  absl::Status s = TG_NCCL_STATUS(ncclInvalidArgument, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            absl::StrCat(__FILE__, ":", line,
                         ": ncclInvalidArgument failed: ncclInvalidArgument: invalid argument "
                         "(run with NCCL_DEBUG=WARN for details)",
                         suffix));
  s = TG_NCCL_STATUS(ncclRemoteError, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(
      s.message(), "ncclRemoteError: remote process exited or there was a network error"));
  EXPECT_TRUE(TG_NCCL_STATUS(ncclSuccess, nullptr).ok());
  EXPECT_STREQ(NcclResultName(ncclSystemError), "ncclSystemError");
}

TEST(NcclFactoryTest, ArgumentAndDeviceErrors) {
  auto store = Store::InMemory();
  const absl::Duration t = absl::Seconds(1);
  auto bad_rank = NewNcclProcessGroup(2, 2, "g", t, store, Device::Cuda(0));
  EXPECT_EQ(bad_rank.status(),
            absl::InvalidArgumentError("NewNcclProcessGroup('g', rank 2 of 2, cuda:0): rank must "
                                       "be in [0, size) and size at least 1"));
  auto cpu = NewNcclProcessGroup(0, 1, "g", t, store, Device::Cpu());
  EXPECT_EQ(cpu.status(),
            absl::InvalidArgumentError(
                "NewNcclProcessGroup('g', rank 0 of 1, cpu): NCCL needs a CUDA device"));
  auto no_store = NewNcclProcessGroup(0, 1, "g", t, nullptr, Device::Cuda(0));
  EXPECT_EQ(no_store.status(),
            absl::InvalidArgumentError("NewNcclProcessGroup('g', rank 0 of 1, cuda:0): no store"));
  auto no_time = NewNcclProcessGroup(0, 1, "g", absl::ZeroDuration(), store, Device::Cuda(0));
  EXPECT_EQ(
      no_time.status(),
      absl::InvalidArgumentError(
          "NewNcclProcessGroup('g', rank 0 of 1, cuda:0): the timeout must be positive, got 0"));
  const int count = cuda::DeviceCount();
  if (count == 0) {
    auto none = NewNcclProcessGroup(0, 1, "g", t, store, Device::Cuda(0));
    EXPECT_EQ(none.status(),
              absl::FailedPreconditionError(
                  "NewNcclProcessGroup('g', rank 0 of 1, cuda:0): no CUDA device is available "
                  "(DeviceCount() = 0: no CUDA driver or no GPU)"));
  } else {
    auto missing = NewNcclProcessGroup(0, 1, "g", t, store, Device::Cuda(count));
    EXPECT_EQ(missing.status(),
              absl::InvalidArgumentError(absl::StrCat(
                  "NewNcclProcessGroup('g', rank 0 of 1, cuda:", count, "): CUDA device ", count,
                  " does not exist (DeviceCount() = ", count, ")")));
  }
}

// ---- One GPU, world size 1 ------------------------------------------------------------------

TEST(NcclWorldOneTest, EveryCollectiveAndDtypeAgainstTheCpu) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = SoloGroup("default");
  ASSERT_NE(pg, nullptr);
  EXPECT_STREQ(pg->backend(), "nccl");
  EXPECT_EQ(pg->device(), Device::Cuda(0));
  CheckAllCollectives(*pg, 0);
  // Waiting again, and on a compute stream of the caller's own.
  cuda::Stream compute;
  cuda::StreamGuard guard(compute);
  RawTensor t = RankTensor(0, 1000, kF32, 0);
  auto work = pg->all_reduce(t, ReduceOp::kSum);
  EXPECT_TRUE(work->wait().ok());
  EXPECT_TRUE(work->wait().ok());
  ExpectValues(
      t, [](int64_t i) { return Value(0, i, kF32); }, 0, "on a side stream");
  cuda::Synchronize();
  TG_CUDA_CHECK(cudaStreamSynchronize(Nccl(pg).stream()));
  EXPECT_TRUE(work->is_completed());
}

TEST(NcclWorldOneTest, EmptyTensorsCompleteAtOnce) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = SoloGroup("empty");
  ASSERT_NE(pg, nullptr);
  RawTensor empty = RawTensor::Empty({0}, kF32, Device::Cuda(0));
  auto work = pg->all_reduce(empty, ReduceOp::kSum);
  EXPECT_TRUE(work->is_completed());
  EXPECT_TRUE(work->wait().ok());
  EXPECT_TRUE(pg->all_gather(empty, empty)->wait().ok());
  EXPECT_EQ(Nccl(pg).held_collectives(), 0);
}

TEST(NcclWorldOneTest, ArgumentErrorsThrowBeforeAnythingIsQueued) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = SoloGroup("default");
  ASSERT_NE(pg, nullptr);
  const Device dev = Device::Cuda(0);
  const std::string g = "on group 'default' (rank 0 of 1, nccl)";
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg->all_reduce(RawTensor::Ones({4}), ReduceOp::kSum); },
      "all_reduce " + g + ": tensor is on cpu, the group's tensors must be on cuda:0"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        pg->all_reduce(RawTensor::Ones({2, 3}, kF32, dev).transpose(0, 1), ReduceOp::kSum);
      },
      "all_reduce " + g + ": tensor of shape [3, 2] must be contiguous"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg->all_reduce(RawTensor::Ones({4}, kU8, dev), ReduceOp::kMax); },
      "all_reduce " + g + ": tensor has unsupported dtype u8 (f32, f64, f16, bf16, i32, i64)"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { pg->all_reduce(RawTensor::Ones({4}, kI32, dev), ReduceOp::kAvg); },
                         "all_reduce " + g + ": ReduceOp avg needs a floating dtype, got i32"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        pg->reduce_scatter(RawTensor::Ones({4}, kF32, dev), RawTensor::Ones({5}, kF32, dev),
                           ReduceOp::kSum);
      },
      "reduce_scatter " + g +
          ": input must hold 1 x 4 = 4 elements (output has shape [4]), got 5 (shape [5])"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] {
        pg->all_gather(RawTensor::Ones({2, 3}, kF32, dev), RawTensor::Ones({4}, kF32, dev));
      },
      "all_gather " + g +
          ": output must hold 1 x 4 = 4 elements (input has shape [4]), got 6 (shape [2, 3])"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg->all_gather(RawTensor::Ones({4}, kF16, dev), RawTensor::Ones({4}, kF32, dev)); },
      "all_gather " + g + ": output has dtype f16 but input has dtype f32"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg->all_gather(RawTensor::Ones({4}, kF32, dev), RawTensor::Ones({4})); },
      "all_gather " + g + ": input is on cpu, the group's tensors must be on cuda:0"));
  EXPECT_TRUE(
      ThrowsErrorExactly([&] { pg->broadcast(RawTensor::Ones({4}, kF32, dev), 1); },
                         "broadcast " + g + ": root 1 is not a rank of the group (size 1)"));
  if (cuda::DeviceCount() >= 2) {
    EXPECT_TRUE(ThrowsErrorExactly(
        [&] { pg->broadcast(RawTensor::Ones({4}, kF32, Device::Cuda(1)), 0); },
        "broadcast " + g + ": tensor is on cuda:1, the group's tensors must be on cuda:0"));
  }
  EXPECT_EQ(Nccl(pg).held_collectives(), 0);
  EXPECT_TRUE(Nccl(pg).error().ok());
  EXPECT_TRUE(pg->barrier()->wait().ok());  // the group still works
}

// The collective reads its input as the caller's stream leaves it (event ordering), wait() does
// not block the host, and the group holds the tensors until the collective has completed.
TEST(NcclWorldOneTest, OrderedAfterTheCallersStreamAndHoldsTensorsUntilDone) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = SoloGroup("lifetime");
  ASSERT_NE(pg, nullptr);
  cuda::Stream compute;
  cuda::StreamGuard guard(compute);
  const int64_t n = 1 << 16;
  RawTensor input = RawTensor::Zeros({n}, kF32, Device::Cuda(0));
  RawTensor output = RawTensor::Full({n}, -1, kF32, Device::Cuda(0));
  cuda::Synchronize();
  std::weak_ptr<Storage> input_storage = input.storage();

  auto gate = std::make_unique<Gate>(compute.get(), absl::Seconds(60));
  input.fill_(3);  // enqueued behind the gate: the all_gather must see it
  auto work = pg->all_gather(output, input);
  EXPECT_FALSE(work->is_completed());
  const absl::Time start = absl::Now();
  EXPECT_TRUE(work->wait().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // no host wait
  EXPECT_FALSE(work->is_completed());
  input = RawTensor();
  work.reset();
  EXPECT_FALSE(input_storage.expired());  // held by the group
  EXPECT_EQ(Nccl(pg).held_collectives(), 1);

  gate->open();
  // The compute stream waits for the all_gather (wait() above): reading orders after it.
  ExpectValues(
      output, [](int64_t) { return 3; }, 0, "all_gather after the gate");
  TG_CUDA_CHECK(cudaStreamSynchronize(Nccl(pg).stream()));
  // Released lazily, by the next collective.
  RawTensor other = RawTensor::Ones({4}, kF32, Device::Cuda(0));
  auto next = pg->all_reduce(other, ReduceOp::kSum);
  EXPECT_TRUE(input_storage.expired());
  EXPECT_TRUE(next->wait().ok());
  cuda::Synchronize();
}

TEST(NcclWorldOneTest, WorkOutlivesTheGroup) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = SoloGroup("short_lived");
  ASSERT_NE(pg, nullptr);
  RawTensor t = RankTensor(0, 100, kBF16, 0);
  auto work = pg->all_reduce(t, ReduceOp::kMax);
  pg.reset();
  EXPECT_TRUE(work->wait().ok());
  ExpectValues(
      t, [](int64_t i) { return Value(0, i, kBF16); }, 0, "after the group");
  work.reset();  // the communicator goes with the last Work
}

TEST(NcclWorldOneTest, BlockingWaitTimesOutAbortsAndBreaksTheGroup) {
  SKIP_WITHOUT_GPUS(1);
  auto results = RunRanks(1, [](const Rank&) {
    NcclOptions options;
    options.blocking_wait = true;
    auto pg = SoloGroup("blocking", options);
    ASSERT_NE(pg, nullptr);
    RawTensor t = RawTensor::Ones({16}, kF32, Device::Cuda(0));
    RawTensor u = RawTensor::Ones({16}, kF32, Device::Cuda(0));
    cuda::Synchronize();
    Gate gate(cuda::CurrentStream(0), absl::Seconds(3));
    auto work = pg->all_reduce(t, ReduceOp::kSum);
    const absl::Status s = work->wait(absl::Milliseconds(300));
    const std::string expected =
        "all_reduce on group 'blocking' (rank 0 of 1, nccl): did not complete within 300ms (a "
        "peer exited, hung or did not issue the same collective); the NCCL communicator was "
        "aborted";
    EXPECT_EQ(s, absl::DeadlineExceededError(expected));
    EXPECT_EQ(Nccl(pg).error(), s);
    EXPECT_TRUE(work->is_completed());
    auto later = pg->all_reduce(u, ReduceOp::kSum);  // the group is broken: the first error
    EXPECT_TRUE(later->is_completed());
    EXPECT_EQ(later->wait(), s);
    EXPECT_EQ(pg->barrier()->wait(), s);
    EXPECT_EQ(work->wait(), s);
    gate.open();
    pg.reset();
  });
  testing::ExpectAllSucceeded(results);
}

TEST(NcclWorldOneTest, BarrierWaitsOnTheHost) {
  SKIP_WITHOUT_GPUS(1);
  auto results = RunRanks(1, [](const Rank&) {
    auto pg = SoloGroup("barrier");
    ASSERT_NE(pg, nullptr);
    EXPECT_TRUE(pg->barrier()->wait().ok());
    Gate gate(cuda::CurrentStream(0), absl::Seconds(3));
    const absl::Status s = pg->barrier()->wait(absl::Milliseconds(200));
    EXPECT_EQ(s, absl::DeadlineExceededError(
                     "barrier on group 'barrier' (rank 0 of 1, nccl): did not complete within "
                     "200ms (a peer exited, hung or did not issue the same collective); the NCCL "
                     "communicator was aborted"));
    gate.open();
  });
  testing::ExpectAllSucceeded(results);
}

// Without blocking_wait, a collective older than the timeout is found when the next one is
// issued. The group's timeout also bounds its creation (ncclCommInitRankConfig), which took
// over 500ms in a fresh process on the H200 once (2026-11-26): 3s leaves room for that.
TEST(NcclWorldOneTest, OverdueCollectiveBreaksTheGroupAtTheNextIssue) {
  SKIP_WITHOUT_GPUS(1);
  auto results = RunRanks(1, [](const Rank&) {
    RawTensor t = RawTensor::Ones({16}, kF32, Device::Cuda(0));
    RawTensor u = RawTensor::Ones({16}, kF32, Device::Cuda(0));
    cuda::Synchronize();
    auto pg = SoloGroup("overdue", {}, absl::Seconds(3));
    ASSERT_NE(pg, nullptr);
    Gate gate(cuda::CurrentStream(0), absl::Seconds(8));
    auto first = pg->reduce_scatter(u, t, ReduceOp::kSum);
    EXPECT_TRUE(first->wait().ok());  // orders the stream only
    absl::SleepFor(absl::Milliseconds(3300));
    auto second = pg->all_reduce(u, ReduceOp::kSum);
    const absl::Status expected = absl::DeadlineExceededError(
        "reduce_scatter on group 'overdue' (rank 0 of 1, nccl): did not complete within 3s "
        "(a peer exited, hung or did not issue the same collective); the NCCL communicator was "
        "aborted");
    EXPECT_EQ(second->wait(), expected);
    EXPECT_EQ(first->wait(), expected);  // never seen complete before the break
    gate.open();
  });
  testing::ExpectAllSucceeded(results);
}

// ---- Rendezvous failures (one GPU, one process) ---------------------------------------------

TEST(NcclRendezvousTest, MissingUniqueIdIsTheStoresTimeoutAnnotated) {
  SKIP_WITHOUT_GPUS(1);
  auto pg = NewNcclProcessGroup(1, 2, "late", absl::Milliseconds(200),
                                Store::InMemory()->WithPrefix("late"), Device::Cuda(0));
  ASSERT_FALSE(pg.ok());
  EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StartsWith(pg.status().message(),
                               "init on group 'late' (rank 1 of 2, nccl): waiting for rank 0's "
                               "ncclUniqueId: "))
      << pg.status();
  EXPECT_TRUE(absl::StrContains(pg.status().message(), "nccl_unique_id")) << pg.status();
}

TEST(NcclRendezvousTest, MalformedUniqueIdIsRejected) {
  SKIP_WITHOUT_GPUS(1);
  auto store = Store::InMemory()->WithPrefix("bad");
  ASSERT_TRUE(store->Set("nccl_unique_id", "xyz").ok());
  auto pg = NewNcclProcessGroup(1, 2, "bad", absl::Seconds(1), store, Device::Cuda(0));
  EXPECT_EQ(pg.status(), absl::InvalidArgumentError(
                             "init on group 'bad' (rank 1 of 2, nccl): expected 256 hex digits "
                             "under 'nccl_unique_id', found a value of 3 bytes"));
}

TEST(NcclRendezvousTest, PeerThatNeverJoinsTimesOutInit) {
  SKIP_WITHOUT_GPUS(1);
  auto results = RunRanks(1, [](const Rank&) {
    auto store = Store::InMemory()->WithPrefix("alone");
    auto pg = NewNcclProcessGroup(0, 2, "alone", absl::Seconds(2), store, Device::Cuda(0));
    ASSERT_FALSE(pg.ok());
    EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded) << pg.status();
    EXPECT_TRUE(absl::StrContains(
        pg.status().message(),
        "init on group 'alone' (rank 0 of 2, nccl): ncclCommInitRankConfig(&comm, size, id, "
        "rank, &config) did not complete within 2s"))
        << pg.status();
    EXPECT_TRUE(store->Get("nccl_unique_id", absl::ZeroDuration()).ok());  // rank 0 published
    std::fflush(nullptr);
    _exit(::testing::Test::HasFailure() ? 1 : 0);  // NCCL's bootstrap threads may still wait
  });
  testing::ExpectAllSucceeded(results);
}

// ---- Several GPUs, one process per rank -----------------------------------------------------

TEST(NcclMultiRankTest, EveryCollectiveAndDtypeAgainstTheCpu) {
  SKIP_WITHOUT_GPUS(2);
  for (int world = 2; world <= std::min(cuda::DeviceCount(), 4); ++world) {
    auto results = RunRanks(world, [](const Rank& me) {
      auto pg = RankGroup("default");
      ASSERT_NE(pg, nullptr);
      EXPECT_EQ(pg->rank(), me.rank);
      EXPECT_EQ(pg->device(), Device::Cuda(me.rank));
      CheckAllCollectives(*pg, me.rank);
    });
    testing::ExpectAllSucceeded(results);
  }
}

// f16 sums and averages go through f32 (nccl_process_group.cc, ReduceThroughF32): the f32 sum
// (kAvg: times f32(1/size)) rounded to f16 once, on every world size. NCCL's ncclAvg on f16
// multiplies each value by f16(1/size) and sums in f16: 2^-24 on 2 ranks became 0 (2^-25 rounds
// to even), 3 ranks of 1.333984375 became 1.3330078125, and from 10 ranks on, 65504 on every
// rank became inf (the sums of 6548 round up), so f16 DDP skipped steps that one process does
// not; its f16 ncclSum rounds every partial sum.
TEST(NcclMultiRankTest, F16SumAndAverageRoundOnceAndAreFiniteWhereEveryRankIs) {
  SKIP_WITHOUT_GPUS(2);
  for (int world = 2; world <= cuda::DeviceCount(); ++world) {
    auto results = RunRanks(world, [](const Rank& me) {
      auto pg = RankGroup("f16avg");
      ASSERT_NE(pg, nullptr);
      const int world = pg->size();
      const double inf = std::numeric_limits<double>::infinity();
      auto value = [&](int k, int r) -> double {
        switch (k) {
          case 0:
            return 65504;  // the largest f16 on every rank
          case 1:
            return 40000;  // the f16 sum of 2 overflows (no average may)
          case 2:
            return std::ldexp(1.0, -24);  // the smallest f16 (premultiplied: 0)
          case 3:
            return 1.333984375;  // f16(1/3) and the f16 sums round
          case 4:
            return r == 0 ? 60000 : -30000;  // cancels
          case 5:
            return 1 + r * std::ldexp(1.0, -11);
          default:
            return r == 1 ? inf : 1;  // a rank overflowed: the average is inf
        }
      };
      constexpr int kKinds = 7;
      for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum}) {
        auto expected = [&](int64_t i) {
          double sum = 0;
          for (int r = 0; r < world; ++r) {
            sum += RawTensor::Scalar(value(i % kKinds, r), kF64).to(kF16).item();
          }
          const float reduced = op == ReduceOp::kAvg
                                    ? static_cast<float>(sum) * static_cast<float>(1.0 / world)
                                    : static_cast<float>(sum);
          return RawTensor::Scalar(reduced, kF32).to(kF16).item();
        };
        // Exact equality (inf == inf; ExpectValues' relative tolerance would accept anything
        // against inf).
        auto check = [&](const RawTensor& got, int64_t first, const std::string& what) {
          const std::vector<double> v = got.to_vector<double>();
          for (int64_t j = 0; j < static_cast<int64_t>(v.size()); ++j) {
            EXPECT_EQ(v[j], expected(first + j)) << what << " " << ReduceOpName(op) << " on "
                                                 << world << " ranks, element " << first + j;
          }
        };
        const int64_t n = 3 * kKinds * world;
        std::vector<double> mine(n);
        for (int64_t i = 0; i < n; ++i) mine[i] = value(i % kKinds, me.rank);
        const Device dev = Device::Cuda(me.rank);
        RawTensor t = RawTensor::FromVector(mine, {n}).to(dev, kF16);
        ASSERT_TRUE(pg->all_reduce(t, op)->wait().ok());
        check(t, 0, "all_reduce f16");
        // reduce_scatter: rank r gets elements [r * 3 * kKinds, (r + 1) * 3 * kKinds).
        RawTensor in = RawTensor::FromVector(mine, {n}).to(dev, kF16);
        RawTensor out = RawTensor::Full({3 * kKinds}, -9, kF16, dev);
        ASSERT_TRUE(pg->reduce_scatter(out, in, op)->wait().ok());
        check(out, me.rank * 3 * kKinds, "reduce_scatter f16");
      }
    });
    testing::ExpectAllSucceeded(results);
  }
}

TEST(NcclMultiRankTest, RankThatSkipsACollectiveTimesOutTheOthers) {
  SKIP_WITHOUT_GPUS(2);
  RunOptions run;
  run.deadline = absl::Seconds(120);
  auto results = RunRanks(
      2,
      [](const Rank& me) {
        NcclOptions options;
        options.blocking_wait = true;
        auto pg = RankGroup("desync", options, absl::Seconds(20));
        ASSERT_NE(pg, nullptr);
        RawTensor t = RankTensor(me.rank, 1024, kF32, me.rank);
        ASSERT_TRUE(pg->all_reduce(t, ReduceOp::kSum)->wait().ok());  // connected and working
        if (me.rank == 1) {
          absl::SleepFor(absl::Seconds(6));  // skips the next all_reduce, outlives rank 0's wait
          return;
        }
        const absl::Status s = pg->all_reduce(t, ReduceOp::kSum)->wait(absl::Seconds(3));
        EXPECT_EQ(s,
                  absl::DeadlineExceededError(
                      "all_reduce on group 'desync' (rank 0 of 2, nccl): did not complete within "
                      "3s (a peer exited, hung or did not issue the same collective); the NCCL "
                      "communicator was aborted"));
        EXPECT_EQ(pg->broadcast(t, 0)->wait(), s);
      },
      run);
  testing::ExpectAllSucceeded(results);
}

}  // namespace
}  // namespace tg::dist
