#pragma once
// Who is in an elastic job (--nnodes MIN:MAX), round by round, as torchrun's dynamic
// rendezvous keeps it. Every launcher has an id for its life (0: the one that hosts the
// store, then 1, 2, ... in arrival order, never reused) and a keep-alive counter; the host
// decides each round's members (ids in node-rank order) and publishes them. While a round
// runs, the host closes it when a member's keep-alive lapses or a node waits to join (room
// permitting). Keys (root keys of the job's store):
//   phalanx/elastic/next_id          the ids given out
//   phalanx/elastic/alive/<id>       a counter each launcher bumps every tick while it lives
//   phalanx/elastic/round            the newest round the host has formed
//   phalanx/elastic/r<k>/members     round k's ids, comma-separated, in node-rank order
//   phalanx/elastic/r<k>/closed      why round k ended (first closer wins)
//   phalanx/elastic/r<k>/report/<id> how round k ended on that launcher (NodeReport JSON)
//   phalanx/elastic/r<k>/next        the host's verdict: the job ends (and how) or goes on
//   phalanx/elastic/r<k>/ack/<id>    that launcher read the verdict
//   phalanx/elastic/r<k>/started/<id> that member read round k's members (elastic_job.cpp)
//   phalanx/elastic/end_ack/<id>     a launcher waiting to be admitted read the job's end
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <phalanx/backends/store.hpp>

#include "wakeable_loop.hpp"

namespace phalanx::launcher {

std::string elastic_key(const std::string& what);
std::string elastic_round_key(int k, const std::string& what);
std::string join_ids(const std::vector<int>& ids);
std::vector<int> split_ids(const std::string& text);

class Membership {
 public:
  /// `host`: this launcher hosts the store (id 0); the others take the next id. Starts the
  /// keep-alive thread. Throws what the store throws.
  Membership(std::shared_ptr<Store> store, bool host, std::chrono::milliseconds tick,
             std::chrono::milliseconds keep_alive, int max_nodes);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int id() const { return id_; }
  Store& store() { return *store_; }

  /// Watches round k with these members: wake_fd() becomes readable when the round is closed
  /// (by anyone) or the store is lost; on the host, the keep-alive thread closes it when a
  /// member is gone or a node waits to join while there is room.
  void begin(int k, const std::vector<int>& members);
  /// The round's workers are gone: the host stops closing it.
  void end_watch();
  int wake_fd() const { return wake_.fd(); }
  std::string why() const;
  bool store_lost() const;
  /// Closes round k (first close wins; never throws).
  void close(int k, const std::string& what);
  /// True when the host closed round k for a membership change (a join or a node gone),
  /// not for a failure of a worker.
  bool closed_for_membership(int k) const;

  /// Host: the launcher with this id has been heard from within the keep-alive.
  bool alive(int id) const;
  /// Host: live launchers not in `members` nor forgotten, by id (those waiting to be admitted).
  std::vector<int> waiting(const std::vector<int>& members) const;
  /// Host: a launcher that left the job (asked to stop) is never taken for one waiting.
  void forget(int id);

 private:
  bool tick(std::unique_lock<std::mutex>& lock);  ///< one keep-alive tick; false: the store is lost
  void watch_liveness();  ///< host: keep-alive counters of every id
  void wake(const std::string& why);
  std::shared_ptr<Store> store_;
  bool host_;
  int id_ = 0;
  std::chrono::milliseconds tick_, keep_alive_;
  int max_nodes_;
  WakePipe wake_;
  mutable std::mutex mu_;
  int round_ = -1;
  bool watching_ = false;
  bool woken_ = false;
  std::vector<int> members_;
  std::string why_, lost_;
  std::map<int, bool> membership_close_;  ///< rounds the host closed for a membership change
  struct Seen {
    std::int64_t value = -1;
    std::chrono::steady_clock::time_point at;
  };
  std::map<int, Seen> seen_;
  std::vector<int> forgotten_;  ///< host: each id's keep-alive counter and when it last moved
  WakeableLoop loop_{mu_, tick_};  ///< last: stopped before the state it reads goes
};

}  // namespace phalanx::launcher
