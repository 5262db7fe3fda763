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
// Dataset<Self, Example<...>>) and implements get(index) and size(). Batches come in the
// sampler's order, so a run is reproducible from tg::manual_seed alone: the sampler draws in the
// calling thread (RandomSampler its permutation from the default generator when it is reset,
// each pass over the loader), and with DataLoaderOptions().workers(n) n threads make the batches
// ahead (at most max_jobs, default 2n, in flight) while the loop consumes them in order, the
// same batches as without workers (libtorch's enforce_ordering). With workers, get() is called
// from several threads at once and must allow it (libtorch's rule too); an exception it throws
// reaches the loop at that batch.
#ifndef TAPEGRAD_DATASET_TORCH_DATA_H_
#define TAPEGRAD_DATASET_TORCH_DATA_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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
  DataLoaderOptions& workers(size_t v) {  // threads that make batches ahead; 0: the caller's
    workers_ = v;
    return *this;
  }
  DataLoaderOptions& max_jobs(size_t v) {  // batches in flight with workers (0: 2 * workers)
    max_jobs_ = v;
    return *this;
  }
  DataLoaderOptions& drop_last(bool v) {
    drop_last_ = v;
    return *this;
  }
  size_t batch_size() const { return batch_size_; }
  size_t workers() const { return workers_; }
  size_t max_jobs() const { return max_jobs_ != 0 ? max_jobs_ : 2 * workers_; }
  bool drop_last() const { return drop_last_; }

 private:
  size_t batch_size_ = 1, workers_ = 0, max_jobs_ = 0;
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
      if (loader_->workers_ != nullptr) {
        batch_ = loader_->workers_->Next();
        return;
      }
      auto indices = loader_->NextIndices();
      if (indices) batch_ = loader_->dataset_.get_batch(*indices);
    }
    StatelessDataLoader* loader_;
    std::optional<BatchType> batch_;
  };

  Iterator begin() {
    workers_.reset();  // a pass left unfinished: its threads stop first
    sampler_.reset();
    if (options_.workers() > 0) workers_ = std::make_unique<Workers>(this);
    return Iterator(this, false);
  }
  Iterator end() { return Iterator(this, true); }
  const DataLoaderOptions& options() const { return options_; }

 private:
  // The next batch's indices from the sampler (nullopt at the end; a short last batch is the end
  // with drop_last).
  std::optional<std::vector<size_t>> NextIndices() {
    auto indices = sampler_.next(options_.batch_size());
    if (indices && options_.drop_last() && indices->size() < options_.batch_size()) return {};
    return indices;
  }

  // One pass's worker threads: jobs numbered in sampler order, results delivered in that order.
  class Workers {
   public:
    explicit Workers(StatelessDataLoader* loader) : loader_(loader) {
      for (size_t i = 0; i < loader->options_.max_jobs() && Submit(); ++i) {
      }
      for (size_t i = 0; i < loader->options_.workers(); ++i)
        threads_.emplace_back([this] { Run(); });
    }
    ~Workers() {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      for (std::thread& t : threads_) t.join();
    }
    // The next batch in order (nullopt at the end); rethrows a worker's exception.
    std::optional<BatchType> Next() {
      std::unique_lock<std::mutex> lock(mu_);
      if (next_ == submitted_) return std::nullopt;
      done_cv_.wait(lock, [&] { return results_.count(next_) != 0; });
      Result result = std::move(results_.at(next_));
      results_.erase(next_++);
      lock.unlock();
      if (result.error) std::rethrow_exception(result.error);
      {
        std::lock_guard<std::mutex> relock(mu_);
        Submit();  // keep max_jobs in flight (the sampler is drawn on this thread)
      }
      cv_.notify_one();
      return std::move(result.batch);
    }

   private:
    struct Result {
      std::optional<BatchType> batch;
      std::exception_ptr error;
    };
    // Queues the sampler's next indices; false at the end. Called with mu_ held (or before the
    // threads exist).
    bool Submit() {
      auto indices = loader_->NextIndices();
      if (!indices) return false;
      jobs_.emplace_back(submitted_++, std::move(*indices));
      return true;
    }
    void Run() {
      for (;;) {
        std::pair<size_t, std::vector<size_t>> job;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
          if (stop_) return;
          job = std::move(jobs_.front());
          jobs_.pop_front();
        }
        Result result;
        try {
          result.batch = loader_->dataset_.get_batch(job.second);
        } catch (...) {
          result.error = std::current_exception();
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          results_.emplace(job.first, std::move(result));
        }
        done_cv_.notify_all();
      }
    }

    StatelessDataLoader* loader_;
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    std::deque<std::pair<size_t, std::vector<size_t>>> jobs_;
    std::map<size_t, Result> results_;
    size_t submitted_ = 0, next_ = 0;
    bool stop_ = false;
    std::vector<std::thread> threads_;
  };

  DatasetType dataset_;
  Sampler sampler_;
  DataLoaderOptions options_;
  std::unique_ptr<Workers> workers_;  // declared last: its threads stop before the rest goes
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
