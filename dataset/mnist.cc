#include "dataset/mnist.h"

#include <sys/stat.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "dataset/idx.h"
#include "tensor/error.h"

namespace tg::data {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// dir/<name>.gz, or dir/<name> when only the uncompressed file exists.
std::string DataFile(const std::string& dir, const std::string& name) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
  const std::string gz = base + ".gz";
  return !Exists(gz) && Exists(base) ? base : gz;
}

}  // namespace

absl::StatusOr<MnistData> LoadMnistFiles(const std::string& images_path,
                                         const std::string& labels_path,
                                         const MnistOptions& options) {
  TG_CHECK(std::isfinite(options.mean), "LoadMnist: mean must be finite, got ", options.mean);
  TG_CHECK(std::isfinite(options.std) && options.std > 0,
           "LoadMnist: std must be positive and finite, got ", options.std);
  absl::StatusOr<RawTensor> images = ReadIdx(images_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<RawTensor> labels = ReadIdx(labels_path);
  if (!labels.ok()) return labels.status();

  if (images->dim() != 3 || images->size(1) != kMnistImageSize ||
      images->size(2) != kMnistImageSize) {
    return absl::InvalidArgumentError(absl::StrCat("LoadMnist: '", images_path, "' holds shape ",
                                                   ShapeToString(images->shape()),
                                                   "; expected images [N, 28, 28]"));
  }
  if (labels->dim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("LoadMnist: '", labels_path, "' holds shape ",
                                                   ShapeToString(labels->shape()),
                                                   "; expected labels [N]"));
  }
  const int64_t n = images->size(0);
  if (labels->size(0) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadMnist: '", images_path, "' holds ", n, " images but '", labels_path,
                     "' holds ", labels->size(0), " labels; expected the same count"));
  }

  MnistData out;
  out.labels = RawTensor::Empty({n}, kI64);
  const uint8_t* l = labels->data<uint8_t>();
  int64_t* lo = out.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (l[i] >= kMnistClasses) {
      return absl::InvalidArgumentError(absl::StrCat("LoadMnist: '", labels_path, "': label ", i,
                                                     " is ", static_cast<int>(l[i]),
                                                     "; expected 0 to ", kMnistClasses - 1));
    }
    lo[i] = l[i];
  }

  // One lookup table: every pixel value maps to the same f32.
  float table[256];
  for (int p = 0; p < 256; ++p) {
    table[p] = static_cast<float>((p / 255.0 - options.mean) / options.std);
  }
  out.images = RawTensor::Empty({n, 1, kMnistImageSize, kMnistImageSize}, kF32);
  const uint8_t* src = images->data<uint8_t>();
  float* dst = out.images.data<float>();
  for (int64_t i = 0; i < images->numel(); ++i) dst[i] = table[src[i]];
  return out;
}

absl::StatusOr<MnistData> LoadMnist(const std::string& dir, MnistSplit split,
                                    const MnistOptions& options) {
  const std::string prefix = split == MnistSplit::kTrain ? "train" : "t10k";
  return LoadMnistFiles(DataFile(dir, prefix + "-images-idx3-ubyte"),
                        DataFile(dir, prefix + "-labels-idx1-ubyte"), options);
}

}  // namespace tg::data
