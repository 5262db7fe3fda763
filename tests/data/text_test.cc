// CharTokenizer (dataset/text.h): nanoGPT's sorted-unique-bytes vocabulary, exact ids,
// encode/decode round trips, saving and restoring the vocabulary, and the error text.
#include "dataset/text.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/tensor/throws.h"

namespace tg::data {
namespace {

using ::tg::testing::ThrowsError;

TEST(CharTokenizerTest, VocabularyIsTheSortedDistinctBytes) {
  const CharTokenizer tok = CharTokenizer::FromText("hello world");
  EXPECT_EQ(tok.vocab(), " dehlorw");
  EXPECT_EQ(tok.vocab_size(), 8);
  absl::StatusOr<std::vector<uint16_t>> ids = tok.Encode("hello");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<uint16_t>{3, 2, 4, 4, 5}));
}

TEST(CharTokenizerTest, ShakespeareLikeTextMatchesNanoGptIds) {
  // nanoGPT: chars = sorted(list(set(data))); stoi = {ch: i for i, ch in enumerate(chars)}.
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
  const CharTokenizer tok = CharTokenizer::FromText(text);
  EXPECT_EQ(tok.vocab(), "\n ,.:BCFacdefhikmnoprstuwyz");
  absl::StatusOr<std::vector<uint16_t>> ids = tok.Encode("First");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<uint16_t>{7, 14, 20, 21, 22}));
}

TEST(CharTokenizerTest, RoundTripsEveryByte) {
  std::string text;
  for (int b = 255; b >= 0; --b) text.push_back(static_cast<char>(b));
  text += text;
  const CharTokenizer tok = CharTokenizer::FromText(text);
  ASSERT_EQ(tok.vocab_size(), 256);
  // Unsigned order: 0x00 first, 0xff last (not signed char order).
  EXPECT_EQ(static_cast<unsigned char>(tok.vocab().front()), 0x00);
  EXPECT_EQ(static_cast<unsigned char>(tok.vocab().back()), 0xff);
  absl::StatusOr<std::vector<uint16_t>> ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0], 255);
  EXPECT_EQ(tok.Decode(*ids), text);
  std::vector<int64_t> wide(ids->begin(), ids->end());
  EXPECT_EQ(tok.Decode(wide), text);
}

TEST(CharTokenizerTest, SavedVocabularyRestoresTheSameTokenizer) {
  const std::string text = "To be, or not to be: that is the question.";
  const CharTokenizer tok = CharTokenizer::FromText(text);
  absl::StatusOr<CharTokenizer> back = CharTokenizer::FromVocab(tok.vocab());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->vocab(), tok.vocab());
  EXPECT_EQ(*back->Encode(text), *tok.Encode(text));
  EXPECT_EQ(back->Decode(*tok.Encode(text)), text);
}

TEST(CharTokenizerTest, FromVocabRejectsUnsortedRepeatedOrEmpty) {
  absl::Status s = CharTokenizer::FromVocab("").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "CharTokenizer::FromVocab: empty vocabulary");
  s = CharTokenizer::FromVocab("abca").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "CharTokenizer::FromVocab: expected strictly increasing bytes, but byte 3 0x61 ('a') "
            "is not greater than byte 2 0x63 ('c')");
  s = CharTokenizer::FromVocab("aab").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  // Bytes compare unsigned: 0x80 after 'z' is fine, '\n' after 0x80 is not.
  EXPECT_TRUE(CharTokenizer::FromVocab("az\x80\xff").ok());
  s = CharTokenizer::FromVocab("\x80\n").status();
  EXPECT_EQ(s.message(),
            "CharTokenizer::FromVocab: expected strictly increasing bytes, but byte 1 0x0a is not "
            "greater than byte 0 0x80");
}

TEST(CharTokenizerTest, EncodeNamesAnUnknownByte) {
  const CharTokenizer tok = CharTokenizer::FromText("abc");
  const absl::Status s = tok.Encode("abz").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "CharTokenizer::Encode: byte 0x7a ('z') at position 2 is not in the vocabulary of 3 "
            "bytes");
  EXPECT_TRUE(tok.Encode("").ok());
}

TEST(CharTokenizerTest, MisuseThrows) {
  const CharTokenizer tok = CharTokenizer::FromText("abc");
  EXPECT_TRUE(ThrowsError(
      [&] {
        tok.Decode(std::vector<uint16_t>{0, 3});
      },
      "CharTokenizer::Decode: id 3 at position 1 is outside [0, 3)"));
  EXPECT_TRUE(ThrowsError([&] { tok.Decode(std::vector<int64_t>{-1}); },
                          "CharTokenizer::Decode: id -1 at position 0 is outside [0, 3)"));
  EXPECT_TRUE(ThrowsError([] { CharTokenizer::FromText(""); }, "CharTokenizer::FromText: empty"));
}

}  // namespace
}  // namespace tg::data
