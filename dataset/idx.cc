#include "dataset/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensor/error.h"

namespace tg::data {
namespace {

constexpr int kMaxDims = 4;
constexpr uint8_t kTypeU8 = 0x08;
// Read in chunks of at most this many bytes; the data buffer grows geometrically from here, so a
// header that promises more than the file holds never makes us allocate the promised size.
constexpr size_t kChunk = size_t{1} << 20;
// How far past the expected end we count trailing bytes before saying "more than".
constexpr int64_t kTrailingCountLimit = int64_t{1} << 20;

const char* IdxTypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

std::string Hex(uint8_t b) { return absl::StrFormat("0x%02x", b); }

std::string DimsToString(const std::vector<int64_t>& dims) { return ShapeToString(dims); }

uint32_t LittleEndian32(const uint8_t* b) {
  return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
}

// A gzFile that closes itself.
class GzReader {
 public:
  explicit GzReader(gzFile file) : file_(file) {}
  ~GzReader() {
    if (file_ != nullptr) gzclose_r(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `n` bytes, stopping early only at the end of the stream or on an error; returns
  // the count read. error() tells the two apart.
  int64_t Read(uint8_t* out, int64_t n) {
    int64_t got = 0;
    while (got < n) {
      const unsigned want = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 30));
      const int r = gzread(file_, out + got, want);
      if (r <= 0) break;
      got += r;
    }
    return got;
  }

  // "" when the stream is fine so far, else zlib's message (e.g. "unexpected end of file" for a
  // truncated gzip stream, "incorrect data check" for a corrupt one).
  std::string error() {
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    if (errnum == Z_OK) return "";
    return message != nullptr && *message != '\0' ? message : absl::StrCat("zlib error ", errnum);
  }

 private:
  gzFile file_;
};

// " (gzip: <message>)" or "".
std::string GzipSuffix(const std::string& error) {
  return error.empty() ? "" : absl::StrCat(" (gzip: ", error, ")");
}

}  // namespace

absl::StatusOr<RawTensor> ReadIdx(const std::string& path, int64_t max_bytes) {
  TG_CHECK(max_bytes > 0, "ReadIdx: max_bytes must be positive, got ", max_bytes);
  const std::string where = absl::StrCat("ReadIdx: '", path, "'");

  // open() + gzdopen() rather than gzopen(): errno is then exactly open()'s, and a directory is
  // reported as one instead of as a read error.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("ReadIdx: cannot open '", path, "'"));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, absl::StrCat("ReadIdx: cannot stat '", path, "'"));
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(where, " is a directory, not an IDX file"));
  }
  gzFile gz = gzdopen(fd, "rb");
  if (gz == nullptr) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(where, ": zlib could not open the file"));
  }
  GzReader reader(gz);
  gzbuffer(gz, 1 << 17);

  // Magic: 0x00 0x00 <type> <ndims>.
  uint8_t magic[4];
  const int64_t magic_got = reader.Read(magic, 4);
  if (magic_got >= 2 && (magic[0] != 0 || magic[1] != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not an IDX file: it starts with bytes ", Hex(magic[0]), " ",
                     Hex(magic[1]), ", expected 0x00 0x00"));
  }
  if (magic_got < 4) {
    return absl::DataLossError(
        absl::StrCat(where, ": truncated IDX header: expected 4 magic bytes, found ", magic_got,
                     GzipSuffix(reader.error())));
  }
  if (magic[2] != kTypeU8) {
    const char* name = IdxTypeName(magic[2]);
    return absl::InvalidArgumentError(
        name != nullptr ? absl::StrCat(where, ": IDX element type ", Hex(magic[2]), " (", name,
                                       ") is not supported; expected 0x08 (unsigned byte)")
                        : absl::StrCat(where, ": unknown IDX element type ", Hex(magic[2]),
                                       "; expected 0x08 (unsigned byte)"));
  }
  const int ndims = magic[3];
  if (ndims < 1 || ndims > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": IDX header has ", ndims, " dimensions; expected 1 to ", kMaxDims));
  }

  // Sizes: ndims big-endian uint32.
  const int64_t header_bytes = 4 + 4 * int64_t{ndims};
  uint8_t size_bytes[4 * kMaxDims];
  const int64_t sizes_got = reader.Read(size_bytes, 4 * ndims);
  if (sizes_got < 4 * ndims) {
    return absl::DataLossError(
        absl::StrCat(where, ": truncated IDX header: expected ", header_bytes, " bytes for ", ndims,
                     " dimensions, found ", 4 + sizes_got, GzipSuffix(reader.error())));
  }
  std::vector<int64_t> dims(ndims);
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = size_bytes + 4 * d;
    dims[d] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
  }
  // Every size is below 2^32, so checking each partial product against max_bytes / size before
  // multiplying keeps the product below max_bytes (no overflow).
  int64_t data_bytes = 1;
  for (int d = 0; d < ndims; ++d) {
    if (dims[d] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": dimension ", d, " of shape ",
                                                     DimsToString(dims),
                                                     " is 0; expected a positive size"));
    }
    if (data_bytes > max_bytes / dims[d]) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape ", DimsToString(dims),
                                                     " needs more than the limit of ", max_bytes,
                                                     " bytes"));
    }
    data_bytes *= dims[d];
  }
  const int64_t total_bytes = header_bytes + data_bytes;
  const auto expected = [&] {
    return absl::StrCat("expected ", total_bytes, " bytes (", header_bytes, "-byte header + ",
                        data_bytes, " bytes of data for shape ", DimsToString(dims), ")");
  };

  // Data: grow the buffer as bytes arrive, never past what the stream has delivered + a chunk.
  std::vector<uint8_t> data;
  int64_t got = 0;
  while (got < data_bytes) {
    const int64_t want =
        std::min<int64_t>(data_bytes - got, std::max<int64_t>(static_cast<int64_t>(kChunk), got));
    data.resize(static_cast<size_t>(got + want));
    const int64_t r = reader.Read(data.data() + got, want);
    got += r;
    if (r < want) break;
  }
  if (got < data_bytes) {
    const std::string error = reader.error();
    if (!error.empty() && error != "unexpected end of file") {
      return absl::DataLossError(absl::StrCat(where, ": corrupt gzip stream after ",
                                              header_bytes + got, " decompressed bytes: ", error,
                                              "; ", expected()));
    }
    return absl::DataLossError(absl::StrCat(where, ": truncated IDX file: ", expected(), ", found ",
                                            header_bytes + got, GzipSuffix(error)));
  }

  // Nothing may follow the data, and a gzip stream must end cleanly (its CRC and length are
  // checked when zlib reaches the trailer, i.e. on this read).
  uint8_t extra[4096];
  int64_t trailing = 0;
  while (trailing <= kTrailingCountLimit) {
    const int64_t r = reader.Read(extra, sizeof(extra));
    trailing += r;
    if (r < static_cast<int64_t>(sizeof(extra))) break;
  }
  const std::string error = reader.error();
  if (trailing > 0) {
    return absl::DataLossError(absl::StrCat(where, ": IDX file has trailing bytes: ", expected(),
                                            ", found ",
                                            trailing > kTrailingCountLimit ? "more than " : "",
                                            total_bytes + trailing, GzipSuffix(error)));
  }
  if (!error.empty()) {
    return absl::DataLossError(absl::StrCat(where, ": corrupt or truncated gzip stream after all ",
                                            total_bytes, " bytes of the IDX file: ", error));
  }
  // gzread ends quietly at bytes after the gzip stream that do not start another gzip member, so
  // the file must end with the trailer of what was decompressed: its CRC-32 and length (IDX
  // files are one gzip member).
  if (!gzdirect(gz)) {
    uLong crc = crc32(0L, magic, 4);
    crc = crc32(crc, size_bytes, static_cast<uInt>(4 * ndims));
    crc = crc32_z(crc, data.data(), static_cast<size_t>(data_bytes));
    uint8_t trailer[8];
    const bool ends_with_trailer =
        st.st_size >= 8 && pread(fd, trailer, 8, st.st_size - 8) == 8 &&
        LittleEndian32(trailer) == static_cast<uint32_t>(crc) &&
        LittleEndian32(trailer + 4) == static_cast<uint32_t>(total_bytes);
    if (!ends_with_trailer) {
      return absl::DataLossError(absl::StrCat(
          where, ": the file does not end with the gzip trailer of its ", total_bytes,
          " IDX bytes (bytes after the gzip stream, or several gzip members)"));
    }
  }

  Shape shape(dims.begin(), dims.end());
  RawTensor out = RawTensor::Empty(shape, kU8);
  std::memcpy(out.data<uint8_t>(), data.data(), static_cast<size_t>(data_bytes));
  return out;
}

absl::Status WriteIdx(const std::string& path, const RawTensor& data, bool gzip) {
  TG_CHECK(data.defined(), "WriteIdx: undefined tensor");
  TG_CHECK(data.dtype() == kU8, "WriteIdx: expected a u8 tensor, got ", DTypeName(data.dtype()));
  TG_CHECK(data.device().is_cpu(), "WriteIdx: expected a CPU tensor, got ",
           data.device().ToString());
  TG_CHECK(data.dim() >= 1 && data.dim() <= kMaxDims, "WriteIdx: expected 1 to ", kMaxDims,
           " dims, got shape ", ShapeToString(data.shape()));
  for (int64_t d = 0; d < data.dim(); ++d) {
    TG_CHECK(data.size(d) >= 1 && data.size(d) <= int64_t{0xFFFFFFFF}, "WriteIdx: size ",
             data.size(d), " of dim ", d, " of shape ", ShapeToString(data.shape()),
             " does not fit an IDX header (1 to 2^32 - 1)");
  }
  std::vector<uint8_t> bytes = {0, 0, kTypeU8, static_cast<uint8_t>(data.dim())};
  for (int64_t d = 0; d < data.dim(); ++d) {
    const uint64_t s = static_cast<uint64_t>(data.size(d));
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(s >> shift));
  }
  const RawTensor c = data.contiguous();
  const uint8_t* p = c.data<uint8_t>();
  bytes.insert(bytes.end(), p, p + c.numel());

  // Written to a temporary file and renamed, so a reader never sees half a file.
  const std::string tmp = absl::StrCat(path, ".tmp");
  const std::string where = absl::StrCat("WriteIdx: '", tmp, "'");
  if (gzip) {
    gzFile gz = gzopen(tmp.c_str(), "wb");
    if (gz == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat(where, ": cannot open"));
    size_t done = 0;
    bool ok = true;
    while (ok && done < bytes.size()) {
      const unsigned n = static_cast<unsigned>(std::min<size_t>(bytes.size() - done, 1 << 30));
      ok = gzwrite(gz, bytes.data() + done, n) == static_cast<int>(n);
      done += n;
    }
    const int close_result = gzclose_w(gz);
    if (!ok || close_result != Z_OK) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat(where, ": gzip write failed"));
    }
  } else {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat(where, ": cannot open"));
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const int e = errno;
    if (std::fclose(f) != 0 || !ok) {
      std::remove(tmp.c_str());
      return absl::ErrnoToStatus(ok ? errno : e, absl::StrCat(where, ": write failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return absl::ErrnoToStatus(e,
                               absl::StrCat("WriteIdx: cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace tg::data
