#pragma once
// Work: the handle of an asynchronous operation.
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
  std::string op_;
  std::uint64_t seq_;
  int rank_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace phalanx
