#include "blame.hpp"

#include <csignal>
#include <cstring>
#include <tuple>

namespace phalanx::launcher {

int blame_tier(const WorkerFailure& f) {
  if (f.term_signal != 0) return f.signal_from_launcher ? 2 : 0;
  if (f.has_record) return f.secondary ? 1 : 0;
  return f.after_stop ? 2 : 0;
}

namespace {
/// A signal from outside (kill -9, the OOM killer) before a crash or abort (which a
/// worker often raises itself on its way out after a peer failed), before an exit code.
int by_exit_code(const WorkerFailure& f) {
  switch (f.term_signal) {
    case 0: return 2;
    case SIGABRT: case SIGSEGV: case SIGBUS: case SIGFPE: case SIGILL: case SIGTRAP: case SIGSYS: return 1;
    default: return 0;
  }
}
}  // namespace

bool blame_before(const WorkerFailure& a, const WorkerFailure& b) {
  return std::make_tuple(blame_tier(a), a.reap_round, by_exit_code(a), !a.is_first, a.unix_ns, a.rank) <
         std::make_tuple(blame_tier(b), b.reap_round, by_exit_code(b), !b.is_first, b.unix_ns, b.rank);
}

bool job_blame_before(const WorkerFailure& a, const WorkerFailure& b) {
  return std::make_tuple(blame_tier(a), !a.is_first, by_exit_code(a), a.unix_ns, a.node, a.rank) <
         std::make_tuple(blame_tier(b), !b.is_first, by_exit_code(b), b.unix_ns, b.node, b.rank);
}

int pick_blamed(const std::vector<WorkerFailure>& failures) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(failures.size()); ++i)
    if (best < 0 || blame_before(failures[i], failures[best])) best = i;
  return best;
}

std::string describe_exit(const WorkerFailure& f) {
  if (f.term_signal != 0)
    return "was killed by signal " + std::to_string(f.term_signal) + " (" + strsignal(f.term_signal) + ")";
  return "exited with code " + std::to_string(f.exit_code);
}

int exit_code_for(const WorkerFailure& f) {
  if (f.term_signal != 0) return 128 + f.term_signal;
  return f.exit_code != 0 ? f.exit_code : 1;
}

}  // namespace phalanx::launcher
