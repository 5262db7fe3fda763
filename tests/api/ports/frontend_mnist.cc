// The whole program of libtorch's C++ frontend tutorial ("Using the PyTorch C++ Frontend": the
// Net, an MNIST data loader, SGD, the epoch loop), written for libtorch and ported by the two
// replacements; with -DPORT_LIBTORCH it is the libtorch program. Arguments: the directory of
// the MNIST-format files (libtorch reads them uncompressed, tapegrad either way) and the number
// of epochs; after each epoch it prints the mean training loss of that epoch and the accuracy
// on the test split.
#ifdef PORT_LIBTORCH
#include <torch/torch.h>
namespace tg = torch;
#else
#include "tapegrad.h"
#endif

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

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

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: frontend_mnist DATA_DIR EPOCHS\n");
    return 2;
  }
  const std::string root = argv[1];
  const int epochs = std::atoi(argv[2]);
  tg::manual_seed(1);
  auto net = std::make_shared<Net>();
  auto data_loader = tg::data::make_data_loader(
      tg::data::datasets::MNIST(root).map(tg::data::transforms::Stack<>()),
      /*batch_size=*/64);
  auto test_loader = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      tg::data::datasets::MNIST(root, tg::data::datasets::MNIST::Mode::kTest)
          .map(tg::data::transforms::Stack<>()),
      /*batch_size=*/1000);
  tg::optim::SGD optimizer(net->parameters(), /*lr=*/0.01);
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    int64_t batches = 0;
    for (auto& batch : *data_loader) {
      optimizer.zero_grad();
      tg::Tensor prediction = net->forward(batch.data);
      tg::Tensor loss = tg::nll_loss(prediction, batch.target);
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      ++batches;
    }
    net->eval();
    int64_t correct = 0, total = 0;
    {
      tg::NoGradGuard no_grad;
      for (auto& batch : *test_loader) {
        correct += net->forward(batch.data).argmax(1).eq(batch.target).sum().item<int64_t>();
        total += batch.target.size(0);
      }
    }
    net->train();
    std::printf("epoch %d batches %lld mean loss %.4f test accuracy %.4f\n", epoch,
                static_cast<long long>(batches), loss_sum / batches,
                static_cast<double>(correct) / total);
  }
  return 0;
}
