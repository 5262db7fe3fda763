#include "train/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tg::train {

namespace {
std::atomic<int> g_stop_signal{0};

void OnStopSignal(int sig) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  // Restore the default action: a second Ctrl-C ends the process at once.
  signal(sig, SIG_DFL);
}
}  // namespace

void StopSignal::Install() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopSignal::requested() { return g_stop_signal.load() != 0; }
int StopSignal::signal_number() { return g_stop_signal.load(); }

std::string StopRequest::Describe() const {
  std::string text = absl::StrCat("signal ", signal, " (", strsignal(signal), ")");
  if (received_by >= 0) absl::StrAppend(&text, " received by rank ", received_by);
  return text;
}

}  // namespace tg::train
