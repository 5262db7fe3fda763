// train/run_main.h RunMain: every allocation failure ends a training binary with exit 1 and a
// message, as a tg::Error does: the CPU allocator's own error, and a std::bad_alloc from any other
// host allocation (a std::vector of a reader or a kernel), which before ended in std::terminate.
#include "train/run_main.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace tg::train {
namespace {

TEST(RunMainTest, BadAllocIsACleanOutOfMemoryError) {
  ::testing::internal::CaptureStderr();
  const int rc = RunMain("train_x", []() -> int { throw std::bad_alloc(); });
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "train_x: out of memory: a host allocation failed (std::bad_alloc)\n");
}

TEST(RunMainTest, AVectorThatCannotBeAllocated) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts the process on an allocation beyond its maximum (even "
                  "with allocator_may_return_null=1, operator new reports it as fatal) instead of "
                  "throwing std::bad_alloc; the plain build runs this test";
#endif
  ::testing::internal::CaptureStderr();
  const int rc = RunMain("train_x", [] {
    std::vector<float> v(size_t{1} << 60);  // 4 EiB
    return static_cast<int>(v.size());
  });
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "train_x: out of memory: a host allocation failed (std::bad_alloc)\n");
}

TEST(RunMainTest, TheTensorAllocatorsErrorAsBefore) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts the process on an allocation beyond its maximum (even "
                  "with allocator_may_return_null=1, its malloc reports it as fatal) instead of "
                  "returning null; the plain build runs this test";
#endif
  ::testing::internal::CaptureStderr();
  const int rc = RunMain("train_x", [] {
    return static_cast<int>(RawTensor::Empty({int64_t{1} << 50}).numel());  // 4 PiB of f32
  });
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "train_x: CPU allocator: out of memory allocating 4503599627370496 bytes\n");
}

TEST(RunMainTest, ReturnsTheBodysExitCode) {
  EXPECT_EQ(RunMain("train_x", [] { return 7; }), 7);
}

}  // namespace
}  // namespace tg::train
