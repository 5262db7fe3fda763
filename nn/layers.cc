#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "tensor/error.h"

namespace tg {
namespace nn {

namespace {
const char* Bool(bool b) { return b ? "true" : "false"; }
}  // namespace

// ---- Linear ----------------------------------------------------------------------------------

LinearImpl::LinearImpl(const LinearOptions& options, Generator& gen)
    : Module("Linear", /*autocast_scope=*/true), options_(options) {
  const int64_t in_features = options.in_features(), out_features = options.out_features();
  TG_CHECK(in_features > 0 && out_features > 0,
           "Linear: sizes must be positive, got in=", in_features, " out=", out_features);
  double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  // kaiming_uniform(a = sqrt(5)) as PyTorch's reset_parameters: the same bound 1/sqrt(in).
  weight = register_parameter("weight", RawTensor::Empty({out_features, in_features}));
  init::KaimingUniform(weight, gen, std::sqrt(5.0));
  if (options.bias()) {
    bias = register_parameter("bias", RawTensor::Empty({out_features}));
    init::Uniform(bias, gen, -bound, bound);
  }
}

Tensor LinearImpl::forward(const Tensor& x) { return tg::Linear(x, weight, bias); }

Tensor LinearImpl::ForwardActivated(const Tensor& x, tg::Activation act) {
  amp::AutocastModuleScope scope(type_name());  // as operator() does for this layer
  return tg::Linear(x, weight, bias, act);
}

std::string LinearImpl::extra_repr() const {
  return absl::StrCat("in=", options_.in_features(), ", out=", options_.out_features(),
                      ", bias=", Bool(bias.defined()));
}

// ---- Embedding -------------------------------------------------------------------------------

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t dim, Generator& gen)
    : Module("Embedding"), num_(num_embeddings), dim_(dim) {
  TG_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ", num_embeddings,
           " x ", dim);
  weight = register_parameter("weight", RawTensor::Empty({num_embeddings, dim}));
  init::Normal(weight, gen);
}

Tensor EmbeddingImpl::forward(const Tensor& indices) {
  return tg::Embedding(weight, indices.data());
}

std::string EmbeddingImpl::extra_repr() const { return absl::StrCat(num_, ", ", dim_); }

// ---- Norms -----------------------------------------------------------------------------------

int64_t OneNormalizedDim(const std::vector<int64_t>& normalized_shape) {
  TG_CHECK(normalized_shape.size() == 1, "LayerNorm: normalized_shape ",
           ShapeToString(normalized_shape),
           " is not supported; tapegrad normalizes over the last dim only (give one size)");
  return normalized_shape[0];
}

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options)
    : Module("LayerNorm"), options_(options) {
  const int64_t dim = options.dim();
  TG_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  if (options.elementwise_affine()) {
    weight = register_parameter("weight", RawTensor::Ones({dim}));
    if (options.bias()) bias = register_parameter("bias", RawTensor::Zeros({dim}));
  }
}

Tensor LayerNormImpl::forward(const Tensor& x) {
  return tg::LayerNorm(x, weight, bias, options_.eps());
}

std::string LayerNormImpl::extra_repr() const {
  return absl::StrCat(options_.dim(), ", eps=", options_.eps(),
                      ", affine=", Bool(weight.defined()));
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : Module("RMSNorm"), dim_(dim), eps_(eps) {
  TG_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", RawTensor::Ones({dim}));
}

Tensor RMSNormImpl::forward(const Tensor& x) {
  TG_CHECK(x.dim() >= 1 && x.size(-1) == dim_, "RMSNorm: input ", ShapeToString(x.shape()),
           " does not end in ", dim_);
  bool low = x.dtype() == kF16 || x.dtype() == kBF16;
  Tensor xf = low ? Cast(x, kF32) : x;
  Tensor ms = Mean(Mul(xf, xf), {-1}, /*keepdim=*/true);
  Tensor y = Mul(Mul(xf, Pow(AddScalar(ms, eps_), -0.5)), weight);
  if (low && !amp::AutocastEnabled()) y = Cast(y, x.dtype());
  return y;
}

std::string RMSNormImpl::extra_repr() const { return absl::StrCat(dim_, ", eps=", eps_); }

// ---- Dropout and activations -----------------------------------------------------------------

DropoutImpl::DropoutImpl(double p, Generator& gen) : Module("Dropout"), p_(p), gen_(&gen) {
  TG_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got ", p);
}

Tensor DropoutImpl::forward(const Tensor& x) {
  if (p_ == 0 || !is_training()) return x;
  return tg::Dropout(x, p_, *gen_, /*training=*/true);
}

std::string DropoutImpl::extra_repr() const { return absl::StrCat("p=", p_); }

Dropout2dImpl::Dropout2dImpl(double p, Generator& gen) : Module("Dropout2d"), p_(p), gen_(&gen) {
  TG_CHECK(p >= 0 && p <= 1, "Dropout2d: p must be in [0, 1], got ", p);
}

Tensor Dropout2dImpl::forward(const Tensor& x) {
  if (p_ == 0 || !is_training()) return x;
  return functional::dropout2d(x, functional::Dropout2dFuncOptions().p(p_).training(true), *gen_);
}

std::string Dropout2dImpl::extra_repr() const { return absl::StrCat("p=", p_); }

Tensor ReLUImpl::forward(const Tensor& x) { return Relu(x); }
GELUImpl::GELUImpl(const GELUOptions& options)
    : Module("GELU"), tanh_(options.approximate() == "tanh") {
  TG_CHECK(tanh_ || options.approximate() == "none",
           "GELU: approximate must be 'none' or 'tanh', got '", options.approximate(), "'");
}

Tensor GELUImpl::forward(const Tensor& x) { return tanh_ ? GeluTanh(x) : Gelu(x); }
std::string GELUImpl::extra_repr() const { return tanh_ ? "approximate=tanh" : ""; }
Tensor TanhImpl::forward(const Tensor& x) { return tg::Tanh(x); }
Tensor SigmoidImpl::forward(const Tensor& x) { return tg::Sigmoid(x); }
Tensor LeakyReLUImpl::forward(const Tensor& x) {
  return functional::leaky_relu(
      x, functional::LeakyReLUFuncOptions().negative_slope(options_.negative_slope()));
}
std::string LeakyReLUImpl::extra_repr() const {
  return absl::StrCat("negative_slope=", options_.negative_slope());
}
Tensor SoftmaxImpl::forward(const Tensor& x) { return x.softmax(dim_); }
std::string SoftmaxImpl::extra_repr() const { return absl::StrCat("dim=", dim_); }
Tensor LogSoftmaxImpl::forward(const Tensor& x) { return x.log_softmax(dim_); }
std::string LogSoftmaxImpl::extra_repr() const { return absl::StrCat("dim=", dim_); }

Tensor SiLUImpl::forward(const Tensor& x) { return tg::Silu(x); }

Tensor FlattenImpl::forward(const Tensor& x) {
  int64_t start = start_ < 0 ? start_ + x.dim() : start_;
  TG_CHECK(start >= 0 && start < std::max<int64_t>(x.dim(), 1), "Flatten: start_dim ", start_,
           " is out of range for input ", ShapeToString(x.shape()));
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  int64_t rest = 1;
  for (int64_t d = start; d < x.dim(); ++d) rest *= x.size(d);
  shape.push_back(rest);
  return Reshape(x, shape);
}

std::string FlattenImpl::extra_repr() const { return absl::StrCat("start_dim=", start_); }

Tensor Activate(const Tensor& x, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return Relu(x);
    case Activation::kGelu:
      return Gelu(x);
    case Activation::kGeluTanh:
      return GeluTanh(x);
    case Activation::kTanh:
      return tg::Tanh(x);
  }
  return x;
}

// ---- Mlp -------------------------------------------------------------------------------------

Mlp::Mlp(const std::vector<int64_t>& sizes, Generator& gen, const Options& options)
    : Module("Mlp"), options_(options) {
  TG_CHECK(sizes.size() >= 2, "Mlp: needs at least an input and an output size, got ", sizes.size(),
           " sizes");
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    layers_.push_back(
        register_module(absl::StrCat("fc", i),
                        Linear(LinearOptions(sizes[i], sizes[i + 1]).bias(options.bias), gen)));
  }
  if (options.dropout > 0) {
    TG_CHECK(options.dropout_gen != nullptr, "Mlp: dropout ", options.dropout,
             " needs Options::dropout_gen");
    dropout_ = register_module("dropout", Dropout(options.dropout, *options.dropout_gen));
  }
}

Tensor Mlp::forward(const Tensor& x) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const bool hidden = i + 1 < layers_.size();
    // The tanh-GELU runs in the product's epilogue (and its derivative in the backward's),
    // saving a pass over the [.., 4C] activation each way, on every device. A layer with forward
    // hooks keeps Linear + GeluTanh, so that its hooks see the layer's own output.
    if (hidden && options_.activation == Activation::kGeluTanh &&
        !layers_[i]->has_forward_hooks()) {
      h = layers_[i]->ForwardActivated(h, tg::Activation::kGeluTanh);
    } else {
      h = layers_[i](h);
      if (hidden) h = Activate(h, options_.activation);
    }
    if (hidden && !dropout_.is_empty()) h = dropout_(h);
  }
  return h;
}

std::string Mlp::extra_repr() const {
  static const char* kNames[] = {"relu", "gelu", "gelu_tanh", "tanh"};
  return absl::StrCat("activation=", kNames[static_cast<int>(options_.activation)]);
}

std::vector<Tensor> LinearWeights(Module& root) {
  std::vector<Tensor> weights;
  for (const auto& [name, module] : root.named_modules()) {
    const auto* linear = dynamic_cast<const LinearImpl*>(module.get());
    if (linear == nullptr) continue;
    const Tensor& w = linear->weight;
    const bool seen = std::any_of(weights.begin(), weights.end(),
                                  [&](const Tensor& v) { return v.impl() == w.impl(); });
    if (!seen) weights.push_back(w);
  }
  return weights;
}

}  // namespace nn
}  // namespace tg
