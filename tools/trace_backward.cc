// Runs a small traced backward and writes what the engine did:
//   DIR/trace.json  Chrome trace (open in https://ui.perfetto.dev or chrome://tracing)
//   DIR/trace.txt   one line per event, indented by nesting
//   DIR/graph.dot   the backward graph (Graphviz), and graph.svg / graph.png when `dot` exists
//
//   bazel run //tools:trace_backward -- --example=reentrant_checkpoint --out=/tmp/trace
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "autograd/trace.h"
#include "tools/trace/examples.h"

ABSL_FLAG(std::string, example, "reentrant_checkpoint",
          "which example: reentrant_checkpoint, non_reentrant_checkpoint, amp_skipped_step, "
          "ddp_2_ranks");
ABSL_FLAG(std::string, out, "", "output directory (created); required");

namespace {

bool WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) std::fprintf(stderr, "trace_backward: cannot write %s\n", path.c_str());
  return static_cast<bool>(f);
}

std::string Quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string example = absl::GetFlag(FLAGS_example);
  std::filesystem::path out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "trace_backward: --out=DIR is required\n");
    return 2;
  }
  // An unknown example is refused before anything is created: a typo leaves no empty
  // directory behind (and no files from an earlier run are overwritten).
  const std::vector<std::string> names = tg::tools::TraceExampleNames();
  if (std::find(names.begin(), names.end(), example) == names.end()) {
    std::fprintf(stderr, "trace_backward: no trace example named '%s' (examples: %s)\n",
                 example.c_str(), absl::StrJoin(names, ", ").c_str());
    return 2;
  }
  // `bazel run` runs in the runfiles tree: a relative --out means the caller's directory.
  if (out.is_relative() && std::getenv("BUILD_WORKING_DIRECTORY") != nullptr) {
    out = std::filesystem::path(std::getenv("BUILD_WORKING_DIRECTORY")) / out;
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "trace_backward: cannot create %s: %s\n", out.c_str(),
                 ec.message().c_str());
    return 1;
  }

  std::string dot;
  std::string json, text;
  size_t n = 0;
  {
    tg::TraceScope trace;
    absl::StatusOr<std::string> result = tg::tools::RunTraceExample(example);
    if (!result.ok()) {
      std::fprintf(stderr, "trace_backward: %s (examples: %s)\n",
                   std::string(result.status().message()).c_str(),
                   absl::StrJoin(tg::tools::TraceExampleNames(), ", ").c_str());
      return 2;
    }
    dot = *result;
    json = trace.ToChromeJson();
    text = trace.ToText();
    n = trace.events().size();
  }
  if (!WriteFile(out / "trace.json", json) || !WriteFile(out / "trace.txt", text) ||
      !WriteFile(out / "graph.dot", dot)) {
    return 1;
  }
  std::printf("%s: %zu events\n  %s\n  %s\n  %s\n", example.c_str(), n,
              (out / "trace.json").c_str(), (out / "trace.txt").c_str(),
              (out / "graph.dot").c_str());
  if (std::system("command -v dot >/dev/null 2>&1") != 0) {
    std::printf("Graphviz `dot` is not installed: wrote graph.dot only "
                "(install graphviz, or run tools/setup.sh, for graph.svg/png)\n");
    return 0;
  }
  for (const char* format : {"svg", "png"}) {
    const std::filesystem::path image = out / (std::string("graph.") + format);
    const std::string cmd = std::string("dot -T") + format + " " + Quoted(out / "graph.dot") +
                            " -o " + Quoted(image);
    if (std::system(cmd.c_str()) == 0) {
      std::printf("  %s\n", image.c_str());
    } else {
      std::fprintf(stderr, "trace_backward: `%s` failed\n", cmd.c_str());
      return 1;
    }
  }
  return 0;
}
