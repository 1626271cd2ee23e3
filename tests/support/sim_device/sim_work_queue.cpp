#include "sim_work_queue.hpp"

#include <thread>

namespace phalanx::sim {

void WorkQueue::push(std::function<void()> fn) {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->started) {
    s->started = true;
    std::thread([this, s] { loop(s); }).detach();
  }
  s->queue.push_back(std::move(fn));
  ++s->enqueued;
  if (ready(*s)) s->work_cv.notify_one();
}

void WorkQueue::loop(State* s) {
  on_worker_start();
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->work_cv.wait(lock, [&] { return !s->queue.empty() && ready(*s); });
    std::function<void()> fn = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    before_item();
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> l(s->mu);
      if (!s->error) s->error = std::current_exception();
    }
    fn = nullptr;  // the captured tensors die here, outside the lock (their frees queue)
    lock.lock();
    ++s->completed;
    s->done_cv.notify_all();
  }
}

std::uint64_t WorkQueue::enqueued() {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  return s->enqueued;
}

void WorkQueue::flush_locked(State* s, std::uint64_t t) {
  if (s->flush_to < t) s->flush_to = t;
  s->work_cv.notify_one();
}

void WorkQueue::wait_locked(State* s, std::unique_lock<std::mutex>& lock, std::uint64_t t) {
  flush_locked(s, t);
  s->done_cv.wait(lock, [&] { return s->completed >= t; });
}

bool WorkQueue::ticket_done(std::uint64_t t) {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  return s->completed >= t;
}

}  // namespace phalanx::sim
