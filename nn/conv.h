// Conv2d and MaxPool2d layers over [batch, channels, height, width] (CPU: oneDNN, or im2col +
// GEMM where oneDNN cannot; the CUDA backend adds cuDNN). Initialisation as PyTorch: weight and
// bias U(-1/sqrt(fan_in), +), with fan_in = in_channels * kh * kw.
//
//   tg::nn::Conv2d conv(tg::nn::Conv2dOptions(1, 32, {3, 3}).padding({1, 1}), gen);
//   tg::nn::MaxPool2d pool({2, 2});   // MaxPool2dOptions({2, 2}).stride({1, 1}) for others
//   tg::Tensor y = pool(tg::Relu(conv(images)));   // [b, 1, 28, 28] -> [b, 32, 14, 14]
#ifndef TAPEGRAD_NN_CONV_H_
#define TAPEGRAD_NN_CONV_H_

#include <array>
#include <cstdint>
#include <string>

#include "autograd/factories.h"
#include "nn/module.h"
#include "nn/options.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace nn {

// A (height, width) pair: kernel sizes, strides, paddings.
using Size2 = std::array<int64_t, 2>;

// Conv2d's options, as torch::nn::Conv2dOptions: Conv2dOptions(3, 64, {3, 3}).padding({1, 1}).
class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  TG_ARG(int64_t, in_channels);
  TG_ARG(int64_t, out_channels);
  TG_ARG(Size2, kernel_size);
  TG_ARG(Size2, stride) = {1, 1};
  TG_ARG(Size2, padding) = {0, 0};
  TG_ARG(Size2, dilation) = {1, 1};
  TG_ARG(bool, bias) = true;
};

// Runs in the autocast dtype when "Conv2d" is in the guard's lower-precision-safe list.
// Seeding: the weight is drawn from `gen` first, then the bias.
class Conv2dImpl : public Module {
 public:
  Conv2dImpl(const Conv2dOptions& options, Generator& gen);
  Conv2dImpl(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size,
             Generator& gen)  // stride 1, no padding, with a bias
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size), gen) {}
  // libtorch's constructors: drawn from the default generator (tg::manual_seed).
  explicit Conv2dImpl(const Conv2dOptions& options) : Conv2dImpl(options, DefaultGenerator()) {}
  Conv2dImpl(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size)
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size), DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Tensor& weight() const { return weight_; }  // [out, in, kh, kw]
  const Tensor& bias() const { return bias_; }      // [out] or undefined
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Conv2dParams params_;  // stride, padding and dilation of options_, as tg::Conv2d takes them
  Tensor weight_, bias_;
};
TG_MODULE(Conv2d);

// MaxPool2d's options, as torch::nn::MaxPool2dOptions; the stride defaults to the kernel size
// (PyTorch's default), padding to 0.
class MaxPool2dOptions {
 public:
  MaxPool2dOptions(std::array<int64_t, 2> kernel_size)  // NOLINT: MaxPool2d({2, 2})
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TG_ARG(Size2, kernel_size);
  TG_ARG(Size2, stride);
  TG_ARG(Size2, padding) = {0, 0};
};

class MaxPool2dImpl : public Module {
 public:
  explicit MaxPool2dImpl(const MaxPool2dOptions& options);
  explicit MaxPool2dImpl(Size2 kernel_size) : MaxPool2dImpl(MaxPool2dOptions(kernel_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const MaxPool2dOptions& options() const { return options_; }

 private:
  MaxPool2dOptions options_;
};
TG_MODULE(MaxPool2d);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_CONV_H_
