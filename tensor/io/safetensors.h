// safetensors (https://github.com/huggingface/safetensors): read and write named CPU tensors and
// a string -> string metadata map, and save / load a StateDict through them.
//
// Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON, then the data buffer. The JSON
// maps each tensor name to {"dtype": "F32", "shape": [2, 2], "data_offsets": [begin, end]}
// (offsets relative to the data buffer) and may hold "__metadata__": {string: string}.
//
// Writer: the header is padded with spaces to a multiple of 8 bytes and tensors are laid out
// contiguously from offset 0 in the reference library's order (larger dtypes first, then by name),
// so every tensor is aligned to its element size in the file and Python's safetensors reads the
// result. It records each tensor's CRC-32 (zlib's) in __metadata__ as "crc32:<name>" -> 8
// lowercase hex digits; computing it, and checking it on load, is one pass over the data. It also
// records the CRC-32 of the whole header (kHeaderChecksumKey, below).
//
// Reader: the reference library's rules (huggingface/safetensors, read_metadata and validate),
// plus a few of ours, every size and offset checked before it is used, so no input crashes, reads
// out of bounds or makes an allocation larger than the data the file actually holds:
// - 8 + the header length lies within the file; the header is UTF-8 JSON text: one object, only
//   JSON whitespace around it (no NUL padding, nothing after it);
// - no key appears twice in the top-level object, in a tensor's entry or in __metadata__ (the
//   reference rejects some duplicates and silently keeps the last tensor of the same name; we
//   refuse them all);
// - __metadata__ (optional, may be null) maps strings to strings; every other key is a tensor:
//   {"dtype", "shape", "data_offsets"} (extra fields are ignored);
// - taken in (begin, end) order the tensors cover the data buffer exactly: the first begins at 0,
//   each next one where the previous one ends (no gaps, no overlaps; zero-size tensors sit on that
//   chain), each holds exactly what its shape and dtype need, and the last one ends at the end of
//   the file (no trailing bytes: this also catches a header length that is off);
// - a "crc32:<name>" entry names a tensor of the file and matches its data; such entries are
//   removed from the metadata returned. Tensors without one (files of other writers) load too.
// - a kHeaderChecksumKey entry matches the header's values (DataLoss naming both checksums
//   otherwise); it is removed from the metadata returned. Files without one load too.
// A bad file gives a Status naming the file, the tensor, the expected and found values and, where
// the check is one of the format's, "(safetensors rule)".
//
//   tg::io::Safetensors st;
//   st.tensors["w"] = tg::RawTensor::FromVector<float>({1, 2, 3, 4}, {2, 2});
//   st.metadata["format"] = "pt";
//   absl::Status s = tg::io::SaveSafetensors("/tmp/w.safetensors", st);
//   absl::StatusOr<tg::io::Safetensors> back = tg::io::LoadSafetensors("/tmp/w.safetensors");
//
//   tg::StateDict sd = optimizer.state_dict();
//   s = tg::io::SaveStateDict("/tmp/opt.safetensors", sd);      // scalars go into __metadata__
//   absl::StatusOr<tg::StateDict> loaded = tg::io::LoadStateDict("/tmp/opt.safetensors");
//
// Status codes: NotFound (missing file), DataLoss (the file is shorter than its header says:
// truncated; or a tensor's data does not match its CRC-32), InvalidArgument (malformed header or
// content, or a tensor the writer cannot store), and the errno-derived code of a failing system
// call.
#ifndef TAPEGRAD_TENSOR_IO_SAFETENSORS_H_
#define TAPEGRAD_TENSOR_IO_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tensor/state_dict.h"
#include "tensor/tensor.h"

namespace tg {
namespace io {

struct Safetensors {
  // CPU tensors; the reader returns contiguous tensors, the writer takes any layout.
  std::map<std::string, RawTensor> tensors;
  // The "__metadata__" object.
  std::map<std::string, std::string> metadata;
};

// The reference library's limit on the JSON header (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The safetensors dtype names: "F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL".
const char* SafetensorsDTypeName(DType dtype);

// The __metadata__ key prefix of the checksums: "crc32:<tensor name>" -> "%08x" of the CRC-32 of
// the tensor's bytes. Written and consumed by this file alone.
inline constexpr char kChecksumMetadataPrefix[] = "crc32:";

// The __metadata__ entry that checksums the whole header: "crc32:__metadata__" -> "%08x" of the
// CRC-32 of the header's canonical text without that entry (the writer's JSON: __metadata__ with
// every entry, the per-tensor checksums included, then each tensor's dtype, shape and offsets in
// file order; no padding). A tensor cannot be named "__metadata__", so the key never clashes
// with a tensor's checksum. Per-tensor CRCs cover the data; this one covers every value of the
// header, the metadata included (settings, scalars, generator states): one flipped digit of a
// learning rate is refused instead of resuming a run at lr 1. The reader rebuilds the canonical
// text from the values it parsed, so whitespace and escaping do not matter. Files without it
// (other writers, and ours before it existed) still load: each of the values they hold is
// validated where it is used (see RunState::Resume).
inline constexpr char kHeaderChecksumKey[] = "crc32:__metadata__";

// The whole file as bytes. InvalidArgument for an undefined or non-CPU tensor, a tensor named
// "__metadata__", a name / metadata string that is not valid UTF-8, or a metadata key with the
// kChecksumMetadataPrefix.
absl::StatusOr<std::string> SerializeSafetensors(const Safetensors& st);
// Parses a whole file held in memory; never reads outside `bytes`.
absl::StatusOr<Safetensors> ParseSafetensors(absl::string_view bytes);

// Writes "<path>.tmp.<pid>.<n>", fsyncs it, renames it over `path` and fsyncs the directory, so
// a crash or an error never leaves a half-written `path` behind; the temporary file is removed
// on failure. First removes the temporaries of crashed saves (RemoveStaleTemporaries: one
// directory listing); that cleanup never fails the save: its error is only appended to the
// message of a save that fails anyway.
absl::Status SaveSafetensors(const std::string& path, const Safetensors& st);
// `bytes` as the whole content of `path`, written the same way as SaveSafetensors (temporary,
// fsync, rename, directory fsync; stale temporaries of `path` removed first). For the small files
// that go with a checkpoint (a config.json).
absl::Status SaveFileAtomically(const std::string& path, absl::string_view bytes);
// Reads the header, then each tensor straight into its storage (no copy of the whole file).
absl::StatusOr<Safetensors> LoadSafetensors(const std::string& path);

// Removes "<path>.tmp.<pid>.<n>" files left by a writer that no longer runs (its pid is not a
// live process: kill(pid, 0) fails with ESRCH), and nothing else: only names of exactly that
// pattern (digits only for pid and n). Returns how many were removed; errors as Status. A reused
// pid keeps a stale file until that process ends; entries that are not regular files are left
// alone. Assumes the writers of `path` run on this machine and in this pid namespace: on a
// filesystem shared between machines or containers a live writer elsewhere looks dead and its
// temporary would be removed. A failing removal does not stop the others; the first one is returned
// after all were tried.
absl::StatusOr<int> RemoveStaleTemporaries(const std::string& path);

// The __metadata__ key prefix of StateDict scalars: "scalar:<key>" -> "%.17g" text, which
// parses back to the identical double (NaN keeps its sign, not its payload).
inline constexpr char kScalarMetadataPrefix[] = "scalar:";

// Tensors as tensors, scalars as kScalarMetadataPrefix entries of __metadata__, plus
// `extra_metadata` (InvalidArgument if one of its keys uses the scalar or checksum prefix).
absl::Status SaveStateDict(const std::string& path, const StateDict& sd,
                           const std::map<std::string, std::string>& extra_metadata = {});
// The inverse; the metadata entries that are not scalars go to `*metadata` when it is not null.
// InvalidArgument names a scalar entry whose text is not a number.
absl::StatusOr<StateDict> LoadStateDict(const std::string& path,
                                        std::map<std::string, std::string>* metadata = nullptr);

}  // namespace io
}  // namespace tg

#endif  // TAPEGRAD_TENSOR_IO_SAFETENSORS_H_
