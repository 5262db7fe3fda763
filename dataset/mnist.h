// (Fashion-)MNIST: the images and labels of one split as training-ready tensors, read from the
// four IDX files of the data set (gzip-compressed or raw) and validated against each other.
//
//   tg::data::MnistOptions options;
//   options.mean = tg::data::kFashionMnistMean;   // optional: (x - mean) / std after [0, 1]
//   options.std = tg::data::kFashionMnistStd;
//   absl::StatusOr<tg::data::MnistData> train =
//       tg::data::LoadMnist(tg::data::kFashionMnistDir, tg::data::MnistSplit::kTrain, options);
//   if (!train.ok()) return train.status();
//   // train->images: f32 [60000, 1, 28, 28]; train->labels: i64 [60000], values 0..9
//
// The directory holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
// t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (Debian's dataset-fashion-mnist
// installs them in kFashionMnistDir); a name without ".gz" is used when only that exists.
// Errors: those of ReadIdx (dataset/idx.h), and InvalidArgument when the images are not
// [N, 28, 28], the labels not [N] with the same N, or a label is 10 or more (the message names
// the file, the index and the value).
#ifndef TAPEGRAD_DATASET_MNIST_H_
#define TAPEGRAD_DATASET_MNIST_H_

#include <string>

#include "absl/status/statusor.h"
#include "tensor/tensor.h"

namespace tg::data {

// Where Debian's dataset-fashion-mnist package puts the data set.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
// Mean and standard deviation of the Fashion-MNIST training pixels scaled to [0, 1] (over all
// 47,040,000 pixels: 0.286040..., 0.353024...).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr int64_t kMnistImageSize = 28;
inline constexpr int64_t kMnistClasses = 10;

enum class MnistSplit { kTrain, kTest };

struct MnistOptions {
  // Pixels p (0..255) become (p / 255 - mean) / std, computed in double and rounded once to
  // f32. The defaults leave them in [0, 1]. std must be positive and finite (tg::Error).
  double mean = 0.0;
  double std = 1.0;
};

struct MnistData {
  RawTensor images;  // f32 [N, 1, 28, 28]
  RawTensor labels;  // i64 [N], values in [0, 10)
};

// Loads one split from `dir` ("train-*" or "t10k-*" files).
absl::StatusOr<MnistData> LoadMnist(const std::string& dir, MnistSplit split,
                                    const MnistOptions& options = {});

// Loads an explicit pair of IDX files (images [N, 28, 28] u8, labels [N] u8).
absl::StatusOr<MnistData> LoadMnistFiles(const std::string& images_path,
                                         const std::string& labels_path,
                                         const MnistOptions& options = {});

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_MNIST_H_
