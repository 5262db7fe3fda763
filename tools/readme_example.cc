// The example of the README's "Training from C++", line for line below this comment:
// tests/tools:readme_example_test holds the two equal, builds this and checks that the loss falls.

#include <cstdio>
#include <memory>

#include "tapegrad.h"

class TwoLayer : public tg::nn::Module {
 public:
  explicit TwoLayer(tg::Generator& gen) : Module("TwoLayer") {
    fc1_ = register_module("fc1", std::make_shared<tg::nn::LinearImpl>(784, 128, gen));
    fc2_ = register_module("fc2", std::make_shared<tg::nn::LinearImpl>(128, 10, gen));
  }
  tg::Tensor forward(const tg::Tensor& x) override {
    return (*fc2_)((*fc1_)(x.view({x.size(0), 784})).relu());
  }

 private:
  std::shared_ptr<tg::nn::LinearImpl> fc1_, fc2_;
};

int main() {
  tg::Generator gen(0);
  auto model = std::make_shared<TwoLayer>(gen);
  model->to(tg::kBFloat16);  // bf16 weights; the optimizer keeps f32 masters
  tg::optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  tg::amp::MixedPrecisionOptimizer opt(
      std::make_unique<tg::optim::AdamW>(model->parameters(), adamw));

  // A batch of 64 random images with random labels (the real loaders: dataset/mnist.h).
  const tg::Tensor images = tg::randn({64, 1, 28, 28}, gen);
  const tg::Tensor labels = tg::randint(0, 10, {64}, gen);
  for (int step = 1; step <= 50; ++step) {
    opt.zero_grad();
    tg::Tensor loss;
    {
      tg::amp::AutocastGuard autocast(tg::kBFloat16);  // matmuls in bf16, the loss in f32
      loss = tg::nn::CrossEntropyLoss((*model)(images), labels);
    }
    opt.backward(loss);          // master gradients (f16: scaled, then unscaled)
    opt.clip_master_grads(1.0);  // by the global norm
    opt.step();                  // skipped on inf/NaN gradients
    if (step % 10 == 0) std::printf("step %d loss %.4f\n", step, loss.item<double>());
  }
}
