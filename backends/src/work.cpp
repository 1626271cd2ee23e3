#include "phalanx/backends/work.hpp"

#include "phalanx/backends/comm_error.hpp"

namespace phalanx {

void Work::wait(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {  // every inline operation: no lock, no clock
    if (error_) std::rethrow_exception(error_);
    return;
  }
  if (timeout.count() < 0) timeout = timeout_;
  std::unique_lock<std::mutex> lock(mu_);
  // The backend's own timeout fires first; this bound only guards against a stuck backend.
  if (!done_ && !cv_.wait_for(lock, timeout, [&] { return done_.load(std::memory_order_relaxed); }))
    throw TimeoutError(detail::concat(op_, " #", seq_, " on rank ", rank_, " did not complete within ",
                                      timeout.count() / 1000.0, " s; a peer may have stopped "
                                      "calling collectives, or be much slower (raise PHALANX_TIMEOUT)"));
  if (error_) std::rethrow_exception(error_);
}

bool Work::is_completed() const {
  return done_.load(std::memory_order_acquire);
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
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

}  // namespace phalanx
