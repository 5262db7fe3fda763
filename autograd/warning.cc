#include "autograd/warning.h"

#include <cstdio>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace tg {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

WarningHandler& Installed() {  // guarded by Mu(); empty = the default handler
  static WarningHandler* handler = new WarningHandler();
  return *handler;
}

// The default: each distinct message once, to stderr.
void PrintOnce(const std::string& message) {
  static absl::flat_hash_set<std::string>* printed = new absl::flat_hash_set<std::string>();
  {
    std::lock_guard<std::mutex> lock(Mu());
    if (!printed->insert(message).second) return;
  }
  std::fprintf(stderr, "tapegrad warning: %s\n", message.c_str());
}

}  // namespace

void Warn(const std::string& message) {
  WarningHandler handler;
  {
    std::lock_guard<std::mutex> lock(Mu());
    handler = Installed();
  }
  if (handler) {
    handler(message);  // without the lock: a handler may warn or install another handler
  } else {
    PrintOnce(message);
  }
}

WarningHandler SetWarningHandler(WarningHandler handler) {
  std::lock_guard<std::mutex> lock(Mu());
  return std::exchange(Installed(), std::move(handler));
}

}  // namespace tg
