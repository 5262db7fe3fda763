// The examples of //tools:trace_backward (and of tests/tools/trace_examples_test.cc): small
// backward passes that show what the engine does, each run under the caller's TraceScope.
//
//   tg::TraceScope trace;
//   absl::StatusOr<std::string> dot = tg::tools::RunTraceExample("reentrant_checkpoint");
//   // trace.events(): what the engine did; *dot: the backward graph before it ran
#ifndef TAPEGRAD_TOOLS_TRACE_EXAMPLES_H_
#define TAPEGRAD_TOOLS_TRACE_EXAMPLES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tg::tools {

// reentrant_checkpoint, non_reentrant_checkpoint, amp_skipped_step, ddp_2_ranks.
std::vector<std::string> TraceExampleNames();

// Runs one example (deterministic; ddp_2_ranks runs two ranks as two threads over Gloo on
// loopback, both recording into the caller's scope) and returns the Graphviz DOT of its backward
// graph, taken before the backward (of rank 0 for DDP). NotFound for an unknown name.
absl::StatusOr<std::string> RunTraceExample(const std::string& name);

}  // namespace tg::tools

#endif  // TAPEGRAD_TOOLS_TRACE_EXAMPLES_H_
