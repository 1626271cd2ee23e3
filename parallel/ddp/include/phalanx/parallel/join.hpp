#pragma once
// Join: uneven inputs (PyTorch 1.13's torch.distributed.algorithms.Join, docs/ddp.md "Join").
// A rank that runs out of batches leaves its training loop and "joins": until every rank
// has joined it shadows, once per iteration of the ranks still training, the collectives
// those ranks issue (DDP's gradient allreduce with zero gradients, SyncBatchNorm's
// reductions with zero counts, ZeRO's parameter broadcasts), so nobody waits for a rank
// that has stopped. Each iteration the ranks agree whether anyone still trains (an
// allreduce of a flag, as PyTorch does): a training rank contributes 1 from its first
// joinable's forward or step (notify_join_context), a joined rank 0.
//
//   parallel::Join join({&ddp, &zero});        // RAII: the destructor joins, or call finish()
//   for (auto& b : my_uneven_batches) { ... ddp.forward ... backward ... zero.step(); }
//   join.finish();                             // shadow the others until all are done
//
//   parallel::Join::run({&ddp}, [&] { ...training loop... });   // the same, as a callable
//
// An exception leaving the loop skips the shadowing (as PyTorch's __exit__): the other
// ranks then fail on their next collective instead of waiting for this one. DDP's
// gradients stay the sum over the ranks still training divided by the initial world size
// (PyTorch's default, divide_by_initial_world_size=True). When every rank has joined,
// DDP's post hook broadcasts the model from the last rank to join (the highest such
// rank), so every rank ends with the same weights.
#include <cstdint>
#include <exception>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

/// Set by Join on each of its joinables for the duration of the context.
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;  ///< this joinable's notify carries the "still training" flag
};

/// Something whose per-iteration collectives a joined rank can shadow (DDP, ZeRO).
class Joinable {
 public:
  virtual ~Joinable() = default;
  /// Runs on a joined rank once per iteration of the ranks still training: the collectives
  /// this joinable issues in one iteration, in the same order, with neutral contributions.
  virtual void join_main_hook() = 0;
  /// Runs on every rank once all have joined; is_last_joiner: this rank never shadowed.
  virtual void join_post_hook(bool is_last_joiner) { (void)is_last_joiner; }
  /// The device and group of this joinable's collectives (Join's flag travels there too).
  virtual Device join_device() const = 0;
  virtual ProcessGroup& join_process_group() = 0;
  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
};

/// A module whose forward issues collectives (SyncBatchNorm in training mode). Under Join,
/// DDP's joined ranks shadow them by running the model on an empty batch.
class ForwardCollectives {
 public:
  virtual ~ForwardCollectives() = default;
  /// Whether the next forward issues collectives (e.g. only in training mode).
  virtual bool has_forward_collectives() const = 0;
};

struct JoinOptions {
  bool enable = true;  ///< false: a no-op context (the joinables behave as without Join)
  /// The first rank to run out of inputs makes every rank throw (instead of shadowing).
  bool throw_on_early_termination = false;
};

class Join {
 public:
  /// Joinables in the order their collectives run within one iteration (DDP before an
  /// optimizer); all on one process group. Throws ValueError on an empty list or on
  /// joinables over different groups.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  /// Calls finish() unless it ran or an exception is leaving the scope (then it only
  /// disables the joinables). May throw what finish() throws.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// This rank has run out of inputs: shadows the others until every rank has joined,
  /// then runs the post hooks. Idempotent.
  void finish();
  /// Iterations this rank shadowed in finish() (0 for the last ranks to join).
  std::int64_t shadowed_iterations() const { return shadowed_; }

  /// Runs body() inside a Join over `joinables`, then finish().
  template <typename F>
  static void run(std::vector<Joinable*> joinables, F&& body, JoinOptions options = {}) {
    Join join(std::move(joinables), options);
    body();
    join.finish();
  }

  /// Called by a joinable once per iteration on a rank still training (DDP's forward,
  /// ZeRO's step): when it is the first joinable of an enabled Join, contributes 1 to the
  /// "still training" count (and, with throw_on_early_termination, checks whether a rank
  /// has run out). Returns the launched allreduce (null when nothing was launched); the
  /// caller waits for it before its iteration ends.
  static WorkPtr notify_join_context(Joinable& joinable);

 private:
  void release_joinables();
  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  ProcessGroup* pg_ = nullptr;
  Device device_;
  bool done_ = false;
  int uncaught_at_start_;
  std::int64_t shadowed_ = 0;
};

/// The highest rank whose `condition` holds, agreed on by every rank (an allreduce max on
/// `device`); throws ValueError when it holds on no rank.
int find_common_rank(ProcessGroup& pg, Device device, bool condition);

}  // namespace phalanx::parallel
