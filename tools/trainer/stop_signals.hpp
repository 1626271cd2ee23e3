#pragma once
// SIGINT/SIGTERM during training (Ctrl-C, or phalanx-run stopping its workers) are noted by
// the handler and acted on between steps: the finished epochs are reported, then the process
// dies by the same signal, as it would have without the handler.
#include <csignal>

namespace phalanx::trainer {

/// The signal noted since training started (0: none).
int stop_signal_noted();

/// Installs the noting handlers for its lifetime.
class StopSignals {
 public:
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals() { restore(); }
  /// The handlers as they were; then a signal noted meanwhile is raised again.
  void restore();

 private:
  struct sigaction old_int_ {}, old_term_ {};
  bool restored_ = false;
};

}  // namespace phalanx::trainer
