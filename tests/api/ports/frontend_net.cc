// The network of libtorch's C++ frontend tutorial ("Using the PyTorch C++ Frontend": three
// Linear layers, relu, dropout, log_softmax, nll_loss, SGD), written for libtorch and ported by
// the two replacements only: with -DPORT_LIBTORCH it is the libtorch program (built against
// the PyTorch wheel's headers, as tests/api/BUILD says), without it the tapegrad one. It learns
// 64 random images by heart (the tutorial reads MNIST: tg::data is not there yet) and prints the
// loss every 50 steps; tests/api:frontend_net_test checks that the loss falls.
#ifdef PORT_LIBTORCH
#include <torch/torch.h>
namespace tg = torch;
#else
#include "tapegrad.h"
#endif

#include <cstdio>
#include <memory>

struct Net : tg::nn::Module {
  Net() {
    fc1 = register_module("fc1", tg::nn::Linear(784, 64));
    fc2 = register_module("fc2", tg::nn::Linear(64, 32));
    fc3 = register_module("fc3", tg::nn::Linear(32, 10));
  }

  tg::Tensor forward(tg::Tensor x) {
    x = tg::relu(fc1->forward(x.reshape({x.size(0), 784})));
    x = tg::dropout(x, /*p=*/0.5, /*train=*/is_training());
    x = tg::relu(fc2->forward(x));
    x = tg::log_softmax(fc3->forward(x), /*dim=*/1);
    return x;
  }

  tg::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

int main() {
  tg::manual_seed(1);
  auto net = std::make_shared<Net>();
  tg::Tensor images = tg::randn({64, 1, 28, 28});
  tg::Tensor labels = tg::randint(0, 10, {64});
  tg::optim::SGD optimizer(net->parameters(), /*lr=*/0.1);
  for (int step = 1; step <= 300; ++step) {
    optimizer.zero_grad();
    tg::Tensor prediction = net->forward(images);
    tg::Tensor loss = tg::nll_loss(prediction, labels);
    loss.backward();
    optimizer.step();
    if (step == 1 || step % 50 == 0) {
      net->eval();
      tg::NoGradGuard no_grad;
      const double eval_loss = tg::nll_loss(net->forward(images), labels).item<double>();
      const double accuracy =
          net->forward(images).argmax(1).eq(labels).sum().item<double>() / labels.size(0);
      std::printf("step %d eval loss %.4f accuracy %.3f\n", step, eval_loss, accuracy);
      net->train();
    }
  }
  return 0;
}
