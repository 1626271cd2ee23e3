#include "phalanx/backends/work.hpp"

#include <thread>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

Work::~Work() {
  if (done_event_) device_kernels_->event_destroy(done_event_);
}

void Work::set_on_device(DeviceKernels* kernels, void* done_event, bool skip_wait) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_kernels_ = kernels;
    done_event_ = done_event;
    skip_device_wait_ = skip_wait;
    enqueued_.store(true, std::memory_order_release);
  }
  cv_.notify_all();  // a wait() sleeping until the operation is on the device
}

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

void Work::wait_on_device() const {
  if (!skip_device_wait_) device_kernels_->stream_wait_event(done_event_);
}

void Work::wait_slow(std::chrono::milliseconds timeout) { wait_for(timeout, false); }

void Work::wait_host(std::chrono::milliseconds timeout) {
  // Queued on the device: wait for its done event first (a device that runs its work when
  // it is waited for: the lazy sim's side stream); the completion thread's watch then ends.
  std::exception_ptr device_error;
  if (!done_.load(std::memory_order_acquire) && !enqueued_.load(std::memory_order_acquire) && !polled()) {
    // Not on the device yet (the worker has not run it): wait until it is, so that it is
    // waited for there below; a watcher never makes a lazy device run it (the sim's).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout.count() < 0 ? timeout_ : timeout, [&] {
      return done_.load(std::memory_order_relaxed) || enqueued_.load(std::memory_order_relaxed) || poll_;
    });
  }
  if (enqueued_.load(std::memory_order_acquire) && !done_.load(std::memory_order_acquire)) {
    try {
      device_kernels_->event_synchronize(done_event_);
    } catch (...) {
      device_error = std::current_exception();
    }
  }
  wait_for(timeout, true);  // the Work's own error first: it names the operation
  if (device_error) std::rethrow_exception(device_error);
}

void Work::wait_for(std::chrono::milliseconds timeout, bool host) {
  if (done_.load(std::memory_order_acquire)) {  // failed: no lock, no clock
    if (error_) std::rethrow_exception(error_);
    return;
  }
  // A device-side wait once the operation is on the device: no host block for the device.
  const auto on_device = [&] { return !host && enqueued_.load(std::memory_order_acquire); };
  if (on_device()) {
    wait_on_device();
    return;
  }
  if (timeout.count() < 0) timeout = timeout_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  // The backend's own timeout fires first; this bound only guards against a stuck backend.
  while (!done_.load(std::memory_order_relaxed) && !on_device()) {
    if (!poll_) {  // finished by another thread, queued on the device, or given a poll meanwhile
      if (!cv_.wait_until(lock, deadline, [&] { return done_.load(std::memory_order_relaxed) || on_device() || poll_; }))
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
  if (!done_.load(std::memory_order_relaxed)) {  // queued on the device, still running
    lock.unlock();
    wait_on_device();
    return;
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
