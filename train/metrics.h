// MetricsWriter: the per-step metrics CSV of a training run, one row per optimizer step, flushed
// after every row so that a crash loses at most the row being written. Plot it with
// tools/plot_metrics.sh.
//
//   absl::StatusOr<tg::train::MetricsWriter> w =
//       tg::train::MetricsWriter::Open("run/metrics.csv", resume_step, {"val_loss"});
//   if (!w.ok()) return w.status();  // "MetricsWriter: cannot open 'run/metrics.csv' ...: No such
//                                    // file or directory" for a missing directory
//   absl::Status s = eval_due ? w->Write(rec, {{"val_loss", val_loss}})  // evaluated this step
//                             : w->Write(rec);                          // val_loss left empty
//
// The file:
//   step,epoch,loss,lr,grad_norm,loss_scale,loss_scale_next,skipped_steps,items_per_s,elapsed_s[,...]
//   1,0.5,2.30258512,0.001,nan,65536,32768,0,1234.5,0.25,
// loss_scale is the scale this step's backward used (the scale before the step's scaler update;
// a skipped step overflowed at it), loss_scale_next the scale after the update, which the next
// step uses (so an overflow reads 65536,32768 and a growth 65536,131072).
// Integers (step, skipped_steps) are written as integers; the two scales exactly, as the shortest
// text that reads back as the same double (4294967296, 0.5, 1e-300; %.9g would write 2^32 as
// 4294967300); every other number with %.9g, which round-trips every f32 value exactly and keeps
// 9 significant digits of a double; NaN is "nan", infinities "inf" / "-inf".
// StepRecord::eta_seconds is not written (it is derived).
//
// Extra columns: named at Open (e.g. "val_loss", "test_acc"), appended after the fixed columns
// and empty on rows where Write is not given a value for them. Evaluation results therefore go
// on the row of the step they were computed at: there is no second kind of row, each step has
// exactly one row (Write rejects a step that is not larger than the previous one), so the file
// stays a plain table that any CSV reader and the plot script understand.
//
// Resuming: Open(path, resume_from_step = k) keeps the header and the rows with step <= k of the
// existing file, drops the rest (the steps that will be run again) and an incomplete last line
// left by a crash, rewrites the file through `path + ".tmp"` + rename, and appends from there.
// The existing header must match the columns asked for (fixed + extras); a file written before
// the loss_scale_next column (the same header without it) is continued with the new header and
// that cell empty in its kept rows. A missing or empty file is started afresh. Without
// resume_from_step the file is created or truncated.
//
// Not thread-safe: one writer per file, used from one thread.
#ifndef TAPEGRAD_TRAIN_METRICS_H_
#define TAPEGRAD_TRAIN_METRICS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "train/step_record.h"

namespace tg::train {

class MetricsWriter {
 public:
  // The fixed columns, in file order.
  static constexpr const char* kFixedColumns =
      "step,epoch,loss,lr,grad_norm,loss_scale,loss_scale_next,skipped_steps,items_per_s,"
      "elapsed_s";

  // Opens `path` for writing (see above). Errors: the file cannot be created or read
  // (ErrnoToStatus code, message naming the path), an extra column that is empty, contains ',',
  // '"' or a newline, or repeats a column (InvalidArgument), an existing file whose header
  // differs (FailedPrecondition) or that has a row whose step is not an integer (DataLoss).
  static absl::StatusOr<MetricsWriter> Open(const std::string& path,
                                            std::optional<int64_t> resume_from_step = std::nullopt,
                                            const std::vector<std::string>& extra_columns = {});

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();  // closes the file (errors ignored: call Close to see them)

  // Appends one row and flushes it. `extras` gives values for some of the extra columns (the
  // others stay empty). Errors: a name that is not an extra column (InvalidArgument), a step not
  // larger than the last row's (FailedPrecondition), a closed writer, or a write error.
  absl::Status Write(const StepRecord& record, const std::map<std::string, double>& extras = {});

  // Closes the file; later Writes fail. Idempotent.
  absl::Status Close();

  const std::string& path() const { return path_; }
  // The header line without the newline: kFixedColumns, then ",name" per extra column.
  const std::string& header() const { return header_; }
  // Step of the last row in the file (written or kept on resume); nullopt while there is none.
  std::optional<int64_t> last_step() const { return last_step_; }

  // One data row without the newline, exactly as Write writes it (for tests and tools).
  static std::string FormatRow(const StepRecord& record,
                               const std::vector<std::string>& extra_columns,
                               const std::map<std::string, double>& extras = {});
  // `value` as written in the file: %.9g, "nan", "inf", "-inf".
  static std::string FormatNumber(double value);
  // A loss scale as written in the file: the shortest text that reads back as `value` exactly
  // ("4294967296", "0.5"), "nan", "inf", "-inf".
  static std::string FormatExact(double value);

 private:
  MetricsWriter(std::string path, std::string header, std::vector<std::string> extra_columns,
                std::FILE* file, std::optional<int64_t> last_step);

  std::string path_;
  std::string header_;
  std::vector<std::string> extra_columns_;
  std::FILE* file_ = nullptr;
  std::optional<int64_t> last_step_;
};

// Opens the metrics CSV `path` (a user path; empty: leaves *out empty). When resuming, rows after
// `resume_step` are dropped first.
absl::Status OpenMetrics(const std::string& path, std::optional<int64_t> resume_step,
                         const std::vector<std::string>& extra_columns,
                         std::optional<MetricsWriter>* out);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_METRICS_H_
