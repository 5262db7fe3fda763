// Token streams for GPT training: llm.c's token shards (.bin), plain text tokenized by
// characters, and nanoGPT's train/validation split.
//
//   absl::StatusOr<tg::data::LoadedTokens> data = tg::data::LoadTokens("shakespeare.txt");
//   if (!data.ok()) return data.status();
//   tg::data::TrainValTokens split = tg::data::SplitTrainVal(data->tokens);  // 90% / 10%
//   // data->tokenizer is set for text (save data->tokenizer->vocab() with the checkpoint)
//   absl::Status s = tg::data::WriteTokenShard("train.bin", split.train);
//
// Shard format (llm.c, dev/data/data_common.py, "gpt-2"): a header of 256 little-endian int32,
// header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = the number of tokens n;
// the other header ints are 0; then n little-endian uint16 tokens and nothing else, so the file
// is exactly 1024 + 2 n bytes.
//
// Errors of ReadTokenShard (absl::Status codes): NotFound (and the other errno codes) when the
// file cannot be opened; InvalidArgument for a wrong magic (the message shows the found and the
// expected value), an unsupported version or a negative token count; DataLoss when the file is
// shorter or longer than the header says (the message gives both byte counts). The reader checks
// the file size before it allocates, so it never allocates more than the file holds.
#ifndef TAPEGRAD_DATASET_TOKEN_SHARD_H_
#define TAPEGRAD_DATASET_TOKEN_SHARD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dataset/text.h"

namespace tg::data {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderInts = 256;
inline constexpr int64_t kTokenShardHeaderBytes = kTokenShardHeaderInts * 4;

// The tokens of an llm.c shard.
absl::StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path);

// Writes `tokens` as an llm.c shard (through a temporary file that is renamed to `path`).
// InvalidArgument when there are more than 2^31 - 1 tokens (the header's int32 count).
absl::Status WriteTokenShard(const std::string& path, absl::Span<const uint16_t> tokens);

struct LoadedTokens {
  std::vector<uint16_t> tokens;
  // Set when the tokens come from text (CharTokenizer::FromText of the whole file); unset for a
  // shard, whose ids belong to a tokenizer that is not ours (GPT-2 BPE for llm.c's shards).
  std::optional<CharTokenizer> tokenizer;
};

// A path ending in ".bin" is read as a token shard; anything else as text (the whole file's
// bytes), tokenized with a CharTokenizer built from it. An empty text file is InvalidArgument.
absl::StatusOr<LoadedTokens> LoadTokens(const std::string& path);

struct TrainValTokens {
  std::vector<uint16_t> train;
  std::vector<uint16_t> val;
};

// nanoGPT's split: with n tokens, train = tokens[0, k) and val = tokens[k, n) for
// k = int(n * train_fraction) (the double product truncated, as Python's int() does; 0.9 gives
// nanoGPT's 90% / 10%). No shuffling: the validation text is the end of the file. train_fraction
// must lie in [0, 1] (tg::Error).
TrainValTokens SplitTrainVal(absl::Span<const uint16_t> tokens, double train_fraction = 0.9);

// train_gpt's --data and --val_data: the training tokens, the validation tokens and where each
// came from (for messages that name the file and the offset of a bad token).
struct TrainValData {
  TrainValTokens tokens;
  // Set when the training data is text: the validation text is tokenized with it too.
  std::optional<CharTokenizer> tokenizer;
  std::string train_path;
  std::string val_path;    // train_path when the validation tokens are its last 10%
  int64_t val_offset = 0;  // the token index in val_path of tokens.val[0]
};

// Loads `data_path` (LoadTokens) and the validation tokens: those of `val_path` when it is not
// empty, else the last 10% of the data (SplitTrainVal). Both files must use one tokenizer, as a
// loss on ids of another tokenizer measures nothing:
// - text and text: the validation text is encoded with the training text's characters;
//   InvalidArgument naming both files and the first byte the training text lacks;
// - a token shard and text (either way round): InvalidArgument naming both files and their
//   kinds. (Shards declare their tokenizer only by their header's magic and version, which
//   ReadTokenShard already requires to be llm.c's GPT-2 format, so two shards always agree.)
// Errors of LoadTokens pass through.
absl::StatusOr<TrainValData> LoadTrainVal(const std::string& data_path,
                                          const std::string& val_path);

// Checks every training and validation token against the vocabulary [0, vocab_size), so an id
// the model cannot embed is refused at load, wherever it lies (a sampled batch might never reach
// it). InvalidArgument for the first one, in file order, naming the file, the token's index in
// it and its byte offset: "'val.bin': token 50300 at index 17 (byte offset 1058) is outside the
// vocabulary of 50257 (ids 0..50256)".
absl::Status CheckVocabulary(const TrainValData& data, int64_t vocab_size);

}  // namespace tg::data

#endif  // TAPEGRAD_DATASET_TOKEN_SHARD_H_
