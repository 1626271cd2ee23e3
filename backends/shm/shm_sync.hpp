#pragma once
// Waiting in the shm backend: spin briefly, then sched_yield, then sleep on a futex in the
// segment (FUTEX_WAIT on shared memory works across processes). While it waits, every
// millisecond it checks that the ranks it waits for are alive (a pidfd per peer, opened
// once all ranks attached), have not left or failed, that the group was not aborted, and
// the operation's deadline.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shm_segment.hpp"

namespace phalanx::shm {

using Clock = std::chrono::steady_clock;

struct WaitPolicy {
  std::chrono::nanoseconds spin{0};   ///< busy-wait this long first (PHALANX_SHM_SPIN_US)
  std::chrono::nanoseconds yield{0};  ///< then sched_yield this long (PHALANX_SHM_YIELD_US), then sleep
};

/// The policy from the environment: by default spin 50 us when this host has at least one
/// CPU per rank (none when it has fewer: the rank waited for may need this CPU), then
/// sched_yield for 200 us (measured on 4 ranks on 2 cores: sleeping sooner costs a wake-up
/// per step, 3-7x slower), then sleep on the futex in 1 ms slices.
WaitPolicy wait_policy_from_env(int ranks_on_host);

/// Binds the calling thread (and the threads it starts later) to this rank's share of the
/// CPUs it may run on: W equal blocks of the affinity mask, rank r the r-th (as OpenMPI
/// binds its ranks). Without it, ranks that wait by yielding or sleeping can end up on one
/// core while another idles (the scheduler pulls a woken task to its waker), and every
/// operation then costs two context switches. Not done when there are more ranks than
/// CPUs, nor with PHALANX_SHM_BIND=0. Returns what it did, for the logs.
std::string bind_to_share(int rank, int world);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Sync {
 public:
  /// Opens a pidfd for every peer (the segment's lines hold their pids).
  Sync(Segment& seg, int rank, WaitPolicy policy, std::chrono::milliseconds timeout);
  ~Sync();
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;

  /// Publishes this rank's step `s` (and its op signature), waking sleepers if any.
  void post(std::uint64_t s, std::uint64_t sig) {
    RankLine& me = seg_.line(rank_);
    me.sig[s & 1].store(sig, std::memory_order_relaxed);
    me.step.store(s, std::memory_order_seq_cst);
    wake_if_sleepers();
  }
  /// After a store another rank may sleep on (a channel's head or tail).
  void wake_if_sleepers() {
    if (seg_.header().sleepers.load(std::memory_order_seq_cst) > 0) wake();
  }
  void wake();

  /// Waits until ready() holds (deadline: unset = the group's timeout from the first wait). need(q): whether this wait still needs rank q (a dead,
  /// departed or failed rank that is not needed is no error). ctx(): the operation's
  /// description, for errors. Throws CommError (dead/left/failed peer, abort) or
  /// TimeoutError (deadline), after marking this rank failed.
  template <class Ready, class Need>
  void wait(Ready&& ready, Need&& need, Clock::time_point& deadline, const std::function<std::string()>& ctx) {
    if (ready()) return;
    // Spin first (the clock is read every 16 pauses). A fixed budget: one that shrank after
    // waits the spin missed (tried) gave the core away to other processes at every step
    // on a loaded machine, and the rank then waited for its own turn to run.
    if (policy_.spin.count() > 0) {
      Clock::time_point spin_start{};
      for (unsigned i = 1;; ++i) {
        cpu_relax();
        if (ready()) return;
        if ((i & 15) == 0) {
          if (aborted_.load(std::memory_order_relaxed)) break;
          const auto now = Clock::now();
          if (spin_start == Clock::time_point{}) spin_start = now;
          else if (now - spin_start > policy_.spin) break;
        }
      }
    }
    const auto start = Clock::now();
    // An operation's deadline starts when it first has to wait (unset: the group's timeout from now).
    if (deadline == Clock::time_point{}) deadline = start + timeout_;
    const auto yield_until = start + policy_.yield;
    auto next_check = Clock::time_point{};
    for (;;) {
      const auto now = Clock::now();
      if (now >= next_check) {
        check(ready, need, deadline, ctx);
        if (ready()) return;
        next_check = now + std::chrono::milliseconds(1);
      }
      if (now < yield_until) {
        ::sched_yield();
        if (ready()) return;
        continue;
      }
      Header& h = seg_.header();
      const std::uint32_t e = h.epoch.load(std::memory_order_acquire);
      h.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (ready()) {
        h.sleepers.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
      sleep_on(e);
      h.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (ready()) return;
    }
  }

  /// abort(): waits return at once with `message`.
  void abort() noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_relaxed); }
  /// 0: rank q is fine; 1: died; 2: left the group (finished cleanly); 3: failed. Any thread.
  int peer_problem(int q) const;
  /// Tells the peers this rank failed (they stop waiting for it).
  void mark_failed() noexcept;
  /// Tells the peers this rank destroyed its group after `collectives` collectives (a
  /// peer still waiting for it gets a PeerFinishedError naming the count).
  void mark_left(std::uint64_t collectives) noexcept;

 private:
  template <class Ready, class Need>
  void check(Ready& ready, Need& need, Clock::time_point deadline, const std::function<std::string()>& ctx) {
    if (aborted()) fail_aborted(ctx);
    for (int q = 0; q < seg_.world(); ++q)
      if (q != rank_ && need(q)) {
        const int why = peer_problem(q);
        if (why != 0 && !ready()) fail_peer(q, why, ctx);
      }
    if (Clock::now() > deadline) {
      int stuck = -1;
      for (int q = 0; q < seg_.world() && stuck < 0; ++q)
        if (q != rank_ && need(q)) stuck = q;
      if (!ready()) fail_timeout(stuck, ctx);
    }
  }
  [[noreturn]] void fail_peer(int q, int why, const std::function<std::string()>& ctx);
  [[noreturn]] void fail_timeout(int q, const std::function<std::string()>& ctx);
  [[noreturn]] void fail_aborted(const std::function<std::string()>& ctx);
  void sleep_on(std::uint32_t epoch);

  Segment& seg_;
  int rank_;
  WaitPolicy policy_;
  std::vector<int> pidfds_;  ///< -1: none (self, or pidfd_open unavailable: kill(pid, 0) then)
  std::atomic<bool> aborted_{false};
  std::chrono::milliseconds timeout_{0};
};

}  // namespace phalanx::shm
