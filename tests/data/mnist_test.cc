// LoadMnist (dataset/mnist.h): exact pixel scaling and normalisation on small synthetic
// files, the validation errors, and (when Debian's dataset-fashion-mnist is installed) the real
// Fashion-MNIST splits: counts, shapes, label histograms and pinned values.
#include "dataset/mnist.h"

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "dataset/idx.h"
#include "gtest/gtest.h"
#include "tests/data/test_files.h"
#include "tests/tensor/throws.h"

namespace tg::data {
namespace {

using ::tg::data::testing::TempPath;
using ::tg::testing::ThrowsError;

// Pixel j of image i in the synthetic files.
uint8_t Pixel(int64_t i, int64_t j) { return static_cast<uint8_t>((i * 784 + j) * 37 % 256); }

RawTensor SyntheticImages(int64_t n, int64_t h = 28, int64_t w = 28) {
  std::vector<uint8_t> v;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < h * w; ++j) v.push_back(Pixel(i, j));
  }
  return RawTensor::FromVector<uint8_t>(v, {n, h, w});
}

// A directory holding train-* files (gzip) for `images` and `labels`.
std::string MakeDir(const RawTensor& images, const RawTensor& labels, bool gzip = true,
                    const std::string& prefix = "train") {
  const std::string dir = TempPath("mnist");
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string ext = gzip ? ".gz" : "";
  EXPECT_TRUE(
      WriteIdx(absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte", ext), images, gzip).ok());
  EXPECT_TRUE(
      WriteIdx(absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte", ext), labels, gzip).ok());
  return dir;
}

TEST(MnistTest, LoadsSyntheticSplitExactly) {
  const RawTensor labels = RawTensor::FromVector<uint8_t>({7, 0, 9}, {3});
  const std::string dir = MakeDir(SyntheticImages(3), labels);
  absl::StatusOr<MnistData> d = LoadMnist(dir, MnistSplit::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->images.dtype(), kF32);
  EXPECT_EQ(d->images.shape(), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(d->labels.dtype(), kI64);
  EXPECT_EQ(d->labels.to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));
  const std::vector<float> px = d->images.to_vector<float>();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 784; ++j) {
      ASSERT_EQ(px[i * 784 + j], static_cast<float>(Pixel(i, j) / 255.0)) << i << " " << j;
    }
  }
  EXPECT_EQ(static_cast<float>(255 / 255.0), 1.0f);
}

TEST(MnistTest, NormalisesWithTheCallersMeanAndStd) {
  const std::string dir = MakeDir(SyntheticImages(2), RawTensor::FromVector<uint8_t>({1, 2}, {2}));
  MnistOptions o;
  o.mean = kFashionMnistMean;
  o.std = kFashionMnistStd;
  absl::StatusOr<MnistData> d = LoadMnist(dir, MnistSplit::kTrain, o);
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<float> px = d->images.to_vector<float>();
  for (int64_t j = 0; j < 2 * 784; ++j) {
    ASSERT_EQ(px[j], static_cast<float>((Pixel(j / 784, j % 784) / 255.0 - 0.2860) / 0.3530));
  }
}

TEST(MnistTest, TestSplitAndUncompressedFiles) {
  const std::string dir = MakeDir(SyntheticImages(2), RawTensor::FromVector<uint8_t>({4, 5}, {2}),
                                  /*gzip=*/false, "t10k");
  absl::StatusOr<MnistData> d = LoadMnist(dir + "/", MnistSplit::kTest);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->labels.to_vector<int64_t>(), (std::vector<int64_t>{4, 5}));
  // No train-* files there.
  EXPECT_EQ(LoadMnist(dir, MnistSplit::kTrain).status().code(), absl::StatusCode::kNotFound);
}

TEST(MnistTest, CountMismatchIsInvalidArgument) {
  const std::string dir = MakeDir(SyntheticImages(3), RawTensor::FromVector<uint8_t>({1, 2}, {2}));
  const absl::Status s = LoadMnist(dir, MnistSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("LoadMnist: '", dir,
                                      "/train-images-idx3-ubyte.gz' holds 3 "
                                      "images but '",
                                      dir,
                                      "/train-labels-idx1-ubyte.gz' holds 2 "
                                      "labels; expected the same count"));
}

TEST(MnistTest, WrongImageShapeIsInvalidArgument) {
  const std::string dir =
      MakeDir(SyntheticImages(2, 27, 28), RawTensor::FromVector<uint8_t>({1, 2}, {2}));
  const absl::Status s = LoadMnist(dir, MnistSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("LoadMnist: '", dir,
                                      "/train-images-idx3-ubyte.gz' holds "
                                      "shape [2, 27, 28]; expected images [N, 28, 28]"));
}

TEST(MnistTest, LabelsMustBeOneDimensional) {
  const std::string dir = MakeDir(SyntheticImages(2), RawTensor::Zeros({2, 1}, kU8));
  const absl::Status s = LoadMnist(dir, MnistSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("LoadMnist: '", dir,
                                      "/train-labels-idx1-ubyte.gz' holds "
                                      "shape [2, 1]; expected labels [N]"));
}

TEST(MnistTest, LabelOutOfRangeIsInvalidArgument) {
  const std::string dir =
      MakeDir(SyntheticImages(3), RawTensor::FromVector<uint8_t>({3, 10, 200}, {3}));
  const absl::Status s = LoadMnist(dir, MnistSplit::kTrain).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("LoadMnist: '", dir,
                                      "/train-labels-idx1-ubyte.gz': label 1 is 10; expected 0 "
                                      "to 9"));
}

TEST(MnistTest, MissingDirectoryIsNotFound) {
  const std::string dir = TempPath("no-such-dir");
  const absl::Status s = LoadMnist(dir, MnistSplit::kTest).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: cannot open '", dir,
                                      "/t10k-images-idx3-ubyte.gz': No such file or directory"));
}

TEST(MnistTest, BadOptionsThrow) {
  MnistOptions o;
  o.std = 0;
  EXPECT_TRUE(ThrowsError([&] { (void)LoadMnist("x", MnistSplit::kTrain, o); },
                          "LoadMnist: std must be positive and finite, got 0"));
}

bool HaveFashionMnist() {
  struct stat st;
  return stat(kFashionMnistDir, &st) == 0;
}

TEST(MnistTest, RealFashionMnistTrain) {
  if (!HaveFashionMnist()) GTEST_SKIP() << kFashionMnistDir << " is not installed";
  absl::StatusOr<MnistData> d = LoadMnist(kFashionMnistDir, MnistSplit::kTrain);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(d->labels.shape(), (Shape{60000}));
  const std::vector<int64_t> labels = d->labels.to_vector<int64_t>();
  std::vector<int64_t> histogram(10, 0);
  for (int64_t l : labels) ++histogram.at(l);
  EXPECT_EQ(histogram, std::vector<int64_t>(10, 6000));
  EXPECT_EQ(labels[0], 9);  // an ankle boot
  EXPECT_EQ(labels[1], 0);
  EXPECT_EQ(labels[3], 3);
  const float* px = d->images.data<float>();
  double first_sum = 0, lo = 1, hi = 0;
  for (int64_t j = 0; j < 784; ++j) first_sum += px[j] * 255.0;
  for (int64_t j = 0; j < d->images.numel(); ++j) {
    lo = std::min<double>(lo, px[j]);
    hi = std::max<double>(hi, px[j]);
  }
  EXPECT_NEAR(first_sum, 76247, 1e-2);  // the u8 pixel sum of the first image
  EXPECT_EQ(lo, 0.0);
  EXPECT_EQ(hi, 1.0);
}

TEST(MnistTest, RealFashionMnistTest) {
  if (!HaveFashionMnist()) GTEST_SKIP() << kFashionMnistDir << " is not installed";
  absl::StatusOr<MnistData> d = LoadMnist(kFashionMnistDir, MnistSplit::kTest);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->images.shape(), (Shape{10000, 1, 28, 28}));
  const std::vector<int64_t> labels = d->labels.to_vector<int64_t>();
  std::vector<int64_t> histogram(10, 0);
  for (int64_t l : labels) ++histogram.at(l);
  EXPECT_EQ(histogram, std::vector<int64_t>(10, 1000));
  EXPECT_EQ(labels[0], 9);
  EXPECT_EQ(labels[1], 2);
  absl::StatusOr<RawTensor> raw =
      ReadIdx(absl::StrCat(kFashionMnistDir, "/t10k-images-idx3-ubyte.gz"));
  ASSERT_TRUE(raw.ok()) << raw.status();
  int64_t sum = 0;
  for (int64_t j = 0; j < 784; ++j) sum += raw->data<uint8_t>()[j];
  EXPECT_EQ(sum, 33456);
}

}  // namespace
}  // namespace tg::data
