#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "train/user_path.h"

namespace tg::train {
namespace {

// Debian's abseil has its own absl::string_view, which StrCat does not take a std::string_view as.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status CheckExtraColumns(const std::vector<std::string>& extra_columns) {
  std::set<std::string> seen;
  std::string_view fixed = MetricsWriter::kFixedColumns;
  while (!fixed.empty()) {
    const size_t comma = fixed.find(',');
    seen.insert(std::string(fixed.substr(0, comma)));
    fixed = comma == std::string_view::npos ? std::string_view() : fixed.substr(comma + 1);
  }
  for (const std::string& name : extra_columns) {
    if (name.empty() || name.find_first_of(",\"\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("MetricsWriter: bad extra column name '", name,
                       "' (must be non-empty, without ',', '\"' or line breaks)"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("MetricsWriter: column '", name, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

// Writes `text` to `file` and flushes it; errno-based Status naming `path` on failure.
absl::Status WriteAndFlush(std::FILE* file, std::string_view text, const std::string& path) {
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size() || std::fflush(file) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("MetricsWriter: cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

// The result of reading an existing metrics file for a resume.
struct KeptRows {
  bool exists = false;  // false: missing or without a complete first line, start afresh
  std::string text;     // the header line and the kept rows, each with its '\n'
  std::optional<int64_t> last_step;
};

// The columns before loss_scale_next, which files written before it was added lack.
constexpr char kBeforeNextScale[] = "step,epoch,loss,lr,grad_norm,loss_scale,";

// A row of such a file with an empty loss_scale_next cell inserted (after the sixth cell); the
// row as it is when it has fewer cells.
std::string WithEmptyNextScale(std::string_view row) {
  size_t at = 0;
  for (int commas = 0; commas < 6; ++commas) {
    at = row.find(',', at);
    if (at == std::string_view::npos) return std::string(row);
    ++at;
  }
  return absl::StrCat(Sv(row.substr(0, at)), ",", Sv(row.substr(at)));
}

absl::StatusOr<KeptRows> ReadKeptRows(const std::string& path, const std::string& header,
                                      int64_t resume_from_step) {
  // The header of a file written before the loss_scale_next column (same extra columns): its
  // kept rows are continued with that cell empty, so a run started by an older version resumes.
  std::string legacy_header = header;
  legacy_header.erase(std::string_view(kBeforeNextScale).size(),
                      std::string_view("loss_scale_next,").size());
  bool legacy = false;
  KeptRows kept;
  std::FILE* in = std::fopen(path.c_str(), "r");
  if (in == nullptr) {
    if (errno == ENOENT) return kept;
    return absl::ErrnoToStatus(errno, absl::StrCat("MetricsWriter: cannot read '", path, "'"));
  }
  char* buffer = nullptr;
  size_t capacity = 0;
  int64_t line_number = 0;
  absl::Status status;
  while (true) {
    errno = 0;
    const ssize_t n = getline(&buffer, &capacity, in);
    if (n < 0) {
      if (errno != 0 || std::ferror(in)) {
        status =
            absl::ErrnoToStatus(errno, absl::StrCat("MetricsWriter: cannot read '", path, "'"));
      }
      break;
    }
    ++line_number;
    std::string_view line(buffer, static_cast<size_t>(n));
    if (line.back() != '\n') break;  // incomplete last line (a crash while writing it): dropped
    line.remove_suffix(1);
    if (line_number == 1) {
      legacy = line == legacy_header;
      if (line != header && !legacy) {
        status = absl::FailedPreconditionError(absl::StrCat("MetricsWriter: cannot resume '", path,
                                                            "': its header is '", Sv(line),
                                                            "', expected '", header, "'"));
        break;
      }
      kept.exists = true;
      absl::StrAppend(&kept.text, header, "\n");
      continue;
    }
    int64_t step = 0;
    if (!absl::SimpleAtoi(Sv(line.substr(0, line.find(','))), &step)) {
      status = absl::DataLossError(absl::StrCat("MetricsWriter: cannot resume '", path, "': line ",
                                                line_number, " does not start with a step: '",
                                                Sv(line), "'"));
      break;
    }
    if (step > resume_from_step) continue;
    absl::StrAppend(&kept.text, legacy ? WithEmptyNextScale(line) : std::string(line), "\n");
    if (!kept.last_step.has_value() || step > *kept.last_step) kept.last_step = step;
  }
  std::free(buffer);
  std::fclose(in);
  if (!status.ok()) return status;
  return kept;
}

}  // namespace

std::string MetricsWriter::FormatNumber(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  return buf;
}

std::string MetricsWriter::FormatExact(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

std::string MetricsWriter::FormatRow(const StepRecord& record,
                                     const std::vector<std::string>& extra_columns,
                                     const std::map<std::string, double>& extras) {
  std::string row =
      absl::StrCat(record.step, ",", FormatNumber(record.epoch), ",", FormatNumber(record.loss),
                   ",", FormatNumber(record.lr), ",", FormatNumber(record.grad_norm), ",",
                   FormatExact(record.loss_scale), ",", FormatExact(record.loss_scale_next), ",",
                   record.skipped_steps, ",", FormatNumber(record.items_per_second), ",",
                   FormatNumber(record.elapsed_seconds));
  for (const std::string& name : extra_columns) {
    row += ',';
    auto it = extras.find(name);
    if (it != extras.end()) row += FormatNumber(it->second);
  }
  return row;
}

absl::StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path,
                                                  std::optional<int64_t> resume_from_step,
                                                  const std::vector<std::string>& extra_columns) {
  if (absl::Status s = CheckExtraColumns(extra_columns); !s.ok()) return s;
  std::string header = kFixedColumns;
  for (const std::string& name : extra_columns) absl::StrAppend(&header, ",", name);

  KeptRows kept;
  if (resume_from_step.has_value()) {
    absl::StatusOr<KeptRows> read = ReadKeptRows(path, header, *resume_from_step);
    if (!read.ok()) return read.status();
    kept = *std::move(read);
  }

  if (!kept.exists) {  // a fresh file: create or truncate, write the header
    std::FILE* file = std::fopen(path.c_str(), "w");
    if (file == nullptr) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("MetricsWriter: cannot open '", path, "' for writing"));
    }
    if (absl::Status s = WriteAndFlush(file, header + "\n", path); !s.ok()) {
      std::fclose(file);
      return s;
    }
    return MetricsWriter(path, std::move(header), extra_columns, file, std::nullopt);
  }

  // Resume: header + kept rows to path.tmp, synced, renamed over path; the open FILE* then
  // appends to the renamed file.
  const std::string tmp_path = path + ".tmp";
  std::FILE* file = std::fopen(tmp_path.c_str(), "w");
  if (file == nullptr) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("MetricsWriter: cannot open '", tmp_path, "' for writing"));
  }
  absl::Status status = WriteAndFlush(file, kept.text, tmp_path);
  if (status.ok() && fsync(fileno(file)) != 0) {
    status =
        absl::ErrnoToStatus(errno, absl::StrCat("MetricsWriter: cannot sync '", tmp_path, "'"));
  }
  if (status.ok() && std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = absl::ErrnoToStatus(
        errno, absl::StrCat("MetricsWriter: cannot rename '", tmp_path, "' to '", path, "'"));
  }
  if (!status.ok()) {
    std::fclose(file);
    std::remove(tmp_path.c_str());
    return status;
  }
  return MetricsWriter(path, std::move(header), extra_columns, file, kept.last_step);
}

MetricsWriter::MetricsWriter(std::string path, std::string header,
                             std::vector<std::string> extra_columns, std::FILE* file,
                             std::optional<int64_t> last_step)
    : path_(std::move(path)),
      header_(std::move(header)),
      extra_columns_(std::move(extra_columns)),
      file_(file),
      last_step_(last_step) {}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      header_(std::move(other.header_)),
      extra_columns_(std::move(other.extra_columns_)),
      file_(std::exchange(other.file_, nullptr)),
      last_step_(other.last_step_) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    Close().IgnoreError();
    path_ = std::move(other.path_);
    header_ = std::move(other.header_);
    extra_columns_ = std::move(other.extra_columns_);
    file_ = std::exchange(other.file_, nullptr);
    last_step_ = other.last_step_;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() { Close().IgnoreError(); }

absl::Status MetricsWriter::Write(const StepRecord& record,
                                  const std::map<std::string, double>& extras) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("MetricsWriter: '", path_, "' is closed"));
  }
  for (const auto& [name, value] : extras) {
    bool known = false;
    for (const std::string& column : extra_columns_) known = known || column == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("MetricsWriter: '", path_, "' has no extra column '", name, "'"));
    }
  }
  if (last_step_.has_value() && record.step <= *last_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("MetricsWriter: step ", record.step, " written to '", path_, "' after step ",
                     *last_step_, " (one row per step, steps increasing)"));
  }
  absl::Status s = WriteAndFlush(file_, FormatRow(record, extra_columns_, extras) + "\n", path_);
  if (s.ok()) last_step_ = record.step;
  return s;
}

absl::Status MetricsWriter::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  std::FILE* file = std::exchange(file_, nullptr);
  if (std::fclose(file) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("MetricsWriter: cannot close '", path_, "'"));
  }
  return absl::OkStatus();
}

absl::Status OpenMetrics(const std::string& path, std::optional<int64_t> resume_step,
                         const std::vector<std::string>& extra_columns,
                         std::optional<MetricsWriter>* out) {
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<MetricsWriter> writer =
      MetricsWriter::Open(ResolveUserPath(path), resume_step, extra_columns);
  if (!writer.ok()) return writer.status();
  out->emplace(std::move(*writer));
  return absl::OkStatus();
}

}  // namespace tg::train
