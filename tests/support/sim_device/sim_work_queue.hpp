#pragma once
// The queue and worker thread the sim device's two streams share (sim_stream.hpp,
// sim_side_stream.hpp): items run in issue order on a thread of the queue's own, started on
// the first push; a stream says when the front item may run (ready) and what its worker
// thread sets up (on_worker_start, before_item).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>

namespace phalanx::sim {

class WorkQueue {
 public:
  /// Whether the ticket's items ran (never makes them run).
  bool ticket_done(std::uint64_t t);

 protected:
  struct State {
    std::mutex mu;
    std::condition_variable work_cv, done_cv;
    std::deque<std::function<void()>> queue;
    std::uint64_t enqueued = 0, completed = 0, flush_to = 0;
    std::size_t allocated = 0;  // Stream: bytes allocated since the lazy queue last ran
    std::exception_ptr error;
    bool started = false;
  };

  WorkQueue() : state_(new State) {}
  ~WorkQueue() = default;  // the streams are never destroyed

  /// Queues `fn` (starting the worker on first use) and wakes the worker when it is ready.
  void push(std::function<void()> fn);
  /// The item count now: the ticket an event recorded now gets.
  std::uint64_t enqueued();
  /// Lets the items up to ticket `t` run (s->mu held).
  static void flush_locked(State* s, std::uint64_t t);
  /// Lets the items up to ticket `t` run and waits until they ran (s->mu held by `lock`).
  static void wait_locked(State* s, std::unique_lock<std::mutex>& lock, std::uint64_t t);

  /// Whether the front item may run (s.mu held; the queue is not empty).
  virtual bool ready(const State& s) const = 0;
  /// Run once on the worker thread before its first item.
  virtual void on_worker_start() = 0;
  /// Run on the worker thread before each item, outside the lock.
  virtual void before_item() {}

  std::atomic<State*> state_;

 private:
  void loop(State* s);
};

}  // namespace phalanx::sim
