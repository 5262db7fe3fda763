// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations, Flatten, and the
// containers Sequential and ModuleList, plus an MLP. Initialisation follows PyTorch's defaults and
// draws from the tg::Generator passed to the constructor.
//
//   tg::Generator gen(0);
//   auto mlp = std::make_shared<tg::nn::Sequential>(std::vector<std::shared_ptr<tg::nn::Module>>{
//       std::make_shared<tg::nn::FlattenImpl>(), std::make_shared<tg::nn::LinearImpl>(784, 256,
//       gen), std::make_shared<tg::nn::ReLUImpl>(),
//       std::make_shared<tg::nn::LinearImpl>(tg::nn::LinearOptions(256, 10).bias(false), gen)});
//   tg::Tensor logits = (*mlp)(images);   // [batch, 1, 28, 28] -> [batch, 10]
#ifndef TAPEGRAD_NN_LAYERS_H_
#define TAPEGRAD_NN_LAYERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/factories.h"
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
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const LinearOptions& options() const { return options_; }

 private:
  LinearOptions options_;
  Tensor weight_, bias_;
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
  const Tensor& weight() const { return weight_; }

 private:
  int64_t num_, dim_;
  Tensor weight_;
};
TG_MODULE(Embedding);

// LayerNorm's options, as torch::nn::LayerNormOptions (over the last dim only):
// LayerNormOptions(768).eps(1e-6).elementwise_affine(false).
class LayerNormOptions {
 public:
  explicit LayerNormOptions(int64_t dim) : dim_(dim) {}
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

 private:
  LayerNormOptions options_;
  Tensor weight_, bias_;
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

 private:
  int64_t dim_;
  double eps_;
  Tensor weight_;
};
TG_MODULE(RMSNorm);

// Zeroes elements with probability p in training mode and scales the rest by 1/(1-p); the
// identity in eval mode or for p = 0. Draws from `gen`, which must outlive the module (the
// training binary owns it and saves its state in checkpoints).
class DropoutImpl : public Module {
 public:
  DropoutImpl(double p, Generator& gen);
  // libtorch's: the default generator (tg::manual_seed), p = 0.5 unless given.
  explicit DropoutImpl(double p = 0.5) : DropoutImpl(p, DefaultGenerator()) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

 private:
  double p_;
  Generator* gen_;
};
TG_MODULE(Dropout);

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

// Runs its children in order; they are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  Tensor forward(const Tensor& x) override;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// A list of modules named "0", "1", ... with no forward of its own (the owner iterates).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // The i-th module as M; throws tg::Error if it is another type.
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    CheckCast(i, m != nullptr);
    return m;
  }

 private:
  void CheckCast(size_t i, bool ok) const;
  std::vector<std::shared_ptr<Module>> modules_;
};

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
  const std::shared_ptr<LinearImpl>& layer(size_t i) const { return layers_.at(i); }
  size_t num_layers() const { return layers_.size(); }

 private:
  Options options_;
  std::vector<std::shared_ptr<LinearImpl>> layers_;
  std::shared_ptr<DropoutImpl> dropout_;
};

Tensor Activate(const Tensor& x, Activation activation);

// The weights of every nn::Linear in `root`'s tree (root included), depth first in registration
// order, each once: what amp::Fp8Training covers for FP8 training (TE converts the te.Linear
// layers; a tied head, which is not a Linear module, is added by the caller).
std::vector<Tensor> LinearWeights(Module& root);

}  // namespace nn
}  // namespace tg

#endif  // TAPEGRAD_NN_LAYERS_H_
