#include "tensor/state_dict.h"

#include <gtest/gtest.h>

#include "tests/tensor/throws.h"

namespace tg {
namespace {

TEST(StateDictTest, MergeAndSubRoundTrip) {
  StateDict inner;
  inner.scalars["step"] = 7;
  inner.tensors["m"] = RawTensor::FromVector<float>({1, 2}, {2});
  StateDict outer;
  outer.scalars["scale"] = 65536;
  outer.Merge("opt.", inner);
  EXPECT_EQ(outer.scalar("opt.step"), 7);
  EXPECT_EQ(outer.scalar("scale"), 65536);
  StateDict back = outer.Sub("opt.");
  EXPECT_EQ(back.scalars.size(), 1u);
  EXPECT_EQ(back.scalar("step"), 7);
  EXPECT_EQ(back.tensor("m").to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_TRUE(outer.Sub("op").has_scalar("t.step"));
  EXPECT_FALSE(outer.Sub("zzz").has_scalar("step"));
}

TEST(StateDictTest, MissingAndDuplicateKeysAreNamed) {
  StateDict sd;
  sd.scalars["a"] = 1;
  EXPECT_TRUE(
      testing::ThrowsErrorExactly([&] { sd.scalar("b"); }, "StateDict: missing scalar 'b'"));
  EXPECT_TRUE(
      testing::ThrowsErrorExactly([&] { sd.tensor("a"); }, "StateDict: missing tensor 'a'"));
  StateDict other;
  other.scalars["a"] = 2;
  EXPECT_TRUE(testing::ThrowsErrorExactly([&] { sd.Merge("", other); },
                                          "StateDict::Merge: duplicate scalar 'a'"));
}

}  // namespace
}  // namespace tg
