// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout and Dropout2d, activations,
// Flatten, plus an MLP (the containers are nn/container.h, included here). Initialisation follows
// PyTorch's defaults and draws from the default generator (tg::manual_seed) or from the
// tg::Generator passed to the constructor. Parameters are public members, as in libtorch
// (`fc->weight`, `fc->bias`).
//
//   tg::nn::Sequential mlp(tg::nn::Flatten(), tg::nn::Linear(784, 256), tg::nn::ReLU(),
//                          tg::nn::Linear(tg::nn::LinearOptions(256, 10).bias(false)));
//   tg::Tensor logits = mlp->forward(images);   // [batch, 1, 28, 28] -> [batch, 10]
#ifndef TAPEGRAD_NN_LAYERS_H_
#define TAPEGRAD_NN_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/factories.h"
#include "nn/container.h"
#include "nn/module.h"
#include "nn/options.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace tg {
namespace nn {

// Linear's options, as torch::nn::LinearOptions: LinearOptions(784, 10).bias(false).
class LinearOptions {
 public:
  LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  TG_ARG(int64_t, in_features);
  TG_ARG(int64_t, out_features);
  TG_ARG(bool, bias) = true;  // false: no bias parameter (and no draw from the generator)
};

// y = x W^T + b. weight [out, in], bias [out]; both U(-1/sqrt(in), 1/sqrt(in)) as in PyTorch.
// Runs in the autocast dtype when "Linear" is in the guard's lower-precision-safe list.
// Seeding: the weight is drawn from `gen` first, then the bias, so one seed gives the same
// layer whichever constructor made it.
//
//   tg::nn::Linear head(tg::nn::LinearOptions(768, 50304).bias(false), gen);
class LinearImpl : public Module {
 public:
  LinearImpl(const LinearOptions& options, Generator& gen);
  LinearImpl(int64_t in_features, int64_t out_features, Generator& gen)  // with a bias
      : LinearImpl(LinearOptions(in_features, out_features), gen) {}
  // libtorch's constructors: drawn from the default generator (tg::manual_seed).
  explicit LinearImpl(const LinearOptions& options) : LinearImpl(options, DefaultGenerator()) {}
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(LinearOptions(in_features, out_features), DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;  // [..., in] -> [..., out]
  // act(forward(x)) as one fused op (tg::Linear with an Activation: the GELU in the cuBLASLt
  // epilogue on CUDA), in the layer's autocast module scope like operator(). Forward hooks do
  // not run: containers use it only for layers without hooks (has_forward_hooks()).
  Tensor ForwardActivated(const Tensor& x, tg::Activation act);
  std::string extra_repr() const override;
  const LinearOptions& options() const { return options_; }

  Tensor weight;  // [out, in]
  Tensor bias;    // [out]; undefined without bias

 private:
  LinearOptions options_;
};
TG_MODULE(Linear);

// Row lookup: weight [num, dim] ~ N(0, 1). The input holds i32/i64 indices (any shape; wrap a
// RawTensor in a Tensor without grad) -> [indices..., dim].
class EmbeddingImpl : public Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t dim, Generator& gen);
  // libtorch's: the default generator (tg::manual_seed).
  EmbeddingImpl(int64_t num_embeddings, int64_t dim)
      : EmbeddingImpl(num_embeddings, dim, DefaultGenerator()) {}
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  Tensor weight;  // [num_embeddings, dim]

 private:
  int64_t num_, dim_;
};
TG_MODULE(Embedding);

int64_t OneNormalizedDim(const std::vector<int64_t>& normalized_shape);

// LayerNorm's options, as torch::nn::LayerNormOptions (over the last dim only):
// LayerNormOptions(768).eps(1e-6).elementwise_affine(false).
class LayerNormOptions {
 public:
  explicit LayerNormOptions(int64_t dim) : dim_(dim) {}
  // libtorch's form, LayerNormOptions({768}): one normalized dim (the last) is supported.
  explicit LayerNormOptions(const std::vector<int64_t>& normalized_shape)
      : dim_(OneNormalizedDim(normalized_shape)) {}
  TG_ARG(int64_t, dim);
  TG_ARG(double, eps) = 1e-5;
  TG_ARG(bool, elementwise_affine) = true;  // false: no weight and no bias
  TG_ARG(bool, bias) = true;                // with elementwise_affine: false keeps only the weight
};

// Normalises over the last dim; weight = 1, bias = 0 ([dim]); computed in f32 under autocast.
class LayerNormImpl : public Module {
 public:
  explicit LayerNormImpl(const LayerNormOptions& options);
  explicit LayerNormImpl(int64_t dim) : LayerNormImpl(LayerNormOptions(dim)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const LayerNormOptions& options() const { return options_; }

  Tensor weight, bias;  // [dim]; undefined without elementwise_affine (bias: or without bias)

 private:
  LayerNormOptions options_;
};
TG_MODULE(LayerNorm);

// x / sqrt(mean(x^2 over the last dim) + eps) * weight (weight = 1, [dim]). f16/bf16 inputs are
// normalised in f32 (as LayerNorm is); the result is f32 under autocast (RMSNorm is on PyTorch's
// autocast f32 list) and the input's dtype otherwise.
class RMSNormImpl : public Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  Tensor weight;  // [dim]

 private:
  int64_t dim_;
  double eps_;
};
TG_MODULE(RMSNorm);

// Dropout's options, as torch::nn::DropoutOptions (Dropout2dOptions is the same class):
// Dropout(0.2), Dropout(DropoutOptions().p(0.2)).
class DropoutOptions {
 public:
  DropoutOptions(double p = 0.5) : p_(p) {}  // NOLINT: implicit, as libtorch's
  TG_ARG(double, p);
  TG_ARG(bool, inplace) = false;  // accepted; the result is computed out of place
};
using Dropout2dOptions = DropoutOptions;

// Zeroes elements with probability p in training mode and scales the rest by 1/(1-p); the
// identity in eval mode or for p = 0. Draws from `gen`, which must outlive the module (the
// training binary owns it and saves its state in checkpoints).
class DropoutImpl : public Module {
 public:
  DropoutImpl(double p, Generator& gen);
  // libtorch's: the default generator (tg::manual_seed), p = 0.5 unless given.
  explicit DropoutImpl(const DropoutOptions& options = DropoutOptions())
      : DropoutImpl(options.p(), DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  double p_;
  Generator* gen_;
};
TG_MODULE(Dropout);

// Zeroes whole channels (x[n, c, ...]) with probability p in training mode and scales the rest
// by 1/(1-p) (torch.nn.Dropout2d, also for [N, C, L] and [C, H, W] as PyTorch treats them: the
// channel is dim 1 of a 4-D input, dim 0 of a 3-D one); the identity in eval mode.
class Dropout2dImpl : public Module {
 public:
  Dropout2dImpl(double p, Generator& gen);
  explicit Dropout2dImpl(const Dropout2dOptions& options = Dropout2dOptions())
      : Dropout2dImpl(options.p(), DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  double p_;
  Generator* gen_;
};
TG_MODULE(Dropout2d);

class ReLUImpl : public Module {
 public:
  ReLUImpl() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};
TG_MODULE(ReLU);

// GELU's options, as torch::nn::GELUOptions: GELUOptions().approximate("tanh").
class GELUOptions {
  TG_ARG(std::string, approximate) = "none";  // "none": exact (erf); "tanh": GPT-2's
};

// Exact (erf) GELU, or the tanh approximation of GPT-2 with approximate "tanh". Throws tg::Error
// for another approximate: "GELU: approximate must be 'none' or 'tanh', got 'fast'".
class GELUImpl : public Module {
 public:
  explicit GELUImpl(const GELUOptions& options = GELUOptions());
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  bool tanh_;
};
TG_MODULE(GELU);

// LeakyReLU's options, as torch::nn::LeakyReLUOptions().negative_slope(0.2).
class LeakyReLUOptions {
  TG_ARG(double, negative_slope) = 0.01;
  TG_ARG(bool, inplace) = false;  // accepted; the result is computed out of place
};

class LeakyReLUImpl : public Module {
 public:
  explicit LeakyReLUImpl(const LeakyReLUOptions& options = LeakyReLUOptions())
      : Module("LeakyReLU"), options_(options) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  LeakyReLUOptions options_;
};
TG_MODULE(LeakyReLU);

class SigmoidImpl : public Module {
 public:
  SigmoidImpl() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};
TG_MODULE(Sigmoid);

// Softmax / LogSoftmax over `dim` (torch::nn::Softmax(1), LogSoftmax(SoftmaxOptions(1))).
class SoftmaxImpl : public Module {
 public:
  explicit SoftmaxImpl(int64_t dim) : Module("Softmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  int64_t dim_;
};
TG_MODULE(Softmax);
class LogSoftmaxImpl : public Module {
 public:
  explicit LogSoftmaxImpl(int64_t dim) : Module("LogSoftmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  int64_t dim_;
};
TG_MODULE(LogSoftmax);

class TanhImpl : public Module {
 public:
  TanhImpl() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};
TG_MODULE(Tanh);

// x * sigmoid(x), as torch.nn.SiLU (the MLP activation of LLaMA-style models).
class SiLUImpl : public Module {
 public:
  SiLUImpl() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};
TG_MODULE(SiLU);

// [d0, d1, ..., dn] -> [d0, ..., d(start-1), product of the rest].
class FlattenImpl : public Module {
 public:
  explicit FlattenImpl(int64_t start_dim = 1) : Module("Flatten"), start_(start_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  int64_t start_;
};
TG_MODULE(Flatten);

enum class Activation { kRelu, kGelu, kGeluTanh, kTanh };

// Linear layers "fc0", "fc1", ... of sizes[0] -> sizes[1] -> ... with the activation between them
// (not after the last), and dropout after each activation when p > 0. Mlp({C, 4C, C}, kGeluTanh)
// is the GPT-2 block's MLP; Mlp({784, 256, 10}, kRelu) an image classifier. On CUDA a kGeluTanh
// activation is fused into the product of the layer before it (Linear::ForwardActivated) unless
// that layer has forward hooks.
class Mlp : public Module {
 public:
  struct Options {
    Activation activation = Activation::kRelu;
    bool bias = true;
    double dropout = 0;                // after each activation
    Generator* dropout_gen = nullptr;  // required when dropout > 0
  };
  Mlp(const std::vector<int64_t>& sizes, Generator& gen, const Options& options);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  const Linear& layer(size_t i) const { return layers_.at(i); }
  size_t num_layers() const { return layers_.size(); }

 private:
  Options options_;
  std::vector<Linear> layers_;
  Dropout dropout_{nullptr};
};

Tensor Activate(const Tensor& x, Activation activation);

// The weights of every nn::Linear in `root`'s tree (root included), depth first in registration
// order, each once: what amp::Fp8Training covers for FP8 training (TE converts the te.Linear
// layers; a tied head, which is not a Linear module, is added by the caller).
std::vector<Tensor> LinearWeights(Module& root);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_LAYERS_H_
