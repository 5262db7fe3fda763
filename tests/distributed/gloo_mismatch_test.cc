// Ranks that issue different collectives on a Gloo group (sizes, dtypes, ops, roots, or out of
// step): gloo's TCP transport used to abort the receiving process (gloo::EnforceNotMet thrown on
// its event-loop thread) or complete with wrong data. Now every rank's Work fails within the
// timeout with an error naming what the other ranks issued, the group stays broken with that
// error, and no rank aborts or hangs.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "distributed/ddp.h"
#include "distributed/process_group.h"
#include "gtest/gtest.h"
#include "nn/layers.h"
#include "tensor/generator.h"
#include "tensor/tensor.h"
#include "tests/distributed/multiprocess.h"
#include "tests/tensor/throws.h"

namespace tg::dist {
namespace {

using testing::Rank;
using testing::RunOptions;
using testing::RunRanks;

constexpr absl::Duration kTimeout = absl::Seconds(2);

// A short collective timeout (mismatches are reported after it) and a kill deadline.
RunOptions MismatchRunOptions() {
  RunOptions options;
  options.dist_timeout = kTimeout;
  options.deadline = absl::Seconds(60);
  return options;
}

// Every rank waits here until all have made their checks, so that none exits (closing its
// connections) while another is still finding out why its collective failed: on a busy machine
// the slower rank then saw "Connection closed by peer" first. A peer that has exited is another
// failure than the one these tests are about. Through marker files in the run's fresh
// rendezvous directory (TG_RDZV=file:///dir), not through the broken group.
void WaitForEveryRank(const Rank& me) {
  const char* rdzv = std::getenv("TG_RDZV");
  ASSERT_NE(rdzv, nullptr);
  const std::string dir = std::string(rdzv).substr(std::string("file://").size());
  const auto marker = [&](int r) { return absl::StrCat(dir, "/checks_done_", r); };
  std::ofstream(marker(me.rank)).put('1');
  for (int r = 0; r < me.world_size; ++r) {
    // Bounded by RunRanks' deadline, which kills a rank that waits forever.
    while (!std::filesystem::exists(marker(r))) absl::SleepFor(absl::Milliseconds(5));
  }
}

// Rank `rank` issues its collective of a mismatched pair.
using Issue = std::function<std::shared_ptr<Work>(ProcessGroup& pg, int rank)>;

// "all_reduce on group 'default' (rank 1 of 2, gloo) of 12 f32 elements (sum)".
std::string Described(const std::string& signature, int rank, int world) {
  const size_t space = signature.find(' ');
  return absl::StrCat(signature.substr(0, space), " on group 'default' (rank ", rank, " of ",
                      world, ", gloo)",
                      space == std::string::npos ? "" : signature.substr(space));
}

std::string Mismatch(const std::string& signature, int rank, int world, int collective,
                     const std::string& others) {
  return absl::StrCat(Described(signature, rank, world),
                      " failed: the ranks issued different collectives as the group's "
                      "collective #",
                      collective, ": ", others,
                      " (every rank must issue the same collectives in the same order with the "
                      "same arguments)");
}

// Runs `issue` on every rank after one matching all_reduce (so the mismatch is collective #2);
// rank r's wait() must fail with expected(r), at once for later collectives too.
void ExpectEveryRankFails(int world, const Issue& issue,
                          const std::function<std::string(int rank)>& expected) {
  const RunOptions options = MismatchRunOptions();
  testing::ExpectAllSucceeded(RunRanks(
      world,
      [&](const Rank& me) {
        auto pg = testing::JoinDefaultGroup();
        RawTensor warm = RawTensor::Ones({8}, kF32);
        TG_DIST_CHECK_OK(pg->all_reduce(warm, ReduceOp::kSum)->wait());
        EXPECT_EQ(warm.to_vector<float>()[0], world);
        const absl::Time start = absl::Now();
        const absl::Status status = issue(*pg, me.rank)->wait();
        EXPECT_LT(absl::Now() - start, kTimeout + absl::Seconds(6));
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
        EXPECT_EQ(std::string(status.message()), expected(me.rank));
        const absl::Status later = pg->barrier()->wait();
        EXPECT_EQ(std::string(later.message()),
                  absl::StrCat("barrier on group 'default' (rank ", me.rank, " of ", world,
                               ", gloo) failed: the group is broken by an earlier failure: ",
                               expected(me.rank)));
        WaitForEveryRank(me);
      },
      options));
}

// Two ranks: rank 0 issues `sig0`, rank 1 `sig1`.
void ExpectPairFails(const Issue& issue, const std::string& sig0, const std::string& sig1) {
  ExpectEveryRankFails(2, issue, [&](int rank) {
    return rank == 0 ? Mismatch(sig0, 0, 2, 2, "rank 1 issued " + sig1)
                     : Mismatch(sig1, 1, 2, 2, "rank 0 issued " + sig0);
  });
}

// The issue: two ranks with different models. DDP's construction broadcasts rank 0's parameters
// (40 elements of Linear(4, 8) against 45 of Linear(4, 9)): it throws on both ranks.
TEST(GlooMismatch, DdpWithDifferentModels) {
  const RunOptions options = MismatchRunOptions();
  testing::ExpectAllSucceeded(RunRanks(
      2,
      [](const Rank& me) {
        auto pg = testing::JoinDefaultGroup();
        Generator gen(7);
        auto model = std::make_shared<nn::LinearImpl>(4, me.rank == 0 ? 8 : 9, gen);
        const std::string mine = me.rank == 0 ? "40" : "45";
        const std::string theirs = me.rank == 0 ? "45" : "40";
        EXPECT_TRUE(tg::testing::ThrowsErrorExactly(
            [&] { DistributedDataParallel ddp(model, pg); },
            "DistributedDataParallel: broadcast of the parameters from rank 0 failed: " +
                Mismatch("broadcast of " + mine + " f32 elements from rank 0", me.rank, 2, 1,
                         absl::StrCat("rank ", 1 - me.rank, " issued broadcast of ", theirs,
                                      " f32 elements from rank 0"))));
        WaitForEveryRank(me);
      },
      options));
}

// All-reduces of different sizes (the receiving rank
// aborted: "op.preamble.length <= op.nbytes. 1200 vs 1000").
TEST(GlooMismatch, AllReduceSizes) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return pg.all_reduce(RawTensor::Ones({rank == 0 ? 1000 : 1200}, kF32), ReduceOp::kSum);
      },
      "all_reduce of 1000 f32 elements (sum)", "all_reduce of 1200 f32 elements (sum)");
}

// f32 against f64 aborted like a size mismatch; f32 against i32 (the same bytes) reduced the
// bits of one dtype as the other.
TEST(GlooMismatch, AllReduceDtypes) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return pg.all_reduce(RawTensor::Ones({100}, rank == 0 ? kF32 : kF64), ReduceOp::kSum);
      },
      "all_reduce of 100 f32 elements (sum)", "all_reduce of 100 f64 elements (sum)");
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return pg.all_reduce(RawTensor::Ones({100}, rank == 0 ? kF32 : kI32), ReduceOp::kSum);
      },
      "all_reduce of 100 f32 elements (sum)", "all_reduce of 100 i32 elements (sum)");
}

// Different reductions of the same tensor gave each rank a different result.
TEST(GlooMismatch, AllReduceOps) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return pg.all_reduce(RawTensor::Ones({100}, kF32),
                             rank == 0 ? ReduceOp::kSum : ReduceOp::kMax);
      },
      "all_reduce of 100 f32 elements (sum)", "all_reduce of 100 f32 elements (max)");
}

TEST(GlooMismatch, AllGatherAndReduceScatterSizes) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        const int64_t n = rank == 0 ? 100 : 120;
        return pg.all_gather(RawTensor::Zeros({2 * n}, kF32), RawTensor::Ones({n}, kF32));
      },
      "all_gather of 100 f32 elements per rank", "all_gather of 120 f32 elements per rank");
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        const int64_t n = rank == 0 ? 100 : 120;
        return pg.reduce_scatter(RawTensor::Zeros({n}, kF32), RawTensor::Ones({2 * n}, kF32),
                                 ReduceOp::kSum);
      },
      "reduce_scatter of 200 f32 elements (sum)", "reduce_scatter of 240 f32 elements (sum)");
}

// A bigger broadcast on the receiving rank completed with its tail unchanged; different roots.
TEST(GlooMismatch, BroadcastSizesAndRoots) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return pg.broadcast(RawTensor::Ones({rank == 0 ? 100 : 120}, kF32), 0);
      },
      "broadcast of 100 f32 elements from rank 0", "broadcast of 120 f32 elements from rank 0");
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) { return pg.broadcast(RawTensor::Ones({100}, kF32), rank); },
      "broadcast of 100 f32 elements from rank 0", "broadcast of 100 f32 elements from rank 1");
}

TEST(GlooMismatch, DifferentOps) {
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        RawTensor t = RawTensor::Ones({100}, kF32);
        return rank == 0 ? pg.all_reduce(t, ReduceOp::kSum) : pg.broadcast(t, 0);
      },
      "all_reduce of 100 f32 elements (sum)", "broadcast of 100 f32 elements from rank 0");
  ExpectPairFails(
      [](ProcessGroup& pg, int rank) {
        return rank == 0 ? pg.barrier() : pg.all_reduce(RawTensor::Ones({4}, kF32), ReduceOp::kMin);
      },
      "barrier", "all_reduce of 4 f32 elements (min)");
}

// Three ranks, one of them different: every rank names the ranks that differ from it.
TEST(GlooMismatch, OneOfThreeRanks) {
  const std::string same = "all_reduce of 300 f32 elements (sum)";
  const std::string odd = "all_reduce of 301 f32 elements (sum)";
  ExpectEveryRankFails(
      3,
      [](ProcessGroup& pg, int rank) {
        return pg.all_reduce(RawTensor::Ones({rank == 2 ? 301 : 300}, kF32), ReduceOp::kSum);
      },
      [&](int rank) {
        return rank == 2 ? Mismatch(odd, 2, 3, 2, "ranks 0, 1 issued " + same)
                         : Mismatch(same, rank, 3, 2, "rank 2 issued " + odd);
      });
}

// A rank that skips a collective is out of step: the next one of the same size is not matched
// with its predecessor on the other rank (that would mix different steps' data).
TEST(GlooMismatch, SkippedCollective) {
  const RunOptions options = MismatchRunOptions();
  testing::ExpectAllSucceeded(RunRanks(
      2,
      [](const Rank& me) {
        auto pg = testing::JoinDefaultGroup();
        const std::string sig8 = "all_reduce of 8 f32 elements (sum)";
        const std::string sig1000 = "all_reduce of 1000 f32 elements (sum)";
        if (me.rank == 0) {
          auto first = pg->all_reduce(RawTensor::Ones({8}, kF32), ReduceOp::kSum);
          auto second = pg->all_reduce(RawTensor::Ones({1000}, kF32), ReduceOp::kSum);
          const std::string expected = Mismatch(sig8, 0, 2, 1, "rank 1 issued " + sig1000);
          EXPECT_EQ(std::string(first->wait().message()), expected);
          EXPECT_EQ(std::string(second->wait().message()),
                    absl::StrCat(Described(sig1000, 0, 2),
                                 " failed: the group is broken by an earlier failure: ", expected));
        } else {
          auto only = pg->all_reduce(RawTensor::Ones({1000}, kF32), ReduceOp::kSum);
          EXPECT_EQ(std::string(only->wait().message()),
                    Mismatch(sig1000, 1, 2, 1, "rank 0 issued " + sig8));
        }
        WaitForEveryRank(me);
      },
      options));
}

}  // namespace
}  // namespace tg::dist
