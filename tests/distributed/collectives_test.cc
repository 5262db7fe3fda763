// Every collective of the Gloo process group, in real processes over loopback, for world sizes
// 1-4 and dtypes f32/f64/f16/bf16 (+ i32/i64), against references computed in-process; argument
// errors; rendezvous timeouts that name the missing rank; a rank killed mid-run.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/init.h"
#include "distributed/process_group.h"
#include "distributed/store.h"
#include "gtest/gtest.h"
#include "tensor/half.h"
#include "tensor/tensor.h"
#include "tests/distributed/multiprocess.h"
#include "tests/tensor/throws.h"

namespace tg::dist {
namespace {

using testing::Rank;
using testing::RunOptions;
using testing::RunRanks;
using tg::testing::ThrowsErrorExactly;

// Rank r's value at i: small integers (and halves) so that sums of up to 4 ranks are exact in
// every dtype, bf16 included; the sign varies so max and min differ from sum.
double Value(int r, int64_t i) { return ((r + 1) * (i % 7) - 3 * (i % 3)) * 0.5 + r; }

RawTensor RankTensor(int r, int64_t n, DType dtype) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Value(r, i);
  return RawTensor::FromVector(v, {n}, dtype);
}

// The reduction of every rank's Value(., i), rounded to `dtype` the way the backend does: the
// exact sum (exact in every dtype here) and, for avg, one division in the compute type.
double Expected(ReduceOp op, int world, int64_t i, DType dtype) {
  double acc = Value(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = Value(r, i);
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  if (op != ReduceOp::kAvg) return acc;
  if (dtype == kF64) return acc / world;
  const float q = static_cast<float>(acc) / static_cast<float>(world);
  if (dtype == kF16) return HalfBitsToFloat(FloatToHalfBits(q));
  if (dtype == kBF16) return BFloat16BitsToFloat(FloatToBFloat16Bits(q));
  return q;
}

void ExpectValues(const RawTensor& t, const std::function<double(int64_t)>& expected,
                  const std::string& what) {
  const std::vector<double> got = t.to_vector<double>();
  int reported = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    if (got[i] != expected(i) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected "
                    << expected(i);
    }
  }
}

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
constexpr DType kFloatTypes[] = {kF32, kF64, kF16, kBF16};

void CheckEveryCollective(const Rank& me) {
  auto pg = testing::JoinDefaultGroup();
  ASSERT_EQ(pg->rank(), me.rank);
  ASSERT_EQ(pg->size(), me.world_size);
  ASSERT_STREQ(pg->backend(), "gloo");
  const int world = me.world_size;
  const int64_t n = 1001;  // not a multiple of any world size
  const int64_t chunk = 257;
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI32, kI64}) {
    const bool floating = IsFloating(dtype);
    for (ReduceOp op : kOps) {
      if (!floating) break;  // integer dtypes: below
      const std::string what = absl::StrCat(DTypeName(dtype), " ", ReduceOpName(op), " world ",
                                            world, " rank ", me.rank);
      RawTensor t = RankTensor(me.rank, n, dtype);
      TG_DIST_CHECK_OK(pg->all_reduce(t, op)->wait());
      ExpectValues(
          t, [&](int64_t i) { return Expected(op, world, i, dtype); }, "all_reduce " + what);

      // reduce_scatter: input [world * chunk]; rank r gets the reduction of chunk r.
      RawTensor in = RankTensor(me.rank, world * chunk, dtype);
      RawTensor out = RawTensor::Empty({chunk}, dtype);
      TG_DIST_CHECK_OK(pg->reduce_scatter(out, in, op)->wait());
      ExpectValues(
          out, [&](int64_t k) { return Expected(op, world, me.rank * chunk + k, dtype); },
          "reduce_scatter " + what);
    }
    if (!floating) {
      // i32/i64: integer values only.
      std::vector<int64_t> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = (me.rank + 1) * (i % 11) - 5;
      RawTensor t = RawTensor::FromVector(v, {n}, dtype);
      TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kSum)->wait());
      const int64_t ranks_sum = world * (world + 1) / 2;
      ExpectValues(
          t, [&](int64_t i) { return double(ranks_sum * (i % 11) - 5 * world); },
          absl::StrCat("all_reduce ", DTypeName(dtype)));
      RawTensor m = RawTensor::FromVector(v, {n}, dtype);
      TG_DIST_CHECK_OK(pg->all_reduce(m, ReduceOp::kMax)->wait());
      ExpectValues(
          m, [&](int64_t i) { return double(i % 11 == 0 ? -5 : world * (i % 11) - 5); },
          absl::StrCat("all_reduce max ", DTypeName(dtype)));
    }

    // all_gather: chunk r of the output is rank r's input.
    RawTensor mine = RankTensor(me.rank, chunk, floating ? dtype : kF64).to(dtype);
    RawTensor gathered = RawTensor::Zeros({world, chunk}, dtype);
    TG_DIST_CHECK_OK(pg->all_gather(gathered, mine)->wait());
    ExpectValues(
        gathered.flatten(),
        [&](int64_t k) {
          return RawTensor::Scalar(Value(k / chunk, k % chunk), kF64).to(dtype).item();
        },
        absl::StrCat("all_gather ", DTypeName(dtype)));

    // broadcast from every root.
    for (int root = 0; root < world; ++root) {
      RawTensor b = RankTensor(me.rank, 33, floating ? dtype : kF64).to(dtype);
      TG_DIST_CHECK_OK(pg->broadcast(b, root)->wait());
      ExpectValues(
          b, [&](int64_t i) { return RawTensor::Scalar(Value(root, i), kF64).to(dtype).item(); },
          absl::StrCat("broadcast ", DTypeName(dtype), " root ", root));
    }
  }
  TG_DIST_CHECK_OK(pg->barrier()->wait());
}

TEST(Collectives, EveryOpDtypeAndWorldSize) {
  for (int world = 1; world <= 4; ++world) {
    testing::ExpectAllSucceeded(RunRanks(world, CheckEveryCollective));
  }
}

// Values that are not exact: f32 sums in a different order than the reference stay within
// f32 rounding; f16/bf16 all_reduce rounds each partial sum, reduce_scatter once.
TEST(Collectives, InexactValuesWithinRounding) {
  testing::ExpectAllSucceeded(RunRanks(3, [](const Rank& me) {
    auto pg = testing::JoinDefaultGroup();
    const int64_t n = 3 * 100;
    auto value = [](int r, int64_t i) { return std::sin(0.37 * i + r) * 3.1 + 0.01 * r; };
    for (DType dtype : kFloatTypes) {
      std::vector<double> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = value(me.rank, i);
      RawTensor t = RawTensor::FromVector(v, {n}, dtype);
      RawTensor in = t.clone();
      TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kSum)->wait());
      RawTensor out = RawTensor::Empty({100}, dtype);
      TG_DIST_CHECK_OK(pg->reduce_scatter(out, in, ReduceOp::kSum)->wait());
      const double tol = dtype == kF64 ? 1e-12 : dtype == kF32 ? 1e-5 : dtype == kF16 ? 2e-2 : 0.1;
      const std::vector<double> got = t.to_vector<double>();
      const std::vector<double> got_rs = out.to_vector<double>();
      for (int64_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int r = 0; r < 3; ++r) ref += RawTensor::Scalar(value(r, i), kF64).to(dtype).item();
        EXPECT_NEAR(got[i], ref, tol * std::max(1.0, std::abs(ref)))
            << DTypeName(dtype) << " " << i;
        if (i / 100 == me.rank) {
          EXPECT_NEAR(got_rs[i % 100], ref, tol * std::max(1.0, std::abs(ref)) / 2);
        }
      }
    }
  }));
}

// all_reduce of f16 with kSum or kAvg is the f32 sum of the ranks' values (kAvg: divided by the
// world size) rounded to f16 once, so an average is finite wherever every rank's value is: DDP's
// f16 gradients then overflow exactly where some rank's local gradient does. The old f16 path
// rounded each partial sum to f16 (2 ranks of 40000: 80000 -> inf, though the average is 40000;
// 3 ranks of 1.333984375 averaged to 1.3330078125). reduce_scatter rounds once too. bf16 and f32
// keep their results (values whose partial sums are exact in every order: the expected values
// are those of the old code as well).
TEST(Collectives, F16SumAndAverageRoundOnceAndAreFiniteWhereEveryRankIs) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Rank r's value of element kind k.
  auto f16_value = [&](int k, int r) -> double {
    switch (k) {
      case 0:
        return 40000;  // the f16 sum of 2 overflows
      case 1:
        return 65504;  // the largest f16
      case 2:
        return r == 0 ? 60000 : 30000;  // an average that is not an f16
      case 3:
        return 1.333984375;  // 3 ranks: the sum rounds, then the quotient
      case 4:
        return 1 + r * 0.00048828125 + 0.25 * (r % 2);  // mixed, sum exact in f32
      case 5:
        return r % 2 == 1 ? -50000 : 50000;  // cancels
      case 6:
        return r == 1 ? inf : 1;  // a rank overflowed: the average is inf
      default:
        return r == 0 ? nan : 2;  // a rank has NaN
    }
  };
  auto other_value = [&](int k, int r) -> double {  // bf16/f32: every partial sum exact
    switch (k) {
      case 0:
        return 40960;
      case 1:
        return 61440;
      case 2:
        return r == 0 ? 1.5 : -0.25;
      case 3:
        return 4096.0 * (r + 1);
      case 4:
        return 0.5 * r - 1;
      case 5:
        return r % 2 == 1 ? -3 : 3;
      case 6:
        return r == 1 ? inf : 1;
      default:
        return r == 0 ? nan : 2;
    }
  };
  constexpr int kKinds = 8;
  const int64_t n = 13;  // element i is of kind i % 8; not a multiple of 2, 3 or 4
  for (int world = 2; world <= 4; ++world) {
    testing::ExpectAllSucceeded(RunRanks(world, [&](const Rank& me) {
      auto pg = testing::JoinDefaultGroup();
      for (DType dtype : {kF16, kBF16, kF32}) {
        auto value = [&](int k, int r) {
          return dtype == kF16 ? f16_value(k, r) : other_value(k, r);
        };
        for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kSum}) {
          // The f32 sum of the values in `dtype` (exact here), divided in f32, rounded once.
          auto expected = [&](int64_t i) {
            double sum = 0;
            for (int r = 0; r < world; ++r) {
              sum += RawTensor::Scalar(value(i % kKinds, r), kF64).to(dtype).item();
            }
            const float reduced = op == ReduceOp::kAvg
                                      ? static_cast<float>(sum) / static_cast<float>(world)
                                      : static_cast<float>(sum);
            return RawTensor::Scalar(reduced, kF32).to(dtype).item();
          };
          auto check = [&](const RawTensor& got, int64_t first, const std::string& what) {
            const std::vector<double> v = got.to_vector<double>();
            for (int64_t j = 0; j < static_cast<int64_t>(v.size()); ++j) {
              const double e = expected(first + j);
              if (std::isnan(e)) {
                EXPECT_TRUE(std::isnan(v[j])) << what << " element " << first + j << ": " << v[j];
              } else {
                EXPECT_EQ(v[j], e) << what << " element " << first + j << " (kind "
                                   << (first + j) % kKinds << ") on " << world << " ranks";
              }
            }
          };
          std::vector<double> mine(n);
          for (int64_t i = 0; i < n; ++i) mine[i] = value(i % kKinds, me.rank);
          RawTensor t = RawTensor::FromVector(mine, {n}, dtype);
          TG_DIST_CHECK_OK(pg->all_reduce(t, op)->wait());
          check(t, 0, absl::StrCat("all_reduce ", ReduceOpName(op), " ", DTypeName(dtype)));

          // reduce_scatter: chunk c of every rank holds elements [c * 8, c * 8 + 8).
          std::vector<double> chunks(world * kKinds);
          for (int64_t i = 0; i < world * kKinds; ++i) chunks[i] = value(i % kKinds, me.rank);
          RawTensor out = RawTensor::Empty({kKinds}, dtype);
          TG_DIST_CHECK_OK(
              pg->reduce_scatter(out, RawTensor::FromVector(chunks, {world * kKinds}, dtype), op)
                  ->wait());
          check(out, 0, absl::StrCat("reduce_scatter ", ReduceOpName(op), " ", DTypeName(dtype)));
        }
      }
    }));
  }
}

// Several collectives in flight at once complete in call order with the right data; in-place
// forms (the shard is a view of the flat buffer) work.
TEST(Collectives, AsyncQueueAndInPlaceViews) {
  testing::ExpectAllSucceeded(RunRanks(2, [](const Rank& me) {
    auto pg = testing::JoinDefaultGroup();
    std::vector<RawTensor> ts;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      ts.push_back(RawTensor::Full({64}, k + me.rank, kF32));
      works.push_back(pg->all_reduce(ts.back(), ReduceOp::kSum));
    }
    for (int k = 7; k >= 0; --k) {
      TG_DIST_CHECK_OK(works[k]->wait());
      EXPECT_TRUE(works[k]->is_completed());
      EXPECT_EQ(ts[k].to_vector<float>()[17], 2 * k + 1);
    }
    // All-gather in place: this rank's input is its chunk of the output.
    RawTensor flat = RawTensor::Zeros({2, 5}, kF32);
    RawTensor shard = flat.select(0, me.rank);
    shard.fill_(me.rank + 10);
    TG_DIST_CHECK_OK(pg->all_gather(flat, shard)->wait());
    EXPECT_EQ(flat.to_vector<float>(),
              std::vector<float>({10, 10, 10, 10, 10, 11, 11, 11, 11, 11}));
    // Reduce-scatter in place: the output is this rank's chunk of the input.
    RawTensor grads = RawTensor::Full({2, 3}, me.rank + 1, kF32);
    RawTensor out = grads.select(0, me.rank);
    TG_DIST_CHECK_OK(pg->reduce_scatter(out, grads, ReduceOp::kAvg)->wait());
    EXPECT_EQ(out.to_vector<float>(), std::vector<float>({1.5, 1.5, 1.5}));
  }));
}

TEST(Collectives, ArgumentErrorsNameTheProblem) {
  DistOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.rdzv = "";
  auto pg_or = InitProcessGroup(o);
  ASSERT_TRUE(pg_or.ok()) << pg_or.status();
  ProcessGroup& pg = **pg_or;
  RawTensor m = RawTensor::Zeros({3, 4}, kF32);
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg.all_reduce(m.transpose(0, 1), ReduceOp::kSum); },
      "all_reduce on group 'default' (rank 0 of 1, gloo): tensor of shape [4, 3] must be "
      "contiguous"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg.all_reduce(RawTensor::Zeros({2}, kI32), ReduceOp::kAvg); },
      "all_reduce on group 'default' (rank 0 of 1, gloo): ReduceOp avg needs a floating dtype, "
      "got i32"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg.all_reduce(RawTensor::Zeros({2}, kU8), ReduceOp::kSum); },
      "all_reduce on group 'default' (rank 0 of 1, gloo): tensor has unsupported dtype u8 "
      "(f32, f64, f16, bf16, i32, i64)"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg.reduce_scatter(RawTensor::Zeros({3}), RawTensor::Zeros({4}), ReduceOp::kSum); },
      "reduce_scatter on group 'default' (rank 0 of 1, gloo): input must hold 1 x 3 = 3 "
      "elements (output has shape [3]), got 4 (shape [4])"));
  EXPECT_TRUE(ThrowsErrorExactly(
      [&] { pg.all_gather(RawTensor::Zeros({3}, kF16), RawTensor::Zeros({3})); },
      "all_gather on group 'default' (rank 0 of 1, gloo): output has dtype f16 but input has "
      "dtype f32"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { pg.broadcast(RawTensor::Zeros({3}), 1); },
                                 "broadcast on group 'default' (rank 0 of 1, gloo): root 1 is "
                                 "out of range for world size 1"));
  EXPECT_TRUE(ThrowsErrorExactly([&] { pg.all_reduce(RawTensor(), ReduceOp::kSum); },
                                 "all_reduce on group 'default' (rank 0 of 1, gloo): tensor is "
                                 "undefined"));
}

TEST(Collectives, MissingRankIsNamedWithinTheTimeout) {
  RunOptions options;
  options.absent_ranks = {2};
  options.dist_timeout = absl::Seconds(2);
  auto results = RunRanks(
      3,
      [](const Rank& me) {
        const absl::Time start = absl::Now();
        auto pg = InitProcessGroup();
        const absl::Duration took = absl::Now() - start;
        ASSERT_FALSE(pg.ok());
        EXPECT_EQ(pg.status().code(), absl::StatusCode::kDeadlineExceeded);
        const std::string message(pg.status().message());
        EXPECT_NE(message.find(absl::StrCat("rendezvous of group 'default' timed out after 2s on "
                                            "rank ",
                                            me.rank,
                                            ": rank 2 of world size 3 has not "
                                            "joined")),
                  std::string::npos)
            << message;
        EXPECT_GE(took, absl::Seconds(2));
        EXPECT_LT(took, absl::Seconds(6));
      },
      options);
  if (testing::IsRankProcess()) return;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0].output;
  EXPECT_TRUE(results[1].ok()) << results[1].output;
  EXPECT_FALSE(results[2].started);
}

// A rank that dies mid-run makes the others' collectives fail with a clear error within the
// timeout, and the group stays failed.
TEST(Collectives, KilledRankFailsTheOthersWithinTheTimeout) {
  RunOptions options;
  options.dist_timeout = absl::Seconds(4);
  auto results = RunRanks(
      3,
      [](const Rank& me) {
        auto pg = testing::JoinDefaultGroup();
        RawTensor t = RawTensor::Ones({1 << 12}, kF32);
        for (int step = 0; step < 5; ++step)
          TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kSum)->wait());
        if (me.rank == 2) raise(SIGKILL);
        const absl::Time start = absl::Now();
        absl::Status status;
        for (int step = 0; step < 1000 && status.ok(); ++step) {
          status = pg->all_reduce(t, ReduceOp::kSum)->wait();
        }
        const absl::Duration took = absl::Now() - start;
        ASSERT_FALSE(status.ok());
        const std::string message(status.message());
        EXPECT_NE(message.find(absl::StrCat("all_reduce on group 'default' (rank ", me.rank,
                                            " of 3, gloo) of 4096 f32 elements (sum)")),
                  std::string::npos)
            << message;
        EXPECT_LT(took, absl::Seconds(4 + 3)) << message;
        // Later collectives fail at once with the first error.
        absl::Status later = pg->barrier()->wait();
        EXPECT_FALSE(later.ok());
        EXPECT_NE(std::string(later.message()).find("the group is broken by an earlier failure"),
                  std::string::npos)
            << later.message();
        std::fflush(stdout);
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0);  // skip the group's teardown
      },
      options);
  if (testing::IsRankProcess()) return;
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0].output;
  EXPECT_TRUE(results[1].ok()) << results[1].output;
  EXPECT_EQ(results[2].signal, SIGKILL);
}

TEST(Store, WaitTimeoutNamesMissingKeysAndPrefixesIsolate) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/store_test");
  auto base = Store::Open("file://" + dir);
  ASSERT_TRUE(base.ok()) << base.status();
  auto job = (*base)->WithPrefix("job");
  auto a = job->WithPrefix("a");
  auto b = job->WithPrefix("b");
  ASSERT_TRUE(a->Set("k", "va").ok());
  ASSERT_TRUE(b->Set("k", "vb").ok());
  EXPECT_EQ(*a->Get("k", absl::Seconds(1)), "va");
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "vb");
  EXPECT_EQ(*job->Get("a/k", absl::Seconds(1)), "va");
  absl::Status s = a->Wait({"k", "x", "y"}, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "store wait timed out after 100ms; missing keys: job/a/x, job/a/y");
  EXPECT_EQ(a->Missing({"k", "x"}), std::vector<std::string>({"job/a/x"}));
}

// The file store's add: read-add-rename under an flock, so adders with their own stores on one
// directory (processes, or threads as here) never lose an update.
TEST(Store, FileStoreAddIsAtomicAcrossStores) {
  const std::string url = absl::StrCat("file://", std::getenv("TEST_TMPDIR"), "/add_test");
  auto a = Store::Open(url), b = Store::Open(url);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*(*a)->Add("n", 5), 5);
  EXPECT_EQ(*(*b)->Add("n", -7), -2);
  EXPECT_EQ(*(*b)->Get("n", absl::Seconds(1)), "-2");
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&url] {
      auto own = Store::Open(url);
      ASSERT_TRUE(own.ok());
      for (int i = 0; i < 50; ++i) ASSERT_TRUE((*own)->Add("count", 1).ok());
    });
  }
  for (std::thread& t : adders) t.join();
  EXPECT_EQ(*(*a)->Get("count", absl::Seconds(1)), "200");
  ASSERT_TRUE((*a)->Set("text", "abc").ok());
  EXPECT_EQ((*a)->Add("text", 1).status(),
            absl::FailedPreconditionError(
                "store: adding to 'text' failed: add: the value of 'text' is not an integer"));
  ASSERT_TRUE((*a)->Set("big", "9223372036854775807").ok());
  EXPECT_EQ((*a)->Add("big", 1).status().message(),
            "store: adding to 'big' failed: add: 9223372036854775807 + 1 under 'big' overflows");
}

TEST(Store, BadUrlsAndUnreachableRedis) {
  EXPECT_EQ(Store::Open("tcpx://x").status().message(),
            "store: unsupported rendezvous 'tcpx://x' (expected file:///dir, redis://host:port, "
            "tcp://host:port or torch-tcp://host:port)");
  EXPECT_EQ(Store::Open("file://relative").status().message(),
            "store: a file rendezvous needs an absolute path (file:///dir), got 'file://relative'");
  EXPECT_EQ(Store::Open("redis://h:99999").status().message(),
            "store: bad port in redis rendezvous 'redis://h:99999'");
  auto unreachable = Store::Open("redis://127.0.0.1:1");
  EXPECT_EQ(unreachable.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(unreachable.status().message().find(
                "store: cannot connect to the Redis server at 127.0.0.1:1"),
            std::string::npos)
      << unreachable.status();
}

class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<std::string, std::string>> vars)
      : vars_(vars) {
    for (auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (auto& [k, v] : vars_) unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

TEST(Init, ResolvesTorchrunOpenMpiAndFlags) {
  {
    ScopedEnv env({{"RANK", "2"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "0"},
                   {"TG_RDZV", "file:///tmp/x"},
                   {"TG_JOB_ID", "j"},
                   {"TG_DIST_TIMEOUT_S", "7"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->rank, 2);
    EXPECT_EQ(e->world_size, 4);
    EXPECT_EQ(e->local_rank, 0);
    EXPECT_EQ(e->rdzv, "file:///tmp/x");
    EXPECT_EQ(e->job_id, "j");
    EXPECT_EQ(e->timeout, absl::Seconds(7));
    DistOptions flags;
    flags.rank = 1;
    flags.rdzv = "redis://h:1";
    e = ResolveDistEnv(flags);
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->rdzv, "redis://h:1");
  }
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"TG_RDZV", "file:///tmp/y"}});
    auto e = ResolveDistEnv({});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->rank, 1);
    EXPECT_EQ(e->world_size, 2);
    EXPECT_EQ(e->local_rank, 1);
    EXPECT_EQ(e->job_id, "tapegrad");
  }
  {
    ScopedEnv env({{"RANK", "x1"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: RANK='x1' is not an integer");
  }
  {
    ScopedEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: rank 4 is out of range for world size 4");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    EXPECT_EQ(ResolveDistEnv({}).status().message(),
              "distributed init: world size 2 needs a rendezvous: pass --rdzv=file:///dir or "
              "redis://host:port, set TG_RDZV or MASTER_ADDR and MASTER_PORT, or start the "
              "processes with tools:launch");
  }
  auto single = ResolveDistEnv({});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->world_size, 1);
}

// Rendezvous through a Redis server on loopback (redis-server from Debian, started here).
TEST(Collectives, RedisRendezvous) {
  std::string port;
  pid_t server = -1;
  if (!testing::IsRankProcess()) {
    // A free port: bind to 0, read it, release it.
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = std::to_string(ntohs(addr.sin_port));
    close(fd);
    server = fork();
    if (server == 0) {
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for the server to accept connections.
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      up = Store::Open("redis://127.0.0.1:" + port).ok();
      if (!up) absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_TRUE(up) << "redis-server did not start on port " << port
                    << " (is the redis-server package installed? tools/setup.sh installs it)";
  }
  RunOptions options;
  options.rdzv = "redis://127.0.0.1:" + port;
  auto results = RunRanks(
      3,
      [](const Rank& me) {
        auto pg = testing::JoinDefaultGroup();
        RawTensor t = RawTensor::Full({10}, me.rank, kF32);
        TG_DIST_CHECK_OK(pg->all_reduce(t, ReduceOp::kMax)->wait());
        EXPECT_EQ(t.to_vector<float>()[9], 2);
      },
      options);
  if (server > 0) {
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
  }
  testing::ExpectAllSucceeded(results);
}

}  // namespace
}  // namespace tg::dist
