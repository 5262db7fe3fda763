// A small CPU forward pass through the tensor library: a linear layer (matmul + bias), GELU,
// layer norm, softmax and cross-entropy on seeded random data, in f32 and in f16 (computed in
// f32, rounded like a GPU would).
//
//   bazel run //tools:demo
#include <cmath>
#include <cstdio>

#include "tensor/generator.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace {

void Run(tg::DType dtype) {
  tg::Generator gen(1234);
  const int64_t batch = 8, in = 64, out = 10;
  const tg::RawTensor x = tg::RandNormal({batch, in}, gen, 0, 1, dtype);       // [8, 64]
  const tg::RawTensor w = tg::RandNormal({in, out}, gen, 0, 1.0 / 8, dtype);   // [64, 10]
  const tg::RawTensor b = tg::RandUniform({out}, gen, -0.1, 0.1, dtype);       // [10]
  const tg::RawTensor targets = tg::RawTensor::Arange(0, batch, 1, tg::kI64);  // [8]
  const tg::RawTensor h = tg::Gelu(tg::Add(tg::Matmul(x, w), b));              // [8, 10]
  const tg::RawTensor normed =
      tg::LayerNorm(h, tg::RawTensor(), tg::RawTensor()).output;  // [8, 10]
  const tg::RawTensor probs = tg::Softmax(normed);                // [8, 10]
  const tg::RawTensor loss = tg::CrossEntropy(normed, targets);   // []
  std::printf("%s: logits row 0 %s\n", tg::DTypeName(dtype),
              normed.select(0, 0).ToString().c_str());
  std::printf("%s: softmax row 0 sums to %.6f, argmax %s\n", tg::DTypeName(dtype),
              tg::Sum(probs.select(0, 0)).item(), tg::Argmax(probs, -1).ToString().c_str());
  std::printf("%s: cross-entropy %.6f (uniform guess would be %.6f)\n\n", tg::DTypeName(dtype),
              loss.item(), std::log(10.0));
}

}  // namespace

int main() {
  std::printf("tapegrad demo: linear -> gelu -> layer_norm -> softmax / cross-entropy\n\n");
  Run(tg::kF32);
  Run(tg::kF16);
  Run(tg::kBF16);
  return 0;
}
