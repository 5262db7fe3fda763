#include "train/progress.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace tg::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A FILE* writing to memory; text() is what was written so far.
class Capture {
 public:
  Capture() : file_(open_memstream(&buffer_, &size_)) {}
  ~Capture() {
    std::fclose(file_);
    std::free(buffer_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(buffer_, size_);
  }

 private:
  char* buffer_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

StepRecord Record(int64_t step) {
  StepRecord r;
  r.step = step;
  r.loss = 0.4312;
  r.lr = 3e-4;
  r.items_per_second = 5123.4;
  r.elapsed_seconds = 0.5 * step;  // 0.5 s per step, exact in binary
  return r;
}

TEST(FormatDurationTest, Cases) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(45), "45s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(59.6), "1m00s");
  EXPECT_EQ(FormatDuration(65), "1m05s");
  EXPECT_EQ(FormatDuration(83), "1m23s");
  EXPECT_EQ(FormatDuration(3599), "59m59s");
  EXPECT_EQ(FormatDuration(3600), "1h00m");
  EXPECT_EQ(FormatDuration(2 * 3600 + 3 * 60 + 59), "2h03m");
  EXPECT_EQ(FormatDuration(100 * 3600), "100h00m");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatDuration(kNaN), "?");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "?");
}

TEST(EtaTest, SmoothStepSeconds) {
  EXPECT_EQ(SmoothStepSeconds(kNaN, 2.0, 4, 0.1), 0.5);  // first interval: its rate
  EXPECT_DOUBLE_EQ(SmoothStepSeconds(1.0, 2.0, 1, 0.1), 1.1);
  // An interval of 2 steps weighs like two single-step updates at its rate.
  const double two_steps = SmoothStepSeconds(1.0, 4.0, 2, 0.5);
  EXPECT_DOUBLE_EQ(two_steps, 1.75);
  EXPECT_DOUBLE_EQ(two_steps, SmoothStepSeconds(SmoothStepSeconds(1.0, 2.0, 1, 0.5), 2.0, 1, 0.5));
  // Constant step time stays exact.
  EXPECT_EQ(SmoothStepSeconds(0.5, 0.5, 1, 0.05), 0.5);
  // Unusable intervals leave the estimate alone.
  EXPECT_EQ(SmoothStepSeconds(1.0, 2.0, 0, 0.1), 1.0);
  EXPECT_EQ(SmoothStepSeconds(1.0, -1.0, 1, 0.1), 1.0);
  EXPECT_EQ(SmoothStepSeconds(1.0, kNaN, 1, 0.1), 1.0);
  EXPECT_TRUE(std::isnan(SmoothStepSeconds(kNaN, 1.0, 0, 0.1)));
}

TEST(EtaTest, EtaSeconds) {
  EXPECT_EQ(EtaSeconds(120, 1000, 0.5), 440);
  EXPECT_EQ(EtaSeconds(1000, 1000, 0.5), 0);
  EXPECT_EQ(EtaSeconds(1001, 1000, 0.5), 0);
  EXPECT_TRUE(std::isnan(EtaSeconds(10, 0, 0.5)));     // total unknown
  EXPECT_TRUE(std::isnan(EtaSeconds(10, 100, kNaN)));  // no estimate yet
}

TEST(FormatStatusLineTest, AllFields) {
  StepRecord r = Record(120);
  r.grad_norm = 1.2345;
  r.loss_scale = 65536;
  r.skipped_steps = 2;
  EXPECT_EQ(FormatStatusLine(r, 1000, "img/s", 83),
            "step 120/1000 | loss 0.4312 | lr 3.00e-04 | gnorm 1.23 | scale 65536 | skipped 2 | "
            "5123 img/s | eta 1m23s");
}

TEST(FormatStatusLineTest, FieldsWithoutValueLeftOut) {
  StepRecord r;
  r.step = 7;
  EXPECT_EQ(FormatStatusLine(r, 0, "tok/s", kNaN), "step 7 | loss nan");
  r.loss = 2.5e-5;
  r.items_per_second = 12.345;
  r.loss_scale = 1;
  r.skipped_steps = 1;  // a skip shows the scale even at 1
  EXPECT_EQ(FormatStatusLine(r, 0, "tok/s", 3725),
            "step 7 | loss 2.500e-05 | scale 1 | skipped 1 | 12.3 tok/s | eta 1h02m");
  r.loss = 123456;
  r.skipped_steps = 0;
  r.loss_scale = 4294967296.0;
  EXPECT_EQ(FormatStatusLine(r, 0, "tok/s", kNaN),
            "step 7 | loss 1.235e+05 | scale 4294967296 | 12.3 tok/s");
}

TEST(ProgressReporterTest, NonTtyPrintsEveryNAndLastStep) {
  Capture out;
  ProgressOptions options;
  options.total_steps = 10;
  options.print_every = 4;
  options.unit = "img/s";
  options.out = out.file();
  ProgressReporter progress(options);
  EXPECT_FALSE(progress.is_tty());  // a memstream is not a terminal
  for (int64_t step = 1; step <= 10; ++step) {
    progress.Report(Record(step));
    if (step == 5) progress.Println("saved checkpoint");
  }
  EXPECT_EQ(progress.seconds_per_step(), 0.5);
  const ProgressSummary summary = progress.Finish();
  EXPECT_EQ(out.text(),
            "step 4/10 | loss 0.4312 | lr 3.00e-04 | 5123 img/s | eta 3s\n"
            "saved checkpoint\n"
            "step 8/10 | loss 0.4312 | lr 3.00e-04 | 5123 img/s | eta 1s\n"
            "step 10/10 | loss 0.4312 | lr 3.00e-04 | 5123 img/s | eta 0s\n"
            "done: 10 steps in 5s | 5123 img/s mean | final loss 0.4312\n");
  EXPECT_EQ(summary.reports, 10);
  EXPECT_EQ(summary.first_step, 1);
  EXPECT_EQ(summary.last_step, 10);
  EXPECT_EQ(summary.wall_seconds, 5);
  EXPECT_DOUBLE_EQ(summary.mean_items_per_second, 5123.4);
  EXPECT_EQ(summary.final_loss, 0.4312);
  EXPECT_EQ(summary.skipped_steps, 0);
  // A second Finish prints nothing.
  const std::string printed = out.text();
  progress.Finish();
  EXPECT_EQ(out.text(), printed);
}

TEST(ProgressReporterTest, NonTtyFinishPrintsUnprintedLastReport) {
  Capture out;
  ProgressOptions options;  // total unknown: no eta, no "/total"
  options.print_every = 4;
  options.out = out.file();
  ProgressReporter progress(options);
  for (int64_t step = 1; step <= 6; ++step) {
    StepRecord r = Record(step);
    r.skipped_steps = step >= 3 ? 1 : 0;
    r.loss_scale = step >= 3 ? 32768 : 65536;
    progress.Report(r);
  }
  progress.Finish();
  EXPECT_EQ(out.text(),
            "step 4 | loss 0.4312 | lr 3.00e-04 | scale 32768 | skipped 1 | 5123 items/s\n"
            "step 6 | loss 0.4312 | lr 3.00e-04 | scale 32768 | skipped 1 | 5123 items/s\n"
            "done: 6 steps in 3s | 5123 items/s mean | final loss 0.4312 | skipped 1\n");
}

TEST(ProgressReporterTest, TtyRewritesInPlaceNewlineOnlyAtPrintlnAndFinish) {
  Capture out;
  ProgressOptions options;
  options.total_steps = 3;
  options.print_every = 100;  // ignored on a terminal: every Report rewrites the line
  options.unit = "tok/s";
  options.out = out.file();
  options.is_tty = true;
  ProgressReporter progress(options);
  EXPECT_TRUE(progress.is_tty());
  progress.Report(Record(1));
  progress.Report(Record(2));
  const std::string l1 = "step 1/3 | loss 0.4312 | lr 3.00e-04 | 5123 tok/s";
  const std::string l2 = "step 2/3 | loss 0.4312 | lr 3.00e-04 | 5123 tok/s | eta 1s";
  EXPECT_EQ(out.text(), "\r" + l1 + "\x1b[K\r" + l2 + "\x1b[K");
  EXPECT_EQ(out.text().find('\n'), std::string::npos);
  progress.Println("eval: val_loss 0.5");
  progress.Println("second message");  // no status line open: no extra newline
  progress.Report(Record(3));
  progress.Finish();
  const std::string l3 = "step 3/3 | loss 0.4312 | lr 3.00e-04 | 5123 tok/s | eta 0s";
  EXPECT_EQ(out.text(), "\r" + l1 + "\x1b[K\r" + l2 +
                            "\x1b[K\neval: val_loss 0.5\nsecond message\n\r" + l3 +
                            "\x1b[K\ndone: 3 steps in 2s | 5123 tok/s mean | final loss 0.4312\n");
}

TEST(ProgressReporterTest, TtyLineLeftOpenIsEndedByTheDestructor) {
  Capture out;
  {
    ProgressOptions options;
    options.out = out.file();
    options.is_tty = true;
    ProgressReporter progress(options);
    progress.Report(Record(1));
  }
  EXPECT_EQ(out.text(), "\rstep 1 | loss 0.4312 | lr 3.00e-04 | 5123 items/s\x1b[K\n");
}

TEST(ProgressReporterTest, EtaFollowsSmoothedStepTimeOrTheRecord) {
  Capture out;
  ProgressOptions options;
  options.total_steps = 100;
  options.out = out.file();
  options.eta_alpha = 0.5;
  ProgressReporter progress(options);
  StepRecord r = Record(10);
  r.elapsed_seconds = 100;  // resumed run: the clock and the step need not start at 0
  progress.Report(r);
  EXPECT_TRUE(std::isnan(progress.seconds_per_step()));
  r.step = 12;  // 2 steps in 2 s
  r.elapsed_seconds = 102;
  progress.Report(r);
  EXPECT_EQ(progress.seconds_per_step(), 1);
  r.step = 13;  // 1 step in 3 s: 1 + 0.5 * (3 - 1)
  r.elapsed_seconds = 105;
  progress.Report(r);
  EXPECT_EQ(progress.seconds_per_step(), 2);
  r.step = 14;
  r.elapsed_seconds = 106;
  r.eta_seconds = 42;  // the caller's own estimate wins
  progress.Report(r);
  EXPECT_EQ(out.text(),
            "step 10/100 | loss 0.4312 | lr 3.00e-04 | 5123 items/s\n"
            "step 12/100 | loss 0.4312 | lr 3.00e-04 | 5123 items/s | eta 1m28s\n"
            "step 13/100 | loss 0.4312 | lr 3.00e-04 | 5123 items/s | eta 2m54s\n"
            "step 14/100 | loss 0.4312 | lr 3.00e-04 | 5123 items/s | eta 42s\n");
  EXPECT_EQ(progress.summary().first_step, 10);
}

TEST(ProgressReporterTest, MeanThroughputIsTimeWeighted) {
  Capture out;
  ProgressOptions options;
  options.out = out.file();
  ProgressReporter progress(options);
  StepRecord r;
  r.step = 1;
  r.items_per_second = 50;  // the first Report has no interval: only used if it is alone
  progress.Report(r);
  EXPECT_EQ(progress.summary().mean_items_per_second, 50);
  r.step = 2;
  r.elapsed_seconds = 1;
  r.items_per_second = 100;
  progress.Report(r);
  r.step = 3;
  r.elapsed_seconds = 3;
  r.items_per_second = 200;
  progress.Report(r);
  EXPECT_DOUBLE_EQ(progress.summary().mean_items_per_second, 500.0 / 3);  // (100*1 + 200*2) / 3
}

TEST(ProgressReporterTest, ElapsedSecondsRuns) {
  ProgressReporter progress(ProgressOptions{});
  const double t = progress.ElapsedSeconds();
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 60);
}

}  // namespace
}  // namespace tg::train
