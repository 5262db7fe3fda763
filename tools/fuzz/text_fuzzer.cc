// Fuzz target of the text loader and its character tokenizer (dataset/text.h,
// dataset/token_shard.h LoadTokens of a non-.bin file).
//
// The input is a whole text file, and also a candidate vocabulary string. Checked:
// - LoadTokens fails exactly for the empty file; otherwise it returns one token per byte, a
//   tokenizer whose vocabulary is the sorted distinct bytes of the text, and Decode(tokens) is
//   the text; FromVocab(vocab()) restores an equal tokenizer.
// - FromVocab(input) succeeds exactly for non-empty, strictly increasing bytes; Encode then
//   round-trips the input through Decode (also with int64 ids), and a byte outside the
//   vocabulary is an InvalidArgument Status, not a crash.
// Crashes, sanitizer reports and exceptions escaping the reader are failures.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dataset/text.h"
#include "dataset/token_shard.h"
#include "tools/fuzz/fuzz_util.h"

namespace tg::fuzz {
namespace {

void CheckLoad(std::string_view text) {
  const std::string path = WriteScratchFile("input.txt", text.data(), text.size());
  absl::StatusOr<data::LoadedTokens> loaded =
      NoThrow("LoadTokens", [&] { return data::LoadTokens(path); });
  FUZZ_CHECK(loaded.ok() == !text.empty(), "LoadTokens of ", text.size(),
             " bytes: ", loaded.status().ToString());
  if (!loaded.ok()) return;
  FUZZ_CHECK(loaded->tokenizer.has_value(), "no tokenizer for text");
  const data::CharTokenizer& tok = *loaded->tokenizer;
  FUZZ_CHECK(loaded->tokens.size() == text.size(), loaded->tokens.size(), " tokens for ",
             text.size(), " bytes");
  bool present[256] = {};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    if (present[b]) vocab.push_back(static_cast<char>(b));
  }
  FUZZ_CHECK(tok.vocab() == vocab, "vocabulary is not the sorted distinct bytes");
  for (uint16_t id : loaded->tokens) FUZZ_CHECK(id < tok.vocab_size(), "token ", id);
  FUZZ_CHECK(tok.Decode(loaded->tokens) == text, "Decode(tokens) is not the text");
  absl::StatusOr<data::CharTokenizer> again = data::CharTokenizer::FromVocab(tok.vocab());
  FUZZ_CHECK(again.ok() && again->vocab() == tok.vocab(), "FromVocab(vocab()) failed");
}

void CheckVocab(std::string_view input) {
  absl::StatusOr<data::CharTokenizer> tok =
      NoThrow("FromVocab", [&] { return data::CharTokenizer::FromVocab(input); });
  bool increasing = !input.empty();
  for (size_t i = 1; i < input.size(); ++i) {
    increasing = increasing &&
                 static_cast<unsigned char>(input[i - 1]) < static_cast<unsigned char>(input[i]);
  }
  FUZZ_CHECK(tok.ok() == increasing, "FromVocab: ", tok.status().ToString());
  if (!tok.ok()) return;
  FUZZ_CHECK(tok->vocab() == input, "vocab() differs from the input");
  absl::StatusOr<std::vector<uint16_t>> ids = NoThrow("Encode", [&] { return tok->Encode(input); });
  FUZZ_CHECK(ids.ok(), ids.status().ToString());
  for (size_t i = 0; i < ids->size(); ++i) FUZZ_CHECK((*ids)[i] == i, "id of byte ", i);
  FUZZ_CHECK(tok->Decode(*ids) == input, "Decode(Encode(vocab))");
  std::vector<int64_t> wide(ids->begin(), ids->end());
  FUZZ_CHECK(tok->Decode(wide) == input, "Decode(int64 ids)");
  if (tok->vocab_size() < 256) {
    // The smallest byte not in the vocabulary.
    unsigned char missing = 0;
    while (input.find(static_cast<char>(missing)) != std::string_view::npos) ++missing;
    const std::string text = std::string(input) + static_cast<char>(missing);
    absl::StatusOr<std::vector<uint16_t>> bad =
        NoThrow("Encode", [&] { return tok->Encode(text); });
    FUZZ_CHECK(!bad.ok() && bad.status().code() == absl::StatusCode::kInvalidArgument,
               "Encode of a byte outside the vocabulary: ", bad.status().ToString());
  }
}

}  // namespace
}  // namespace tg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  tg::fuzz::CheckLoad(input);
  tg::fuzz::CheckVocab(input);
  return 0;
}
