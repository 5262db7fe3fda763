#include "train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tg::train {
namespace {

// Debian's abseil has its own absl::string_view, which StrCat does not take a std::string_view as.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A loss: 4 decimals in [1e-3, 1e5) (and for 0), else 3-digit scientific; "nan", "inf".
std::string FormatLoss(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const double a = std::fabs(v);
  if (a == 0 || (a >= 1e-3 && a < 1e5)) return absl::StrFormat("%.4f", v);
  return absl::StrFormat("%.3e", v);
}

// A throughput: integer from 100 up, else 3 significant digits.
std::string FormatRate(double v) {
  if (std::isfinite(v) && std::fabs(v) >= 100) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.3g", v);
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t t = std::llround(seconds);
  if (t < 60) return absl::StrFormat("%ds", t);
  if (t < 3600) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%dh%02dm", t / 3600, (t % 3600) / 60);
}

double SmoothStepSeconds(double smoothed, double interval_seconds, int64_t interval_steps,
                         double alpha) {
  if (interval_steps <= 0 || !std::isfinite(interval_seconds) || interval_seconds < 0) {
    return smoothed;
  }
  const double rate = interval_seconds / static_cast<double>(interval_steps);
  if (std::isnan(smoothed)) return rate;
  const double weight = 1 - std::pow(1 - alpha, static_cast<double>(interval_steps));
  return smoothed + weight * (rate - smoothed);
}

double EtaSeconds(int64_t step, int64_t total_steps, double seconds_per_step) {
  if (total_steps <= 0 || std::isnan(seconds_per_step)) return StepRecord::kNaN;
  if (step >= total_steps) return 0;
  return static_cast<double>(total_steps - step) * seconds_per_step;
}

std::string FormatStatusLine(const StepRecord& record, int64_t total_steps, std::string_view unit,
                             double eta_seconds) {
  std::string line = absl::StrCat("step ", record.step);
  if (total_steps > 0) absl::StrAppend(&line, "/", total_steps);
  absl::StrAppend(&line, " | loss ", FormatLoss(record.loss));
  if (!std::isnan(record.lr)) absl::StrAppend(&line, " | lr ", absl::StrFormat("%.2e", record.lr));
  if (!std::isnan(record.grad_norm)) {
    absl::StrAppend(&line, " | gnorm ", absl::StrFormat("%.3g", record.grad_norm));
  }
  if (record.loss_scale != 1 || record.skipped_steps > 0) {
    absl::StrAppend(&line, " | scale ", absl::StrFormat("%.10g", record.loss_scale));
  }
  if (record.skipped_steps > 0) absl::StrAppend(&line, " | skipped ", record.skipped_steps);
  if (!std::isnan(record.items_per_second)) {
    absl::StrAppend(&line, " | ", FormatRate(record.items_per_second), " ", Sv(unit));
  }
  if (!std::isnan(eta_seconds)) absl::StrAppend(&line, " | eta ", FormatDuration(eta_seconds));
  return line;
}

std::string FormatSummaryLine(const ProgressSummary& summary, std::string_view unit) {
  std::string line =
      absl::StrCat("done: ", summary.last_step, " steps in ", FormatDuration(summary.wall_seconds));
  if (!std::isnan(summary.mean_items_per_second)) {
    absl::StrAppend(&line, " | ", FormatRate(summary.mean_items_per_second), " ", Sv(unit),
                    " mean");
  }
  if (summary.reports > 0) absl::StrAppend(&line, " | final loss ", FormatLoss(summary.final_loss));
  if (summary.skipped_steps > 0) absl::StrAppend(&line, " | skipped ", summary.skipped_steps);
  return line;
}

ProgressReporter::ProgressReporter(ProgressOptions options)
    : options_(std::move(options)),
      is_tty_(options_.is_tty.has_value() ? *options_.is_tty : isatty(fileno(options_.out)) != 0),
      start_(std::chrono::steady_clock::now()) {
  if (options_.print_every < 1) options_.print_every = 1;
}

ProgressReporter::~ProgressReporter() {
  if (line_open_) Emit("\n");
}

double ProgressReporter::ElapsedSeconds() const {
  const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
  return d.count();
}

void ProgressReporter::Emit(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), options_.out);
  std::fflush(options_.out);
}

void ProgressReporter::Report(const StepRecord& record) {
  // Estimates and summary.
  if (last_.has_value()) {
    const int64_t steps = record.step - last_->step;
    const double seconds = record.elapsed_seconds - last_->elapsed_seconds;
    seconds_per_step_ = SmoothStepSeconds(seconds_per_step_, seconds, steps, options_.eta_alpha);
    if (steps > 0 && seconds > 0 && std::isfinite(record.items_per_second)) {
      weighted_items_ += record.items_per_second * seconds;
      weighted_seconds_ += seconds;
    }
  } else {
    summary_.first_step = record.step;
  }
  ++summary_.reports;
  summary_.last_step = record.step;
  summary_.wall_seconds = record.elapsed_seconds;
  summary_.final_loss = record.loss;
  summary_.skipped_steps = record.skipped_steps;
  if (weighted_seconds_ > 0) {
    summary_.mean_items_per_second = weighted_items_ / weighted_seconds_;
  } else if (summary_.reports == 1) {
    summary_.mean_items_per_second = record.items_per_second;
  }
  last_ = record;
  last_eta_ = !std::isnan(record.eta_seconds)
                  ? record.eta_seconds
                  : EtaSeconds(record.step, options_.total_steps, seconds_per_step_);

  // Output.
  const std::string line = FormatStatusLine(record, options_.total_steps, options_.unit, last_eta_);
  if (is_tty_) {
    Emit(absl::StrCat("\r", line, "\x1b[K"));
    line_open_ = true;
    return;
  }
  last_printed_ = record.step % options_.print_every == 0 ||
                  (options_.total_steps > 0 && record.step == options_.total_steps);
  if (last_printed_) Emit(absl::StrCat(line, "\n"));
}

void ProgressReporter::Println(std::string_view message) {
  std::string text;
  if (line_open_) text = "\n";
  line_open_ = false;
  absl::StrAppend(&text, Sv(message), "\n");
  Emit(text);
}

ProgressSummary ProgressReporter::Finish() {
  if (finished_) return summary_;
  finished_ = true;
  std::string text;
  if (line_open_) text = "\n";
  line_open_ = false;
  if (!is_tty_ && last_.has_value() && !last_printed_) {
    absl::StrAppend(&text, FormatStatusLine(*last_, options_.total_steps, options_.unit, last_eta_),
                    "\n");
  }
  absl::StrAppend(&text, FormatSummaryLine(summary_, options_.unit), "\n");
  Emit(text);
  return summary_;
}

}  // namespace tg::train
