// pytorch/examples cpp/mnist/mnist.cpp (a CNN with Conv2d, Dropout2d, max_pool2d, dropout and
// SGD with momentum, 10 epochs on MNIST from ./data, a test-split evaluation after each), ported
// by the replacements of port_prelude.h and nothing else.
// clang-format off
#include "tests/api/ports/port_prelude.h"

#include <cstddef>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

// Where to find the MNIST dataset.
const char* kDataRoot = "./data";

// The batch size for training.
const int64_t kTrainBatchSize = 64;

// The batch size for testing.
const int64_t kTestBatchSize = 1000;

// The number of epochs to train.
const int64_t kNumberOfEpochs = 10;

// After how many batches to log a new update with the loss value.
const int64_t kLogInterval = 10;

struct Net : tg::nn::Module {
  Net()
      : conv1(tg::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(tg::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  tg::Tensor forward(tg::Tensor x) {
    x = tg::relu(tg::max_pool2d(conv1->forward(x), 2));
    x = tg::relu(
        tg::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = tg::relu(fc1->forward(x));
    x = tg::dropout(x, /*p=*/0.5, /*training=*/is_training());
    x = fc2->forward(x);
    return tg::log_softmax(x, /*dim=*/1);
  }

  tg::nn::Conv2d conv1;
  tg::nn::Conv2d conv2;
  tg::nn::Dropout2d conv2_drop;
  tg::nn::Linear fc1;
  tg::nn::Linear fc2;
};

template <typename DataLoader>
void train(
    size_t epoch,
    Net& model,
    tg::Device device,
    DataLoader& data_loader,
    tg::optim::Optimizer& optimizer,
    size_t dataset_size) {
  model.train();
  size_t batch_idx = 0;
  for (auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    optimizer.zero_grad();
    auto output = model.forward(data);
    auto loss = tg::nll_loss(output, targets);
    TG_ASSERT(!std::isnan(loss.template item<float>()));
    loss.backward();
    optimizer.step();

    if (batch_idx++ % kLogInterval == 0) {
      std::printf(
          "\rTrain Epoch: %ld [%5ld/%5ld] Loss: %.4f",
          epoch,
          batch_idx * batch.data.size(0),
          dataset_size,
          loss.template item<float>());
    }
  }
}

template <typename DataLoader>
void test(
    Net& model,
    tg::Device device,
    DataLoader& data_loader,
    size_t dataset_size) {
  tg::NoGradGuard no_grad;
  model.eval();
  double test_loss = 0;
  int32_t correct = 0;
  for (const auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    auto output = model.forward(data);
    test_loss += tg::nll_loss(
                     output,
                     targets,
                     /*weight=*/{},
                     tg::Reduction::Sum)
                     .template item<float>();
    auto pred = output.argmax(1);
    correct += pred.eq(targets).sum().template item<int64_t>();
  }

  test_loss /= dataset_size;
  std::printf(
      "\nTest set: Average loss: %.4f | Accuracy: %.3f\n",
      test_loss,
      static_cast<double>(correct) / dataset_size);
}

auto main() -> int {
  tg::manual_seed(1);

  tg::DeviceType device_type;
  if (tg::cuda::is_available()) {
    std::cout << "CUDA available! Training on GPU." << std::endl;
    device_type = tg::kCUDA;
  } else {
    std::cout << "Training on CPU." << std::endl;
    device_type = tg::kCPU;
  }
  tg::Device device(device_type);

  Net model;
  model.to(device);

  auto train_dataset = tg::data::datasets::MNIST(kDataRoot)
                           .map(tg::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(tg::data::transforms::Stack<>());
  const size_t train_dataset_size = train_dataset.size().value();
  auto train_loader =
      tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
          std::move(train_dataset), kTrainBatchSize);

  auto test_dataset = tg::data::datasets::MNIST(
                          kDataRoot, tg::data::datasets::MNIST::Mode::kTest)
                          .map(tg::data::transforms::Normalize<>(0.1307, 0.3081))
                          .map(tg::data::transforms::Stack<>());
  const size_t test_dataset_size = test_dataset.size().value();
  auto test_loader =
      tg::data::make_data_loader(std::move(test_dataset), kTestBatchSize);

  tg::optim::SGD optimizer(
      model.parameters(), tg::optim::SGDOptions(0.01).momentum(0.5));

  for (size_t epoch = 1; epoch <= kNumberOfEpochs; ++epoch) {
    train(epoch, model, device, *train_loader, optimizer, train_dataset_size);
    test(model, device, *test_loader, test_dataset_size);
  }
}
