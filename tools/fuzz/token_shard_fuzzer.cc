// Fuzz target of the llm.c token shard reader (dataset/token_shard.h).
//
// The input is a whole .bin file. Checked on every input:
// - ReadTokenShard and LoadTokens (which dispatches on the ".bin" name) agree, and LoadTokens
//   sets no tokenizer for a shard.
// - A shard that reads is exactly 1024 + 2 n bytes with the magic, version 1 and count n in its
//   header, and the tokens are its little-endian uint16 payload.
// - WriteTokenShard + ReadTokenShard round-trips the tokens; SplitTrainVal keeps every token.
// Crashes, sanitizer reports and exceptions escaping the reader are failures.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dataset/token_shard.h"
#include "tools/fuzz/fuzz_util.h"

namespace tg::fuzz {
namespace {

int32_t Le32(const uint8_t* b) {
  return static_cast<int32_t>(uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) |
                              (uint32_t{b[3]} << 24));
}

void Run(const uint8_t* data, size_t size) {
  const std::string path = WriteScratchFile("input.bin", data, size);
  absl::StatusOr<std::vector<uint16_t>> tokens =
      NoThrow("ReadTokenShard", [&] { return data::ReadTokenShard(path); });
  absl::StatusOr<data::LoadedTokens> loaded =
      NoThrow("LoadTokens", [&] { return data::LoadTokens(path); });
  FUZZ_CHECK(tokens.ok() == loaded.ok(), "ReadTokenShard: ", tokens.status().ToString(),
             " but LoadTokens: ", loaded.status().ToString());
  if (!tokens.ok()) return;
  FUZZ_CHECK(loaded->tokens == *tokens, "LoadTokens returned other tokens");
  FUZZ_CHECK(!loaded->tokenizer.has_value(), "LoadTokens set a tokenizer for a shard");

  const size_t n = tokens->size();
  FUZZ_CHECK(size == static_cast<size_t>(data::kTokenShardHeaderBytes) + 2 * n, "a ", size,
             "-byte file read as ", n, " tokens");
  FUZZ_CHECK(Le32(data) == data::kTokenShardMagic && Le32(data + 4) == data::kTokenShardVersion &&
                 Le32(data + 8) == static_cast<int32_t>(n),
             "header does not match the ", n, " tokens read");
  const uint8_t* payload = data + data::kTokenShardHeaderBytes;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t want = static_cast<uint16_t>(payload[2 * i] | (payload[2 * i + 1] << 8));
    FUZZ_CHECK((*tokens)[i] == want, "token ", i, " is ", (*tokens)[i], ", the file holds ", want);
  }

  const std::string out = ScratchPath("written.bin");
  absl::Status written =
      NoThrow("WriteTokenShard", [&] { return data::WriteTokenShard(out, *tokens); });
  FUZZ_CHECK(written.ok(), written.ToString());
  absl::StatusOr<std::vector<uint16_t>> back =
      NoThrow("ReadTokenShard", [&] { return data::ReadTokenShard(out); });
  FUZZ_CHECK(back.ok() && *back == *tokens, "WriteTokenShard + ReadTokenShard round trip");

  data::TrainValTokens split = data::SplitTrainVal(*tokens);
  FUZZ_CHECK(split.train.size() + split.val.size() == n, "SplitTrainVal lost tokens");
}

}  // namespace
}  // namespace tg::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tg::fuzz::Run(data, size);
  return 0;
}
