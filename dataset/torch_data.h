// libtorch's torch::data, spelled tg::data: datasets with get()/size(), transforms mapped over
// them (Normalize, Lambda, Stack), samplers (SequentialSampler, RandomSampler) and a data
// loader to iterate over batches.
//
//   auto dataset = tg::data::datasets::MNIST(tg::data::kFashionMnistDir)
//                      .map(tg::data::transforms::Normalize<>(0.2860, 0.3530))
//                      .map(tg::data::transforms::Stack<>());
//   auto loader = tg::data::make_data_loader<tg::data::samplers::RandomSampler>(
//       std::move(dataset), /*batch_size=*/64);
//   for (auto& batch : *loader) { ... batch.data [64, 1, 28, 28], batch.target [64] ... }
//
// A user's dataset derives from tg::data::datasets::Dataset<Self> (or
// Dataset<Self, Example<...>>) and implements get(index) and size(). The loader runs in the
// calling thread (DataLoaderOptions::workers is accepted and ignored): batches come in the
// sampler's order, so a run is reproducible from tg::manual_seed alone. RandomSampler draws
// its permutation from the default generator when it is reset (each pass over the loader).
#ifndef TAPEGRAD_DATASET_TORCH_DATA_H_
#define TAPEGRAD_DATASET_TORCH_DATA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "autograd/factories.h"
#include "autograd/ops.h"
#include "autograd/torch_functions.h"
#include "autograd/variable.h"
#include "dataset/mnist.h"
#include "tensor/error.h"

namespace tg::data {

template <typename Data = Tensor, typename Target = Tensor>
struct Example {
  using DataType = Data;
  using TargetType = Target;
  Example() = default;
  Example(Data data, Target target) : data(std::move(data)), target(std::move(target)) {}
  Data data;
  Target target;
};

namespace datasets {

// A dataset of examples read one at a time; get_batch collects them for the loader.
template <typename Self, typename SingleExample = Example<>>
class Dataset {
 public:
  using ExampleType = SingleExample;
  using BatchType = std::vector<SingleExample>;
  virtual ~Dataset() = default;
  virtual ExampleType get(size_t index) = 0;
  virtual std::optional<size_t> size() const = 0;
  virtual BatchType get_batch(const std::vector<size_t>& indices) {
    BatchType batch;
    batch.reserve(indices.size());
    for (size_t i : indices) batch.push_back(get(i));
    return batch;
  }
  // The dataset with `transform` applied (to each example, or to each batch for a collation
  // such as Stack). Consumes this dataset, as libtorch's map() on an rvalue.
  template <typename Transform>
  auto map(Transform transform) &&;
};

// `source` with `transform` applied to what get_batch returns.
template <typename Source, typename Transform>
class MapDataset {
 public:
  using BatchType =
      decltype(std::declval<Transform&>().apply_batch(std::declval<typename Source::BatchType>()));
  MapDataset(Source source, Transform transform)
      : source_(std::move(source)), transform_(std::move(transform)) {}
  BatchType get_batch(const std::vector<size_t>& indices) {
    return transform_.apply_batch(source_.get_batch(indices));
  }
  std::optional<size_t> size() const { return source_.size(); }
  template <typename Next>
  MapDataset<MapDataset, Next> map(Next next) && {
    return MapDataset<MapDataset, Next>(std::move(*this), std::move(next));
  }

 private:
  Source source_;
  Transform transform_;
};

template <typename Self, typename SingleExample>
template <typename Transform>
auto Dataset<Self, SingleExample>::map(Transform transform) && {
  return MapDataset<Self, Transform>(std::move(static_cast<Self&>(*this)), std::move(transform));
}

// (Fashion-)MNIST from the directory of its four IDX files (dataset/mnist.h): examples of
// images f32 [1, 28, 28] in [0, 1] and targets i64 0-d, as libtorch's MNIST. Throws tg::Error
// with the reader's message when the files are missing or malformed.
class MNIST : public Dataset<MNIST> {
 public:
  enum class Mode { kTrain, kTest };
  explicit MNIST(const std::string& root, Mode mode = Mode::kTrain);
  Example<> get(size_t index) override;
  std::optional<size_t> size() const override;
  bool is_train() const { return mode_ == Mode::kTrain; }
  const Tensor& images() const { return images_; }    // [N, 1, 28, 28]
  const Tensor& targets() const { return targets_; }  // [N]

 private:
  Mode mode_;
  Tensor images_, targets_;
};

}  // namespace datasets

namespace transforms {

// Applies a function to each example's data (libtorch's TensorTransform / Lambda).
template <typename Target = Tensor>
class Lambda {
 public:
  explicit Lambda(std::function<Tensor(Tensor)> fn) : fn_(std::move(fn)) {}
  std::vector<Example<Tensor, Target>> apply_batch(std::vector<Example<Tensor, Target>> batch) {
    for (auto& example : batch) example.data = fn_(example.data);
    return batch;
  }

 private:
  std::function<Tensor(Tensor)> fn_;
};

// (data - mean) / stddev per example (one mean and stddev for every channel, or one per
// channel of a [C, ...] example).
template <typename Target = Tensor>
class Normalize : public Lambda<Target> {
 public:
  Normalize(double mean, double stddev) : Normalize(std::vector<double>{mean}, {stddev}) {}
  Normalize(std::vector<double> mean, std::vector<double> stddev)
      : Lambda<Target>([mean, stddev](Tensor x) {
          TG_CHECK(mean.size() == stddev.size() && !mean.empty(),
                   "Normalize: give as many means as standard deviations");
          Shape shape(static_cast<size_t>(std::max<int64_t>(x.dim(), 1)), 1);
          shape[0] = static_cast<int64_t>(mean.size());
          const Tensor m = tg::tensor(mean, x.dtype()).view(shape);
          const Tensor s = tg::tensor(stddev, x.dtype()).view(shape);
          return (x - m) / s;
        }) {}
};

// Stacks a batch of examples into one Example of [batch, ...] tensors (libtorch's Stack<>).
template <typename E = Example<>>
class Stack {
 public:
  E apply_batch(const std::vector<E>& batch) {
    std::vector<Tensor> data, targets;
    for (const E& example : batch) {
      data.push_back(example.data);
      targets.push_back(example.target);
    }
    return E(tg::stack(data), tg::stack(targets));
  }
};

}  // namespace transforms

namespace samplers {

// Indices 0..size-1 in order.
class SequentialSampler {
 public:
  explicit SequentialSampler(size_t size) : size_(size) {}
  void reset(std::optional<size_t> new_size = std::nullopt) {
    if (new_size) size_ = *new_size;
    next_ = 0;
  }
  std::optional<std::vector<size_t>> next(size_t batch_size);

 private:
  size_t size_, next_ = 0;
};

// A random permutation of 0..size-1, drawn from the default generator at each reset.
class RandomSampler {
 public:
  explicit RandomSampler(int64_t size) : size_(static_cast<size_t>(size)) { reset(); }
  void reset(std::optional<size_t> new_size = std::nullopt);
  std::optional<std::vector<size_t>> next(size_t batch_size);

 private:
  size_t size_, next_ = 0;
  std::vector<size_t> order_;
};

}  // namespace samplers

struct DataLoaderOptions {
  DataLoaderOptions() = default;
  DataLoaderOptions(size_t batch_size) : batch_size_(batch_size) {}  // NOLINT: as libtorch's
  DataLoaderOptions& batch_size(size_t v) {
    batch_size_ = v;
    return *this;
  }
  DataLoaderOptions& workers(size_t v) {  // accepted; batches are made in the calling thread
    workers_ = v;
    return *this;
  }
  DataLoaderOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  size_t batch_size() const { return batch_size_; }
  size_t workers() const { return workers_; }
  bool drop_last() const { return drop_last_; }

 private:
  size_t batch_size_ = 1, workers_ = 0;
  bool drop_last_ = false;
};

// Iterates over the batches of `dataset` in `sampler`'s order; each range-for pass resets the
// sampler (a new permutation for RandomSampler).
template <typename DatasetType, typename Sampler>
class StatelessDataLoader {
 public:
  using BatchType = typename DatasetType::BatchType;
  StatelessDataLoader(DatasetType dataset, Sampler sampler, DataLoaderOptions options)
      : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
    TG_CHECK(options_.batch_size() > 0, "DataLoader: batch_size must be positive");
  }

  class Iterator {
   public:
    Iterator(StatelessDataLoader* loader, bool end) : loader_(loader) {
      if (!end) Advance();
    }
    BatchType& operator*() { return *batch_; }
    BatchType* operator->() { return &*batch_; }
    Iterator& operator++() {
      Advance();
      return *this;
    }
    bool operator==(const Iterator& o) const { return !batch_ && !o.batch_; }
    bool operator!=(const Iterator& o) const { return !(*this == o); }

   private:
    void Advance() {
      batch_.reset();
      auto indices = loader_->sampler_.next(loader_->options_.batch_size());
      if (!indices) return;
      if (loader_->options_.drop_last() && indices->size() < loader_->options_.batch_size()) {
        return;
      }
      batch_ = loader_->dataset_.get_batch(*indices);
    }
    StatelessDataLoader* loader_;
    std::optional<BatchType> batch_;
  };

  Iterator begin() {
    sampler_.reset();
    return Iterator(this, false);
  }
  Iterator end() { return Iterator(this, true); }
  const DataLoaderOptions& options() const { return options_; }

 private:
  DatasetType dataset_;
  Sampler sampler_;
  DataLoaderOptions options_;
};

template <typename Sampler = samplers::RandomSampler, typename DatasetType>
std::unique_ptr<StatelessDataLoader<DatasetType, Sampler>> make_data_loader(
    DatasetType dataset, DataLoaderOptions options = DataLoaderOptions()) {
  const std::optional<size_t> size = dataset.size();
  TG_CHECK(size.has_value(), "make_data_loader: the dataset has no size");
  Sampler sampler(static_cast<int64_t>(*size));
  return std::make_unique<StatelessDataLoader<DatasetType, Sampler>>(std::move(dataset),
                                                                     std::move(sampler), options);
}

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_TORCH_DATA_H_
