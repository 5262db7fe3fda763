// Helpers for the data tests: unique paths under TEST_TMPDIR and whole-file byte I/O.
//
//   std::string path = tg::data::testing::TempPath("labels.idx");
//   tg::data::testing::WriteBytes(path, {0, 0, 8, 1, 0, 0, 0, 1, 7});
//   std::vector<uint8_t> bytes = tg::data::testing::ReadBytes(path);
#ifndef TAPEGRAD_TESTS_DATA_TEST_FILES_H_
#define TAPEGRAD_TESTS_DATA_TEST_FILES_H_

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tg::data::testing {

// TEST_TMPDIR/<counter>_<name>: a fresh path for every call.
inline std::string TempPath(const std::string& name) {
  static int counter = 0;
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", counter++, "_", name);
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  }
  ASSERT_EQ(std::fclose(f), 0);
}

// Writes `bytes` gzip-compressed (zlib's gzopen "wb").
inline void WriteGzipBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(gz), Z_OK);
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::vector<uint8_t> bytes;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return bytes;
  uint8_t buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  std::fclose(f);
  return bytes;
}

}  // namespace tg::data::testing

#endif  // TAPEGRAD_TESTS_DATA_TEST_FILES_H_
