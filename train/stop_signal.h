// Stop requests: Ctrl-C / SIGTERM polled between steps, and why a (data-parallel) run stops.
#ifndef TAPEGRAD_TRAIN_STOP_SIGNAL_H_
#define TAPEGRAD_TRAIN_STOP_SIGNAL_H_

#include <string>

namespace tg::train {

// SIGINT / SIGTERM set a flag (the first signal only; a second one kills the process as usual)
// that the training loop polls between steps, so it can save a checkpoint and exit cleanly.
class StopSignal {
 public:
  static void Install();
  static bool requested();
  static int signal_number();  // 0 while none was received
};

// Why a run stops: the signal, and in a data-parallel run which rank received it (every rank
// stops after the same step; see DataParallel::Agree).
struct StopRequest {
  int signal = 0;        // 0: no stop
  int received_by = -1;  // the rank that received it; -1 in a single process
  int this_rank = 0;
  // "signal 15 (Terminated)", plus " received by rank 1" when data parallel.
  std::string Describe() const;
};

}  // namespace tg::train

#endif  // TAPEGRAD_TRAIN_STOP_SIGNAL_H_
