// llm.c token shards, LoadTokens and SplitTrainVal (dataset/token_shard.h): the exact bytes
// of a shard, round trips, the error text for a wrong magic / version / size (truncation at every
// length, trailing bytes), text files tokenized by characters, nanoGPT's 90/10 split, and
// LoadTrainVal / CheckVocabulary (one tokenizer for both files, every token in the vocabulary).
#include "dataset/token_shard.h"

#include <cstdint>
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
using ::tg::testing::ThrowsError;

void PutLe32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

// A shard written byte by byte: header ints (magic, version, count), then `tokens`.
std::vector<uint8_t> ShardBytes(uint32_t magic, uint32_t version, uint32_t count,
                                const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b(1024, 0);
  PutLe32(b, 0, magic);
  PutLe32(b, 4, version);
  PutLe32(b, 8, count);
  for (uint16_t t : tokens) {
    b.push_back(static_cast<uint8_t>(t));
    b.push_back(static_cast<uint8_t>(t >> 8));
  }
  return b;
}

TEST(TokenShardTest, WriterProducesLlmcBytesAndRoundTrips) {
  const std::vector<uint16_t> tokens = {50256, 0, 1, 258, 65535, 7};
  const std::string path = TempPath("shard.bin");
  ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
  EXPECT_EQ(ReadBytes(path), ShardBytes(20240520, 1, 6, tokens));
  absl::StatusOr<std::vector<uint16_t>> back = ReadTokenShard(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, tokens);
  EXPECT_TRUE(ReadBytes(path + ".tmp").empty());  // renamed into place
}

TEST(TokenShardTest, ReadsAHandWrittenShardAndAnEmptyOne) {
  const std::string path = TempPath("hand.bin");
  WriteBytes(path, ShardBytes(20240520, 1, 3, {0x0102, 0xFFFE, 9}));
  absl::StatusOr<std::vector<uint16_t>> t = ReadTokenShard(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<uint16_t>{0x0102, 0xFFFE, 9}));

  ASSERT_TRUE(WriteTokenShard(path, {}).ok());
  t = ReadTokenShard(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->empty());
}

TEST(TokenShardTest, WrongMagicShowsFoundAndExpected) {
  const std::string path = TempPath("magic.bin");
  WriteBytes(path, ShardBytes(12345, 1, 0, {}));
  absl::Status s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                      "' is not an llm.c token shard: magic number is 12345, "
                                      "expected 20240520"));
  // llm.c's Llama 3 shards get a hint; a text file gets its first 4 bytes as a number.
  WriteBytes(path, ShardBytes(20240801, 7, 0, {}));
  s = ReadTokenShard(path).status();
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                      "' is not an llm.c token shard: magic number is 20240801, "
                                      "expected 20240520 (20240801 is llm.c's uint32-token "
                                      "format, not supported)"));
  WriteBytes(path, {'a', 'b', 'c', 'd', 'e'});
  s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "magic number is 1684234849, expected 20240520"));
}

TEST(TokenShardTest, WrongVersionAndNegativeCount) {
  const std::string path = TempPath("version.bin");
  WriteBytes(path, ShardBytes(20240520, 2, 0, {}));
  absl::Status s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                      "': unsupported shard version 2, expected 1 (uint16 "
                                      "tokens)"));
  WriteBytes(path, ShardBytes(20240520, 1, 0xFFFFFFFF, {}));
  s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("ReadTokenShard: '", path, "': header holds a negative token count -1"));
}

TEST(TokenShardTest, TruncatedAtEveryLengthIsAnError) {
  const std::vector<uint8_t> full = ShardBytes(20240520, 1, 5, {1, 2, 3, 4, 5});
  for (size_t len = 0; len < full.size(); ++len) {
    const std::string path = TempPath("cut.bin");
    WriteBytes(path, std::vector<uint8_t>(full.begin(), full.begin() + len));
    const absl::Status s = ReadTokenShard(path).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "length " << len << ": " << s;
    if (len < 1024) {
      EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                          "': truncated header: expected 1024 bytes (256 int32), "
                                          "found ",
                                          len));
    } else {
      EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                          "': truncated shard: expected 1034 bytes (1024-byte "
                                          "header + 5 uint16 tokens), found ",
                                          len));
    }
  }
}

TEST(TokenShardTest, HugeCountInTheHeaderIsDataLossNotAnAllocation) {
  const std::string path = TempPath("huge.bin");
  WriteBytes(path, ShardBytes(20240520, 1, 0x7FFFFFFF, {1}));
  const absl::Status s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                      "': truncated shard: expected 4294968318 bytes (1024-byte "
                                      "header + 2147483647 uint16 tokens), found 1026"));
}

TEST(TokenShardTest, TrailingBytesAreDataLoss) {
  const std::string path = TempPath("trailing.bin");
  std::vector<uint8_t> b = ShardBytes(20240520, 1, 2, {1, 2});
  b.push_back(0);
  WriteBytes(path, b);
  const absl::Status s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", path,
                                      "': trailing bytes: expected 1028 bytes (1024-byte header "
                                      "+ 2 uint16 tokens), found 1029"));
}

TEST(TokenShardTest, MissingFileAndDirectory) {
  const std::string path = TempPath("missing.bin");
  absl::Status s = ReadTokenShard(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("ReadTokenShard: cannot open '", path, "': No such file or directory"));
  const char* dir = std::getenv("TEST_TMPDIR");
  ASSERT_NE(dir, nullptr);
  s = ReadTokenShard(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("ReadTokenShard: '", dir, "' is not a regular file"));
  s = WriteTokenShard(TempPath("no/such/dir.bin"), {1});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST(LoadTokensTest, BinIsAShardWithoutTokenizer) {
  const std::string path = TempPath("train.bin");
  ASSERT_TRUE(WriteTokenShard(path, {5, 6, 7}).ok());
  absl::StatusOr<LoadedTokens> t = LoadTokens(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens, (std::vector<uint16_t>{5, 6, 7}));
  EXPECT_FALSE(t->tokenizer.has_value());
  // A text file named .bin is read as a shard, and says so.
  WriteBytes(path, {'h', 'e', 'l', 'l', 'o'});
  EXPECT_EQ(LoadTokens(path).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadTokensTest, TextIsTokenizedByCharacters) {
  const std::string path = TempPath("input.txt");
  const std::string text = "ab\nba c\n";
  WriteBytes(path, std::vector<uint8_t>(text.begin(), text.end()));
  absl::StatusOr<LoadedTokens> t = LoadTokens(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->tokenizer.has_value());
  EXPECT_EQ(t->tokenizer->vocab(), "\n abc");
  EXPECT_EQ(t->tokens, (std::vector<uint16_t>{2, 3, 0, 3, 2, 1, 4, 0}));
  EXPECT_EQ(t->tokenizer->Decode(t->tokens), text);
}

TEST(LoadTokensTest, EmptyOrMissingTextIsAnError) {
  const std::string path = TempPath("empty.txt");
  WriteBytes(path, {});
  absl::Status s = LoadTokens(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("LoadTokens: text file '", path,
                                      "' is empty; expected at least one byte"));
  s = LoadTokens(TempPath("missing.txt")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
}

TEST(SplitTrainValTest, FirstNinetyPercentTrainLastTenVal) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  TrainValTokens s = SplitTrainVal(tokens);
  ASSERT_EQ(s.train.size(), 900u);
  ASSERT_EQ(s.val.size(), 100u);
  EXPECT_EQ(s.train.front(), 0);
  EXPECT_EQ(s.train.back(), 899);
  EXPECT_EQ(s.val.front(), 900);
  EXPECT_EQ(s.val.back(), 999);
  // int(n * 0.9) as in Python: 11 * 0.9 = 9.9 -> 9; 10 * 0.9 = 9.0 -> 9; 1115394 (tiny
  // Shakespeare) -> 1003854.
  EXPECT_EQ(SplitTrainVal(std::vector<uint16_t>(11)).train.size(), 9u);
  EXPECT_EQ(SplitTrainVal(std::vector<uint16_t>(10)).train.size(), 9u);
  EXPECT_EQ(SplitTrainVal(std::vector<uint16_t>(1115394)).train.size(), 1003854u);
  EXPECT_EQ(SplitTrainVal(std::vector<uint16_t>(1115394)).val.size(), 111540u);
  EXPECT_EQ(SplitTrainVal(tokens, 1.0).val.size(), 0u);
  EXPECT_EQ(SplitTrainVal(tokens, 0.0).train.size(), 0u);
  EXPECT_TRUE(SplitTrainVal({}).train.empty());
  EXPECT_TRUE(ThrowsError([&] { SplitTrainVal(tokens, 1.5); },
                          "SplitTrainVal: train_fraction must lie in [0, 1], got 1.5"));
}

// --val_data in the tokenizer of --data: text validation data is encoded with the training
// text's characters (ids that mean the same bytes), and a byte the training text lacks is refused
// naming both files.
TEST(LoadTrainValTest, TextValidationUsesTheTrainingTextsCharacters) {
  const std::string train = TempPath("train.txt"), val = TempPath("val.txt");
  const std::string train_text = "abcd\n", val_text = "dcb\n";
  WriteBytes(train, std::vector<uint8_t>(train_text.begin(), train_text.end()));
  WriteBytes(val, std::vector<uint8_t>(val_text.begin(), val_text.end()));
  absl::StatusOr<TrainValData> d = LoadTrainVal(train, val);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->tokenizer.has_value());
  EXPECT_EQ(d->tokenizer->vocab(), "\nabcd");
  EXPECT_EQ(d->tokens.train, (std::vector<uint16_t>{1, 2, 3, 4, 0}));
  // Its own vocabulary ("\nbcd") would have given {3, 2, 1, 0}.
  EXPECT_EQ(d->tokens.val, (std::vector<uint16_t>{4, 3, 2, 0}));
  EXPECT_EQ(d->train_path, train);
  EXPECT_EQ(d->val_path, val);
  EXPECT_EQ(d->val_offset, 0);

  const std::string other = TempPath("other.txt");
  WriteBytes(other, {'a', 'b', 'z'});
  absl::Status s = LoadTrainVal(train, other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("validation text '", other, "' uses a byte that training text '", train,
                         "' does not, so the model has no token for it: CharTokenizer::Encode: "
                         "byte 0x7a ('z') at position 2 is not in the vocabulary of 5 bytes"));
}

TEST(LoadTrainValTest, ShardAndTextTogetherAreRefusedNamingBoth) {
  const std::string text = TempPath("input.txt"), shard = TempPath("val.bin");
  WriteBytes(text, {'h', 'i', '\n'});
  ASSERT_TRUE(WriteTokenShard(shard, {15496, 995}).ok());
  absl::Status s = LoadTrainVal(text, shard).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("the validation data and the training data use different tokenizers, so "
                         "the validation loss would mean nothing: '",
                         shard, "' is an llm.c token shard (GPT-2 token ids), '", text,
                         "' is text (tokenized by its bytes); give both as text or both as token "
                         "shards (.bin)"));
  s = LoadTrainVal(shard, text).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            absl::StrCat("the validation data and the training data use different tokenizers, so "
                         "the validation loss would mean nothing: '",
                         text, "' is text (tokenized by its bytes), '", shard,
                         "' is an llm.c token shard (GPT-2 token ids); give both as text or both "
                         "as token shards (.bin)"));
  // Two shards, and a missing validation file (its reader's error).
  const std::string train = TempPath("train.bin");
  ASSERT_TRUE(WriteTokenShard(train, {1, 2, 3}).ok());
  absl::StatusOr<TrainValData> d = LoadTrainVal(train, shard);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->tokenizer.has_value());
  EXPECT_EQ(d->tokens.train, (std::vector<uint16_t>{1, 2, 3}));
  EXPECT_EQ(d->tokens.val, (std::vector<uint16_t>{15496, 995}));
  EXPECT_EQ(LoadTrainVal(train, TempPath("missing.bin")).status().code(),
            absl::StatusCode::kNotFound);
}

// Without --val_data: the last 10% of the file, which CheckVocabulary names by their index in it.
TEST(LoadTrainValTest, SplitKeepsTheValidationOffsetInTheFile) {
  const std::string path = TempPath("train.bin");
  std::vector<uint16_t> tokens(20);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
  absl::StatusOr<TrainValData> d = LoadTrainVal(path, "");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tokens.train.size(), 18u);
  EXPECT_EQ(d->tokens.val, (std::vector<uint16_t>{18, 19}));
  EXPECT_EQ(d->val_path, path);
  EXPECT_EQ(d->val_offset, 18);
}

// Every token of both splits is checked, named by file, token index and byte offset: in the
// training split, in the last 10% of --data, and in --val_data.
TEST(CheckVocabularyTest, NamesTheFileIndexAndByteOffsetOfTheFirstBadToken) {
  const std::string train = TempPath("train.bin"), val = TempPath("val.bin");
  std::vector<uint16_t> tokens(100, 7);
  ASSERT_TRUE(WriteTokenShard(train, tokens).ok());
  ASSERT_TRUE(WriteTokenShard(val, {1, 2, 50257, 50300}).ok());
  absl::StatusOr<TrainValData> d = LoadTrainVal(train, val);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::Status s = CheckVocabulary(*d, 50257);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("'", val,
                                      "': token 50257 at index 2 (byte offset 1028) is "
                                      "outside the vocabulary of 50257 (ids 0..50256)"));
  EXPECT_TRUE(CheckVocabulary(*d, 50301).ok());

  tokens[95] = 60000;  // in the validation split of the file alone
  ASSERT_TRUE(WriteTokenShard(train, tokens).ok());
  d = LoadTrainVal(train, "");
  ASSERT_TRUE(d.ok()) << d.status();
  s = CheckVocabulary(*d, 50257);
  EXPECT_EQ(s.message(), absl::StrCat("'", train,
                                      "': token 60000 at index 95 (byte offset 1214) "
                                      "is outside the vocabulary of 50257 (ids 0..50256)"));
  tokens[3] = 50304;  // the training split comes first
  ASSERT_TRUE(WriteTokenShard(train, tokens).ok());
  d = LoadTrainVal(train, "");
  ASSERT_TRUE(d.ok()) << d.status();
  s = CheckVocabulary(*d, 50257);
  EXPECT_EQ(s.message(), absl::StrCat("'", train,
                                      "': token 50304 at index 3 (byte offset 1030) "
                                      "is outside the vocabulary of 50257 (ids 0..50256)"));
  // Text: one token per byte, so the byte offset is the index.
  const std::string text = TempPath("input.txt");
  WriteBytes(text, {'a', 'b', 'c', 'a', 'b', 'c', 'a', 'b', 'c', 'd'});
  d = LoadTrainVal(text, "");
  ASSERT_TRUE(d.ok()) << d.status();
  s = CheckVocabulary(*d, 3);  // 'd' is token 3
  EXPECT_EQ(s.message(), absl::StrCat("'", text,
                                      "': token 3 at index 9 (byte offset 9) is "
                                      "outside the vocabulary of 3 (ids 0..2)"));
}

}  // namespace
}  // namespace tg::data
