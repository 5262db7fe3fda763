#include "nn/models/hf_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tensor/io/fd.h"

namespace tg::nn::hf {
namespace {

// About 100 bytes per tensor: a few hundred KB for the largest models of the family.
constexpr int64_t kMaxIndexJsonBytes = 64 << 20;

bool IsDirectory(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

// model.safetensors.index.json: its shards read and checked against the map, then merged.
absl::StatusOr<Tensors> ReadSharded(const std::string& caller, const std::string& index_path) {
  const std::string where = absl::StrCat("sharded checkpoint index ", Quote(index_path));
  absl::StatusOr<Json> json =
      ReadJsonFile(caller, index_path, where, kMaxIndexJsonBytes, "an index");
  if (!json.ok()) return json.status();
  const Json& j = *json;
  auto map_it = j.is_object() ? j.find("weight_map") : j.end();
  if (map_it == j.end() || !map_it->is_object() || map_it->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " has no 'weight_map' object {tensor name: shard file} with at least one tensor"));
  }
  // shard file -> the tensors the map puts there.
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": weight_map['", name, "'] is ",
                                                     shard.dump(), "; expected a file name"));
    }
    const std::string file = shard.get<std::string>();
    // A plain name inside the directory: the index must not reach other files.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map['", name, "'] is ", shard.dump(),
                       "; a shard must be a file name in the index's directory (no '/', no '..')"));
    }
    shards[file].insert(name);
  }
  // Every shard first, then the checks, so that a tensor in the wrong shard is named as such.
  const std::string dir = DirName(index_path);
  std::map<std::string, io::Safetensors> read;
  for (const auto& [file, names] : shards) {
    absl::StatusOr<io::Safetensors> st = io::LoadSafetensors(absl::StrCat(dir, "/", file));
    if (!st.ok()) {
      return absl::Status(st.status().code(), absl::StrCat(where, ": shard ", Quote(file), ": ",
                                                           st.status().message()));
    }
    read[file] = std::move(*st);
  }
  Tensors out;
  out.path = index_path;
  out.format = absl::StrCat("HuggingFace safetensors, ", shards.size(), " shard",
                            shards.size() == 1 ? "" : "s");
  for (auto& [file, st] : read) {
    for (auto& [name, tensor] : st.tensors) {
      auto in_map = map_it->find(name);
      if (in_map == map_it->end()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": shard ", Quote(file),
                                                       " holds tensor ", Quote(name),
                                                       ", which weight_map does not list"));
      }
      if (in_map->get<std::string>() != file) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": tensor ", Quote(name), " is in shard ", Quote(file),
                         " but weight_map puts it in ", Quote(in_map->get<std::string>()),
                         " (each tensor must be in exactly one shard)"));
      }
      out.st.tensors[name] = std::move(tensor);
    }
  }
  for (const auto& [file, names] : shards) {
    for (const std::string& name : names) {
      if (out.st.tensors.count(name) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": weight_map puts tensor ",
                                                       Quote(name), " in shard ", Quote(file),
                                                       ", which does not hold it"));
      }
    }
  }
  return out;
}

absl::StatusOr<Tensors> ReadSingle(const std::string& path) {
  absl::StatusOr<io::Safetensors> st = io::LoadSafetensors(path);
  if (!st.ok()) return st.status();
  return Tensors{std::move(*st), "HuggingFace safetensors", path};
}

// GPT-2's byte-level BPE writes every byte as a printable character (bytes_to_unicode in its
// tokenizer): the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the
// other 68 bytes, in increasing order, for U+0100, U+0101, ... (space is U+0120 'Ġ', newline
// U+010A 'Ċ'). Returned as UTF-8.
std::string ByteLevelChar(unsigned char byte) {
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int code = byte;
  if (!printable(byte)) {
    code = 256;
    for (int b = 0; b < byte; ++b) code += printable(b) ? 0 : 1;
  }
  std::string out;
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else {  // two UTF-8 bytes cover code points up to U+07FF
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
  return out;
}

}  // namespace

std::string Quote(const std::string& text) { return absl::StrCat("'", text, "'"); }

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool IsFile(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

absl::StatusOr<int> OpenRegular(const std::string& caller, const std::string& path, int64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(caller, ": cannot open ", Quote(path)));
  }
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(caller, ": cannot stat ", Quote(path)));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(caller, ": ", Quote(path), " is not a regular file"));
  }
  *size = static_cast<int64_t>(info.st_size);
  return fd;
}

absl::Status ReadAt(int fd, int64_t offset, int64_t n, void* dst, const std::string& where) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)),
                              static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::ErrnoToStatus(errno, absl::StrCat(where, ": read at byte ", offset));
    if (r == 0) {
      return absl::DataLossError(
          absl::StrCat(where, ": the file ended at byte ", offset, " (truncated while reading)"));
    }
    p += r;
    offset += r;
    n -= r;
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ReadJsonFile(const std::string& caller, const std::string& path,
                                  const std::string& where, int64_t max_bytes, const char* kind) {
  int64_t size = 0;
  absl::StatusOr<int> fd_or = OpenRegular(caller, path, &size);
  if (!fd_or.ok()) return fd_or.status();
  io::Fd fd(*fd_or);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has ", size, " bytes; ", kind, " has at most ", max_bytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  if (absl::Status s = ReadAt(fd.get(), 0, size, text.data(), where); !s.ok()) return s;
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not valid JSON: ", e.what()));
  }
}

absl::StatusOr<bool> IsPyTorchPickle(const std::string& caller, const std::string& path) {
  int64_t size = 0;
  absl::StatusOr<int> fd_or = OpenRegular(caller, path, &size);
  if (!fd_or.ok()) return fd_or.status();
  io::Fd fd(*fd_or);
  if (size < 4) return false;
  char head[4];
  if (absl::Status s = ReadAt(fd.get(), 0, 4, head, path); !s.ok()) return s;
  return std::memcmp(head, "PK\3\4", 4) == 0 || (head[0] == '\x80' && head[1] == '\x02');
}

absl::Status PyTorchPickleError(const std::string& caller, const std::string& path,
                                const std::string& dir, const std::string& model_class) {
  return absl::InvalidArgumentError(absl::StrCat(
      caller, ": ", Quote(path),
      " is a PyTorch pickle (pytorch_model.bin), which tapegrad does not read (unpickling runs "
      "code); convert it to safetensors with transformers: python -c \"from transformers import ",
      model_class, " as M; M.from_pretrained('", dir, "').save_pretrained('", dir,
      "', safe_serialization=True)\" (writes model.safetensors beside it)"));
}

absl::StatusOr<Tensors> ReadTensors(const std::string& caller, const std::string& path,
                                    const std::string& model_class) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(caller, ": cannot open ", Quote(path)));
  }
  if (S_ISDIR(info.st_mode)) {
    const std::string single = absl::StrCat(path, "/model.safetensors");
    const std::string index = absl::StrCat(path, "/model.safetensors.index.json");
    if (IsFile(single)) return ReadSingle(single);
    if (IsFile(index)) return ReadSharded(caller, index);
    for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
      if (IsFile(absl::StrCat(path, "/", pickle))) {
        return PyTorchPickleError(caller, absl::StrCat(path, "/", pickle), path, model_class);
      }
    }
    return ReadSingle(single);  // NotFound, naming model.safetensors
  }
  if (absl::EndsWith(path, ".safetensors.index.json")) return ReadSharded(caller, path);
  absl::StatusOr<bool> pickle = IsPyTorchPickle(caller, path);
  if (!pickle.ok()) return pickle.status();
  if (*pickle) return PyTorchPickleError(caller, path, DirName(path), model_class);
  return ReadSingle(path);
}

absl::Status CreateDirectories(const std::string& caller, const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError(absl::StrCat(caller, ": empty directory"));
  // Each prefix ending before a '/', then the whole path.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string prefix = dir.substr(0, end);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::ErrnoToStatus(errno, absl::StrCat(caller, ": cannot create ", Quote(prefix)));
    }
    if (!prefix.empty() && !IsDirectory(prefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat(caller, ": ", Quote(prefix), " is not a directory"));
    }
    if (end == std::string::npos) return absl::OkStatus();
  }
}

absl::Status WriteModelDirectory(const std::string& caller, const std::string& dir,
                                 io::Safetensors st,
                                 const std::vector<std::pair<std::string, std::string>>& files) {
  if (absl::Status s = CreateDirectories(caller, dir); !s.ok()) return s;
  st.metadata["format"] = "pt";  // transformers refuses safetensors files without it
  if (absl::Status s = io::SaveSafetensors(dir + "/model.safetensors", st); !s.ok()) return s;
  for (const auto& [name, text] : files) {
    if (absl::Status s = io::SaveFileAtomically(dir + "/" + name, text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> CharTokenizerFiles(const std::string& vocab,
                                                                    int64_t max_length) {
  Json ids = Json::object();
  for (size_t i = 0; i < vocab.size(); ++i) {
    ids[ByteLevelChar(static_cast<unsigned char>(vocab[i]))] = static_cast<int64_t>(i);
  }
  Json tokenizer_config = {
      {"tokenizer_class", "GPT2Tokenizer"},
      {"model_max_length", max_length},
      {"add_prefix_space", false},
      {"bos_token", nullptr},
      {"eos_token", nullptr},
      {"unk_token", nullptr},
      {"pad_token", nullptr},
      {"clean_up_tokenization_spaces", false},
  };
  return {{"vocab.json", ids.dump(2) + "\n"},
          {"merges.txt", "#version: 0.2\n"},
          {"tokenizer_config.json", tokenizer_config.dump(2) + "\n"}};
}

std::string ReadCharVocab(const std::string& caller, const std::string& path, int64_t vocab_size) {
  // A character vocabulary has at most 256 entries of a few bytes; GPT-2's BPE one is ~1 MB.
  constexpr int64_t kMaxCharVocabJsonBytes = 16 << 10;
  if (vocab_size < 1 || vocab_size > 256) return "";
  absl::StatusOr<Json> json =
      ReadJsonFile(caller, path, path, kMaxCharVocabJsonBytes, "vocab.json");
  if (!json.ok() || !json->is_object() || static_cast<int64_t>(json->size()) != vocab_size) {
    return "";
  }
  const Json& j = *json;
  std::map<std::string, unsigned char> byte_of;
  for (int b = 0; b < 256; ++b) byte_of[ByteLevelChar(static_cast<unsigned char>(b))] = b;
  std::string vocab(static_cast<size_t>(vocab_size), '\0');
  std::vector<bool> seen(static_cast<size_t>(vocab_size), false);
  for (const auto& [key, id] : j.items()) {
    const auto byte = byte_of.find(key);
    if (byte == byte_of.end() || !id.is_number_integer()) return "";
    const int64_t i = id.get<int64_t>();
    if (i < 0 || i >= vocab_size || seen[i]) return "";
    seen[i] = true;
    vocab[i] = static_cast<char>(byte->second);
  }
  return vocab;
}

}  // namespace tg::nn::hf
