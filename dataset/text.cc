#include "dataset/text.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/error.h"

namespace tg::data {
namespace {

// "0x41 ('A')" for printable bytes, "0x0a" otherwise.
std::string ByteName(unsigned char b) {
  return std::isprint(b) ? absl::StrFormat("0x%02x ('%c')", b, b) : absl::StrFormat("0x%02x", b);
}

}  // namespace

CharTokenizer::CharTokenizer(std::string vocab) : vocab_(std::move(vocab)) {
  id_of_byte_.fill(-1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    id_of_byte_[static_cast<unsigned char>(vocab_[i])] = static_cast<int16_t>(i);
  }
}

CharTokenizer CharTokenizer::FromText(std::string_view text) {
  TG_CHECK(!text.empty(), "CharTokenizer::FromText: empty text");
  bool present[256] = {};
  for (char c : text) present[static_cast<unsigned char>(c)] = true;
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    if (present[b]) vocab.push_back(static_cast<char>(b));
  }
  return CharTokenizer(std::move(vocab));
}

absl::StatusOr<CharTokenizer> CharTokenizer::FromVocab(std::string_view vocab) {
  if (vocab.empty()) {
    return absl::InvalidArgumentError("CharTokenizer::FromVocab: empty vocabulary");
  }
  for (size_t i = 1; i < vocab.size(); ++i) {
    const unsigned char prev = vocab[i - 1], cur = vocab[i];
    if (cur <= prev) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CharTokenizer::FromVocab: expected strictly increasing bytes, but byte ", i, " ",
          ByteName(cur), " is not greater than byte ", i - 1, " ", ByteName(prev)));
    }
  }
  return CharTokenizer(std::string(vocab));
}

absl::StatusOr<std::vector<uint16_t>> CharTokenizer::Encode(std::string_view text) const {
  std::vector<uint16_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int16_t id = id_of_byte_[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CharTokenizer::Encode: byte ", ByteName(static_cast<unsigned char>(text[i])),
          " at position ", i, " is not in the vocabulary of ", vocab_.size(), " bytes"));
    }
    ids[i] = static_cast<uint16_t>(id);
  }
  return ids;
}

namespace {

template <typename Id>
std::string DecodeIds(const std::string& vocab, absl::Span<const Id> ids) {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    TG_CHECK(ids[i] >= 0 && static_cast<uint64_t>(ids[i]) < vocab.size(),
             "CharTokenizer::Decode: id ", ids[i], " at position ", i, " is outside [0, ",
             vocab.size(), ")");
    out[i] = vocab[static_cast<size_t>(ids[i])];
  }
  return out;
}

}  // namespace

std::string CharTokenizer::Decode(absl::Span<const uint16_t> ids) const {
  return DecodeIds(vocab_, ids);
}

std::string CharTokenizer::Decode(absl::Span<const int64_t> ids) const {
  return DecodeIds(vocab_, ids);
}

}  // namespace tg::data
