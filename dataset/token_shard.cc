#include "dataset/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensor/error.h"

namespace tg::data {
namespace {

// llm.c's magic for its uint32-token (Llama 3) shards, named in the error for a helpful hint.
constexpr int32_t kLlama3ShardMagic = 20240801;

// An open file descriptor that closes itself.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens `path` for reading and returns its size; `op` names the caller in messages.
absl::StatusOr<int64_t> OpenRegular(const char* op, const std::string& path, int* fd_out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(op, ": cannot open '", path, "'"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, absl::StrCat(op, ": cannot stat '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(op, ": '", path, "' is not a regular file"));
  }
  *fd_out = fd;
  return static_cast<int64_t>(st.st_size);
}

// Reads exactly `n` bytes (fewer only if the file shrank meanwhile: DataLoss).
absl::Status ReadExactly(const char* op, const std::string& path, int fd, void* out, int64_t n) {
  auto* p = static_cast<char*>(out);
  int64_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, p + got, static_cast<size_t>(std::min<int64_t>(n - got, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::ErrnoToStatus(errno, absl::StrCat(op, ": cannot read '", path, "'"));
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat(op, ": '", path, "' ended after ", got, " bytes while reading ", n));
    }
    got += r;
  }
  return absl::OkStatus();
}

int32_t LoadLe32(const uint8_t* b) {
  return static_cast<int32_t>(uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) |
                              (uint32_t{b[3]} << 24));
}

void StoreLe32(int32_t v, uint8_t* b) {
  const uint32_t u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(u >> (8 * i));
}

}  // namespace

absl::StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path) {
  constexpr const char* kOp = "ReadTokenShard";
  const std::string where = absl::StrCat(kOp, ": '", path, "'");
  int raw_fd = -1;
  absl::StatusOr<int64_t> size = OpenRegular(kOp, path, &raw_fd);
  if (!size.ok()) return size.status();
  Fd fd(raw_fd);

  uint8_t header[kTokenShardHeaderBytes];
  const int64_t header_got = std::min<int64_t>(*size, kTokenShardHeaderBytes);
  if (absl::Status s = ReadExactly(kOp, path, fd.get(), header, header_got); !s.ok()) return s;
  if (header_got >= 4) {
    const int32_t magic = LoadLe32(header);
    if (magic != kTokenShardMagic) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is not an llm.c token shard: magic number is ", magic, ", expected ",
          kTokenShardMagic,
          magic == kLlama3ShardMagic ? " (20240801 is llm.c's uint32-token format, not supported)"
                                     : ""));
    }
  }
  if (header_got < kTokenShardHeaderBytes) {
    return absl::DataLossError(absl::StrCat(where, ": truncated header: expected ",
                                            kTokenShardHeaderBytes, " bytes (256 int32), found ",
                                            header_got));
  }
  const int32_t version = LoadLe32(header + 4);
  if (version != kTokenShardVersion) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unsupported shard version ", version,
                                                   ", expected ", kTokenShardVersion,
                                                   " (uint16 tokens)"));
  }
  const int32_t count = LoadLe32(header + 8);
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header holds a negative token count ", count));
  }
  const int64_t expected = kTokenShardHeaderBytes + 2 * int64_t{count};
  if (*size != expected) {
    return absl::DataLossError(absl::StrCat(
        where, *size < expected ? ": truncated shard: expected " : ": trailing bytes: expected ",
        expected, " bytes (", kTokenShardHeaderBytes, "-byte header + ", count,
        " uint16 tokens), found ", *size));
  }

  // The size matched, so this allocation is what the file holds.
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  if (absl::Status s = ReadExactly(kOp, path, fd.get(), tokens.data(), 2 * int64_t{count});
      !s.ok()) {
    return s;
  }
  if constexpr (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__) {
    for (uint16_t& t : tokens) t = static_cast<uint16_t>((t >> 8) | (t << 8));
  }
  return tokens;
}

absl::Status WriteTokenShard(const std::string& path, absl::Span<const uint16_t> tokens) {
  constexpr const char* kOp = "WriteTokenShard";
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ", tokens.size(), " tokens do not fit the int32 count of a shard"));
  }
  uint8_t header[kTokenShardHeaderBytes] = {};
  StoreLe32(kTokenShardMagic, header);
  StoreLe32(kTokenShardVersion, header + 4);
  StoreLe32(static_cast<int32_t>(tokens.size()), header + 8);
  std::vector<uint8_t> body(2 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    body[2 * i] = static_cast<uint8_t>(tokens[i]);
    body[2 * i + 1] = static_cast<uint8_t>(tokens[i] >> 8);
  }

  const std::string tmp = absl::StrCat(path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(kOp, ": cannot open '", tmp, "'"));
  }
  bool ok = std::fwrite(header, 1, sizeof(header), f) == sizeof(header);
  ok = ok && (body.empty() || std::fwrite(body.data(), 1, body.size(), f) == body.size());
  const int e = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    const int err = ok ? errno : e;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat(kOp, ": cannot write '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(err,
                               absl::StrCat(kOp, ": cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedTokens> LoadTokens(const std::string& path) {
  LoadedTokens out;
  if (absl::EndsWith(path, ".bin")) {
    absl::StatusOr<std::vector<uint16_t>> tokens = ReadTokenShard(path);
    if (!tokens.ok()) return tokens.status();
    out.tokens = *std::move(tokens);
    return out;
  }
  constexpr const char* kOp = "LoadTokens";
  int raw_fd = -1;
  absl::StatusOr<int64_t> size = OpenRegular(kOp, path, &raw_fd);
  if (!size.ok()) return size.status();
  Fd fd(raw_fd);
  if (*size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": text file '", path, "' is empty; expected at least one byte"));
  }
  std::string text(static_cast<size_t>(*size), '\0');
  if (absl::Status s = ReadExactly(kOp, path, fd.get(), text.data(), *size); !s.ok()) return s;
  CharTokenizer tokenizer = CharTokenizer::FromText(text);
  absl::StatusOr<std::vector<uint16_t>> tokens = tokenizer.Encode(text);
  if (!tokens.ok()) return tokens.status();  // cannot happen: the vocabulary is the text's
  out.tokens = *std::move(tokens);
  out.tokenizer = std::move(tokenizer);
  return out;
}

TrainValTokens SplitTrainVal(absl::Span<const uint16_t> tokens, double train_fraction) {
  TG_CHECK(train_fraction >= 0 && train_fraction <= 1,
           "SplitTrainVal: train_fraction must lie in [0, 1], got ", train_fraction);
  const double n = static_cast<double>(tokens.size());
  const size_t k = std::min(tokens.size(), static_cast<size_t>(n * train_fraction));
  TrainValTokens out;
  out.train.assign(tokens.begin(), tokens.begin() + k);
  out.val.assign(tokens.begin() + k, tokens.end());
  return out;
}

namespace {

// What a tokens file holds, for messages.
std::string KindOf(const std::string& path, bool text) {
  return text ? absl::StrCat("'", path, "' is text (tokenized by its bytes)")
              : absl::StrCat("'", path, "' is an llm.c token shard (GPT-2 token ids)");
}

// The first token of `tokens` outside [0, vocab_size), named by its index in `path` (tokens[0]
// is token `first` of the file) and its byte offset there.
absl::Status CheckIds(const std::string& path, absl::Span<const uint16_t> tokens, int64_t first,
                      int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < vocab_size) continue;
    const int64_t index = first + static_cast<int64_t>(i);
    // A shard's tokens are 2 bytes each after its header; text has one token per byte.
    const int64_t byte = absl::EndsWith(path, ".bin") ? kTokenShardHeaderBytes + 2 * index : index;
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "': token ", tokens[i], " at index ", index, " (byte offset ", byte,
        ") is outside the vocabulary of ", vocab_size, " (ids 0..", vocab_size - 1, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainValData> LoadTrainVal(const std::string& data_path,
                                          const std::string& val_path) {
  absl::StatusOr<LoadedTokens> train = LoadTokens(data_path);
  if (!train.ok()) return train.status();
  TrainValData out;
  out.train_path = data_path;
  out.tokenizer = std::move(train->tokenizer);
  if (val_path.empty()) {
    out.tokens = SplitTrainVal(train->tokens);
    out.val_path = data_path;
    out.val_offset = static_cast<int64_t>(out.tokens.train.size());
    return out;
  }
  absl::StatusOr<LoadedTokens> val = LoadTokens(val_path);
  if (!val.ok()) return val.status();
  out.val_path = val_path;
  const bool train_text = out.tokenizer.has_value(), val_text = val->tokenizer.has_value();
  if (train_text != val_text) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the validation data and the training data use different tokenizers, so the validation "
        "loss would mean nothing: ",
        KindOf(val_path, val_text), ", ", KindOf(data_path, train_text),
        "; give both as text or both as token shards (.bin)"));
  }
  if (train_text) {
    // The validation ids are the training text's: its bytes back from the validation file's own
    // ids, encoded again.
    absl::StatusOr<std::vector<uint16_t>> ids =
        out.tokenizer->Encode(val->tokenizer->Decode(val->tokens));
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "validation text '", val_path, "' uses a byte that training text '", data_path,
          "' does not, so the model has no token for it: ", ids.status().message()));
    }
    val->tokens = *std::move(ids);
  }
  out.tokens.train = std::move(train->tokens);
  out.tokens.val = std::move(val->tokens);
  return out;
}

absl::Status CheckVocabulary(const TrainValData& data, int64_t vocab_size) {
  if (absl::Status s = CheckIds(data.train_path, data.tokens.train, 0, vocab_size); !s.ok()) {
    return s;
  }
  return CheckIds(data.val_path, data.tokens.val, data.val_offset, vocab_size);
}

}  // namespace tg::data
