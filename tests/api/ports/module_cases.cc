// Layer, container, indexing, scheduler and scaler cases that print their results, one line per
// value list ("name v1 v2 ..."), written once for libtorch and tapegrad (port_prelude.h): the
// libtorch build printed tests/api/testdata/module_cases_libtorch.txt, and module_cases_test.sh
// compares tapegrad's output with it value by value. Inputs and weights are deterministic
// (sin/cos of aranges), so nothing depends on either library's random draws.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/api/ports/port_prelude.h"

namespace F = tg::nn::functional;

namespace {

void Print(const std::string& name, const tg::Tensor& t) {
  tg::Tensor flat = t.detach().to(tg::kFloat64).contiguous().view({-1});
  std::printf("%s", name.c_str());
  for (int64_t i = 0; i < flat.numel(); ++i) std::printf(" %.9g", flat[i].item<double>());
  std::printf("\n");
}

// A deterministic f32 tensor of `shape`: sin(0.37 i + phase), computed on the host.
tg::Tensor Wave(std::vector<int64_t> shape, double phase = 0.0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(std::sin(0.37 * i + phase));
  return tg::tensor(values).reshape(shape);
}

void SetWeights(tg::nn::Module& m) {
  tg::NoGradGuard no_grad;
  double phase = 0.5;
  for (auto& p : m.parameters()) {
    p.copy_(Wave(p.sizes().vec(), phase) * 0.5);
    phase += 1.0;
  }
}

}  // namespace

int main() {
  {  // BatchNorm2d: two training steps (batch statistics, running updates), then eval.
    tg::nn::BatchNorm2d bn(tg::nn::BatchNorm2dOptions(3).momentum(0.2));
    SetWeights(*bn);
    tg::Tensor x = Wave({2, 3, 2, 2}).requires_grad_(true);
    tg::Tensor y = bn(x);
    Print("bn2d.train.y", y);
    (y * Wave({2, 3, 2, 2}, 1.0)).sum().backward();
    Print("bn2d.train.dx", x.grad());
    Print("bn2d.train.dweight", bn->weight.grad());
    Print("bn2d.train.dbias", bn->bias.grad());
    bn(Wave({2, 3, 2, 2}, 2.0) * 3);
    Print("bn2d.running_mean", tg::Tensor(bn->named_buffers()["running_mean"]));
    Print("bn2d.running_var", tg::Tensor(bn->named_buffers()["running_var"]));
    bn->eval();
    Print("bn2d.eval.y", bn(x));
  }
  {  // BatchNorm1d on [N, C] with the cumulative mean (momentum nullopt), no affine.
    tg::nn::BatchNorm1d bn(tg::nn::BatchNorm1dOptions(4).momentum(std::nullopt).affine(false));
    bn(Wave({5, 4}));
    bn(Wave({5, 4}, 1.0) * 2);
    Print("bn1d.running_mean", tg::Tensor(bn->named_buffers()["running_mean"]));
    Print("bn1d.running_var", tg::Tensor(bn->named_buffers()["running_var"]));
  }
  {  // GroupNorm: 2 groups of 2 channels.
    tg::nn::GroupNorm gn(tg::nn::GroupNormOptions(2, 4).eps(1e-3));
    SetWeights(*gn);
    tg::Tensor x = Wave({2, 4, 3}).requires_grad_(true);
    tg::Tensor y = gn(x);
    Print("gn.y", y);
    (y * Wave({2, 4, 3}, 0.3)).sum().backward();
    Print("gn.dx", x.grad());
    Print("gn.dweight", gn->weight.grad());
  }
  {  // ConvTranspose2d with stride, padding, output_padding and dilation; and stride 1.
    tg::nn::ConvTranspose2d deconv(tg::nn::ConvTranspose2dOptions(2, 3, {3, 2})
                                       .stride({2, 1})
                                       .padding({1, 0})
                                       .output_padding({1, 0})
                                       .dilation({1, 2}));
    SetWeights(*deconv);
    tg::Tensor x = Wave({2, 2, 3, 3}).requires_grad_(true);
    tg::Tensor y = deconv(x);
    Print("deconv.sizes", tg::tensor(y.sizes().vec()));
    Print("deconv.y", y);
    (y * y).sum().backward();
    Print("deconv.dx", x.grad());
    Print("deconv.dweight", deconv->weight.grad());
    Print("deconv.dbias", deconv->bias.grad());
    tg::nn::ConvTranspose2d plain(tg::nn::ConvTranspose2dOptions(2, 1, 4).bias(false));
    SetWeights(*plain);
    Print("deconv_plain.y", plain(Wave({1, 2, 1, 1})));
    tg::nn::ConvTranspose2d cropped(tg::nn::ConvTranspose2dOptions(1, 1, 2).padding(2));
    SetWeights(*cropped);
    Print("deconv_cropped.y", cropped(Wave({1, 1, 5, 5})));
  }
  {  // Conv1d.
    tg::nn::Conv1d conv(tg::nn::Conv1dOptions(2, 3, 3).stride(2).padding(1));
    SetWeights(*conv);
    tg::Tensor x = Wave({2, 2, 7}).requires_grad_(true);
    tg::Tensor y = conv(x);
    Print("conv1d.y", y);
    y.pow(2).sum().backward();
    Print("conv1d.dx", x.grad());
    Print("conv1d.dweight", conv->weight.grad());
  }
  {  // Pooling.
    tg::Tensor x = Wave({1, 2, 5, 5}).requires_grad_(true);
    Print("avgpool.pad", F::avg_pool2d(x, F::AvgPool2dFuncOptions(3).stride(2).padding(1)));
    tg::Tensor y =
        F::avg_pool2d(x, F::AvgPool2dFuncOptions(3).stride(2).padding(1).count_include_pad(false));
    Print("avgpool.nopad", y);
    y.sum().backward();
    Print("avgpool.nopad.dx", x.grad());
    Print("avgpool.module", tg::nn::AvgPool2d(tg::nn::AvgPool2dOptions(2))(x));
    Print("avgpool.divisor", F::avg_pool2d(x, F::AvgPool2dFuncOptions(2).divisor_override(3)));
    Print("maxpool.fn", tg::max_pool2d(x, 2));
    Print("maxpool.pad", F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1)));
  }
  {  // Activations and losses.
    tg::Tensor x = Wave({7}, 2.5) * 3;
    Print("leaky_relu", tg::nn::LeakyReLU(tg::nn::LeakyReLUOptions().negative_slope(0.2))(x));
    Print("sigmoid", tg::nn::Sigmoid()(x));
    Print("log_softmax", tg::nn::LogSoftmax(0)(x));
    tg::Tensor logp = tg::log_softmax(Wave({4, 3}), 1);
    tg::Tensor target = tg::tensor({0, 2, 1, 2}, tg::kLong);
    Print("nll.weighted",
          tg::nll_loss(logp, target, tg::tensor({0.2, 1.0, 3.0}), tg::Reduction::Mean, -100));
    Print("nll.sum", tg::nll_loss(logp, target, {}, tg::Reduction::Sum, -100));
  }
  {  // Indexing.
    tg::Tensor x = tg::arange(24, tg::kFloat32).reshape({2, 3, 4});
    using namespace tg::indexing;
    Print("index.col", x.index({Slice(), 1}));
    Print("index.ellipsis", x.index({"...", -1}));
    Print("index.step", x.index({Slice(), Slice(None, None, 2), Slice(1, 3)}));
    Print("index.none", tg::tensor(x.index({None, 0, Slice(), None}).sizes().vec()));
    Print("index.tensor", x.index({Slice(), tg::tensor({2, 0}, tg::kLong)}));
    tg::Tensor w = tg::zeros({3, 3});
    w.index_put_({Slice(), 1}, 5.0);
    w.index_put_({0}, tg::ones({3}) * 2);
    Print("index_put", w);
    tg::Tensor leaf = tg::arange(6, tg::kFloat32).reshape({2, 3}).requires_grad_(true);
    (leaf.index({Slice(), Slice(1, None)}) * tg::tensor({1.0, 10.0})).sum().backward();
    Print("index.grad", leaf.grad());
  }
  {  // Containers: Sequential of holders, named; ModuleList; ModuleDict.
    tg::nn::Sequential seq(tg::nn::Linear(3, 4), tg::nn::ReLU(), tg::nn::Linear(4, 2));
    SetWeights(*seq);
    Print("sequential.y", seq->forward(Wave({2, 3})));
    std::printf("sequential.size %d\n", static_cast<int>(seq->size()));
    for (const auto& p : seq->named_parameters()) {
      std::printf("sequential.param %s\n", p.key().c_str());
    }
    std::vector<std::pair<std::string, std::shared_ptr<tg::nn::Module>>> items = {
        {"a", tg::nn::Linear(2, 2).ptr()}, {"b", tg::nn::ReLU().ptr()}};
    tg::nn::ModuleDict dict(items);
    for (const auto& p : dict->named_parameters()) {
      std::printf("moduledict.param %s\n", p.key().c_str());
    }
  }
  {  // StepLR and ReduceLROnPlateau, call by call.
    tg::Tensor w = tg::zeros({1}, tg::requires_grad());
    tg::optim::SGD sgd({w}, tg::optim::SGDOptions(1.0));
    tg::optim::StepLR step(sgd, 2, 0.5);
    std::vector<double> lrs;
    for (int i = 0; i < 7; ++i) {
      step.step();
      lrs.push_back(sgd.param_groups()[0].options().get_lr());
    }
    Print("steplr", tg::tensor(lrs, tg::kFloat64));
    tg::optim::SGD sgd2({w}, tg::optim::SGDOptions(1.0));
    tg::optim::ReduceLROnPlateauScheduler plateau(sgd2, tg::optim::ReduceLROnPlateauScheduler::min,
                                                  0.5, 1, 1e-4,
                                                  tg::optim::ReduceLROnPlateauScheduler::rel, 1);
    lrs.clear();
    for (float metric : {5.f, 4.f, 4.f, 4.f, 4.f, 3.f, 3.f, 3.f, 3.f}) {
      plateau.step(metric);
      lrs.push_back(sgd2.param_groups()[0].options().get_lr());
    }
    Print("plateau", tg::tensor(lrs, tg::kFloat64));
  }
  return 0;
}
