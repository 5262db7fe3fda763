// Every row of the differentiable-op table (tests/autograd/op_table.h) on CUDA against the CPU:
// the output and the gradients of every input, in f32, f16 and bf16, within the row's CUDA
// tolerance. Skips without a GPU; the CPU-side drivers of the same table are op_table_test.cc.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/device_backend.h"
#include "tests/autograd/op_table.h"
#include "tests/tensor/op_table_support.h"

namespace tg {
namespace {

using testing::Describe;
using testing::ErrorOf;
using testing::MakeInputs;
using testing::OpRow;
using testing::OpTable;
using testing::OutputAndGrads;
using testing::SeedOf;
using testing::Tol;
using testing::ValueMismatches;

TEST(OpTableCuda, EveryRowForwardAndGradientsMatchTheCpu) {
  if (DeviceCount(DeviceType::kCuda) == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<OpRow>& table = OpTable();
  for (size_t r = 0; r < table.size(); ++r) {
    const OpRow& row = table[r];
    for (DType dtype : {kF32, kF16, kBF16}) {
      const std::string what = absl::StrCat(Describe(row), " [", DTypeName(dtype), "]");
      SCOPED_TRACE(what);
      VariableList cpu, gpu;
      const std::string error = ErrorOf([&] {
        cpu = OutputAndGrads(row.run, MakeInputs(row, SeedOf(row), dtype));
        gpu = OutputAndGrads(row.run, MakeInputs(row, SeedOf(row), dtype, Device::Cuda(0)));
      });
      ASSERT_EQ(error, "");
      ASSERT_EQ(cpu.size(), gpu.size());
      const Tol tol = row.cuda.For(dtype);
      for (size_t i = 0; i < cpu.size(); ++i) {
        const std::string output = i == 0 ? "output" : absl::StrCat("gradient of input ", i - 1);
        ASSERT_TRUE(gpu[i].defined()) << what << " " << output;
        EXPECT_TRUE(gpu[i].data().device().is_cuda()) << what << " " << output;
        EXPECT_EQ(gpu[i].dtype(), cpu[i].dtype()) << what << " " << output;
        ASSERT_EQ(gpu[i].shape(), cpu[i].shape()) << what << " " << output;
        const std::string m =
            ValueMismatches(cpu[i].data(), gpu[i].data().to(Device::Cpu()), tol, 1, "CPU", "CUDA");
        EXPECT_TRUE(m.empty()) << what << " " << output << ":" << m
                               << "\n  tolerance: " << row.cuda.why;
      }
    }
  }
}

}  // namespace
}  // namespace tg
