#pragma once
// Restarts that rendezvous across nodes: the launchers of a multi-node job agree on each
// round (attempt) through the job's store, like torchrun's rendezvous rounds. A failure on
// any node closes the round; every launcher stops its workers, reports how its node ended,
// and all of them read the same reports, so they blame the same rank and either start round
// k+1 together or all give up. Keys (root keys of the job's store):
//   phalanx/launch/alive/<node>       a counter each launcher bumps while it lives
//   phalanx/launch/r<k>/closed        set by the first launcher whose node failed in round k
//   phalanx/launch/r<k>/report/<node> how round k ended on that node (JSON)
//   phalanx/launch/r<k>/read/<node>   that node has read every report (node 0 then may exit)
//   phalanx/launch/round              the round node 0 runs now (a launcher started late joins it)
//   phalanx/launch/nproc/<node>       that node's --nproc-per-node (every node must match node 0)
//   phalanx/launch/next_node          node ranks given out without --node-rank (node_rank.hpp)
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <phalanx/backends/store.hpp>

#include "blame.hpp"
#include "wakeable_loop.hpp"

namespace phalanx::launcher {

/// How one round ended on one node.
struct NodeReport {
  int node = 0;
  bool ok = false;                  ///< its workers all exited 0
  int interrupted = 0;              ///< the signal its launcher got (0: none)
  int max_restarts = 0;             ///< its --max-restarts (node 0's decides)
  std::optional<WorkerFailure> failure;  ///< its first failure
  std::vector<std::string> tail;         ///< that worker's last lines
  std::string fatal;  ///< non-empty: the job cannot run (a setup error); every node ends
};

/// Each tail line (and the failure's message) is cut at this many bytes in a report.
constexpr std::size_t kReportLineBytes = 4096;

/// Never throws for odd output: invalid UTF-8 is replaced, long lines are cut.
std::string to_json(const NodeReport& r);
bool from_json(const std::string& text, NodeReport& r);

/// The launcher got a signal while waiting for the other nodes (its report says so).
struct Interrupted : std::runtime_error {
  explicit Interrupted(int sig);
  int sig;
};

/// The round's verdict from every node's report: the worker to blame (by job_blame_before)
/// and the node it ran on; nullopt when every node succeeded.
std::optional<NodeReport> job_blame(const std::vector<NodeReport>& reports);

class JobRounds {
 public:
  /// Starts the heartbeat (every launcher must construct one for the job's life).
  /// `stale_after`: how long a silent peer launcher is waited for before giving up.
  JobRounds(std::shared_ptr<Store> store, int nnodes, int node, std::chrono::milliseconds tick,
            std::chrono::milliseconds stale_after);
  ~JobRounds();
  JobRounds(const JobRounds&) = delete;
  JobRounds& operator=(const JobRounds&) = delete;

  /// Says this node's --nproc-per-node and returns the round to start with: 0 on node 0,
  /// the round node 0 runs now on the others. On a node whose --nproc-per-node differs from
  /// node 0's, returns that round with `fatal` set to a one-line message (post_fatal it).
  int join(int nproc_per_node, std::string& fatal);
  /// Ends round k for every node: closes it and posts a report carrying `fatal` (and leaves).
  void post_fatal(int k, const std::string& fatal);
  /// This node leaves the job after posting its report for round k without reading the
  /// others' (fatal, interrupted): node 0 does not wait for it in finish(). Never throws.
  void leave(int k);
  /// Watches round k: wake_fd() becomes readable when another node closes it or the store
  /// is lost (why() then says which).
  void begin(int k);
  int wake_fd() const { return wake_.fd(); }
  std::string why() const;
  /// True once the store is gone (node 0's launcher exited): nothing more can be said.
  bool store_lost() const;
  /// This node failed in round k: tell the others (first close wins; never throws).
  void close(int k, const std::string& what);
  /// Publishes this node's report for round k and returns every node's, in node order.
  /// Throws std::runtime_error with a one-line message when the store is lost or a peer's
  /// launcher stops answering for stale_after. A report too large for the store is sent
  /// without its tail and message. `interrupted` (polled between waits) returning a signal
  /// publishes an interrupted report instead and throws Interrupted.
  std::vector<NodeReport> exchange(int k, const NodeReport& mine, const std::function<int()>& interrupted = {});
  /// The job ends after round k: node 0 waits (bounded, and not past `interrupted`) until
  /// every node has read the reports before its store goes away; the others say they have.
  void finish(int k, const std::function<int()>& interrupted = {});

 private:
  bool heartbeat(std::unique_lock<std::mutex>& lock);  ///< one tick; false: the store is lost
  void wake();
  void throw_if_lost() const;
  /// Throws when a peer's heartbeat has not moved for stale_after.
  void check_peers_alive(std::vector<std::pair<std::int64_t, std::chrono::steady_clock::time_point>>& seen);
  std::shared_ptr<Store> store_;
  int nnodes_, node_;
  std::chrono::milliseconds tick_, stale_after_;
  WakePipe wake_;
  std::atomic<int> round_{-1};
  std::atomic<bool> woken_{false};
  mutable std::mutex mu_;
  std::string why_;
  std::string lost_;  ///< set once the store is gone: every later call fails at once with it
  WakeableLoop loop_{mu_, tick_};  ///< last: stopped before the state it reads goes
};

}  // namespace phalanx::launcher
