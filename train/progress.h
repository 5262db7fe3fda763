// ProgressReporter: the status line of a training binary. On a terminal one line is rewritten in
// place at every Report ("\r" + line + "\x1b[K", no newline); otherwise (a log file, a pipe) a
// plain line is printed every print_every steps and at the last step. Plus FormatDuration and the
// pure ETA functions it uses, and a Summary at Finish.
//
//   tg::train::ProgressOptions options;
//   options.total_steps = 1000;  options.print_every = 50;  options.unit = "img/s";
//   tg::train::ProgressReporter progress(options);
//   for (...) {
//     ... rec.step = step; rec.loss = ...; rec.elapsed_seconds = progress.ElapsedSeconds(); ...
//     progress.Report(rec);
//     if (step % 500 == 0) progress.Println("saved checkpoint");  // ends the status line first
//   }
//   tg::train::ProgressSummary summary = progress.Finish();      // newline + summary line
//
// The line (one line, shown here on two):
//   step 120/1000 | loss 0.4312 | lr 3.00e-04 | gnorm 1.23 | scale 65536 | skipped 2 |
//       5123 img/s | eta 1m23s
// The loss is always shown ("nan" included): %.4f in [1e-3, 1e5) and for 0, else %.3e. The other
// fields only with a value: "/1000" when total_steps > 0; lr (%.2e) and gnorm (%.3g) when not
// NaN; scale (%.10g) when loss_scale != 1 or skipped_steps > 0; skipped when skipped_steps > 0;
// the throughput (%.0f from 100 up, else %.3g, then the unit) when items_per_second is not NaN;
// eta (FormatDuration) from StepRecord::eta_seconds when given, else from the estimate below,
// which needs total_steps > 0 and two Reports at different steps.
//
// ETA: seconds per step is an exponential moving average over the intervals between Reports
// (elapsed_seconds and step differences, so Report need not be called every step), and
// eta = (total_steps - step) * seconds_per_step. SmoothStepSeconds / EtaSeconds are that math.
//
// Times come from StepRecord::elapsed_seconds (the caller's clock; ElapsedSeconds() is a
// steady clock started at construction, for callers without one). Not thread-safe.
#ifndef TAPEGRAD_TRAIN_PROGRESS_H_
#define TAPEGRAD_TRAIN_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "train/step_record.h"

namespace tg::train {

// "45s", "1m23s", "2h03m" (minutes and seconds two-digit after a larger unit); rounded to the
// nearest second first; "59m59s" is followed by "1h00m". Negative, NaN or inf: "?".
std::string FormatDuration(double seconds);

// One EMA update of the seconds-per-step estimate with an interval of `interval_steps` steps
// that took `interval_seconds`: with r = interval_seconds / interval_steps and
// w = 1 - (1 - alpha)^interval_steps (the weight `interval_steps` single-step updates would
// give), returns r if `smoothed` is NaN (no estimate yet), else smoothed + w * (r - smoothed).
// interval_steps <= 0 or a negative / non-finite interval_seconds leave `smoothed` unchanged.
double SmoothStepSeconds(double smoothed, double interval_seconds, int64_t interval_steps,
                         double alpha);

// (total_steps - step) * seconds_per_step, 0 once step >= total_steps; NaN when total_steps <= 0
// or seconds_per_step is NaN.
double EtaSeconds(int64_t step, int64_t total_steps, double seconds_per_step);

// The status line of `record`, without "\r" or newline (format above). `eta_seconds` NaN leaves
// the eta out.
std::string FormatStatusLine(const StepRecord& record, int64_t total_steps, std::string_view unit,
                             double eta_seconds);

struct ProgressOptions {
  int64_t total_steps = 0;       // <= 0: unknown (no "/total", no eta estimate)
  int64_t print_every = 1;       // non-terminal output: a line when step % print_every == 0
  std::string unit = "items/s";  // throughput unit, e.g. "img/s", "tok/s"
  std::FILE* out = stderr;
  std::optional<bool> is_tty;  // nullopt: isatty(fileno(out))
  double eta_alpha = 0.05;     // SmoothStepSeconds alpha (per step)
};

struct ProgressSummary {
  int64_t reports = 0;      // Report calls
  int64_t first_step = 0;   // step of the first Report (> 1 after a resume)
  int64_t last_step = 0;    // step of the last Report
  double wall_seconds = 0;  // elapsed_seconds of the last Report
  // Time-weighted mean of items_per_second over the intervals between Reports (each interval
  // weighted by its elapsed time, i.e. total items / total time when items_per_second is the
  // rate of the interval); the single value when there was one Report; NaN when none had one.
  double mean_items_per_second = StepRecord::kNaN;
  double final_loss = StepRecord::kNaN;
  int64_t skipped_steps = 0;  // of the last Report (cumulative)
};

// "done: 1000 steps in 12m03s | 5123 img/s mean | final loss 0.1234 | skipped 2", fields without
// a value left out ("steps" counts last_step; skipped shown when > 0).
std::string FormatSummaryLine(const ProgressSummary& summary, std::string_view unit);

class ProgressReporter {
 public:
  explicit ProgressReporter(ProgressOptions options = {});
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;
  // Ends a terminal status line left open (a run that returns without Finish) with a newline;
  // prints no summary.
  ~ProgressReporter();

  // Updates the ETA estimate and the summary with `record` and prints its status line: always on
  // a terminal (rewriting the current one), otherwise when step % print_every == 0 or
  // step == total_steps. Call it every step, or at any steps in increasing order.
  void Report(const StepRecord& record);

  // Prints `message` and a newline; on a terminal a status line being shown is ended first with
  // a newline (it stays on screen) and the next Report starts a new one.
  void Println(std::string_view message);

  // Ends the run: on a terminal ends the status line with a newline; otherwise prints the last
  // Report's line if print_every skipped it. Then prints FormatSummaryLine and returns the
  // summary. A second call prints nothing and returns the same summary.
  ProgressSummary Finish();

  const ProgressSummary& summary() const { return summary_; }
  // Current smoothed seconds per step (NaN before two Reports at different steps).
  double seconds_per_step() const { return seconds_per_step_; }
  bool is_tty() const { return is_tty_; }
  // Seconds since construction (steady clock).
  double ElapsedSeconds() const;

 private:
  void Emit(std::string_view text);

  ProgressOptions options_;
  bool is_tty_;
  std::chrono::steady_clock::time_point start_;
  bool line_open_ = false;  // terminal: a status line without its newline is on screen
  bool finished_ = false;
  std::optional<StepRecord> last_;  // last Report
  bool last_printed_ = false;       // non-terminal: the last Report's line was printed
  double last_eta_ = StepRecord::kNaN;
  double seconds_per_step_ = StepRecord::kNaN;
  double weighted_items_ = 0;    // sum of items_per_second * interval seconds
  double weighted_seconds_ = 0;  // sum of those interval seconds
  ProgressSummary summary_;
};

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_PROGRESS_H_
