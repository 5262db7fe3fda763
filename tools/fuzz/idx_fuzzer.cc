// Fuzz target of the IDX reader (dataset/idx.h), raw or gzip-compressed.
//
// The input is a whole file. Checked on every input:
// - A tensor read is u8, contiguous, with 1 to 4 dims of positive sizes.
// - With a small max_bytes (64) the reader refuses larger payloads and otherwise agrees with the
//   default limit.
// - A raw (not gzip) file that reads is exactly header + data: WriteIdx(raw) of the tensor
//   reproduces the input byte for byte; a gzip one round-trips through WriteIdx(gzip) + ReadIdx.
// Crashes, sanitizer reports and exceptions escaping the reader are failures.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dataset/idx.h"
#include "tools/fuzz/fuzz_util.h"

namespace tg::fuzz {
namespace {

constexpr int64_t kSmallLimit = 64;

void Run(const uint8_t* data, size_t size) {
  const std::string path = WriteScratchFile("input.idx", data, size);
  absl::StatusOr<RawTensor> full = NoThrow("ReadIdx", [&] { return data::ReadIdx(path); });
  absl::StatusOr<RawTensor> small =
      NoThrow("ReadIdx(small)", [&] { return data::ReadIdx(path, kSmallLimit); });

  if (small.ok()) {
    FUZZ_CHECK(small->numel() <= kSmallLimit, "max_bytes ", kSmallLimit, " but read ",
               Describe(*small));
    FUZZ_CHECK(full.ok() && SameTensor(*full, *small), "the two limits disagree");
  }
  if (!full.ok()) return;
  const RawTensor& t = *full;
  FUZZ_CHECK(t.dtype() == kU8 && t.is_contiguous() && t.device().is_cpu(), Describe(t));
  FUZZ_CHECK(t.dim() >= 1 && t.dim() <= 4, Describe(t));
  for (int64_t d = 0; d < t.dim(); ++d) FUZZ_CHECK(t.size(d) >= 1, Describe(t));
  if (t.numel() <= kSmallLimit) {
    FUZZ_CHECK(small.ok(), "a ", t.numel(), "-byte payload is refused with max_bytes ", kSmallLimit,
               ": ", small.status().ToString());
  }

  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  const std::string out = ScratchPath("written.idx");
  absl::Status written = NoThrow("WriteIdx", [&] { return data::WriteIdx(out, t, gzip); });
  FUZZ_CHECK(written.ok(), written.ToString());
  if (!gzip) {
    FUZZ_CHECK(ReadWholeFile(out) == std::string(reinterpret_cast<const char*>(data), size),
               "WriteIdx does not reproduce the raw file that was read as ", Describe(t));
  }
  absl::StatusOr<RawTensor> back = NoThrow("ReadIdx", [&] { return data::ReadIdx(out); });
  FUZZ_CHECK(back.ok() && SameTensor(*back, t), "WriteIdx + ReadIdx round trip");
}

}  // namespace
}  // namespace tg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tg::fuzz::Run(data, size);
  return 0;
}
