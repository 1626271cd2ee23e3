#pragma once
// Which worker to blame for a failed attempt: the one that failed first, judged by what the
// launcher can know (docs/launcher.md, "Blame"). Reaping in rank order is not enough: when
// the launcher is paused while one rank is killed, a survivor that exited after losing its
// peer is reaped in the same poll round.
#include <cstdint>
#include <string>
#include <vector>

namespace phalanx::launcher {

struct WorkerFailure {
  int node = 0;
  int rank = -1;
  int pid = 0;
  int exit_code = 0;    ///< when it exited
  int term_signal = 0;  ///< when a signal killed it
  bool signal_from_launcher = false;  ///< that signal is one the launcher sent it
  bool after_stop = false;            ///< reaped after the launcher began stopping the workers
  int reap_round = 0;                 ///< the launcher's poll round that reaped it
  std::int64_t unix_ns = 0;           ///< when it was reaped (or its record's time, when it has one)
  // From its failure record in the store, when it has one (/work/notes: failure records).
  bool has_record = false;
  bool secondary = false;  ///< it failed because another rank failed
  bool is_first = false;   ///< it holds failure/first
  std::string message;     ///< its record's message
  std::int64_t step = -1;  ///< its record's training step (-1: none noted)
};

/// 0: its own failure (a signal the launcher did not send, a non-secondary record, or an
/// exit before the launcher stopped anything); 1: secondary by its record; 2: stopped by the
/// launcher (its signal, or an exit after the stop without a record saying otherwise).
int blame_tier(const WorkerFailure& f);

/// Order on one node: tier, then poll round, then a signal from outside (SIGKILL, SIGTERM...)
/// before a crash or abort (SIGSEGV, SIGABRT...) before an exit code, then failure/first,
/// then the time, then the rank.
bool blame_before(const WorkerFailure& a, const WorkerFailure& b);

/// Order across nodes (poll rounds of different launchers are not comparable): tier, then
/// failure/first, then the same signal classes, then the time, then node and rank.
bool job_blame_before(const WorkerFailure& a, const WorkerFailure& b);

/// Index of the worker to blame in `failures` (-1 when empty), by blame_before.
int pick_blamed(const std::vector<WorkerFailure>& failures);

/// "exited with code 3" or "was killed by signal 9 (Killed)".
std::string describe_exit(const WorkerFailure& f);
/// The launcher's exit code for it: its exit code, or 128 + its signal.
int exit_code_for(const WorkerFailure& f);

}  // namespace phalanx::launcher
