// Conv2d and MaxPool2d layers over [batch, channels, height, width] (CPU: oneDNN, or im2col +
// GEMM where oneDNN cannot; the CUDA backend adds cuDNN). Initialisation as PyTorch: weight and
// bias U(-1/sqrt(fan_in), +), with fan_in = in_channels * kh * kw.
//
//   tg::nn::Conv2d conv(1, 32, {3, 3}, gen, {.padding = {1, 1}});
//   tg::nn::MaxPool2d pool({2, 2});
//   tg::Variable y = pool(tg::Relu(conv(images)));   // [b, 1, 28, 28] -> [b, 32, 14, 14]
#ifndef TAPEGRAD_NN_CONV_H_
#define TAPEGRAD_NN_CONV_H_

#include <array>
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace nn {

// Runs in the autocast dtype when "Conv2d" is in the guard's lower-precision-safe list.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel, Generator& gen,
         Conv2dParams params = {}, bool bias = true);
  Variable forward(const Variable& x) override;
  std::string extra_repr() const override;
  const Variable& weight() const { return weight_; }  // [out, in, kh, kw]
  const Variable& bias() const { return bias_; }      // [out] or undefined

 private:
  int64_t in_, out_;
  std::array<int64_t, 2> kernel_;
  Conv2dParams params_;
  Variable weight_, bias_;
};

// stride defaults to the kernel size, as in PyTorch.
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                     std::array<int64_t, 2> padding = {0, 0});
  Variable forward(const Variable& x) override;
  std::string extra_repr() const override;

 private:
  std::array<int64_t, 2> kernel_, stride_, padding_;
};

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_CONV_H_
