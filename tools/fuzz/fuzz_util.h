// Helpers shared by the fuzz targets of tools/fuzz: invariant checks that abort with a message
// (so both libFuzzer and the standalone driver report the input), a per-process scratch
// directory for readers that take a path, and byte-exact tensor comparison.
//
//   std::string path = tg::fuzz::WriteScratchFile("input.idx", data, size);
//   absl::StatusOr<tg::RawTensor> t = tg::fuzz::NoThrow("ReadIdx", [&] { return ReadIdx(path); });
//   FUZZ_CHECK(!t.ok() || t->dtype() == tg::kU8, "ReadIdx returned dtype ", ...);
#ifndef TAPEGRAD_TOOLS_FUZZ_FUZZ_UTIL_H_
#define TAPEGRAD_TOOLS_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "tensor/tensor.h"

namespace tg::fuzz {

// Prints "fuzz invariant violated at file:line: message" and aborts: a crash to the fuzzer.
[[noreturn]] void Fail(const char* file, int line, const std::string& message);

#define FUZZ_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      ::tg::fuzz::Fail(__FILE__, __LINE__, ::absl::StrCat(#cond, ": ", __VA_ARGS__)); \
    }                                                                                 \
  } while (0)

// Runs `fn` and returns its result; an exception escaping a reader is a bug (readers report
// file problems as absl::Status), so it aborts naming `what` and the exception's message.
template <class Fn>
auto NoThrow(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::exception& e) {
    Fail(__FILE__, __LINE__,
         absl::StrCat(what, " threw instead of returning a Status: ", e.what()));
  } catch (...) {
    Fail(__FILE__, __LINE__, absl::StrCat(what, " threw a non-std exception"));
  }
}

// Writes `data` to <scratch dir>/<name> (replacing it) and returns the path. The scratch
// directory is made once per process under $TEST_TMPDIR (or $TMPDIR, or /tmp) and removed at
// exit.
std::string WriteScratchFile(const std::string& name, const void* data, size_t size);
// The scratch directory, and <scratch dir>/<name> (nothing is written).
const std::string& ScratchDir();
std::string ScratchPath(const std::string& name);
// The whole file, or aborts.
std::string ReadWholeFile(const std::string& path);

// Same dtype, shape and bytes (contiguous CPU tensors, as the readers return).
bool SameTensor(const RawTensor& a, const RawTensor& b);
// "f32[2, 3]" for messages.
std::string Describe(const RawTensor& t);

}  // namespace tg::fuzz

#endif  // TAPEGRAD_TOOLS_FUZZ_FUZZ_UTIL_H_
