#pragma once
// The sim device's compute stream (docs/devices.md, "The asynchronous mode"). In the default
// synchronous mode a kernel runs when it is called. PHALANX_SIM_ASYNC=1 (eager) queues kernels,
// device copies and frees and runs them in issue order on a worker thread, as a GPU does;
// PHALANX_SIM_ASYNC=lazy runs the queue only when the host waits for it (a copy to the host,
// an event synchronisation) or when it exceeds kLazyBound items, so that a read that skips a
// wait sees stale or poisoned data every time, not only when a race goes badly.
// A thread marked as the communication stream (set_comm_stream) runs its kernels and copies
// at once, unordered with the compute stream, as a communication stream is: it must wait
// for an event recorded where the data it reads was produced.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "sim_work_queue.hpp"

namespace phalanx::sim {

enum class Mode : int { Sync = 0, Eager = 1, Lazy = 2 };

/// Parses PHALANX_SIM_ASYNC: unset, "" or "0": Sync; "1" or "eager": Eager; "lazy": Lazy;
/// anything else throws ConfigError.
Mode mode_from_env();

/// A sim event: a stream's item count when it was recorded (0: nothing to wait for), on the
/// compute stream or the side stream (sim_side_stream.hpp).
struct SimEvent {
  std::uint64_t ticket = 0;
  bool side = false;
};

/// Whether the calling thread works on the communication stream.
bool on_comm_stream();
void set_comm_stream(bool on);

class Stream : public WorkQueue {
 public:
  static Stream& instance();

  Mode mode() const { return static_cast<Mode>(mode_.load(std::memory_order_acquire)); }
  /// Drains the queue, then switches.
  void set_mode(Mode m);

  /// Runs `fn` now (synchronous mode, or a communication-stream thread) or queues it.
  void submit(std::function<void()> fn);
  /// Queues `fn` on the compute stream whatever the calling thread, the stream's own
  /// included (frees: stream-ordered).
  void submit_ordered(std::function<void()> fn);
  /// Waits until the queue is empty (what was queued before this call, and the frees its
  /// work queued as it ran); rethrows the first error a
  /// queued kernel raised since the last report (as CUDA reports an asynchronous error).
  void synchronize();

  /// The ticket an event recorded now gets: complete once that many items have run.
  std::uint64_t ticket();
  /// Waits until the ticket's items ran; rethrows a queued kernel's error without clearing it.
  void wait_ticket(std::uint64_t t);
  /// Items queued and not yet run (tests).
  std::size_t pending();
  /// A block of `nbytes` is being allocated: in lazy mode, once kLazyBytes were allocated
  /// since the queue last ran, the caller waits until what is queued ran (queued work holds
  /// its tensors, so an unflushed queue of kLazyBound items held that many tensors' memory).
  void note_allocation(std::size_t nbytes);

  static constexpr std::size_t kLazyBound = 4096;
  static constexpr std::size_t kLazyBytes = std::size_t(256) << 20;

 private:
  Stream();
  bool ready(const State& s) const override;
  void on_worker_start() override;
  static void before_fork();
  static void after_fork_parent();
  static void after_fork_child();

  std::atomic<int> mode_;
};

}  // namespace phalanx::sim
