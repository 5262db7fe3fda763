// Every row of the differentiable-op table (tests/autograd/op_table.h) on every registered device
// besides the CPU (tensor/kernel_table.h: DevicesToTestAgainstTheCpu; CUDA today) against the
// CPU: the output and the gradients of every input, in f32, f16 and bf16, within the row's device
// tolerance (OpRow::cuda, measured on CUDA). Skips when the binary has no such device; the
// CPU-side drivers of the same table are op_table_test.cc.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "tensor/kernel_table.h"
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

TEST(OpTableDevices, EveryRowForwardAndGradientsMatchTheCpu) {
  const std::vector<Device> devices = DevicesToTestAgainstTheCpu();
  if (devices.empty()) GTEST_SKIP() << "no device besides the CPU";
  const std::vector<OpRow>& table = OpTable();
  for (const Device device : devices) {
    const std::string name = DeviceTypeDisplayName(device.type);
    for (size_t r = 0; r < table.size(); ++r) {
      const OpRow& row = table[r];
      for (DType dtype : {kF32, kF16, kBF16}) {
        const std::string what =
            absl::StrCat(device.ToString(), ": ", Describe(row), " [", DTypeName(dtype), "]");
        SCOPED_TRACE(what);
        VariableList cpu, out;
        const std::string error = ErrorOf([&] {
          cpu = OutputAndGrads(row.run, MakeInputs(row, SeedOf(row), dtype));
          out = OutputAndGrads(row.run, MakeInputs(row, SeedOf(row), dtype, device));
        });
        ASSERT_EQ(error, "");
        ASSERT_EQ(cpu.size(), out.size());
        const Tol tol = row.cuda.For(dtype);
        for (size_t i = 0; i < cpu.size(); ++i) {
          const std::string output = i == 0 ? "output" : absl::StrCat("gradient of input ", i - 1);
          ASSERT_TRUE(out[i].defined()) << what << " " << output;
          EXPECT_EQ(out[i].data().device(), device) << what << " " << output;
          EXPECT_EQ(out[i].dtype(), cpu[i].dtype()) << what << " " << output;
          ASSERT_EQ(out[i].shape(), cpu[i].shape()) << what << " " << output;
          const std::string m =
              ValueMismatches(cpu[i].data(), out[i].data().to(Device::Cpu()), tol, 1, "CPU", name);
          EXPECT_TRUE(m.empty()) << what << " " << output << ":" << m
                                 << "\n  tolerance: " << row.cuda.why;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tg
