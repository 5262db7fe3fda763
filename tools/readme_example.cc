// The example of the README's "Training from C++", line for line below this comment:
// tests/tools:readme_example_test holds the two equal, builds this and checks that the loss falls.

#include <cstdio>
#include <memory>

#include "tapegrad.h"

struct TwoLayerImpl : tg::nn::Module {
  TwoLayerImpl() {
    fc1 = register_module("fc1", tg::nn::Linear(784, 128));
    fc2 = register_module("fc2", tg::nn::Linear(128, 10));
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    return fc2(fc1(x.view({x.size(0), 784})).relu());
  }
  tg::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TG_MODULE(TwoLayer);

int main() {
  tg::manual_seed(0);
  TwoLayer model;
  model->to(tg::kBFloat16);  // bf16 weights; the optimizer keeps f32 masters
  tg::amp::MixedPrecisionOptimizer opt(
      std::make_unique<tg::optim::AdamW>(model->parameters(), tg::optim::AdamWOptions(1e-3)));

  // A batch of 64 random images with random labels (the real loaders: dataset/mnist.h).
  const tg::Tensor images = tg::randn({64, 1, 28, 28});
  const tg::Tensor labels = tg::randint(0, 10, {64});
  for (int step = 1; step <= 50; ++step) {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::AutocastGuard autocast(tg::kBFloat16);  // matmuls in bf16, the loss in f32
      loss = tg::nn::CrossEntropyLoss(model(images), labels);
    }
    opt.backward(loss);          // master gradients (f16: scaled, then unscaled)
    opt.clip_master_grads(1.0);  // by the global norm
    opt.step();                  // skipped on inf/NaN gradients
    if (step % 10 == 0) std::printf("step %d loss %.4f\n", step, loss.item<double>());
  }
}
