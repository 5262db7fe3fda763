// Fuzz target of the safetensors reader (tensor/io/safetensors.h).
//
// The input is a whole file. Checked on every input:
// - ParseSafetensors (in memory) and LoadSafetensors (the same bytes as a file) agree: both fail
//   or both return the same tensors and metadata; LoadStateDict succeeds only where they do.
// - A parsed file re-serializes (SerializeSafetensors), and the bytes parse again to identical
//   tensors and metadata; serializing that result gives the same bytes (the writer is canonical).
// - No tensor holds more bytes than the file (no allocation beyond the input).
// Crashes, sanitizer reports and exceptions escaping a reader are failures (errors are Status).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "tensor/io/safetensors.h"
#include "tools/fuzz/fuzz_util.h"

namespace tg::fuzz {
namespace {

void CheckSame(const io::Safetensors& a, const io::Safetensors& b, const char* what) {
  FUZZ_CHECK(a.metadata == b.metadata, what, ": metadata differs");
  FUZZ_CHECK(a.tensors.size() == b.tensors.size(), what, ": ", a.tensors.size(), " vs ",
             b.tensors.size(), " tensors");
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    FUZZ_CHECK(it != b.tensors.end(), what, ": tensor '", name, "' missing");
    FUZZ_CHECK(SameTensor(t, it->second), what, ": tensor '", name, "' differs: ", Describe(t),
               " vs ", Describe(it->second));
  }
}

void Run(absl::string_view bytes) {
  absl::StatusOr<io::Safetensors> parsed =
      NoThrow("ParseSafetensors", [&] { return io::ParseSafetensors(bytes); });
  const std::string path = WriteScratchFile("input.safetensors", bytes.data(), bytes.size());
  absl::StatusOr<io::Safetensors> loaded =
      NoThrow("LoadSafetensors", [&] { return io::LoadSafetensors(path); });
  std::map<std::string, std::string> metadata;
  absl::StatusOr<StateDict> sd =
      NoThrow("LoadStateDict", [&] { return io::LoadStateDict(path, &metadata); });

  FUZZ_CHECK(parsed.ok() == loaded.ok(), "ParseSafetensors: ", parsed.status().ToString(),
             " but LoadSafetensors: ", loaded.status().ToString());
  FUZZ_CHECK(parsed.ok() || !sd.ok(), "LoadStateDict accepted a file ParseSafetensors rejects");
  if (!parsed.ok()) return;
  CheckSame(*parsed, *loaded, "LoadSafetensors vs ParseSafetensors");
  if (sd.ok()) {
    FUZZ_CHECK(sd->tensors.size() == parsed->tensors.size(), "LoadStateDict tensor count");
    for (const auto& [name, t] : parsed->tensors) {
      auto it = sd->tensors.find(name);
      FUZZ_CHECK(it != sd->tensors.end() && SameTensor(t, it->second), "LoadStateDict tensor '",
                 name, "'");
    }
  }

  uint64_t total = 0;
  for (const auto& [name, t] : parsed->tensors) {
    FUZZ_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), "tensor '", name,
               "' is not a contiguous CPU tensor");
    total += static_cast<uint64_t>(t.numel()) * t.element_size();
  }
  FUZZ_CHECK(total <= bytes.size(), "tensors hold ", total, " bytes, the file only ", bytes.size());

  absl::StatusOr<std::string> again =
      NoThrow("SerializeSafetensors", [&] { return io::SerializeSafetensors(*parsed); });
  FUZZ_CHECK(again.ok(), "a parsed file does not serialize: ", again.status().ToString());
  absl::StatusOr<io::Safetensors> reparsed =
      NoThrow("ParseSafetensors", [&] { return io::ParseSafetensors(*again); });
  FUZZ_CHECK(reparsed.ok(), "serialized bytes do not parse: ", reparsed.status().ToString());
  CheckSame(*parsed, *reparsed, "round trip");
  absl::StatusOr<std::string> third =
      NoThrow("SerializeSafetensors", [&] { return io::SerializeSafetensors(*reparsed); });
  FUZZ_CHECK(third.ok() && *third == *again, "serialization is not canonical");
}

}  // namespace
}  // namespace tg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tg::fuzz::Run(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
