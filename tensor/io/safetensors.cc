#include "tensor/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensor/error.h"

namespace tg {
namespace io {
namespace {

// Tensor bytes are copied as they are in memory; the format is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

using Json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kSupportedDTypes[] = "F32, F64, F16, BF16, I32, I64, U8, BOOL";
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

constexpr DTypeEntry kDTypes[] = {
    {kBool, "BOOL", 0}, {kU8, "U8", 1},   {kF16, "F16", 2}, {kBF16, "BF16", 3},
    {kI32, "I32", 4},   {kF32, "F32", 5}, {kF64, "F64", 6}, {kI64, "I64", 7},
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
  std::vector<Tensor> tensors;
  uint64_t data_bytes = 0;
};

uint64_t NumBytes(const Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
}

std::string JsonString(const std::string& s) {
  // `s` is valid UTF-8 (checked by the caller), so dump() cannot throw.
  return Json(s).dump();
}

absl::StatusOr<WritePlan> PlanWrite(const Safetensors& st) {
  for (const auto& [key, value] : st.metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SerializeSafetensors: metadata entry ", Quote(key), " is not valid UTF-8"));
    }
  }
  struct Item {
    const std::string* name;
    Tensor tensor;
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

  std::string json = "{";
  if (!st.metadata.empty()) {
    absl::StrAppend(&json, "\"", kMetadataKey, "\":{");
    bool first = true;
    for (const auto& [key, value] : st.metadata) {
      absl::StrAppend(&json, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    json += "}";
  }
  WritePlan plan;
  for (const Item& item : items) {
    const uint64_t n = NumBytes(item.tensor);
    absl::StrAppend(&json, json.size() > 1 ? "," : "", JsonString(*item.name), ":{\"dtype\":\"",
                    EntryOf(item.tensor.dtype()).name, "\",\"shape\":[",
                    absl::StrJoin(item.tensor.shape(), ","), "],\"data_offsets\":[",
                    plan.data_bytes, ",", plan.data_bytes + n, "]}");
    plan.data_bytes += n;
    plan.tensors.push_back(item.tensor);
  }
  json += "}";
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
  uint64_t begin = 0;
  uint64_t end = 0;
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

// A SAX handler that accepts everything and keeps the parser's error message (the DOM parser
// with exceptions disabled only says "discarded").
struct ErrorCollector : nlohmann::json_sax<Json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
};

std::string JsonErrorMessage(absl::string_view text) {
  ErrorCollector collector;
  Json::sax_parse(text.begin(), text.end(), &collector);
  return collector.message.empty() ? "unknown error" : collector.message;
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

absl::Status ParseEntry(const std::string& where, const std::string& name, const Json& j,
                        uint64_t data_size, HeaderEntry* out) {
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
  if (begin > end) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "data_offsets [", begin, ", ", end, "] begin after end"));
  }
  if (end > data_size) {
    return absl::DataLossError(absl::StrCat(at, "data_offsets [", begin, ", ", end,
                                            "] end beyond the data buffer of ", data_size,
                                            " bytes (truncated file?)"));
  }
  const uint64_t element_size = ElementSize(out->dtype->dtype);
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, element_size, &nbytes)) {
    return absl::InvalidArgumentError(absl::StrCat(at, "shape ", ShapeToString(out->shape), " of ",
                                                   out->dtype->name,
                                                   " needs more than 2^64 bytes"));
  }
  if (nbytes != end - begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, "data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes, but shape ",
        ShapeToString(out->shape), " of ", out->dtype->name, " needs ", nbytes));
  }
  out->begin = begin;
  out->end = end;
  return absl::OkStatus();
}

absl::Status ParseHeader(const std::string& where, absl::string_view text, uint64_t data_size,
                         std::vector<HeaderEntry>* entries,
                         std::map<std::string, std::string>* metadata) {
  if (NestsTooDeep(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header JSON nests deeper than ", kMaxJsonDepth, " levels"));
  }
  const Json root = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header is not valid JSON: ", JsonErrorMessage(text)));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header must be a JSON object, found ", Describe(root)));
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
    absl::Status status = ParseEntry(where, key, value, data_size, &entry);
    if (!status.ok()) return status;
    entries->push_back(std::move(entry));
  }
  // Overlaps: sorted by begin, each non-empty range must start at or after the furthest end so
  // far. (Gaps and trailing bytes are accepted.)
  std::vector<const HeaderEntry*> order;
  for (const HeaderEntry& e : *entries) {
    if (e.end > e.begin) order.push_back(&e);
  }
  std::sort(order.begin(), order.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const HeaderEntry* furthest = nullptr;
  for (const HeaderEntry* e : order) {
    if (furthest != nullptr && e->begin < furthest->end) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensors ", Quote(furthest->name), " (data_offsets [",
                       furthest->begin, ", ", furthest->end, "]) and ", Quote(e->name),
                       " (data_offsets [", e->begin, ", ", e->end, "]) overlap"));
    }
    if (furthest == nullptr || e->end > furthest->end) furthest = e;
  }
  return absl::OkStatus();
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
    Tensor t;
    try {
      // Every size was checked against the bytes the source holds.
      t = Tensor::Empty(e.shape, e.dtype->dtype);
    } catch (const Error& error) {
      return absl::InternalError(
          absl::StrCat(where, ": tensor ", Quote(e.name), ": ", error.what()));
    }
    if (e.end > e.begin) {
      status = read(data_start + e.begin, e.end - e.begin, t.raw_data());
      if (!status.ok()) return status;
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

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports close()'s error (a deferred write error on some filesystems).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("SaveSafetensors: writing ", QuotePath(what)));
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

absl::Status WriteFileAtomically(const std::string& path, const WritePlan& plan) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int raw_fd = -1;
  for (int attempt = 0; attempt < 100 && raw_fd < 0; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
    raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (raw_fd < 0 && errno != EEXIST) break;
  }
  if (raw_fd < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("SaveSafetensors: cannot create ", QuotePath(tmp)));
  }
  Fd fd(raw_fd);
  auto fail = [&](absl::Status status) {
    if (fd.get() >= 0) fd.Close();
    ::unlink(tmp.c_str());
    return status;
  };
  absl::Status status = WriteAll(fd.get(), plan.prefix.data(), plan.prefix.size(), tmp);
  for (size_t i = 0; status.ok() && i < plan.tensors.size(); ++i) {
    const Tensor& t = plan.tensors[i];
    status = WriteAll(fd.get(), t.raw_data(), NumBytes(t), tmp);
  }
  if (!status.ok()) return fail(status);
  if (::fsync(fd.get()) != 0) {
    return fail(
        absl::ErrnoToStatus(errno, absl::StrCat("SaveSafetensors: fsync ", QuotePath(tmp))));
  }
  if (fd.Close() != 0) {
    return fail(
        absl::ErrnoToStatus(errno, absl::StrCat("SaveSafetensors: close ", QuotePath(tmp))));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat("SaveSafetensors: rename ", QuotePath(tmp), " to ", QuotePath(path))));
  }
  // Make the rename durable. Some filesystems cannot fsync a directory (EINVAL): not an error.
  const std::string dir = DirName(path);
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0 || (::fsync(dir_fd.get()) != 0 && errno != EINVAL)) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("SaveSafetensors: wrote ", QuotePath(path),
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
  for (const Tensor& t : plan->tensors) {
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

absl::Status SaveSafetensors(const std::string& path, const Safetensors& st) {
  absl::StatusOr<WritePlan> plan = PlanWrite(st);
  if (!plan.ok()) return plan.status();
  return WriteFileAtomically(path, *plan);
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
    if (absl::StartsWith(key, kScalarMetadataPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat("SaveStateDict: metadata key ", Quote(key),
                                                     " uses the reserved prefix '",
                                                     kScalarMetadataPrefix, "'"));
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
