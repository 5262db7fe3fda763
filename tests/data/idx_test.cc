// ReadIdx / WriteIdx (dataset/idx.h): exact decoding of raw and gzip files written byte by
// byte, the writer's bytes, and a clear absl::Status for every malformed file (bad magic,
// unsupported type, bad dims, huge sizes, truncation at every length, trailing bytes, corrupt
// gzip) with the pinned message text.
#include "dataset/idx.h"

#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/data/test_files.h"
#include "tests/tensor/throws.h"

namespace tg::data {
namespace {

using ::tg::data::testing::ReadBytes;
using ::tg::data::testing::TempPath;
using ::tg::data::testing::WriteBytes;
using ::tg::data::testing::WriteGzipBytes;
using ::tg::testing::ThrowsError;

// A [2, 3, 4] u8 IDX file whose element i is (7 * i + 3) % 256: 16 header + 24 data bytes.
std::vector<uint8_t> SmallIdx3() {
  std::vector<uint8_t> b = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4};
  for (int i = 0; i < 24; ++i) b.push_back(static_cast<uint8_t>((7 * i + 3) % 256));
  return b;
}

std::vector<uint8_t> SmallIdx3Values() {
  std::vector<uint8_t> v;
  for (int i = 0; i < 24; ++i) v.push_back(static_cast<uint8_t>((7 * i + 3) % 256));
  return v;
}

absl::Status ReadStatus(const std::vector<uint8_t>& bytes, std::string* path_out = nullptr) {
  const std::string path = TempPath("file.idx");
  WriteBytes(path, bytes);
  if (path_out != nullptr) *path_out = path;
  return ReadIdx(path).status();
}

TEST(IdxTest, ReadsRawFileExactly) {
  const std::string path = TempPath("raw.idx");
  WriteBytes(path, SmallIdx3());
  absl::StatusOr<RawTensor> t = ReadIdx(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), kU8);
  EXPECT_EQ(t->shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(t->is_contiguous());
  EXPECT_EQ(t->to_vector<uint8_t>(), SmallIdx3Values());
}

TEST(IdxTest, ReadsGzipFileExactly) {
  const std::string path = TempPath("file.idx.gz");
  WriteGzipBytes(path, SmallIdx3());
  ASSERT_EQ(ReadBytes(path).at(0), 0x1f);  // really compressed
  absl::StatusOr<RawTensor> t = ReadIdx(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t->to_vector<uint8_t>(), SmallIdx3Values());
}

TEST(IdxTest, ReadsOneDimensionalLabels) {
  const std::string path = TempPath("labels.idx");
  WriteBytes(path, {0, 0, 8, 1, 0, 0, 0, 5, 9, 0, 0, 3, 255});
  absl::StatusOr<RawTensor> t = ReadIdx(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{5}));
  EXPECT_EQ(t->to_vector<int64_t>(), (std::vector<int64_t>{9, 0, 0, 3, 255}));
}

TEST(IdxTest, ReadsBigEndianSizesAndFourDims) {
  // Sizes 256 and 1 x 1 x 1: the size bytes are big-endian (00 00 01 00 = 256).
  std::vector<uint8_t> b = {0, 0, 8, 4, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1};
  for (int i = 0; i < 256; ++i) b.push_back(static_cast<uint8_t>(255 - i));
  const std::string path = TempPath("four.idx");
  WriteBytes(path, b);
  absl::StatusOr<RawTensor> t = ReadIdx(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->shape(), (Shape{256, 1, 1, 1}));
  EXPECT_EQ(t->to_vector<int64_t>()[0], 255);
  EXPECT_EQ(t->to_vector<int64_t>()[255], 0);
}

TEST(IdxTest, LargeGzipFileReadsInChunks) {
  // 3 MiB + 5 bytes of data: more than the reader's first 1 MiB chunk.
  const int64_t n = (int64_t{3} << 20) + 5;
  std::vector<uint8_t> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<uint8_t>((i * 131) >> 3);
  const RawTensor t = RawTensor::FromVector<uint8_t>(values, {n});
  const std::string path = TempPath("big.idx.gz");
  ASSERT_TRUE(WriteIdx(path, t, /*gzip=*/true).ok());
  absl::StatusOr<RawTensor> r = ReadIdx(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->to_vector<uint8_t>(), values);
}

TEST(IdxTest, WriteIdxWritesTheFormatAndRoundTrips) {
  const RawTensor t = RawTensor::FromVector<uint8_t>(SmallIdx3Values(), {2, 3, 4});
  const std::string raw = TempPath("w.idx");
  ASSERT_TRUE(WriteIdx(raw, t, /*gzip=*/false).ok());
  EXPECT_EQ(ReadBytes(raw), SmallIdx3());

  const std::string gz = TempPath("w.idx.gz");
  ASSERT_TRUE(WriteIdx(gz, t, /*gzip=*/true).ok());
  const std::vector<uint8_t> gz_bytes = ReadBytes(gz);
  ASSERT_GE(gz_bytes.size(), 2u);
  EXPECT_EQ(gz_bytes[0], 0x1f);
  EXPECT_EQ(gz_bytes[1], 0x8b);
  absl::StatusOr<RawTensor> back = ReadIdx(gz);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shape(), t.shape());
  EXPECT_EQ(back->to_vector<uint8_t>(), SmallIdx3Values());

  // A non-contiguous view is written in its logical (row-major) order.
  const RawTensor tt = t.transpose(1, 2);  // [2, 4, 3]
  ASSERT_TRUE(WriteIdx(raw, tt, false).ok());
  absl::StatusOr<RawTensor> back_t = ReadIdx(raw);
  ASSERT_TRUE(back_t.ok()) << back_t.status();
  EXPECT_EQ(back_t->shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(back_t->to_vector<uint8_t>(), tt.to_vector<uint8_t>());
  EXPECT_FALSE(ReadBytes(raw + ".tmp").size() > 0);  // the temporary file was renamed
}

TEST(IdxTest, WriteIdxRejectsTensorsItCannotRepresent) {
  EXPECT_TRUE(ThrowsError([] { (void)WriteIdx(TempPath("x"), RawTensor::Zeros({2}), false); },
                          "WriteIdx: expected a u8 tensor, got f32"));
  EXPECT_TRUE(ThrowsError(
      [] {
        (void)WriteIdx(TempPath("x"), RawTensor::Zeros({1, 1, 1, 1, 1}, kU8), false);
      },
      "WriteIdx: expected 1 to 4 dims, got shape [1, 1, 1, 1, 1]"));
  EXPECT_TRUE(ThrowsError(
      [] {
        (void)WriteIdx(TempPath("x"), RawTensor::Zeros({0, 3}, kU8), false);
      },
      "WriteIdx: size 0 of dim 0"));
}

TEST(IdxTest, WriteIdxToAMissingDirectoryIsNotFound) {
  const absl::Status s = WriteIdx(TempPath("no/such/dir/x.idx"), RawTensor::Zeros({2}, kU8), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST(IdxTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = TempPath("does-not-exist.idx.gz");
  const absl::Status s = ReadIdx(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("ReadIdx: cannot open '", path, "': No such file or directory"));
}

TEST(IdxTest, DirectoryIsInvalidArgument) {
  const std::string dir = TempPath("a-directory");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const absl::Status s = ReadIdx(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", dir, "' is a directory, not an IDX file"));
}

TEST(IdxTest, BadMagicNamesTheBytes) {
  std::string path;
  const absl::Status s = ReadStatus({'P', 'K', 3, 4, 0, 0, 0, 1, 0}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "' is not an IDX file: it starts with bytes 0x50 0x4b, "
                                      "expected 0x00 0x00"));
}

TEST(IdxTest, UnsupportedElementTypesAreNamed) {
  std::string path;
  absl::Status s = ReadStatus({0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': IDX element type 0x0d (float32) is not supported; "
                                      "expected 0x08 (unsigned byte)"));
  s = ReadStatus({0, 0, 0x09, 1, 0, 0, 0, 1, 0}, &path);
  EXPECT_TRUE(absl::StrContains(s.message(), "0x09 (signed byte) is not supported")) << s;
  s = ReadStatus({0, 0, 0x42, 1, 0, 0, 0, 1, 0}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': unknown IDX element type 0x42; expected 0x08 "
                                      "(unsigned byte)"));
}

TEST(IdxTest, DimensionCountMustBeOneToFour) {
  std::string path;
  absl::Status s = ReadStatus({0, 0, 8, 0, 7}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("ReadIdx: '", path, "': IDX header has 0 dimensions; expected 1 to 4"));
  s = ReadStatus({0, 0, 8, 5, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "has 5 dimensions; expected 1 to 4")) << s;
}

TEST(IdxTest, ZeroSizeIsInvalidArgument) {
  std::string path;
  const absl::Status s = ReadStatus({0, 0, 8, 2, 0, 0, 0, 3, 0, 0, 0, 0}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': dimension 1 of shape [3, 0] is 0; expected a positive "
                                      "size"));
}

TEST(IdxTest, HugeSizesAreRejectedBeforeAnyAllocation) {
  // 4 x (2^32 - 1): the product overflows 64 bits; rejected from the header alone.
  std::string path;
  std::vector<uint8_t> b = {0, 0, 8, 4};
  for (int i = 0; i < 16; ++i) b.push_back(0xFF);
  b.push_back(1);
  absl::Status s = ReadStatus(b, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("ReadIdx: '", path,
                         "': shape [4294967295, 4294967295, 4294967295, 4294967295] needs more "
                         "than the limit of 4294967296 bytes"));

  // Just above the default limit: 2 x 2^31 + ... = 2^32 + 2^31.
  s = ReadStatus({0, 0, 8, 2, 0, 0, 0, 3, 0x80, 0, 0, 0, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "shape [3, 2147483648] needs more than the limit"))
      << s;
}

TEST(IdxTest, MaxBytesIsTheLimit) {
  std::vector<uint8_t> b = {0, 0, 8, 2, 0, 0, 0, 10, 0, 0, 0, 10};
  b.resize(b.size() + 100, 1);
  const std::string path = TempPath("limit.idx");
  WriteBytes(path, b);
  EXPECT_TRUE(ReadIdx(path, 100).ok());
  const absl::Status s = ReadIdx(path, 99).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "needs more than the limit of 99 bytes")) << s;
}

TEST(IdxTest, HeaderPromisingAGigabyteFromATinyFileIsDataLoss) {
  // 10^9 bytes promised (below the limit), 3 present: the reader reports the counts instead of
  // allocating the promised gigabyte first.
  std::string path;
  const absl::Status s = ReadStatus({0, 0, 8, 1, 0x3B, 0x9A, 0xCA, 0x00, 1, 2, 3}, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': truncated IDX file: expected 1000000008 bytes (8-byte "
                                      "header + 1000000000 bytes of data for shape "
                                      "[1000000000]), found 11"));
}

TEST(IdxTest, PromiseJustBelowTheLimitFromAShortGzipStreamIsDataLoss) {
  // [65535, 65535] = 4294836225 bytes promised, 8 MiB of zeros delivered: the buffer only grows
  // with the delivered bytes, so this returns at once instead of allocating 4 GB.
  std::vector<uint8_t> b = {0, 0, 8, 2, 0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF};
  b.resize(b.size() + (size_t{8} << 20), 0);
  const std::string path = TempPath("short.idx.gz");
  WriteGzipBytes(path, b);
  const absl::Status s = ReadIdx(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': truncated IDX file: expected 4294836237 bytes (12-byte "
                                      "header + 4294836225 bytes of data for shape [65535, "
                                      "65535]), found 8388620"));
}

TEST(IdxTest, TruncatedRawFileAtEveryLengthIsDataLoss) {
  const std::vector<uint8_t> full = SmallIdx3();
  for (size_t len = 0; len < full.size(); ++len) {
    std::string path;
    const absl::Status s =
        ReadStatus(std::vector<uint8_t>(full.begin(), full.begin() + len), &path);
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
    std::string expected;
    if (len < 4) {
      expected = absl::StrCat("ReadIdx: '", path,
                              "': truncated IDX header: expected 4 magic bytes, found ", len);
    } else if (len < 16) {
      expected = absl::StrCat("ReadIdx: '", path,
                              "': truncated IDX header: expected 16 bytes for 3 dimensions, "
                              "found ",
                              len);
    } else {
      expected = absl::StrCat("ReadIdx: '", path,
                              "': truncated IDX file: expected 40 bytes (16-byte header + 24 "
                              "bytes of data for shape [2, 3, 4]), found ",
                              len);
    }
    EXPECT_EQ(s.message(), expected) << "length " << len;
  }
}

TEST(IdxTest, TruncatedGzipFileAtEveryLengthIsDataLoss) {
  const std::string full_path = TempPath("full.idx.gz");
  WriteGzipBytes(full_path, SmallIdx3());
  const std::vector<uint8_t> gz = ReadBytes(full_path);
  ASSERT_GT(gz.size(), 18u);
  for (size_t len = 0; len < gz.size(); ++len) {
    const std::string path = TempPath("cut.idx.gz");
    WriteBytes(path, std::vector<uint8_t>(gz.begin(), gz.begin() + len));
    const absl::Status s = ReadIdx(path).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
  }
  // The gzip trailer (CRC-32 + length) cut off after all the data decompressed.
  const std::string path = TempPath("no-trailer.idx.gz");
  WriteBytes(path, std::vector<uint8_t>(gz.begin(), gz.end() - 1));
  const absl::Status s = ReadIdx(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "unexpected end of file")) << s;
}

TEST(IdxTest, TrailingBytesAreDataLoss) {
  std::vector<uint8_t> b = SmallIdx3();
  b.push_back(0);
  b.push_back(1);
  std::string path;
  absl::Status s = ReadStatus(b, &path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': IDX file has trailing bytes: expected 40 bytes "
                                      "(16-byte header + 24 bytes of data for shape [2, 3, 4]), "
                                      "found 42"));

  const std::string gz = TempPath("trailing.idx.gz");
  WriteGzipBytes(gz, b);
  s = ReadIdx(gz).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "trailing bytes: expected 40 bytes")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "found 42")) << s;
}

// zlib's gzread stops quietly at bytes after the gzip stream that do not start a gzip member.
TEST(IdxTest, BytesAfterTheGzipStreamAreDataLoss) {
  const std::string ok = TempPath("one_member.idx.gz");
  WriteGzipBytes(ok, SmallIdx3());
  ASSERT_TRUE(ReadIdx(ok).ok());
  std::ifstream in(ok, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = TempPath("garbage_after_gzip.idx.gz");
  std::ofstream(path, std::ios::binary) << bytes << "garbage";
  const absl::Status s = ReadIdx(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadIdx: '", path,
                                      "': the file does not end with the gzip trailer of its 40 "
                                      "IDX bytes (bytes after the gzip stream, or several gzip "
                                      "members)"));
}

TEST(IdxTest, CorruptGzipNeverCrashesAndNeverReturnsWrongData) {
  const std::string full_path = TempPath("full.idx.gz");
  WriteGzipBytes(full_path, SmallIdx3());
  const std::vector<uint8_t> gz = ReadBytes(full_path);
  int errors = 0;
  for (size_t i = 0; i < gz.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      std::vector<uint8_t> bad = gz;
      bad[i] ^= flip;
      const std::string path = TempPath("flip.idx.gz");
      WriteBytes(path, bad);
      absl::StatusOr<RawTensor> t = ReadIdx(path);
      if (t.ok()) {
        // Only bytes the gzip format does not check (e.g. the header's mtime and OS fields) may
        // change without an error, and then the data must be unchanged.
        EXPECT_EQ(t->shape(), (Shape{2, 3, 4})) << "byte " << i;
        EXPECT_EQ(t->to_vector<uint8_t>(), SmallIdx3Values()) << "byte " << i;
      } else {
        ++errors;
        EXPECT_FALSE(t.status().message().empty());
      }
    }
  }
  EXPECT_GT(errors, static_cast<int>(gz.size()));  // most flips are detected
}

TEST(IdxTest, RejectsNonPositiveMaxBytes) {
  EXPECT_TRUE(ThrowsError([] { (void)ReadIdx("x", 0); }, "ReadIdx: max_bytes must be positive"));
}

}  // namespace
}  // namespace tg::data
