#include "tools/fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace tg::fuzz {
namespace {

void RemoveScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(ScratchDir(), ignored);
}

}  // namespace

// Removed at exit (libFuzzer's -runs=N and -max_total_time end through exit()).
const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string templ = absl::StrCat(base != nullptr ? base : "/tmp", "/tg_fuzz_XXXXXX");
    if (::mkdtemp(templ.data()) == nullptr) {
      Fail(__FILE__, __LINE__,
           absl::StrCat("cannot create a scratch directory ", templ, ": ", std::strerror(errno)));
    }
    auto* d = new std::string(templ);
    std::atexit(RemoveScratchDir);
    return d;
  }();
  return *dir;
}

void Fail(const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", file, line, message.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string ScratchPath(const std::string& name) { return absl::StrCat(ScratchDir(), "/", name); }

std::string WriteScratchFile(const std::string& name, const void* data, size_t size) {
  const std::string path = ScratchPath(name);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(__FILE__, __LINE__, absl::StrCat("cannot create ", path));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd, p, size);
    if (w <= 0) Fail(__FILE__, __LINE__, absl::StrCat("cannot write ", path));
    p += w;
    size -= static_cast<size_t>(w);
  }
  ::close(fd);
  return path;
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(__FILE__, __LINE__, absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool SameTensor(const RawTensor& a, const RawTensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const RawTensor ca = a.contiguous(), cb = b.contiguous();
  const size_t n = static_cast<size_t>(ca.numel()) * ca.element_size();
  return n == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), n) == 0;
}

std::string Describe(const RawTensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(DTypeName(t.dtype()), ShapeToString(t.shape()));
}

}  // namespace tg::fuzz
