#include "launch_job.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "elastic_job.hpp"
#include "failure_report.hpp"
#include "job_store.hpp"
#include "phalanx/parallel/internal/rdzv_token.hpp"
#include "stop_report.hpp"
#include "worker_group.hpp"

namespace phalanx::launcher {

namespace {

/// A single node given no token gets a random one; a job across nodes whose token comes
/// from the id alone is told what that means.
void prepare_token(LaunchOptions& o) {
  if (o.rdzv_token.empty() && o.nnodes == 1) {
    std::string error;
    if (!parallel::random_token(o.rdzv_token, error))
      throw LaunchError(1, "cannot make a job token: " + error + "; pass one with --rdzv-token");
  }
  if (o.nnodes > 1 && !o.rdzv_id.empty() && !o.rdzv_id_has_secret)
    std::fprintf(stderr,
                 "phalanx-run: note: the job token comes from --rdzv-id alone (%s is not set): anyone who knows "
                 "the id and can reach %s:%d can join or stop the job.\n",
                 parallel::kRdzvSecretEnv, o.master_addr.c_str(), o.master_port);
}

/// The round this node starts with: 0, or with several nodes the one node 0 runs now (a
/// launcher started late, or restarted, joins it).
int first_round(const LaunchOptions& o, JobRounds* rounds) {
  if (!rounds) return 0;
  std::string fatal;
  int first = 0;
  try {
    first = rounds->join(o.nproc_per_node, fatal);
  } catch (const std::exception& e) {
    throw LaunchError(1, "node " + std::to_string(o.node_rank) + ": " + e.what());
  }
  if (!fatal.empty()) {
    rounds->post_fatal(first, fatal);
    throw LaunchError(2, fatal);
  }
  if (first > 0)
    std::fprintf(stderr, "phalanx-run: node %d joins the job in round %d (restart %d).\n", o.node_rank, first, first);
  return first;
}

/// Runs round k of this node's workers; with several nodes the round is watched (another
/// node's failure stops it) and closed at this node's first failure.
Outcome run_round(const LaunchOptions& o, const JobStore& js, int k, bool progress) {
  Attempt a;
  a.master_port = js.port;
  a.token = o.rdzv_token;
  a.restart_count = k;
  a.store = js.store.get();
  a.progress_passthrough = progress;
  JobRounds* rounds = js.rounds.get();
  if (rounds) {
    rounds->begin(k);
    a.stop_fd = rounds->wake_fd();
    a.stop_reason = [rounds] { return rounds->why(); };
    a.store_lost = [rounds] { return rounds->store_lost(); };
    a.on_first_failure = [rounds, k](const WorkerFailure& f) {
      rounds->close(k, "rank " + std::to_string(f.rank) + " " + describe_exit(f));
    };
  }
  const Outcome r = run_workers(o, a);
  if (!r.launch_error.empty()) {
    std::fprintf(stderr, "phalanx-run: %s; stopped the %d worker(s) already started.\n", r.launch_error.c_str(),
                 r.stopped_others);
    if (rounds) rounds->close(k, r.launch_error);
  }
  return r;
}

/// A stop asked for: a signal to this launcher, workers that saved on a signal of their own
/// (srun's, kill's), or rank 0's stop record (also when its save failed). The job ends here,
/// with no restart; the other nodes read this node's report. Returns the exit code then.
std::optional<int> end_if_stopped(const LaunchOptions& o, const JobStore& js, int k, const Outcome& r) {
  const auto stop_rec = read_stop_record(js.store.get(), k);
  if (!(r.interrupted || (r.stopped_after_save > 0 && !r.blamed) || (stop_rec && !r.ok))) return std::nullopt;
  const int sig = r.signal_received ? r.signal_received : stop_rec && stop_rec->signal ? stop_rec->signal : SIGTERM;
  if (js.rounds) {
    js.rounds->close(k, r.interrupted ? std::string("its launcher got ") + strsignal(sig)
                                      : std::string("its workers were asked to stop (") + strsignal(sig) + ")");
    NodeReport mine;
    mine.node = o.node_rank;
    mine.interrupted = sig;
    try {
      js.store->set("phalanx/launch/r" + std::to_string(k) + "/report/" + std::to_string(o.node_rank), to_json(mine));
    } catch (const std::exception&) {
    }
    js.rounds->leave(k);
  }
  return report_stop(r, stop_rec, o);
}

/// How a round that was not asked to stop ended: the exit code when the job ends now
/// whatever the restart budget, else the worker blamed (if any) for the restart decision.
struct RoundEnd {
  std::optional<int> exit_code;
  std::optional<WorkerFailure> blamed;
};

/// A single node: its own outcome is the job's.
RoundEnd settle_alone(const LaunchOptions& o, const Outcome& r) {
  if (r.ok) return {0, std::nullopt};
  if (r.blamed) print_failure("", *r.blamed, r.tail, r.stopped_others, o.nproc_per_node, 1);
  return {std::nullopt, r.blamed};
}

/// Several nodes: every launcher reports how round k ended on its node and reads the others'
/// reports, so all of them blame the same rank and restart (or give up) together. Node 0's
/// --max-restarts becomes the job's.
RoundEnd settle_with_nodes(LaunchOptions& o, const JobStore& js, int k, const Outcome& r) {
  JobRounds& rounds = *js.rounds;
  if (!r.stopped_because.empty())
    std::fprintf(stderr, "phalanx-run: node %d: stopped %d worker(s): %s\n", o.node_rank, r.stopped_others,
                 r.stopped_because.c_str());
  NodeReport mine;
  mine.node = o.node_rank;
  mine.ok = r.ok;
  mine.max_restarts = o.max_restarts;
  mine.failure = r.blamed;
  mine.tail = r.tail;
  std::vector<NodeReport> reports;
  try {
    reports = rounds.exchange(k, mine, [] { return take_signal(); });
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "phalanx-run: got %s while waiting for the other nodes; the job ends.\n", strsignal(e.sig));
    return {128 + e.sig, std::nullopt};
  } catch (const std::exception& e) {
    if (r.stopped_because != e.what()) std::fprintf(stderr, "phalanx-run: node %d: %s\n", o.node_rank, e.what());
    // A worker of this node that failed on its own is worth naming; one this launcher
    // stopped is not the cause.
    const bool own = r.blamed && blame_tier(*r.blamed) < 2;
    if (own) print_failure("on this node, ", *r.blamed, r.tail, -1, o.nproc_per_node, o.nnodes);
    return {own ? exit_code_for(*r.blamed) : 1, std::nullopt};
  }
  for (const auto& rep : reports)
    if (!rep.fatal.empty()) {
      std::fprintf(stderr, "phalanx-run: node %d: %s; the job ends.\n", rep.node, rep.fatal.c_str());
      rounds.finish(k, take_signal);
      return {2, std::nullopt};
    }
  for (const auto& rep : reports)
    if (rep.interrupted) {
      std::fprintf(stderr, "phalanx-run: node %d's launcher got %s; the job ends.\n", rep.node,
                   strsignal(rep.interrupted));
      rounds.finish(k, take_signal);
      return {r.stopped_after_save == o.nproc_per_node ? report_stop(r, read_stop_record(js.store.get(), k), o) : 1,
              std::nullopt};
    }
  const auto verdict = job_blame(reports);
  if (!verdict) {
    bool all_ok = true;
    for (const auto& rep : reports) all_ok = all_ok && rep.ok;
    if (all_ok) {
      rounds.finish(k, take_signal);
      return {0, std::nullopt};
    }
  }
  RoundEnd end{std::nullopt, r.blamed};
  if (verdict) {
    end.blamed = verdict->failure;
    print_failure("the job failed in round " + std::to_string(k) + ": ", *end.blamed, verdict->tail, -1,
                  o.nproc_per_node, o.nnodes);
  } else {
    std::fprintf(stderr, "phalanx-run: round %d was stopped before any worker failed.\n", k);
  }
  o.max_restarts = reports[0].max_restarts;  // node 0's budget is the job's
  return end;
}

}  // namespace

/// A failure that recurs after a restart: the same message at the same training step (both
/// from the failure records; a worker that noted no step never counts). Restarting again
/// would only fail there again (a NaN at that step, a bad sample).
bool recurs(const std::optional<WorkerFailure>& before, const std::optional<WorkerFailure>& now) {
  return before && now && before->has_record && now->has_record && now->step >= 0 && now->step == before->step &&
         now->message == before->message;
}

int launch_job(LaunchOptions& o) {
  prepare_token(o);
  install_signal_handlers();
  const JobStore js = open_job_store(o);
  if (o.elastic()) return launch_elastic(o, js);
  const bool progress = ::isatty(1) == 1;
  const int world = o.nnodes * o.nproc_per_node;
  std::optional<WorkerFailure> last_failure;
  for (int k = first_round(o, js.rounds.get());; ++k) {
    const Outcome r = run_round(o, js, k, progress);
    if (const auto code = end_if_stopped(o, js, k, r)) return *code;
    const RoundEnd end = js.rounds ? settle_with_nodes(o, js, k, r) : settle_alone(o, r);
    if (end.exit_code) return *end.exit_code;
    if (k < o.max_restarts && recurs(last_failure, end.blamed)) {
      std::fprintf(stderr,
                   "phalanx-run: the same failure recurred at step %lld after a restart (%s); not restarting "
                   "again (%d restart(s) left): it will recur there until its cause is fixed.\n",
                   static_cast<long long>(end.blamed->step), end.blamed->message.c_str(), o.max_restarts - k);
      if (js.rounds) js.rounds->finish(k, take_signal);
      return exit_code_for(*end.blamed);
    }
    last_failure = end.blamed;
    if (k >= o.max_restarts) {
      if (o.max_restarts > 0) std::fprintf(stderr, "phalanx-run: giving up after %d restart(s).\n", o.max_restarts);
      if (js.rounds) js.rounds->finish(k, take_signal);
      return end.blamed ? exit_code_for(*end.blamed) : 1;
    }
    std::fprintf(stderr, "phalanx-run: restarting the group (restart %d of %d, world size %d).\n", k + 1,
                 o.max_restarts, world);
  }
}

}  // namespace phalanx::launcher
