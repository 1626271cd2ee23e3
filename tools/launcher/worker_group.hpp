#pragma once
// Starting, watching and stopping one attempt of a node's workers.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <phalanx/backends/store.hpp>
#include <phalanx/parallel/stop.hpp>

#include "blame.hpp"
#include "launch_options.hpp"

namespace phalanx::launcher {

/// What one attempt needs besides the options.
struct Attempt {
  int master_port = 0;
  std::string token;
  int restart_count = 0;
  Store* store = nullptr;  ///< the job's store, for failure records (null: blame by exits alone)
  std::function<bool()> store_lost;  ///< true once the store is known gone (skip it then)
  bool progress_passthrough = false;  ///< draw rank 0's '\r' redraws on our terminal
  /// Readable when the attempt must end because of something outside this node (another
  /// node's failure, a lost store); -1: none. `stop_reason` then says why.
  int stop_fd = -1;
  std::function<std::string()> stop_reason;
  /// Called once, at this node's first worker failure (to tell the other nodes).
  std::function<void(const WorkerFailure&)> on_first_failure;
};

struct Outcome {
  bool ok = false;           ///< every worker exited 0 and nothing stopped them
  bool interrupted = false;  ///< the launcher got a stop signal (SIGTERM, SIGINT, SIGUSR1 ...)
  int signal_received = 0;
  std::string stopped_because;          ///< non-empty: stopped from outside this node (why)
  std::optional<WorkerFailure> blamed;  ///< the worker that failed first on this node
  std::vector<std::string> tail;        ///< its last output lines
  int stopped_others = 0;               ///< workers the launcher had to stop
  std::string launch_error;  ///< non-empty: a worker could not be started (no fds, no fork)
  int stopped_after_save = 0;  ///< workers that exited kExitStoppedAfterSave (saved on a stop)
  int killed_at_deadline = 0;  ///< workers still running at the stop's deadline (SIGKILLed)
  int exited_ok = 0;           ///< workers that exited 0
};

/// A worker's exit status after it saved on a stop request.
using parallel::kExitStoppedAfterSave;

/// Installs SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 handlers that the run loop watches, makes the
/// launcher the child subreaper of its workers' descendants and raises its open-files limit
/// to the hard limit (workers get the original limit and signal dispositions back). Once.
void install_signal_handlers();
/// Readable when the launcher got one of those signals.
int signal_fd();
/// The signal the launcher got since the last call (0: none); empties signal_fd().
int take_signal();

/// Runs the node's workers once and returns how it ended: starts them (spawn), relays their
/// output and stops them at the first failure or stop request (watch), relays what is left
/// once they are gone (drain), and names the worker to blame (blame).
Outcome run_workers(const LaunchOptions& o, const Attempt& a);

}  // namespace phalanx::launcher
