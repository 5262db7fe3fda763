// FP8 training across data-parallel ranks (amp/fp8.h with dist::MaxAmaxesAcrossRanks): every
// rank sees other data, yet after each update all ranks hold the same delayed-scaling state, the
// one the recipe gives for the largest amax of any rank, so their FP8 casts agree (as DDP's
// weights do). Current scaling reduces nothing: each rank's activation scale is its own.
#include "amp/fp8.h"

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "distributed/ddp.h"
#include "gtest/gtest.h"
#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tests/distributed/multiprocess.h"

namespace tg::dist {
namespace {

using testing::Rank;

// Rank r's input: the same draw scaled by r + 1 (so rank world_size - 1 has the largest amax).
RawTensor InputOf(int rank) {
  Generator gen(7);
  return RandNormal({4, 16}, gen, 0.0, 1.0 + rank);
}

float Amax(const RawTensor& t) {
  float a = 0;
  for (float v : t.to_vector<float>()) a = std::max(a, std::fabs(v));
  return a;
}

TEST(Fp8DataParallelTest, DelayedScalingStateIsTheSameOnEveryRank) {
  const int world = 3;
  auto results = testing::RunRanks(world, [](const Rank& r) {
    auto pg = testing::JoinDefaultGroup();
    Generator init(1);  // the same weights on every rank
    Tensor w0(RandNormal({8, 16}, init, 0.0, 0.1), true);
    Tensor w1(RandNormal({2, 8}, init, 0.0, 0.1), true);
    amp::Fp8TrainingOptions o;
    o.delayed.amax_history_len = 2;
    amp::Fp8Training fp8({w0, w1}, o);
    fp8.set_amax_reducer(MaxAmaxesAcrossRanks(pg, Device::Cpu()));
    Tensor h0, y;
    {
      amp::Fp8Autocast on(fp8);
      h0 = Linear(Tensor(InputOf(r.rank)), w0);
      y = Linear(h0, w1);
      on.Finish();
    }
    // The forward update used the largest input amax of any rank (the last rank's).
    const float largest = Amax(InputOf(r.world_size - 1));
    EXPECT_EQ(fp8.delayed()->scale(0, amp::Fp8Role::kInput), 448.0f / largest);
    // Backward: grad_output of layer 1 is (rank + 1) everywhere; the largest is world_size.
    Sum(MulScalar(y, 1.0 + r.rank)).backward();
    EXPECT_EQ(fp8.delayed()->scale(1, amp::Fp8Role::kGradOutput),
              57344.0f / static_cast<float>(r.world_size));
    // Every scale agrees across the ranks: its MAX and MIN over them are this rank's value.
    std::vector<float> scales;
    for (int layer = 0; layer < 2; ++layer) {
      for (amp::Fp8Role role :
           {amp::Fp8Role::kInput, amp::Fp8Role::kWeight, amp::Fp8Role::kGradOutput}) {
        scales.push_back(fp8.delayed()->scale(layer, role));
      }
    }
    RawTensor mx = RawTensor::FromVector<float>(scales, {6}), mn = mx.clone();
    ASSERT_TRUE(pg->all_reduce(mx, ReduceOp::kMax)->wait().ok());
    ASSERT_TRUE(pg->all_reduce(mn, ReduceOp::kMin)->wait().ok());
    EXPECT_EQ(mx.to_vector<float>(), scales);
    EXPECT_EQ(mn.to_vector<float>(), scales);
  });
  testing::ExpectAllSucceeded(results);
}

}  // namespace
}  // namespace tg::dist
