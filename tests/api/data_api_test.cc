// tg::data (dataset/torch_data.h): a user's dataset, transforms, both samplers and the loader,
// and MNIST over Debian's Fashion-MNIST files, as libtorch's torch::data is used.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tapegrad.h"

namespace {

// Example i: data [2] = {i, 10 i}, target i.
class Squares : public tg::data::datasets::Dataset<Squares> {
 public:
  explicit Squares(size_t n) : n_(n) {}
  tg::data::Example<> get(size_t index) override {
    const double i = static_cast<double>(index);
    return {tg::tensor({i, 10 * i}), tg::scalar_tensor(static_cast<int64_t>(index))};
  }
  std::optional<size_t> size() const override { return n_; }

 private:
  size_t n_;
};

TEST(DataApi, SequentialBatchesOfAUserDataset) {
  auto loader = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      Squares(10).map(tg::data::transforms::Stack<>()), /*batch_size=*/4);
  std::vector<int64_t> sizes, targets;
  for (auto& batch : *loader) {
    sizes.push_back(batch.data.size(0));
    EXPECT_EQ(batch.data.size(1), 2);
    for (int64_t t : batch.target.data().to_vector<int64_t>()) targets.push_back(t);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(targets, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // drop_last leaves out the short batch; a second pass starts again.
  auto dropping = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      Squares(10).map(tg::data::transforms::Stack<>()),
      tg::data::DataLoaderOptions().batch_size(4).drop_last(true));
  for (int pass = 0; pass < 2; ++pass) {
    int batches = 0;
    for (auto& batch : *dropping) {
      EXPECT_EQ(batch.data.size(0), 4);
      ++batches;
    }
    EXPECT_EQ(batches, 2);
  }
}

TEST(DataApi, RandomSamplerIsAPermutationPerPassFromTheSeed) {
  auto run = [](uint64_t seed) {
    tg::manual_seed(seed);
    auto loader = tg::data::make_data_loader(Squares(20).map(tg::data::transforms::Stack<>()), 8);
    std::vector<std::vector<int64_t>> passes;
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<int64_t> order;
      for (auto& batch : *loader) {
        for (int64_t t : batch.target.data().to_vector<int64_t>()) order.push_back(t);
      }
      passes.push_back(order);
    }
    return passes;
  };
  const auto a = run(5), b = run(5);
  EXPECT_EQ(a, b);        // reproducible from the seed
  EXPECT_NE(a[0], a[1]);  // a new permutation each pass
  for (auto order : a) {
    std::sort(order.begin(), order.end());
    std::vector<int64_t> all(20);
    for (int64_t i = 0; i < 20; ++i) all[static_cast<size_t>(i)] = i;
    EXPECT_EQ(order, all);
  }
}

// Example i, or an error for index 13.
class FailsAt13 : public tg::data::datasets::Dataset<FailsAt13> {
 public:
  tg::data::Example<> get(size_t index) override {
    TG_CHECK(index != 13, "FailsAt13: example 13 is broken");
    return {tg::tensor({static_cast<double>(index)}), tg::tensor({static_cast<int64_t>(index)})};
  }
  std::optional<size_t> size() const override { return 40; }
};

TEST(DataApi, WorkersGiveTheSameBatchesInTheSameOrder) {
  auto targets = [](size_t workers, size_t max_jobs, bool drop_last) {
    tg::manual_seed(7);
    auto loader = tg::data::make_data_loader<tg::data::samplers::RandomSampler>(
        Squares(103).map(tg::data::transforms::Stack<>()),
        tg::data::DataLoaderOptions().batch_size(8).workers(workers).max_jobs(max_jobs).drop_last(
            drop_last));
    std::vector<int64_t> out;
    for (int pass = 0; pass < 2; ++pass) {
      for (auto& batch : *loader) {
        for (int64_t t : batch.target.data().to_vector<int64_t>()) out.push_back(t);
        out.push_back(-1);  // batch boundary
      }
    }
    return out;
  };
  const std::vector<int64_t> serial = targets(0, 0, false);
  EXPECT_EQ(targets(1, 0, false), serial);
  EXPECT_EQ(targets(3, 0, false), serial);
  EXPECT_EQ(targets(2, 1, false), serial);
  EXPECT_EQ(targets(2, 0, true), targets(0, 0, true));
  EXPECT_NE(targets(2, 0, true), serial);  // drop_last dropped the 7 left over each pass
}

TEST(DataApi, AWorkersExceptionReachesTheLoopAtItsBatch) {
  auto loader = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      FailsAt13().map(tg::data::transforms::Stack<>()),
      tg::data::DataLoaderOptions().batch_size(4).workers(2));
  int batches = 0;
  try {
    for (auto& batch : *loader) {
      (void)batch;
      ++batches;
    }
    FAIL() << "example 13 throws";
  } catch (const tg::Error& e) {
    EXPECT_STREQ(e.what(), "FailsAt13: example 13 is broken");
  }
  EXPECT_EQ(batches, 3);  // batches 0-2 (indices 0-11) came first
}

TEST(DataApi, TransformsApplyPerExample) {
  auto loader = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      Squares(3)
          .map(tg::data::transforms::Lambda<>([](tg::Tensor x) { return x + 1; }))
          .map(tg::data::transforms::Normalize<>(1.0, 2.0))
          .map(tg::data::transforms::Stack<>()),
      3);
  for (auto& batch : *loader) {
    // ((i, 10 i) + 1 - 1) / 2
    EXPECT_EQ(batch.data.data().to_vector<float>(), (std::vector<float>{0, 0, 0.5f, 5, 1, 10}));
  }
}

TEST(DataApi, MnistFromItsFiles) {
  try {
    tg::data::datasets::MNIST("/no/such/dir");
    FAIL() << "a missing directory must throw";
  } catch (const tg::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("MNIST: ", 0), 0u) << e.what();
  }
  if (!std::filesystem::exists(tg::data::kFashionMnistDir)) {
    GTEST_SKIP() << "no Fashion-MNIST files in " << tg::data::kFashionMnistDir;
  }
  auto dataset =
      tg::data::datasets::MNIST(tg::data::kFashionMnistDir, tg::data::datasets::MNIST::Mode::kTest);
  EXPECT_EQ(dataset.size().value(), 10000u);
  auto loader = tg::data::make_data_loader<tg::data::samplers::SequentialSampler>(
      std::move(dataset).map(tg::data::transforms::Stack<>()), 64);
  auto it = loader->begin();
  auto& first = *it;
  EXPECT_EQ(first.data.sizes().vec(), (std::vector<int64_t>{64, 1, 28, 28}));
  EXPECT_EQ(first.target.dtype(), tg::kLong);
  EXPECT_GE(first.data.min().item<float>(), 0.0f);
  EXPECT_LE(first.data.max().item<float>(), 1.0f);
}

}  // namespace
