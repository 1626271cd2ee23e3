#include "phalanx/backends/work.hpp"

#include <thread>

#include "phalanx/backends/comm_error.hpp"

namespace phalanx {

void Work::throw_timeout(std::chrono::milliseconds timeout) const {
  throw TimeoutError(detail::concat(op_, " #", seq_, " on rank ", rank_, " did not complete within ",
                                    timeout.count() / 1000.0, " s; a peer may have stopped "
                                    "calling collectives, or be much slower (raise PHALANX_TIMEOUT)"));
}

bool Work::poll_locked() {
  std::exception_ptr failure;
  if (!poll_(failure)) return false;  // may throw (a thread that may not poll): still pending
  error_ = failure;
  poll_ = nullptr;
  done_.store(true, std::memory_order_release);
  cv_.notify_all();
  return true;
}

void Work::wait_slow(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {  // failed: no lock, no clock
    if (error_) std::rethrow_exception(error_);
    return;
  }
  if (timeout.count() < 0) timeout = timeout_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  // The backend's own timeout fires first; this bound only guards against a stuck backend.
  while (!done_.load(std::memory_order_relaxed)) {
    if (!poll_) {  // finished by another thread (or given a poll while we sleep)
      if (!cv_.wait_until(lock, deadline, [&] { return done_.load(std::memory_order_relaxed) || poll_; }))
        throw_timeout(timeout);
      continue;
    }
    if (poll_locked()) break;
    const auto now = Clock::now();
    if (now >= deadline) throw_timeout(timeout);
    // Not a spin: the peer may need this core (4 ranks on 2 cores).
    lock.unlock();
    if (now - start < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  if (error_) std::rethrow_exception(error_);
}

bool Work::poll_completed() const {
  if (!polled_.load(std::memory_order_acquire)) return false;
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_.load(std::memory_order_relaxed) && poll_) return const_cast<Work*>(this)->poll_locked();
  return done_.load(std::memory_order_relaxed);
}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;  // the first outcome stands (an abort may race the backend)
    error_ = error;
    poll_ = nullptr;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

void Work::attach_poll(Poll poll) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Polled even when an abort ended it meanwhile: the backend already listed it (MPI's
    // posted_ names it before this call), so its spare must not be reused while listed.
    polled_.store(true, std::memory_order_release);
    if (done_) return;  // aborted meanwhile
    poll_ = std::move(poll);
  }
  cv_.notify_all();  // a waiter sleeping on the condition variable starts polling
}

bool Work::detach_poll(std::exception_ptr error) {
  Poll dropped;  // destroyed after the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped = std::move(poll_);
    poll_ = nullptr;
    if (done_) return false;
    error_ = error;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

}  // namespace phalanx
