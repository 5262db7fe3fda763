// The start and the end of a training binary's main(): the allocator policy of a training process,
// and the exit code with a message for a failed Status, an escaping tg::Error or std::bad_alloc.
//
//   int main(int argc, char** argv) {
//     tg::train::KeepFreedMemoryInProcess();
//     return tg::train::RunMain("train_gpt", [&] { ...; return 0; });
//   }
#ifndef TAPEGRAD_TRAIN_RUN_MAIN_H_
#define TAPEGRAD_TRAIN_RUN_MAIN_H_

#include <functional>

#include "absl/status/status.h"

namespace tg::train {

// Allocator policy for a training process: glibc returns large freed blocks (activations,
// gradients) to the kernel and page-faults them back in on the next step; this keeps them in the
// process (the mmap threshold raised to glibc's 32 MiB maximum, the trim threshold to 1 GiB), which
// removes most of the system time of a CPU training step. Call once at the start of main().
void KeepFreedMemoryInProcess();

// Prints "<name>: <message>" for a failed status and returns exit code 1.
int Fail(const char* name, const absl::Status& status);
// Runs a training binary's body; a tg::Error escaping it becomes Fail(name, ...), and so does a
// std::bad_alloc ("out of memory: a host allocation failed (std::bad_alloc)"): every allocation
// failure, also one in a kernel's parallel region, exits 1 with a message.
int RunMain(const char* name, const std::function<int()>& body);

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_RUN_MAIN_H_
