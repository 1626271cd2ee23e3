#pragma once
// Work: the handle of an asynchronous operation.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace phalanx {

class Work {
 public:
  Work(std::string op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout)
      : op_(std::move(op)), seq_(seq), rank_(rank), timeout_(timeout) {}
  virtual ~Work() = default;

  /// Blocks until the operation finished; rethrows its error. Waits at most `timeout`
  /// (default: the group's timeout), then throws TimeoutError naming the op.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  bool is_completed() const;
  /// The error the operation ended with (null while running or on success).
  std::exception_ptr exception() const;

  const std::string& op() const { return op_; }
  std::uint64_t sequence_number() const { return seq_; }

  /// Called by the backend once the operation ended (error null on success), or by an
  /// abort from another thread. Idempotent: only the first call counts (returns true).
  bool finish(std::exception_ptr error = nullptr);

 private:
  friend class ProcessGroup;
  /// finish() with success for a Work no other thread can see yet (an inline operation
  /// before its Work is returned): no lock, no notify.
  void finish_unshared() noexcept { done_.store(true, std::memory_order_release); }

  std::string op_;
  std::uint64_t seq_;
  int rank_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // done_ is set once, under mu_ (release) after error_: wait() on a finished Work reads it
  // without the lock. ProcessGroup::submit rewrites every field of an inline Work that
  // nobody holds any more, to reuse it.
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace phalanx
