#include "stop_signals.hpp"

namespace phalanx::trainer {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

int stop_signal_noted() { return g_stop_signal; }

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = note_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a step in progress is finished, not interrupted
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

void StopSignals::restore() {
  if (restored_) return;
  restored_ = true;
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  if (const int sig = g_stop_signal) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace phalanx::trainer
