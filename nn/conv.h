// Convolution and pooling layers: Conv2d over [batch, channels, height, width] (CPU: oneDNN, or
// im2col + GEMM where oneDNN cannot; the CUDA backend adds cuDNN), Conv1d over [batch,
// channels, length] (Conv2d's kernels on a height of 1), ConvTranspose2d (composed of Conv2d:
// the input dilated by the stride, padded, and convolved with the flipped kernel, so its
// gradient is Conv2d's), MaxPool2d and AvgPool2d. Initialisation as PyTorch: weight and bias
// U(-1/sqrt(fan_in), +), with fan_in = weight.size(1) * kernel elements.
//
//   tg::nn::Conv2d conv(tg::nn::Conv2dOptions(1, 32, 3).padding(1));
//   tg::nn::MaxPool2d pool(2);   // MaxPool2dOptions(2).stride(1) for others
//   tg::Tensor y = pool(tg::relu(conv(images)));   // [b, 1, 28, 28] -> [b, 32, 14, 14]
#ifndef TAPEGRAD_NN_CONV_H_
#define TAPEGRAD_NN_CONV_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "autograd/factories.h"
#include "nn/module.h"
#include "nn/options.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace nn {

// A (height, width) pair: kernel sizes, strides, paddings; one number or two, as libtorch's.
using Size2 = ExpandingArray<2>;

// Conv2d's options, as torch::nn::Conv2dOptions: Conv2dOptions(3, 64, 3).padding(1) or
// Conv2dOptions(3, 64, {3, 5}).padding({1, 2}).
class Conv2dOptions {
 public:
  Conv2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
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
  Conv2dImpl(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
             Generator& gen)  // stride 1, no padding, with a bias
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size), gen) {}
  // libtorch's constructors: drawn from the default generator (tg::manual_seed).
  explicit Conv2dImpl(const Conv2dOptions& options) : Conv2dImpl(options, DefaultGenerator()) {}
  Conv2dImpl(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size), DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Conv2dOptions& options() const { return options_; }

  Tensor weight;  // [out, in, kh, kw]
  Tensor bias;    // [out] or undefined

 private:
  Conv2dOptions options_;
  Conv2dParams params_;  // stride, padding and dilation of options_, as tg::Conv2d takes them
};
TG_MODULE(Conv2d);

// Conv1d's options, as torch::nn::Conv1dOptions: Conv1dOptions(16, 32, 3).stride(2).padding(1).
class Conv1dOptions {
 public:
  Conv1dOptions(int64_t in_channels, int64_t out_channels, ExpandingArray<1> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  TG_ARG(int64_t, in_channels);
  TG_ARG(int64_t, out_channels);
  TG_ARG(ExpandingArray<1>, kernel_size);
  TG_ARG(ExpandingArray<1>, stride) = 1;
  TG_ARG(ExpandingArray<1>, padding) = 0;
  TG_ARG(ExpandingArray<1>, dilation) = 1;
  TG_ARG(bool, bias) = true;
};

// [N, C, L] (or [C, L]) -> [N, out, L']; weight [out, in, k]. Conv2d's kernels (and autocast
// entry "Conv2d") on the input viewed as [N, C, 1, L].
class Conv1dImpl : public Module {
 public:
  Conv1dImpl(const Conv1dOptions& options, Generator& gen);
  explicit Conv1dImpl(const Conv1dOptions& options) : Conv1dImpl(options, DefaultGenerator()) {}
  Conv1dImpl(int64_t in_channels, int64_t out_channels, ExpandingArray<1> kernel_size)
      : Conv1dImpl(Conv1dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Conv1dOptions& options() const { return options_; }

  Tensor weight;  // [out, in, k]
  Tensor bias;    // [out] or undefined

 private:
  Conv1dOptions options_;
};
TG_MODULE(Conv1d);

// ConvTranspose2d's options, as torch::nn::ConvTranspose2dOptions:
// ConvTranspose2dOptions(256, 128, 3).stride(2).padding(1).output_padding(1).bias(false).
class ConvTranspose2dOptions {
 public:
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  TG_ARG(int64_t, in_channels);
  TG_ARG(int64_t, out_channels);
  TG_ARG(Size2, kernel_size);
  TG_ARG(Size2, stride) = 1;
  TG_ARG(Size2, padding) = 0;
  TG_ARG(Size2, output_padding) = 0;  // below max(stride, dilation), as PyTorch requires
  TG_ARG(Size2, dilation) = 1;
  TG_ARG(int64_t, groups) = 1;  // 1 only
  TG_ARG(bool, bias) = true;
};

// The transposed convolution (the gradient of Conv2d with respect to its input): [N, in, H, W]
// -> [N, out, (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1, ...];
// weight [in, out, kh, kw] as PyTorch's.
class ConvTranspose2dImpl : public Module {
 public:
  ConvTranspose2dImpl(const ConvTranspose2dOptions& options, Generator& gen);
  explicit ConvTranspose2dImpl(const ConvTranspose2dOptions& options)
      : ConvTranspose2dImpl(options, DefaultGenerator()) {}
  ConvTranspose2dImpl(int64_t in_channels, int64_t out_channels, Size2 kernel_size)
      : ConvTranspose2dImpl(ConvTranspose2dOptions(in_channels, out_channels, kernel_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const ConvTranspose2dOptions& options() const { return options_; }

  Tensor weight;  // [in, out, kh, kw]
  Tensor bias;    // [out] or undefined

 private:
  ConvTranspose2dOptions options_;
};
TG_MODULE(ConvTranspose2d);

// MaxPool2d's options, as torch::nn::MaxPool2dOptions; the stride defaults to the kernel size
// (PyTorch's default), padding to 0.
class MaxPool2dOptions {
 public:
  MaxPool2dOptions(Size2 kernel_size)  // NOLINT: MaxPool2d(2), MaxPool2d({2, 2})
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TG_ARG(Size2, kernel_size);
  TG_ARG(Size2, stride);
  TG_ARG(Size2, padding) = 0;
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

// AvgPool2d's options, as torch::nn::AvgPool2dOptions (nn/functional.h's avg_pool2d says what
// each means); the stride defaults to the kernel size.
class AvgPool2dOptions {
 public:
  AvgPool2dOptions(Size2 kernel_size)  // NOLINT: AvgPool2d(2)
      : kernel_size_(kernel_size), stride_(kernel_size) {}
  TG_ARG(Size2, kernel_size);
  TG_ARG(Size2, stride);
  TG_ARG(Size2, padding) = 0;
  TG_ARG(bool, ceil_mode) = false;  // false only
  TG_ARG(bool, count_include_pad) = true;
  TG_ARG(std::optional<int64_t>, divisor_override);
};

class AvgPool2dImpl : public Module {
 public:
  explicit AvgPool2dImpl(const AvgPool2dOptions& options);
  explicit AvgPool2dImpl(Size2 kernel_size) : AvgPool2dImpl(AvgPool2dOptions(kernel_size)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const AvgPool2dOptions& options() const { return options_; }

 private:
  AvgPool2dOptions options_;
};
TG_MODULE(AvgPool2d);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_CONV_H_
