#pragma once
// A launcher's background loop (keep-alive, heartbeat) that sleeps a tick at a time and is
// stopped at once, and the pipe through which it wakes the thread that poll()s its workers.
// Membership and JobRounds each run one.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace phalanx::launcher {

/// A pipe whose read end becomes readable on notify() (for poll()); drain() makes it quiet.
class WakePipe {
 public:
  WakePipe() {
    if (::pipe2(fd_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("phalanx-run: pipe failed");
  }
  ~WakePipe() {
    ::close(fd_[0]);
    ::close(fd_[1]);
  }
  WakePipe(const WakePipe&) = delete;
  WakePipe& operator=(const WakePipe&) = delete;
  int fd() const { return fd_[0]; }
  void notify() {
    const char b = 1;
    if (::write(fd_[1], &b, 1) < 0) {  // full: it is readable already
    }
  }
  void drain() {
    char b[16];
    while (::read(fd_[0], b, sizeof b) > 0) {
    }
  }

 private:
  int fd_[2] = {-1, -1};
};

/// Runs `body` on a thread of its own, a tick apart, until stop() (or the destructor) or
/// until `body` returns false. `body` runs with the owner's mutex held and may unlock it
/// around slow work (the store), relocking it before it returns.
class WakeableLoop {
 public:
  WakeableLoop(std::mutex& mu, std::chrono::milliseconds tick) : mu_(mu), tick_(tick) {}
  ~WakeableLoop() { stop(); }
  WakeableLoop(const WakeableLoop&) = delete;
  WakeableLoop& operator=(const WakeableLoop&) = delete;

  void start(std::function<bool(std::unique_lock<std::mutex>&)> body) {
    thread_ = std::thread([this, body = std::move(body)] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!quit_) {
        if (!body(lock)) return;
        cv_.wait_for(lock, tick_, [this] { return quit_; });
      }
    });
  }
  /// Wakes the loop out of its sleep and joins it. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex& mu_;
  std::chrono::milliseconds tick_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace phalanx::launcher
