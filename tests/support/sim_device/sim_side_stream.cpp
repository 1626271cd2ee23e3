#include "sim_side_stream.hpp"

#include <pthread.h>

#include <thread>

#include "sim_stream.hpp"

namespace phalanx::sim {

namespace {
thread_local bool t_side = false;  // the side stream's own thread
bool lazy() { return Stream::instance().mode() == Mode::Lazy; }
}  // namespace

SideStream& SideStream::instance() {
  static SideStream* s = new SideStream;  // never destroyed, as the compute stream
  return *s;
}

SideStream::SideStream() : state_(new State) {
  // A forked child has no side thread: it starts on fresh state (the old one is left behind).
  pthread_atfork(nullptr, nullptr, [] { instance().state_.store(new State); });
}

void SideStream::submit(std::function<void()> fn) {
  if (Stream::instance().mode() == Mode::Sync || t_side) {
    fn();
    return;
  }
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->started) {
    s->started = true;
    std::thread([this, s] { loop(s); }).detach();
  }
  s->queue.push_back(std::move(fn));
  ++s->enqueued;
  if (!lazy()) s->work_cv.notify_one();
}

void SideStream::loop(State* s) {
  t_side = true;
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->work_cv.wait(lock, [&] { return !s->queue.empty() && (!lazy() || s->flush_to > s->completed); });
    std::function<void()> fn = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    // Its copies move the bytes at once, unordered with the compute stream (set again for
    // each item: a process group's CommStream scope inside one switches it off at its end).
    set_comm_stream(true);
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> l(s->mu);
      if (!s->error) s->error = std::current_exception();
    }
    fn = nullptr;  // its captured tensors die outside the lock
    lock.lock();
    ++s->completed;
    s->done_cv.notify_all();
  }
}

std::uint64_t SideStream::ticket() {
  if (Stream::instance().mode() == Mode::Sync) return 0;
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  return s->enqueued;
}

void SideStream::wait_ticket(std::uint64_t t) {
  if (t == 0 || t_side) return;
  State* s = state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  if (s->flush_to < t) s->flush_to = t;
  s->work_cv.notify_one();
  s->done_cv.wait(lock, [&] { return s->completed >= t; });
  if (s->error) std::rethrow_exception(s->error);
}

bool SideStream::ticket_done(std::uint64_t t) {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  return s->completed >= t;
}

void SideStream::flush() {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  s->flush_to = s->enqueued;
  s->work_cv.notify_one();
}

}  // namespace phalanx::sim
