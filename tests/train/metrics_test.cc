#include "train/metrics.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace tg::train {
namespace {

constexpr char kHeader[] =
    "step,epoch,loss,lr,grad_norm,loss_scale,loss_scale_next,skipped_steps,items_per_s,elapsed_s";

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

StepRecord Record(int64_t step, double loss) {
  StepRecord r;
  r.step = step;
  r.epoch = step / 4.0;
  r.loss = loss;
  r.lr = 1e-3;
  r.loss_scale = 65536;
  r.loss_scale_next = 65536;
  r.items_per_second = 1234.5;
  r.elapsed_seconds = 0.25 * step;
  return r;
}

TEST(MetricsWriterTest, FormatNumber) {
  EXPECT_EQ(MetricsWriter::FormatNumber(0), "0");
  EXPECT_EQ(MetricsWriter::FormatNumber(1.5), "1.5");
  EXPECT_EQ(MetricsWriter::FormatNumber(3e-4), "0.0003");
  EXPECT_EQ(MetricsWriter::FormatNumber(65536), "65536");
  EXPECT_EQ(MetricsWriter::FormatNumber(4294967296.0), "4.2949673e+09");
  EXPECT_EQ(MetricsWriter::FormatNumber(1.0 / 3), "0.333333333");
  EXPECT_EQ(MetricsWriter::FormatNumber(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(MetricsWriter::FormatNumber(-std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(MetricsWriter::FormatNumber(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(MetricsWriter::FormatNumber(-std::numeric_limits<double>::infinity()), "-inf");
  // %.9g round-trips every float.
  for (float f : {0.1f, 2.30258512f, 1e-30f, 3.4028235e38f, 0.43119999f}) {
    EXPECT_EQ(std::strtof(MetricsWriter::FormatNumber(f).c_str(), nullptr), f) << f;
  }
}

// The loss scales are written exactly: %.9g wrote 2^32 as 4294967300 (4.2949673e+09), a value
// no scaler holds.
TEST(MetricsWriterTest, LossScalesReadBackExactly) {
  EXPECT_EQ(MetricsWriter::FormatExact(4294967296.0), "4294967296");
  EXPECT_EQ(MetricsWriter::FormatExact(0x1p60), "1152921504606846976");
  EXPECT_EQ(MetricsWriter::FormatExact(0.5), "0.5");
  EXPECT_EQ(MetricsWriter::FormatExact(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(MetricsWriter::FormatExact(0x1p-1074), "5e-324");
  EXPECT_EQ(MetricsWriter::FormatExact(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(MetricsWriter::FormatExact(std::numeric_limits<double>::quiet_NaN()), "nan");
  for (double scale : {4294967296.0, 0x1p127, 0x1p-126, 3.0 * 0x1p40, 1e-300, 1.0 / 3}) {
    EXPECT_EQ(std::strtod(MetricsWriter::FormatExact(scale).c_str(), nullptr), scale) << scale;
  }
  StepRecord r = Record(7, 2.5);
  r.loss_scale = 4294967296.0;  // DeepSpeed's class default, grown once
  r.loss_scale_next = 8589934592.0;
  EXPECT_EQ(MetricsWriter::FormatRow(r, {}),
            "7,1.75,2.5,0.001,nan,4294967296,8589934592,0,1234.5,1.75");
}

TEST(MetricsWriterTest, TwoRecordsExactText) {
  const std::string path = TempPath("two.csv");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->header(), kHeader);
  StepRecord a = Record(1, 2.5);
  StepRecord b = Record(2, 2.25);
  b.grad_norm = 0.75;
  b.loss_scale = 65536;  // overflowed at 65536: skipped, backed off for the next step
  b.loss_scale_next = 32768;
  b.skipped_steps = 1;
  ASSERT_TRUE(w->Write(a).ok());
  // Flushed after every row: the file has it before Close.
  EXPECT_EQ(ReadFile(path),
            std::string(kHeader) + "\n1,0.25,2.5,0.001,nan,65536,65536,0,1234.5,0.25\n");
  ASSERT_TRUE(w->Write(b).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) +
                                "\n"
                                "1,0.25,2.5,0.001,nan,65536,65536,0,1234.5,0.25\n"
                                "2,0.5,2.25,0.001,0.75,65536,32768,1,1234.5,0.5\n");
}

TEST(MetricsWriterTest, ExtraColumnsEmptyWhereNotGiven) {
  const std::string path = TempPath("extra.csv");
  absl::StatusOr<MetricsWriter> w =
      MetricsWriter::Open(path, std::nullopt, {"val_loss", "test_acc"});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Write(Record(1, 2.5)).ok());
  ASSERT_TRUE(w->Write(Record(2, 2.25), {{"val_loss", 2.375}}).ok());
  ASSERT_TRUE(w->Write(Record(3, 2.0), {{"test_acc", 0.5}, {"val_loss", 2.125}}).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) +
                                ",val_loss,test_acc\n"
                                "1,0.25,2.5,0.001,nan,65536,65536,0,1234.5,0.25,,\n"
                                "2,0.5,2.25,0.001,nan,65536,65536,0,1234.5,0.5,2.375,\n"
                                "3,0.75,2,0.001,nan,65536,65536,0,1234.5,0.75,2.125,0.5\n");
}

TEST(MetricsWriterTest, WriteErrors) {
  const std::string path = TempPath("errors.csv");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, std::nullopt, {"val_loss"});
  ASSERT_TRUE(w.ok()) << w.status();
  absl::Status s = w->Write(Record(1, 1), {{"val_acc", 1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'val_acc'"), std::string::npos) << s;
  ASSERT_TRUE(w->Write(Record(5, 1)).ok());
  s = w->Write(Record(5, 1), {{"val_loss", 1}});  // eval results go on the step's only row
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("step 5"), std::string::npos) << s;
  EXPECT_EQ(w->Write(Record(4, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->last_step(), 5);
  ASSERT_TRUE(w->Close().ok());
  ASSERT_TRUE(w->Close().ok());  // idempotent
  EXPECT_EQ(w->Write(Record(6, 1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadFile(path), std::string(kHeader) +
                                ",val_loss\n"
                                "5,1.25,1,0.001,nan,65536,65536,0,1234.5,1.25,\n");
}

TEST(MetricsWriterTest, BadExtraColumnNames) {
  const std::string path = TempPath("bad_columns.csv");
  for (const char* name : {"", "a,b", "a\"b", "a\nb", "loss", "step"}) {
    EXPECT_EQ(MetricsWriter::Open(path, std::nullopt, {name}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(MetricsWriter::Open(path, std::nullopt, {"val_loss", "val_loss"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsWriterTest, MissingDirectoryNamesPath) {
  const std::string path = TempPath("no_such_dir/metrics.csv");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("'" + path + "'"), std::string::npos) << w.status();
  // Resuming into a missing directory fails the same way.
  EXPECT_EQ(MetricsWriter::Open(path, 10).status().code(), absl::StatusCode::kNotFound);
}

TEST(MetricsWriterTest, ResumeDropsLaterStepsKeepsHeaderAndAppends) {
  const std::string path = TempPath("resume.csv");
  {
    absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, std::nullopt, {"val_loss"});
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t step = 1; step <= 5; ++step) {
      ASSERT_TRUE(w->Write(Record(step, step)).ok());
    }
  }  // the destructor closes
  // A crash while writing step 6 left half a line.
  {
    std::FILE* f = std::fopen(path.c_str(), "a");
    std::fputs("6,1.5,6,0.0", f);
    std::fclose(f);
  }
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, 3, {"val_loss"});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->last_step(), 3);
  const std::string kept = std::string(kHeader) +
                           ",val_loss\n"
                           "1,0.25,1,0.001,nan,65536,65536,0,1234.5,0.25,\n"
                           "2,0.5,2,0.001,nan,65536,65536,0,1234.5,0.5,\n"
                           "3,0.75,3,0.001,nan,65536,65536,0,1234.5,0.75,\n";
  EXPECT_EQ(ReadFile(path), kept);  // rewritten before the first Write
  EXPECT_EQ(w->Write(Record(3, 3)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w->Write(Record(4, 40), {{"val_loss", 41}}).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), kept + "4,1,40,0.001,nan,65536,65536,0,1234.5,1,41\n");
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());  // renamed away
}

TEST(MetricsWriterTest, ResumeBeforeFirstRowKeepsOnlyHeader) {
  const std::string path = TempPath("resume0.csv");
  WriteFile(path, std::string(kHeader) + "\n1,0.25,1,0.001,nan,65536,65536,0,1234.5,0.25\n");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->last_step(), std::nullopt);
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) + "\n");
}

TEST(MetricsWriterTest, ResumeMissingOrEmptyFileStartsAfresh) {
  const std::string path = TempPath("resume_missing.csv");
  std::remove(path.c_str());
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, 100);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Write(Record(101, 1)).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path),
            std::string(kHeader) + "\n101,25.25,1,0.001,nan,65536,65536,0,1234.5,25.25\n");

  WriteFile(path, "step,epo");  // crashed while writing the header
  w = MetricsWriter::Open(path, 100);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) + "\n");
}

// A run started before the loss_scale_next column resumes into its metrics file: the header is
// rewritten and the kept rows get an empty loss_scale_next cell (the plot skips empty cells).
TEST(MetricsWriterTest, ResumeContinuesAFileWithoutLossScaleNext) {
  const std::string path = TempPath("resume_legacy.csv");
  WriteFile(path,
            "step,epoch,loss,lr,grad_norm,loss_scale,skipped_steps,items_per_s,elapsed_s,val_loss\n"
            "1,0.25,1,0.001,nan,65536,0,1234.5,0.25,\n"
            "2,0.5,2,0.001,nan,32768,1,1234.5,0.5,2.5\n"
            "3,0.75,3,0.001,nan,32768,1,1234.5,0.75,\n");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, 2, {"val_loss"});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->Write(Record(3, 30)).ok());
  ASSERT_TRUE(w->Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) +
                                ",val_loss\n"
                                "1,0.25,1,0.001,nan,65536,,0,1234.5,0.25,\n"
                                "2,0.5,2,0.001,nan,32768,,1,1234.5,0.5,2.5\n"
                                "3,0.75,30,0.001,nan,65536,65536,0,1234.5,0.75,\n");
  // Other extra columns than the run's are still refused.
  WriteFile(path, "step,epoch,loss,lr,grad_norm,loss_scale,skipped_steps,items_per_s,elapsed_s\n");
  EXPECT_EQ(MetricsWriter::Open(path, 2, {"val_loss"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MetricsWriterTest, ResumeRejectsOtherHeaderOrBadRows) {
  const std::string path = TempPath("resume_bad.csv");
  const std::string original =
      std::string(kHeader) + "\n1,0.25,1,0.001,nan,65536,65536,0,1234.5,0.25\n";
  WriteFile(path, original);
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path, 1, {"val_loss"});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find(path), std::string::npos) << w.status();
  EXPECT_EQ(ReadFile(path), original);  // untouched

  WriteFile(path, std::string(kHeader) + "\nx,0.25,1,0.001,nan,65536,65536,0,1234.5,0.25\n");
  w = MetricsWriter::Open(path, 1);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find("line 2"), std::string::npos) << w.status();
}

TEST(MetricsWriterTest, OpenWithoutResumeTruncates) {
  const std::string path = TempPath("truncate.csv");
  WriteFile(path, "old contents\n");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(ReadFile(path), std::string(kHeader) + "\n");
}

TEST(MetricsWriterTest, MoveKeepsTheFile) {
  const std::string path = TempPath("move.csv");
  absl::StatusOr<MetricsWriter> w = MetricsWriter::Open(path);
  ASSERT_TRUE(w.ok()) << w.status();
  MetricsWriter moved = *std::move(w);
  ASSERT_TRUE(moved.Write(Record(1, 1)).ok());
  EXPECT_EQ(w->Write(Record(2, 1)).code(), absl::StatusCode::kFailedPrecondition);  // moved from
  absl::StatusOr<MetricsWriter> other = MetricsWriter::Open(TempPath("move_other.csv"));
  ASSERT_TRUE(other.ok()) << other.status();
  MetricsWriter assigned = *std::move(other);
  assigned = std::move(moved);  // closes move_other.csv, takes over move.csv
  ASSERT_TRUE(assigned.Write(Record(2, 1)).ok());
  EXPECT_EQ(assigned.path(), path);
  ASSERT_TRUE(assigned.Close().ok());
  EXPECT_EQ(ReadFile(path), std::string(kHeader) +
                                "\n"
                                "1,0.25,1,0.001,nan,65536,65536,0,1234.5,0.25\n"
                                "2,0.5,1,0.001,nan,65536,65536,0,1234.5,0.5\n");
}

}  // namespace
}  // namespace tg::train
