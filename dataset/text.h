// CharTokenizer: character-level tokens for text, as nanoGPT's shakespeare_char prepares them:
// the vocabulary is the sorted set of distinct bytes of a training text, and a token is the
// index of its byte in that vocabulary. The vocabulary string is the tokenizer's whole state, so
// a checkpoint stores it (e.g. as a u8 tensor or a metadata string) and FromVocab restores it.
//
//   tg::data::CharTokenizer tok = tg::data::CharTokenizer::FromText("hello world");
//   // tok.vocab() == " dehlorw", tok.vocab_size() == 8
//   absl::StatusOr<std::vector<uint16_t>> ids = tok.Encode("hello");   // {3, 2, 4, 4, 5}
//   std::string text = tok.Decode(*ids);                                 // "hello"
//   absl::StatusOr<tg::data::CharTokenizer> again =
//       tg::data::CharTokenizer::FromVocab(tok.vocab());   // e.g. from a checkpoint
//
// Bytes, not Unicode characters: for ASCII text (Shakespeare) this is exactly nanoGPT's
// vocabulary and ids; UTF-8 text gets one token per byte, ordered by unsigned byte value.
#ifndef TAPEGRAD_DATASET_TEXT_H_
#define TAPEGRAD_DATASET_TEXT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tg::data {

class CharTokenizer {
 public:
  // The vocabulary of `text`: its distinct bytes in increasing unsigned order. Throws tg::Error
  // on empty text.
  static CharTokenizer FromText(std::string_view text);
  // Restores a tokenizer from vocab(). InvalidArgument unless `vocab` is non-empty and strictly
  // increasing (as unsigned bytes), which also rules out repeated bytes.
  static absl::StatusOr<CharTokenizer> FromVocab(std::string_view vocab);

  // The sorted distinct bytes; token i is vocab()[i].
  const std::string& vocab() const { return vocab_; }
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }

  // One token per byte of `text`. InvalidArgument naming the first byte that is not in the
  // vocabulary and its position.
  absl::StatusOr<std::vector<uint16_t>> Encode(std::string_view text) const;
  // The bytes of `ids`; throws tg::Error on an id outside [0, vocab_size()).
  std::string Decode(absl::Span<const uint16_t> ids) const;
  std::string Decode(absl::Span<const int64_t> ids) const;

 private:
  explicit CharTokenizer(std::string vocab);

  std::string vocab_;
  std::array<int16_t, 256> id_of_byte_;  // -1 for bytes not in the vocabulary
};

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_TEXT_H_
