#pragma once
// Starting, watching and stopping one attempt of a node's workers.
#include <string>
#include <vector>

#include "launch_options.hpp"

namespace phalanx::launcher {

struct Outcome {
  bool ok = false;           ///< every worker exited 0
  bool interrupted = false;  ///< the launcher got SIGINT/SIGTERM
  int signal_received = 0;
  int failed_rank = -1;      ///< the first worker that failed
  int failed_pid = 0;
  int exit_code = 0;         ///< its exit code, or 0 when killed by a signal
  int term_signal = 0;       ///< the signal that killed it
  std::vector<std::string> tail;  ///< its last output lines
  int stopped_others = 0;    ///< workers the launcher had to stop
};

/// Installs SIGINT/SIGTERM handlers that the run loop watches (call once).
void install_signal_handlers();

/// Runs the node's workers once (restart `restart_count`) and returns how it ended.
Outcome run_workers(const LaunchOptions& o, int master_port, const std::string& token, int restart_count);

}  // namespace phalanx::launcher
