#pragma once
// Work: the handle of an asynchronous operation.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace phalanx {

class Work {
 public:
  Work(std::string op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout)
      : op_(std::move(op)), seq_(seq), rank_(rank), timeout_(timeout) {}
  Work(const char* op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout)
      : op_(op), seq_(seq), rank_(rank), timeout_(timeout) {}
  virtual ~Work() = default;

  /// Blocks until the operation finished; rethrows its error. Waits at most `timeout`
  /// (default: the group's timeout), then throws TimeoutError naming the op. A Work its
  /// waiter progresses (a send or recv of MPI at MPI_THREAD_SINGLE: attach_poll)
  /// is driven from here: one non-blocking step, then a yield (a sleep after the first
  /// millisecond), until it ends; such a Work may be waited on only from the thread its
  /// backend allows (ConfigError otherwise, the Work stays pending).
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    // Inline: every operation that ran on the caller's thread ends here, with no call.
    if (done_.load(std::memory_order_acquire) && !error_) return;
    wait_slow(timeout);
  }
  /// Whether the operation finished; a Work its waiter progresses takes one step here.
  bool is_completed() const { return done_.load(std::memory_order_acquire) || poll_completed(); }
  /// The error the operation ended with (null while running or on success).
  std::exception_ptr exception() const;

  const std::string& op() const { return op_; }
  std::uint64_t sequence_number() const { return seq_; }

  /// Called by the backend once the operation ended (error null on success), or by an
  /// abort from another thread. Idempotent: only the first call counts (returns true).
  bool finish(std::exception_ptr error = nullptr);

 protected:
  /// One non-blocking step of an operation progressed by its waiter: true once it ended,
  /// with `failure` set when it failed. Throws when the calling thread may not progress it
  /// (the Work then stays pending). Called under mu_.
  using Poll = std::function<bool(std::exception_ptr& failure)>;
  /// From now on the Work ends when `poll` says so, called by wait() / is_completed(), on
  /// the waiter's thread. For a backend that completes its own Works (Backend::inline_work)
  /// where no thread of its own may do it (MPI at MPI_THREAD_SINGLE); a Work with a poll is
  /// left pending by the group when the run_* hook returns.
  void attach_poll(Poll poll);
  /// The owner is going away: a pending polled Work fails with `error` and drops its poll
  /// (which refers to the owner). False when it had ended already.
  bool detach_poll(std::exception_ptr error);
  /// Whether a poll was ever attached (the Work's end was handed to its waiter), also when
  /// an abort had ended the Work first (the backend may still list it).
  bool polled() const { return polled_.load(std::memory_order_relaxed); }
  /// Makes a Work that ended, and that no other thread holds any more, the Work of a new
  /// operation: named `op` (null: keep the name), numbered `seq`; pending, no error. For a
  /// backend that reuses its Works (no allocation per operation).
  void restart(const char* op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout) {
    if (op) op_ = op;
    seq_ = seq;
    rank_ = rank;
    timeout_ = timeout;
    if (error_) error_ = nullptr;
    done_.store(false, std::memory_order_relaxed);
  }

 private:
  friend class ProcessGroup;  // finish_unshared, polled()
  /// finish() with success for a Work no other thread can see yet (an inline operation
  /// before its Work is returned): no lock, no notify.
  void finish_unshared() noexcept { done_.store(true, std::memory_order_release); }
  /// One poll step under mu_ (held by `lock`); true once done_.
  bool poll_locked();
  [[noreturn]] void throw_timeout(std::chrono::milliseconds timeout) const;
  void wait_slow(std::chrono::milliseconds timeout);
  bool poll_completed() const;  // is_completed() of a Work not done yet

  std::string op_;
  std::uint64_t seq_;
  int rank_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // done_ is set once, under mu_ (release) after error_: wait() on a finished Work reads it
  // without the lock. restart() rewrites every field of a Work that nobody else holds
  // any more, to reuse it.
  std::atomic<bool> done_{false};
  std::atomic<bool> polled_{false};  // poll_ was attached (read without the lock)
  std::exception_ptr error_;
  Poll poll_;  // under mu_; null once the Work ended
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace phalanx
