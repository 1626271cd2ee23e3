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

class DeviceKernels;

class Work {
 public:
  Work(std::string op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout)
      : op_(std::move(op)), seq_(seq), rank_(rank), timeout_(timeout) {}
  Work(const char* op, std::uint64_t seq, int rank, std::chrono::milliseconds timeout)
      : op_(op), seq_(seq), rank_(rank), timeout_(timeout) {}
  virtual ~Work();

  /// Waits for the operation; rethrows its error. Waits at most `timeout` (default: the
  /// group's timeout), then throws TimeoutError naming the op.
  /// A Work that completes on a device (a backend that orders device streams: NCCL; see
  /// on_device()) does not block the host for the device: once the backend has queued the
  /// operation on its stream, wait() makes the calling thread's compute stream wait for the
  /// operation's done event (DeviceKernels::stream_wait_event) and returns, so the kernels
  /// issued afterwards read its results, as c10d's WorkNCCL::wait does. A failure found
  /// later (the watchdog's timeout, a dead peer) surfaces at synchronize(), at the next
  /// wait() of a failed Work or as the broken group's next operation. synchronize() blocks
  /// the host until the device finished. Other Works complete on the host: wait() blocks. A Work its
  /// waiter progresses (a send or recv of MPI at MPI_THREAD_SINGLE: attach_poll)
  /// is driven from here: one non-blocking step, then a yield (a sleep after the first
  /// millisecond), until it ends; such a Work may be waited on only from the thread its
  /// backend allows (ConfigError otherwise, the Work stays pending).
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    // Inline: every operation that ran on the caller's thread ends here, with no call.
    if (done_.load(std::memory_order_acquire) && !error_) return;
    wait_slow(timeout);
  }
  /// Blocks the calling thread until the operation finished, on the device too (a
  /// host-side wait: the pass flag of a step, a barrier); rethrows its error. The same as
  /// wait() for a Work that completes on the host.
  void synchronize(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    if (done_.load(std::memory_order_acquire) && !error_) return;
    wait_host(timeout);
  }
  /// Whether wait() is a device-side wait: the operation was queued on a device stream and
  /// its done event recorded there (it may still be running).
  bool on_device() const { return enqueued_.load(std::memory_order_acquire); }
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
  /// backend that reuses its Works (no allocation per operation); such Works complete on
  /// the host (never on_device()).
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
  /// synchronize(): wait_slow() until the operation ended, on the device too.
  void wait_host(std::chrono::milliseconds timeout);
  /// Waits until the Work ended, or (host false) until it is queued on a device, then makes
  /// the calling thread's stream wait for it there.
  void wait_for(std::chrono::milliseconds timeout, bool host);
  /// The operation is queued on `kernels`' device and `done_event` (owned from now on,
  /// destroyed with the Work) recorded after it: wait() becomes a device-side wait
  /// (`skip_wait`: returns without it; a test switch, PHALANX_TEST_SKIP_DEVICE_ORDER=wait).
  void set_on_device(DeviceKernels* kernels, void* done_event, bool skip_wait = false);
  /// The device-side wait itself.
  void wait_on_device() const;
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
  // A device Work: the done event and its table, written once before enqueued_ (release).
  DeviceKernels* device_kernels_ = nullptr;
  void* done_event_ = nullptr;
  bool skip_device_wait_ = false;
  std::atomic<bool> enqueued_{false};
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace phalanx
