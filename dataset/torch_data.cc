#include "dataset/torch_data.h"

#include <algorithm>

namespace tg::data {
namespace datasets {

MNIST::MNIST(const std::string& root, Mode mode) : mode_(mode) {
  absl::StatusOr<MnistData> loaded =
      LoadMnist(root, mode == Mode::kTrain ? MnistSplit::kTrain : MnistSplit::kTest);
  if (!loaded.ok()) throw Error(absl::StrCat("MNIST: ", loaded.status().message()));
  images_ = Tensor(loaded->images);
  targets_ = Tensor(loaded->labels);
}

Example<> MNIST::get(size_t index) {
  const int64_t n = images_.size(0);
  TG_CHECK(index < static_cast<size_t>(n), "MNIST: index ", index, " is out of range for ", n,
           " examples");
  const int64_t i = static_cast<int64_t>(index);
  return Example<>(images_[i], targets_[i]);
}

std::optional<size_t> MNIST::size() const { return static_cast<size_t>(images_.size(0)); }

}  // namespace datasets

namespace samplers {

std::optional<std::vector<size_t>> SequentialSampler::next(size_t batch_size) {
  if (next_ >= size_) return std::nullopt;
  std::vector<size_t> indices;
  const size_t end = std::min(size_, next_ + batch_size);
  for (size_t i = next_; i < end; ++i) indices.push_back(i);
  next_ = end;
  return indices;
}

void RandomSampler::reset(std::optional<size_t> new_size) {
  if (new_size) size_ = *new_size;
  const std::vector<int64_t> perm =
      randperm(static_cast<int64_t>(size_)).data().to_vector<int64_t>();
  order_.assign(perm.begin(), perm.end());
  next_ = 0;
}

std::optional<std::vector<size_t>> RandomSampler::next(size_t batch_size) {
  if (next_ >= size_) return std::nullopt;
  const size_t end = std::min(size_, next_ + batch_size);
  std::vector<size_t> indices(order_.begin() + static_cast<std::ptrdiff_t>(next_),
                              order_.begin() + static_cast<std::ptrdiff_t>(end));
  next_ = end;
  return indices;
}

}  // namespace samplers
}  // namespace tg::data
