// Warnings: how the library tells a C++ caller about something that is allowed but probably
// not what they meant (PyTorch's warnings.warn / TORCH_WARN), without throwing.
//
// Every warning goes to one process-wide handler. The default handler prints each distinct
// message once to stderr ("tapegrad warning: <message>"), like Python's default filter. A
// program (or a test) may install its own: to log, to count, to turn warnings into errors.
//
//   std::vector<std::string> seen;
//   tg::WarningHandlerGuard guard([&](const std::string& m) { seen.push_back(m); });
//   tg::Checkpoint(fn, {x});       // seen: the use_reentrant warning (no explicit choice)
//
// Where the library warns (each names the PyTorch warning it mirrors):
// - autograd/checkpoint.h: CheckpointOptions::reentrant left unset (PyTorch: use_reentrant not
//   passed explicitly), and reentrant checkpointing of inputs none of which requires grad.
//
// The handler is process-wide, not thread-local, so that warnings raised on the engine's
// hand-off threads (deeply nested backward calls) reach it too; it is called without any lock
// held, once per Warn() call (deduplication is the default handler's choice).
#ifndef TAPEGRAD_AUTOGRAD_WARNING_H_
#define TAPEGRAD_AUTOGRAD_WARNING_H_

#include <functional>
#include <string>

namespace tg {

using WarningHandler = std::function<void(const std::string& message)>;

// Reports `message` to the installed handler.
void Warn(const std::string& message);

// Installs `handler` (an empty one restores the default) and returns the previous handler
// (empty when it was the default).
WarningHandler SetWarningHandler(WarningHandler handler);

// Installs a handler for the lifetime of the guard, then puts the previous one back.
class WarningHandlerGuard {
 public:
  explicit WarningHandlerGuard(WarningHandler handler)
      : previous_(SetWarningHandler(std::move(handler))) {}
  ~WarningHandlerGuard() { SetWarningHandler(std::move(previous_)); }
  WarningHandlerGuard(const WarningHandlerGuard&) = delete;
  WarningHandlerGuard& operator=(const WarningHandlerGuard&) = delete;

 private:
  WarningHandler previous_;
};

}  // namespace tg

#endif  // TAPEGRAD_AUTOGRAD_WARNING_H_
