// The seed corpus of //tools/fuzz is what its file names say: every "valid_*" seed reads, every
// "invalid_*" seed is refused with a Status, through each reader's main entry point ("edge_*"
// seeds may do either: behaviour that no contract pins). So the
// invalid seeds double as regression files of the readers' checks (the safetensors layout
// rules: header length one byte short, duplicate names, gaps, trailing bytes, NUL padding, ...).
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataset/idx.h"
#include "dataset/token_shard.h"
#include "gtest/gtest.h"
#include "tensor/io/safetensors.h"
#include "tools/fuzz/checkpoint_setup.h"
#include "train/checkpoint.h"

namespace tg::fuzz {
namespace {

namespace fs = std::filesystem;

// Reads each seed of tools/fuzz/corpus/<reader> with `read` and compares with its name.
void CheckCorpus(const std::string& reader,
                 const std::function<absl::Status(const std::string& path)>& read) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator("tools/fuzz/corpus/" + reader)) {
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    const bool valid = name.rfind("valid_", 0) == 0;
    const bool edge = name.rfind("edge_", 0) == 0;
    ASSERT_TRUE(valid || edge || name.rfind("invalid_", 0) == 0) << name << ": unprefixed seed";
    const absl::Status status = read(file.string());
    if (edge) continue;
    if (valid) {
      EXPECT_TRUE(status.ok()) << reader << "/" << name << ": " << status;
    } else {
      EXPECT_FALSE(status.ok()) << reader << "/" << name << " was accepted";
    }
  }
}

TEST(CorpusTest, Safetensors) {
  CheckCorpus("safetensors", [](const std::string& path) {
    return io::LoadStateDict(path).status();  // the safetensors layer and the scalar metadata
  });
}

TEST(CorpusTest, Checkpoint) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/checkpoint";
  fs::create_directories(dir);
  CheckCorpus("checkpoint", [&](const std::string& path) {
    fs::copy_file(path, train::CheckpointPath(dir), fs::copy_options::overwrite_existing);
    absl::Status last;
    for (RunKind kind : kRunKinds) {  // valid: resumes into one of the runs
      FuzzRun run = MakeFuzzRun(kind);
      std::map<std::string, std::string> metadata;
      std::vector<std::string> changes;
      last = run.state->Resume(dir, {"lr"}, &metadata, &changes).status();
      if (last.ok()) break;
    }
    return last;
  });
}

TEST(CorpusTest, Idx) {
  CheckCorpus("idx", [](const std::string& path) { return data::ReadIdx(path).status(); });
}

TEST(CorpusTest, TokenShard) {
  CheckCorpus("token_shard",
              [](const std::string& path) { return data::ReadTokenShard(path).status(); });
}

TEST(CorpusTest, Text) {
  CheckCorpus("text", [](const std::string& path) { return data::LoadTokens(path).status(); });
}

}  // namespace
}  // namespace tg::fuzz
