// tools/train/run.h: --device parsing (CheckDevice) and the host copies checkpoints are made of
// (ToHost).
#include "tools/train/run.h"

#include <gtest/gtest.h>

#include "tensor/generator.h"

namespace tg::train {
namespace {

TEST(CheckDeviceTest, ParsesCpuAndCudaAndRejectsOtherNames) {
  absl::StatusOr<Device> cpu = CheckDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CUDA", "cuda0"}) {
    const absl::StatusOr<Device> d = CheckDevice(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(d.status().message(),
              std::string("--device=") + bad + ": expected cpu, cuda or cuda:N");
  }
  // A device no machine has: the reason comes from the CUDA backend (no GPU, or no such device).
  const absl::StatusOr<Device> missing = CheckDevice("cuda:999");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.status().message().rfind("--device=cuda:999: ", 0), 0u)
      << missing.status().message();
}

TEST(ToHostTest, KeepsScalarsAndHostTensors) {
  Generator gen(0);
  StateDict sd;
  sd.tensors["w"] = RandNormal({2, 3}, gen);
  sd.scalars["step"] = 7;
  const StateDict host = ToHost(sd);
  EXPECT_TRUE(host.tensor("w").shares_storage(sd.tensor("w")));  // already on the host
  EXPECT_EQ(host.scalar("step"), 7);
}

}  // namespace
}  // namespace tg::train
