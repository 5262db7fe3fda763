#include "tensor/io/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "tensor/error.h"
#include "tensor/io/fd.h"

namespace tg {
namespace io {
namespace {

// RawTensor bytes are copied as they are in memory; the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

using Json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kSupportedDTypes[] =
    "F32, F64, F16, BF16, I32, I64, U8, BOOL, F8_E4M3, F8_E5M2";
// A valid header nests 3 levels ({name: {"shape": [..]}}); unknown fields may add a few. The cap
// bounds the parser's memory (a 100 MB header of '[' would otherwise build 100M nested arrays).
constexpr int kMaxJsonDepth = 16;
// Names and values quoted in error messages are cut to this many bytes.
constexpr size_t kMaxQuotedBytes = 120;

struct DTypeEntry {
  DType dtype;
  const char* name;
  // Position in the reference library's Dtype enum (ordered by alignment); the writer sorts by
  // it, descending, then by name, as the reference does.
  int rank;
};

// The reference orders F8_E5M2 before F8_E4M3, both between U8 and F16. Its F8_E4M3 is e4m3fn
// (no infinities), tensor/float8.h's Float8E4M3; any byte is a valid FP8 element (NaN codes too).
constexpr DTypeEntry kDTypes[] = {
    {kBool, "BOOL", 0},       {kU8, "U8", 1},   {kF8E5M2, "F8_E5M2", 2}, {kF8E4M3, "F8_E4M3", 3},
    {kF16, "F16", 4},         {kBF16, "BF16", 5}, {kI32, "I32", 6},       {kF32, "F32", 7},
    {kF64, "F64", 8},         {kI64, "I64", 9},
};

const DTypeEntry& EntryOf(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  throw Error("safetensors: unknown dtype");
}

const DTypeEntry* EntryOf(const std::string& name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

// Paths come from the caller and are quoted whole.
std::string QuotePath(absl::string_view path) { return absl::StrCat("'", path, "'"); }

// Names and values from a file are quoted shortened.
std::string Quote(absl::string_view s) {
  if (s.size() <= kMaxQuotedBytes) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kMaxQuotedBytes), "...' (", s.size(), " bytes)");
}

// A JSON value's text for an error message, shortened.
std::string Dump(const Json& j) {
  std::string text = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuotedBytes) text = absl::StrCat(text.substr(0, kMaxQuotedBytes), "...");
  return text;
}

// A JSON value for an error message: its type and (shortened) text.
std::string Describe(const Json& j) { return absl::StrCat(j.type_name(), " ", Dump(j)); }

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct WritePlan {
  // The 8-byte header length followed by the padded JSON header.
  std::string prefix;
  // Contiguous tensors in file order.
  std::vector<RawTensor> tensors;
  uint64_t data_bytes = 0;
};

uint64_t NumBytes(const RawTensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

std::string JsonString(const std::string& s) {
  // `s` is valid UTF-8 (checked by the caller), so dump() cannot throw.
  return Json(s).dump();
}

// zlib's CRC-32 (the one of gzip and PNG) of `n` bytes.
uint32_t Crc32(const void* data, uint64_t n) {
  return static_cast<uint32_t>(::crc32_z(0, static_cast<const Bytef*>(data), n));
}

// A kChecksumMetadataPrefix value: 8 lowercase hex digits.
std::string CrcText(uint32_t crc) { return absl::StrFormat("%08x", crc); }

bool ParseCrcText(absl::string_view text, uint32_t* crc) {
  if (text.size() != 8) return false;
  *crc = 0;
  for (const char c : text) {
    uint32_t digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    *crc = (*crc << 4) | digit;
  }
  return true;
}

// One tensor's entry of the header, as the writer lays it out.
struct HeaderTensor {
  const std::string* name;
  const char* dtype;
  const Shape* shape;
  uint64_t begin, end;
};

// The writer's header JSON (without padding): "__metadata__" first when there is any, then the
// tensors in the given (file) order. The reader rebuilds the same text from what it parsed to
// check kHeaderChecksumKey, so this is the one canonical form of a header's values.
std::string HeaderJson(const std::map<std::string, std::string>& metadata,
                       const std::vector<HeaderTensor>& tensors) {
  std::string json = "{";
  if (!metadata.empty()) {
    absl::StrAppend(&json, "\"", kMetadataKey, "\":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      absl::StrAppend(&json, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    json += "}";
  }
  for (const HeaderTensor& t : tensors) {
    absl::StrAppend(&json, json.size() > 1 ? "," : "", JsonString(*t.name), ":{\"dtype\":\"",
                    t.dtype, "\",\"shape\":[", absl::StrJoin(*t.shape, ","), "],\"data_offsets\":[",
                    t.begin, ",", t.end, "]}");
  }
  json += "}";
  return json;
}

// The CRC-32 of HeaderJson(metadata, tensors) with `metadata` taken without kHeaderChecksumKey.
uint32_t HeaderCrc(std::map<std::string, std::string> metadata,
                   const std::vector<HeaderTensor>& tensors) {
  metadata.erase(kHeaderChecksumKey);
  const std::string json = HeaderJson(metadata, tensors);
  return Crc32(json.data(), json.size());
}

absl::StatusOr<WritePlan> PlanWrite(const Safetensors& st) {
  for (const auto& [key, value] : st.metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SerializeSafetensors: metadata entry ", Quote(key), " is not valid UTF-8"));
    }
    if (absl::StartsWith(key, kChecksumMetadataPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SerializeSafetensors: metadata key ", Quote(key), " uses the reserved prefix '",
          kChecksumMetadataPrefix, "' (the writer records each tensor's checksum there)"));
    }
  }
  struct Item {
    const std::string* name;
    RawTensor tensor;
    int rank;
  };
  std::vector<Item> items;
  items.reserve(st.tensors.size());
  for (const auto& [name, tensor] : st.tensors) {
    const std::string where = absl::StrCat("SerializeSafetensors: tensor ", Quote(name));
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is reserved for the metadata object"));
    }
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name is not valid UTF-8"));
    }
    if (!tensor.defined()) return absl::InvalidArgumentError(absl::StrCat(where, " is undefined"));
    if (!tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is on ", tensor.device().ToString(), "; expected a CPU tensor"));
    }
    items.push_back({&name, tensor.contiguous(), EntryOf(tensor.dtype()).rank});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    return *a.name < *b.name;
  });

  // The caller's entries plus one checksum per tensor (a pass over all the data: about a second
  // per few GB).
  std::map<std::string, std::string> metadata = st.metadata;
  for (const Item& item : items) {
    metadata[absl::StrCat(kChecksumMetadataPrefix, *item.name)] =
        CrcText(Crc32(item.tensor.raw_data(), NumBytes(item.tensor)));
  }

  std::vector<HeaderTensor> entries;
  entries.reserve(items.size());
  WritePlan plan;
  for (const Item& item : items) {
    const uint64_t n = NumBytes(item.tensor);
    entries.push_back({item.name, EntryOf(item.tensor.dtype()).name, &item.tensor.shape(),
                       plan.data_bytes, plan.data_bytes + n});
    plan.data_bytes += n;
    plan.tensors.push_back(item.tensor);
  }
  // The whole header's checksum, over the header as it would be without that entry (see
  // kHeaderChecksumKey). An empty file stays the reference's "{}".
  if (!metadata.empty() || !entries.empty()) {
    metadata[kHeaderChecksumKey] = CrcText(HeaderCrc(metadata, entries));
  }
  std::string json = HeaderJson(metadata, entries);
  // Pad with spaces so that the data buffer starts 8-byte aligned, like the reference writer.
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t header_bytes = json.size();
  plan.prefix.resize(8);
  std::memcpy(plan.prefix.data(), &header_bytes, 8);
  plan.prefix += json;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Reader

// Reads exactly `n` bytes at `offset` of the source into `dst`.
using ReadFn = std::function<absl::Status(uint64_t offset, size_t n, void* dst)>;

struct HeaderEntry {
  std::string name;
  const DTypeEntry* dtype = nullptr;
  Shape shape;
  // What the shape and dtype need; data_offsets must hold exactly this many bytes.
  uint64_t nbytes = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  // The CRC-32 that __metadata__ records for the tensor, if any.
  bool has_crc = false;
  uint32_t crc = 0;
};

// Rejects JSON that nests deeper than kMaxJsonDepth before the parser builds it. Brackets inside
// strings do not count; on malformed input the parser reports the error instead.
bool NestsTooDeep(absl::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// A non-negative JSON integer (as the reference's usize), or nullopt-like false.
bool AsUnsigned(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {  // "-0"
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// Reads one tensor's entry. Its offsets are checked against the others' in CheckLayout.
absl::Status ParseEntry(const std::string& where, const std::string& name, const Json& j,
                        HeaderEntry* out) {
  const std::string at = absl::StrCat(where, ": tensor ", Quote(name), ": ");
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, "expected an object with dtype, shape and data_offsets, found ", Describe(j)));
  }
  const auto dtype_it = j.find("dtype");
  const auto shape_it = j.find("shape");
  const auto offsets_it = j.find("data_offsets");
  for (const auto& [it, key] : {std::pair{dtype_it, "dtype"}, std::pair{shape_it, "shape"},
                                std::pair{offsets_it, "data_offsets"}}) {
    if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(at, "missing \"", key, "\""));
  }
  out->name = name;

  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "\"dtype\" must be a string, found ", Describe(*dtype_it)));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  out->dtype = EntryOf(dtype_name);
  if (out->dtype == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(at, "unsupported dtype ", Quote(dtype_name),
                                                   " (expected one of ", kSupportedDTypes, ")"));
  }

  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, "\"shape\" must be an array of non-negative integers, found ", Describe(*shape_it)));
  }
  // numel, and the product with zeros taken as ones (what the contiguous strides multiply up
  // to), must both fit in int64.
  uint64_t numel = 1, span = 1;
  bool overflow = false;
  for (size_t d = 0; d < shape_it->size(); ++d) {
    const Json& dim = (*shape_it)[d];
    uint64_t size;
    if (!AsUnsigned(dim, &size)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "shape[", d, "] must be a non-negative integer, found ", Describe(dim)));
    }
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      overflow = true;
      break;
    }
    out->shape.push_back(static_cast<int64_t>(size));
    overflow = overflow || __builtin_mul_overflow(numel, size, &numel) ||
               __builtin_mul_overflow(span, std::max<uint64_t>(size, 1), &span) ||
               span > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "shape ", Dump(*shape_it), " has more elements than int64 can count"));
  }

  uint64_t begin, end;
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !AsUnsigned((*offsets_it)[0], &begin) ||
      !AsUnsigned((*offsets_it)[1], &end)) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "\"data_offsets\" must be two non-negative integers [begin, end], found ",
                     Describe(*offsets_it)));
  }
  const uint64_t element_size = ElementSize(out->dtype->dtype);
  if (__builtin_mul_overflow(numel, element_size, &out->nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat(at, "shape ", ShapeToString(out->shape), " of ",
                                                   out->dtype->name,
                                                   " needs more than 2^64 bytes"));
  }
  out->begin = begin;
  out->end = end;
  return absl::OkStatus();
}

// The reference's rules for the data buffer: taken in (begin, end) order, the first tensor begins
// at offset 0 and each next one where the previous one ends (no gaps, no overlaps; zero-size
// tensors fit anywhere on that chain), each holds exactly the bytes its shape and dtype need, and
// the last one ends where the file ends. `data_size` is what the file holds after the header.
absl::Status CheckLayout(const std::string& where, const std::vector<HeaderEntry>& entries,
                         uint64_t data_size) {
  std::vector<const HeaderEntry*> order;
  for (const HeaderEntry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const HeaderEntry* previous = nullptr;
  uint64_t start = 0;  // where the next tensor must begin: the end of `previous`
  for (const HeaderEntry* e : order) {
    const std::string at = absl::StrCat(where, ": tensor ", Quote(e->name), ": data_offsets [",
                                        e->begin, ", ", e->end, "]");
    if (e->end < e->begin) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, " begin after end; begin <= end (safetensors rule)"));
    }
    if (e->begin > start && previous == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, " leave a gap of ", e->begin,
                       " bytes at the start of the data buffer; the first tensor must begin at "
                       "offset 0 (safetensors rule)"));
    }
    if (e->begin > start) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, " leave a gap of ", e->begin - start, " bytes after tensor ",
                       Quote(previous->name), " (which ends at ", start,
                       "); the data buffer must be covered exactly, without gaps (safetensors "
                       "rule)"));
    }
    if (e->begin < start) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tensors ", Quote(previous->name), " (data_offsets [", previous->begin, ", ",
          previous->end, "]) and ", Quote(e->name), " (data_offsets [", e->begin, ", ", e->end,
          "]) overlap; each tensor must begin where the previous one ends (safetensors rule)"));
    }
    if (e->end - e->begin != e->nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, " hold ", e->end - e->begin, " bytes, but shape ", ShapeToString(e->shape), " of ",
          e->dtype->name, " needs ", e->nbytes, " (safetensors rule)"));
    }
    previous = e;
    start = e->end;
  }
  if (start > data_size) {  // `previous` ends beyond the file
    return absl::DataLossError(absl::StrCat(
        where, ": tensor ", Quote(previous->name), ": data_offsets [", previous->begin, ", ",
        previous->end, "] end beyond the data buffer of ", data_size, " bytes (truncated file?)"));
  }
  if (start < data_size) {
    const std::string covered = previous == nullptr ? std::string("the header lists no tensor")
                                                    : absl::StrCat("the tensors cover ", start,
                                                                   " (up to the end of tensor ",
                                                                   Quote(previous->name), ")");
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the data buffer holds ", data_size, " bytes after the header, but ",
                     covered, ": ", data_size - start,
                     " left over (trailing bytes, or a header length that is too small); the "
                     "file must end where the last tensor ends (safetensors rule)"));
  }
  return absl::OkStatus();
}

// Parses the header in one SAX pass that builds the DOM (as nlohmann's parser does), keeps the
// parser's error message (the DOM parser with exceptions disabled only says "discarded"), and
// finds the first key that appears twice in one of the objects whose keys the reader uses: the
// top level (tensor names, "__metadata__"), a tensor's entry and __metadata__. The DOM would keep
// one of them silently (the last). Keys are compared unescaped. Objects nested deeper (inside
// unknown fields, which are ignored) are not checked. Linear in the header: the insertion into
// the DOM's object tells a repeated key, so the check costs nothing more. (It used to be
// nlohmann's parser callback, whose DOM builder scans the whole top-level object for discarded
// values each time a tensor's entry closes: quadratic in the number of tensors, 13 s for 10k.)
class HeaderParser : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderParser(Json* root) : root_(root) {}

  // The first duplicate, or "" if there is none.
  const std::string& duplicate() const { return duplicate_; }
  // Why the text is not JSON, once the parse failed.
  const std::string& error() const { return error_; }

  bool null() override { return Add(Json(nullptr)); }
  bool boolean(bool value) override { return Add(Json(value)); }
  bool number_integer(number_integer_t value) override { return Add(Json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return Add(Json(value)); }
  bool number_float(number_float_t value, const string_t&) override { return Add(Json(value)); }
  bool string(string_t& value) override { return Add(Json(value)); }
  bool binary(binary_t& value) override { return Add(Json::binary(value)); }
  bool start_object(std::size_t) override { return Add(Json(Json::value_t::object), true); }
  bool start_array(std::size_t) override { return Add(Json(Json::value_t::array), true); }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool end_array() override {
    open_.pop_back();
    return true;
  }
  bool key(string_t& key) override {
    key_ = key;
    if (open_.size() == 1) top_level_key_ = key;
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    error_ = ex.what();
    return false;
  }

 private:
  // Places `value` where the parse stands: the root, the next element of the open array, or the
  // member named by the last key of the open object. A container becomes the open one; only the
  // innermost open container grows, so the pointers on `open_` stay valid.
  bool Add(Json value, bool opens = false) {
    Json* placed = root_;
    if (open_.empty()) {
      *root_ = std::move(value);
    } else if (open_.back()->is_array()) {
      open_.back()->push_back(std::move(value));
      placed = &open_.back()->back();
    } else {
      auto& members = open_.back()->get_ref<Json::object_t&>();
      // try_emplace moves neither the key nor the value when the key is there already.
      auto [it, inserted] = members.try_emplace(std::move(key_), std::move(value));
      if (!inserted) {
        NoteDuplicate(open_.size());
        it->second = std::move(value);  // the last one, as nlohmann's DOM
      }
      placed = &it->second;
    }
    if (opens) open_.push_back(placed);
    return true;
  }

  // key_ appeared twice in the object open at `depth` (1: the top level).
  void NoteDuplicate(size_t depth) {
    if (depth > 2 || !duplicate_.empty()) return;
    if (depth == 1 && key_ == kMetadataKey) {
      duplicate_ = "the header holds \"__metadata__\" twice";
    } else if (depth == 1) {
      duplicate_ = absl::StrCat("the header names tensor ", Quote(key_), " twice");
    } else if (top_level_key_ == kMetadataKey) {
      duplicate_ = absl::StrCat("\"__metadata__\" holds the key ", Quote(key_), " twice");
    } else {
      duplicate_ =
          absl::StrCat("tensor ", Quote(top_level_key_), ": field \"", key_, "\" appears twice");
    }
    absl::StrAppend(&duplicate_, "; each key of an object must be unique");
  }

  Json* root_;
  std::vector<Json*> open_;  // the containers open around the current event, outermost first
  std::string key_;          // the last key read
  std::string top_level_key_;
  std::string duplicate_;
  std::string error_;
};

// Moves the kChecksumMetadataPrefix entries of `metadata` into the entries they name.
absl::Status TakeChecksums(const std::string& where, std::map<std::string, std::string>* metadata,
                           std::vector<HeaderEntry>* entries) {
  std::map<absl::string_view, HeaderEntry*> by_name;
  for (HeaderEntry& e : *entries) by_name[e.name] = &e;
  for (auto it = metadata->begin(); it != metadata->end();) {
    const std::string& key = it->first;
    if (!absl::StartsWith(key, kChecksumMetadataPrefix)) {
      ++it;
      continue;
    }
    const absl::string_view name =
        absl::string_view(key).substr(sizeof(kChecksumMetadataPrefix) - 1);
    const auto entry = by_name.find(name);
    if (entry == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"__metadata__\" entry ", Quote(key),
                                                     " records a checksum of tensor ", Quote(name),
                                                     ", which the file does not hold"));
    }
    if (!ParseCrcText(it->second, &entry->second->crc)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"__metadata__\" entry ", Quote(key),
                                                     " has the value ", Quote(it->second),
                                                     "; expected a CRC-32 as 8 lowercase hex "
                                                     "digits"));
    }
    entry->second->has_crc = true;
    it = metadata->erase(it);
  }
  return absl::OkStatus();
}

// Verifies and removes the kHeaderChecksumKey entry of `metadata`, if any, against the canonical
// text of the parsed header (HeaderJson, tensors in the writer's order: by descending dtype rank,
// then name). Runs after CheckLayout, before the per-tensor checksums are taken out.
absl::Status CheckHeaderChecksum(const std::string& where, const std::vector<HeaderEntry>& entries,
                                 std::map<std::string, std::string>* metadata) {
  const auto it = metadata->find(kHeaderChecksumKey);
  if (it == metadata->end()) return absl::OkStatus();
  uint32_t recorded;
  if (!ParseCrcText(it->second, &recorded)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"__metadata__\" entry ", Quote(it->first), " has the value ",
                     Quote(it->second), "; expected a CRC-32 as 8 lowercase hex digits"));
  }
  metadata->erase(it);
  std::vector<const HeaderEntry*> order;
  order.reserve(entries.size());
  for (const HeaderEntry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    if (a->dtype->rank != b->dtype->rank) return a->dtype->rank > b->dtype->rank;
    return a->name < b->name;
  });
  std::vector<HeaderTensor> tensors;
  tensors.reserve(order.size());
  for (const HeaderEntry* e : order) {
    tensors.push_back({&e->name, e->dtype->name, &e->shape, e->begin, e->end});
  }
  const uint32_t crc = HeaderCrc(*metadata, tensors);
  if (crc != recorded) {
    return absl::DataLossError(absl::StrCat(
        where, ": the header's CRC-32 is ", CrcText(crc), ", its \"__metadata__\" entry '",
        kHeaderChecksumKey, "' records ", CrcText(recorded),
        " (the header is corrupt: a metadata value or a tensor's entry changed)"));
  }
  return absl::OkStatus();
}

// Parses and validates the header; `data_size` is what the file holds after it.
absl::Status ParseHeader(const std::string& where, absl::string_view text, uint64_t data_size,
                         std::vector<HeaderEntry>* entries,
                         std::map<std::string, std::string>* metadata) {
  // nlohmann's parser stops at a NUL byte as at the end of the input, so "{}\0junk" would pass.
  // JSON text holds no NUL (not even inside strings, where it must be escaped).
  const size_t nul = text.find('\0');
  if (nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": header byte ", nul, " (of ", text.size(),
        ") is NUL; the header must be JSON text with only whitespace around it: pad it with "
        "spaces, not NUL bytes (safetensors rule)"));
  }
  if (NestsTooDeep(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header JSON nests deeper than ", kMaxJsonDepth, " levels"));
  }
  Json root;
  HeaderParser parser(&root);
  if (!Json::sax_parse(text.begin(), text.end(), &parser)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": header is not valid JSON: ", parser.error().empty() ? "unknown error" : parser.error()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header must be a JSON object, found ", Describe(root)));
  }
  if (!parser.duplicate().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", parser.duplicate()));
  }
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;  // as the reference (an optional map)
      if (!value.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": \"__metadata__\" must be an object of strings, found ", Describe(value)));
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": \"__metadata__\" entry ",
                                                         Quote(mkey), " must be a string, found ",
                                                         Describe(mvalue)));
        }
        (*metadata)[mkey] = mvalue.get<std::string>();
      }
      continue;
    }
    HeaderEntry entry;
    absl::Status status = ParseEntry(where, key, value, &entry);
    if (!status.ok()) return status;
    entries->push_back(std::move(entry));
  }
  absl::Status status = CheckLayout(where, *entries, data_size);
  if (!status.ok()) return status;
  status = CheckHeaderChecksum(where, *entries, metadata);
  if (!status.ok()) return status;
  return TakeChecksums(where, metadata, entries);
}

// Parses a safetensors source of `total` bytes that `read` gives access to; `where` names it in
// messages ("safetensors file '/x'").
absl::StatusOr<Safetensors> Read(const std::string& where, uint64_t total, const ReadFn& read) {
  if (total < 8) {
    return absl::DataLossError(absl::StrCat(
        where, ": ", total, " bytes is too short for the 8-byte header length (truncated file?)"));
  }
  uint64_t header_bytes;
  absl::Status status = read(0, 8, &header_bytes);
  if (!status.ok()) return status;
  if (header_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header length is 0; expected a JSON object"));
  }
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header length ", header_bytes,
                                                   " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_bytes > total - 8) {
    return absl::DataLossError(absl::StrCat(where, ": header length ", header_bytes,
                                            " exceeds the ", total - 8,
                                            " bytes that follow the length field (truncated "
                                            "file?)"));
  }
  std::string header(header_bytes, '\0');
  status = read(8, header.size(), header.data());
  if (!status.ok()) return status;

  const uint64_t data_start = 8 + header_bytes;
  std::vector<HeaderEntry> entries;
  Safetensors st;
  status = ParseHeader(where, header, total - data_start, &entries, &st.metadata);
  if (!status.ok()) return status;
  header = std::string();

  for (const HeaderEntry& e : entries) {
    RawTensor t;
    try {
      // Every size was checked against the bytes the source holds.
      t = RawTensor::Empty(e.shape, e.dtype->dtype);
    } catch (const Error& error) {
      return absl::InternalError(
          absl::StrCat(where, ": tensor ", Quote(e.name), ": ", error.what()));
    }
    if (e.end > e.begin) {
      status = read(data_start + e.begin, e.end - e.begin, t.raw_data());
      if (!status.ok()) return status;
    }
    if (e.has_crc) {
      const uint32_t crc = Crc32(t.raw_data(), e.nbytes);
      if (crc != e.crc) {
        return absl::DataLossError(absl::StrCat(
            where, ": tensor ", Quote(e.name), ": CRC-32 of its ", e.nbytes, " bytes is ",
            CrcText(crc), ", the header records ", CrcText(e.crc), " (the data is corrupt)"));
      }
    }
    if (e.dtype->dtype == kBool) {
      // A bool holding anything but 0 or 1 is undefined behaviour in C++.
      const unsigned char* p = static_cast<const unsigned char*>(t.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (p[i] > 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": tensor ", Quote(e.name), ": BOOL element ", i, " is ",
                           static_cast<int>(p[i]), "; expected 0 or 1"));
        }
      }
    }
    st.tensors.emplace(e.name, std::move(t));
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// Files

absl::Status WriteAll(const char* caller, int fd, const void* data, size_t n,
                      const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(caller, ": writing ", QuotePath(what)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The writer's pid if `name` is exactly "<prefix><pid>.<n>" (digits only, pid a possible pid_t
// above 0), else 0.
pid_t TemporaryOwner(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix)) return 0;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos) return 0;
  const absl::string_view pid_text = name.substr(0, dot), n_text = name.substr(dot + 1);
  auto all_digits = [](absl::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!all_digits(pid_text) || !all_digits(n_text) || pid_text.size() > 10) return 0;
  uint64_t pid = 0;
  for (const char c : pid_text) pid = pid * 10 + static_cast<uint64_t>(c - '0');
  if (pid > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) return 0;
  return static_cast<pid_t>(pid);
}

// `caller` starts every error message.
absl::Status WriteFileAtomically(const char* caller, const std::string& path,
                                 const WritePlan& plan) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (raw_fd < 0 && errno != EEXIST) break;
  }
  if (raw_fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(caller, ": cannot create ", QuotePath(tmp)));
  }
  Fd fd(raw_fd);
  auto fail = [&](absl::Status status) {
    if (fd.get() >= 0) fd.Close();
    ::unlink(tmp.c_str());
    return status;
  };
  absl::Status status = WriteAll(caller, fd.get(), plan.prefix.data(), plan.prefix.size(), tmp);
  for (size_t i = 0; status.ok() && i < plan.tensors.size(); ++i) {
    const RawTensor& t = plan.tensors[i];
    status = WriteAll(caller, fd.get(), t.raw_data(), NumBytes(t), tmp);
  }
  if (!status.ok()) return fail(status);
  if (::fsync(fd.get()) != 0) {
    return fail(absl::ErrnoToStatus(errno, absl::StrCat(caller, ": fsync ", QuotePath(tmp))));
  }
  if (fd.Close() != 0) {
    return fail(absl::ErrnoToStatus(errno, absl::StrCat(caller, ": close ", QuotePath(tmp))));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat(caller, ": rename ", QuotePath(tmp), " to ", QuotePath(path))));
  }
  // Make the rename durable. Some filesystems cannot fsync a directory (EINVAL): not an error.
  const std::string dir = DirName(path);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || (::fsync(dir_fd.get()) != 0 && errno != EINVAL)) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat(caller, ": wrote ", QuotePath(path),
                                            " but could not sync its directory ", QuotePath(dir)));
  }
  return absl::OkStatus();
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) { return EntryOf(dtype).name; }

absl::StatusOr<std::string> SerializeSafetensors(const Safetensors& st) {
  absl::StatusOr<WritePlan> plan = PlanWrite(st);
  if (!plan.ok()) return plan.status();
  std::string out;
  out.reserve(plan->prefix.size() + plan->data_bytes);
  out += plan->prefix;
  for (const RawTensor& t : plan->tensors) {
    out.append(static_cast<const char*>(t.raw_data()), NumBytes(t));
  }
  return out;
}

absl::StatusOr<Safetensors> ParseSafetensors(absl::string_view bytes) {
  return Read("safetensors buffer", bytes.size(), [&](uint64_t offset, size_t n, void* dst) {
    if (offset > bytes.size() || n > bytes.size() - offset) {  // guarded by Read; kept as a check
      return absl::DataLossError(absl::StrCat("safetensors buffer: ", n, " bytes at offset ",
                                              offset, " lie outside the ", bytes.size(),
                                              "-byte buffer"));
    }
    std::memcpy(dst, bytes.data() + offset, n);
    return absl::OkStatus();
  });
}

absl::StatusOr<int> RemoveStaleTemporaries(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = DirName(path);
  // "<path>.tmp." relative to `dir`; a candidate's path is `path` with the name's tail appended.
  const std::string prefix =
      absl::StrCat(slash == std::string::npos ? path : path.substr(slash + 1), ".tmp.");
  if (prefix.size() == 5) {
    return absl::InvalidArgumentError(absl::StrCat("RemoveStaleTemporaries: ", QuotePath(path),
                                                   " names a directory, not a file"));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> listing(::opendir(dir.c_str()), &::closedir);
  if (listing == nullptr) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("RemoveStaleTemporaries: cannot list ", QuotePath(dir)));
  }
  // Collected first: removing entries while readdir() walks the directory is allowed but muddy.
  std::vector<std::pair<std::string, pid_t>> candidates;  // (path, owner)
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(listing.get());
    if (entry == nullptr) break;
    const pid_t owner = TemporaryOwner(entry->d_name, prefix);
    if (owner > 0) {
      candidates.emplace_back(absl::StrCat(path, ".tmp.", entry->d_name + prefix.size()), owner);
    }
  }
  if (errno != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("RemoveStaleTemporaries: cannot list ", QuotePath(dir)));
  }
  int removed = 0;
  absl::Status first_error;
  for (const auto& [candidate, owner] : candidates) {
    // EPERM means the process exists (another user's): kept, like any live writer's file.
    if (::kill(owner, 0) == 0 || errno != ESRCH) continue;
    struct stat info;
    if (::lstat(candidate.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    if (::unlink(candidate.c_str()) == 0) {
      ++removed;
    } else if (errno != ENOENT && first_error.ok()) {  // ENOENT: someone else removed it
      first_error = absl::ErrnoToStatus(
          errno, absl::StrCat("RemoveStaleTemporaries: cannot remove ", QuotePath(candidate),
                              ", left by process ", owner, " which no longer runs"));
    }
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

absl::Status SaveFileAtomically(const std::string& path, absl::string_view bytes) {
  WritePlan plan;
  plan.prefix = std::string(bytes);
  const absl::StatusOr<int> cleanup = RemoveStaleTemporaries(path);
  const absl::Status status = WriteFileAtomically("SaveFileAtomically", path, plan);
  if (!status.ok() && !cleanup.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (and before the save: ", cleanup.status().message(), ")"));
  }
  return status;
}

absl::Status SaveSafetensors(const std::string& path, const Safetensors& st) {
  absl::StatusOr<WritePlan> plan = PlanWrite(st);
  if (!plan.ok()) return plan.status();
  // Before writing, so that the space of a crashed save's temporary is free again. Its failure
  // does not stop the save (a temporary that cannot be removed takes space, no correctness); it
  // is reported only with a failing save, where it likely shares the cause.
  const absl::StatusOr<int> cleanup = RemoveStaleTemporaries(path);
  const absl::Status status = WriteFileAtomically("SaveSafetensors", path, *plan);
  if (!status.ok() && !cleanup.ok()) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (and before the save: ", cleanup.status().message(), ")"));
  }
  return status;
}

absl::StatusOr<Safetensors> LoadSafetensors(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("LoadSafetensors: cannot open ", QuotePath(path)));
  }
  struct stat info;
  if (::fstat(fd.get(), &info) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("LoadSafetensors: cannot stat ", QuotePath(path)));
  }
  if (!S_ISREG(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadSafetensors: ", QuotePath(path), " is not a regular file"));
  }
  const std::string where = absl::StrCat("safetensors file ", QuotePath(path));
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  return Read(where, size, [&](uint64_t offset, size_t n, void* dst) {
    char* p = static_cast<char*>(dst);
    uint64_t at = offset;
    while (n > 0) {
      const ssize_t r =
          ::pread(fd.get(), p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return absl::ErrnoToStatus(errno, absl::StrCat(where, ": read at byte ", at));
      if (r == 0) {
        return absl::DataLossError(absl::StrCat(where, ": the file ended at byte ", at, " of the ",
                                                size, " it had when opened"));
      }
      p += r;
      at += static_cast<uint64_t>(r);
      n -= static_cast<size_t>(r);
    }
    return absl::OkStatus();
  });
}

absl::Status SaveStateDict(const std::string& path, const StateDict& sd,
                           const std::map<std::string, std::string>& extra_metadata) {
  Safetensors st;
  st.tensors = sd.tensors;
  for (const auto& [key, value] : extra_metadata) {
    for (const char* prefix : {kScalarMetadataPrefix, kChecksumMetadataPrefix}) {
      if (absl::StartsWith(key, prefix)) {
        return absl::InvalidArgumentError(absl::StrCat("SaveStateDict: metadata key ", Quote(key),
                                                       " uses the reserved prefix '", prefix, "'"));
      }
    }
    st.metadata[key] = value;
  }
  for (const auto& [key, value] : sd.scalars) {
    // 17 significant digits identify every double; SimpleAtod reads them back exactly.
    st.metadata[absl::StrCat(kScalarMetadataPrefix, key)] = absl::StrFormat("%.17g", value);
  }
  return SaveSafetensors(path, st);
}

absl::StatusOr<StateDict> LoadStateDict(const std::string& path,
                                        std::map<std::string, std::string>* metadata) {
  absl::StatusOr<Safetensors> st = LoadSafetensors(path);
  if (!st.ok()) return st.status();
  StateDict sd;
  sd.tensors = std::move(st->tensors);
  for (auto& [key, value] : st->metadata) {
    if (!absl::StartsWith(key, kScalarMetadataPrefix)) {
      if (metadata != nullptr) (*metadata)[key] = std::move(value);
      continue;
    }
    double d;
    if (!absl::SimpleAtod(value, &d)) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors file ", QuotePath(path),
                                                     ": scalar ", Quote(key), " has the value ",
                                                     Quote(value), "; expected a number"));
    }
    sd.scalars[key.substr(sizeof(kScalarMetadataPrefix) - 1)] = d;
  }
  return sd;
}

}  // namespace io
}  // namespace tg
