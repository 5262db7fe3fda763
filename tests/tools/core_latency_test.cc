// tools/bench/core_latency: the phase rule (exact) and the probe's answers with one CPU and with
// two.
#include "tools/bench/core_latency.h"

#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tg::bench {
namespace {

const double kNan = std::numeric_limits<double>::quiet_NaN();

TEST(SameCorePhase, AllWithinTwiceTheSmallest) {
  EXPECT_TRUE(SameCorePhase({}));
  EXPECT_TRUE(SameCorePhase({380}));
  EXPECT_TRUE(SameCorePhase({66, 90, 132}));     // 132 = 2 x 66
  EXPECT_FALSE(SameCorePhase({66, 90, 133}));
  EXPECT_FALSE(SameCorePhase({70, 72, 390, 71}));  // one probe in the far placement
  EXPECT_TRUE(SameCorePhase({360, 410, 390}));
}

TEST(SameCorePhase, LeavesOutOneCpuProbes) {
  EXPECT_TRUE(SameCorePhase({kNan, kNan}));
  EXPECT_TRUE(SameCorePhase({kNan, 70, 75}));
  EXPECT_FALSE(SameCorePhase({70, kNan, 390}));
}

// Runs fn with this thread's affinity mask limited to its first `count` CPUs, then restores it.
template <typename Fn>
void WithCpus(int count, Fn fn) {
  cpu_set_t saved, limited;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  CPU_ZERO(&limited);
  int taken = 0;
  for (int c = 0; c < CPU_SETSIZE && taken < count; ++c) {
    if (CPU_ISSET(c, &saved)) {
      CPU_SET(c, &limited);
      ++taken;
    }
  }
  if (taken < count) GTEST_SKIP() << "needs " << count << " CPUs, has " << taken;
  ASSERT_EQ(sched_setaffinity(0, sizeof(limited), &limited), 0);
  fn();
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
}

TEST(CoreRoundTripNs, NanWithOneCpu) {
  WithCpus(1, [] { EXPECT_TRUE(std::isnan(CoreRoundTripNs(100))); });
}

TEST(CoreRoundTripNs, PositiveWithTwoCpusAndMaskRestored) {
  WithCpus(2, [] {
    cpu_set_t before, after;
    ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
    // 100 trips: on a loaded machine a trip can wait for a scheduler slice (milliseconds).
    const double ns = CoreRoundTripNs(100);
    ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
    // A round trip is two cache-line transfers: more than a nanosecond, and finite.
    EXPECT_GT(ns, 1.0);
    EXPECT_TRUE(std::isfinite(ns));
    EXPECT_TRUE(CPU_EQUAL(&before, &after)) << "the probe left the calling thread pinned";
  });
}

}  // namespace
}  // namespace tg::bench
