// The files of a transformers checkpoint directory, shared by the model readers and writers of
// nn/models (gpt2_io, llama_io): small JSON files (config.json, a shard index), the tensors of
// model.safetensors or of its shards, and the directory an export writes.
//
//   absl::StatusOr<tg::nn::hf::Tensors> t = tg::nn::hf::ReadTensors("LoadLlamaCheckpoint", dir,
//                                                                   "LlamaForCausalLM");
//   // t->st.tensors: every tensor, shards merged; t->path: the file or index read
//
// Layouts read (save_pretrained's): a directory holding model.safetensors, else
// model.safetensors.index.json {"metadata": {...}, "weight_map": {tensor: shard file}} and its
// shards; such an index or a safetensors file named directly. Every shard must be a plain file name
// inside the directory (no '/', no ".."), every tensor of the map must be in the shard the map
// names, and every tensor of a shard must be in the map under that shard (each tensor in exactly
// one shard). A PyTorch pickle (pytorch_model.bin, or a file that starts as torch.save writes) is
// refused with the transformers call that rewrites it as safetensors: unpickling runs code.
//
// Private to nn/models: its messages start with the public function's name (`caller`).
#ifndef TAPEGRAD_NN_MODELS_HF_FILES_H_
#define TAPEGRAD_NN_MODELS_HF_FILES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tensor/io/safetensors.h"

namespace tg::nn::hf {

using Json = nlohmann::json;

// 'text', for messages.
std::string Quote(const std::string& text);
// The directory of `path` ("." for a bare name).
std::string DirName(const std::string& path);
bool IsFile(const std::string& path);

// Opens a regular file for reading (its size to *size); `caller` starts the messages.
absl::StatusOr<int> OpenRegular(const std::string& caller, const std::string& path, int64_t* size);
// Reads exactly n bytes at `offset`; DataLoss when the file ends first.
absl::Status ReadAt(int fd, int64_t offset, int64_t n, void* dst, const std::string& where);

// The JSON document of the small file `path`: at most `max_bytes` (else InvalidArgument "<where>
// has N bytes; <kind> has at most M"), valid JSON.
absl::StatusOr<Json> ReadJsonFile(const std::string& caller, const std::string& path,
                                  const std::string& where, int64_t max_bytes, const char* kind);

// Whether `path` starts as a PyTorch pickle does (torch.save's zip archive "PK\3\4", or a bare
// protocol-2 pickle); false for a file shorter than 4 bytes. Errors opening it as Status.
absl::StatusOr<bool> IsPyTorchPickle(const std::string& caller, const std::string& path);
// The refusal of the pickle `path` in `dir`, with the `model_class` call that converts it.
absl::Status PyTorchPickleError(const std::string& caller, const std::string& path,
                                const std::string& dir, const std::string& model_class);

struct Tensors {
  io::Safetensors st;  // every tensor (CPU, the file's dtypes), shards merged
  std::string format;  // "HuggingFace safetensors" or "HuggingFace safetensors, 3 shards"
  std::string path;    // the safetensors file or index read: config.json lies beside it
};
// The tensors of `path` (a directory, an index or a safetensors file, as above).
absl::StatusOr<Tensors> ReadTensors(const std::string& caller, const std::string& path,
                                    const std::string& model_class);

// Creates `dir` and every missing directory above it (as save_pretrained does); InvalidArgument
// when `dir` or one above it is not a directory.
absl::Status CreateDirectories(const std::string& caller, const std::string& dir);
// Writes <dir>/model.safetensors (metadata "format": "pt", which transformers requires) and each
// (name, text) of `files`, each to a temporary file renamed over the target, after creating `dir`.
absl::Status WriteModelDirectory(const std::string& caller, const std::string& dir,
                                 io::Safetensors st,
                                 const std::vector<std::pair<std::string, std::string>>& files);

// A character-level model's tokenizer as transformers' GPT2Tokenizer files (vocab.json, merges.txt,
// tokenizer_config.json): every byte of `vocab` is a token (no merges), token i the byte
// vocab[i] written as GPT-2's byte-level character, no special tokens (a character vocabulary
// has no end-of-text token; declaring one would add an id the model does not have).
// AutoTokenizer.from_pretrained(dir) then encodes and decodes text with the model's ids.
std::vector<std::pair<std::string, std::string>> CharTokenizerFiles(const std::string& vocab,
                                                                    int64_t max_length);
// The character vocabulary of a vocab.json that CharTokenizerFiles wrote: its keys GPT-2
// byte-level characters of single bytes, its ids 0..vocab_size-1, each once. Anything else (a BPE
// vocabulary, a missing or unreadable file) gives "": not a character-level model.
std::string ReadCharVocab(const std::string& caller, const std::string& path, int64_t vocab_size);

}  // namespace tg::nn::hf

#endif  // TAPEGRAD_NN_MODELS_HF_FILES_H_
