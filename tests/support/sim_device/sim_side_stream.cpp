#include "sim_side_stream.hpp"

#include <pthread.h>

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

SideStream::SideStream() {
  // A forked child has no side thread: it starts on fresh state (the old one is left behind).
  pthread_atfork(nullptr, nullptr, [] { instance().state_.store(new State); });
}

void SideStream::submit(std::function<void()> fn) {
  if (Stream::instance().mode() == Mode::Sync || t_side) {
    fn();
    return;
  }
  push(std::move(fn));
}

bool SideStream::ready(const State& s) const { return !lazy() || s.flush_to > s.completed; }

void SideStream::on_worker_start() { t_side = true; }

void SideStream::before_item() {
  // Its copies move the bytes at once, unordered with the compute stream (set again for
  // each item: a process group's CommStream scope inside one switches it off at its end).
  set_comm_stream(true);
}

std::uint64_t SideStream::ticket() {
  if (Stream::instance().mode() == Mode::Sync) return 0;
  return enqueued();
}

void SideStream::wait_ticket(std::uint64_t t) {
  if (t == 0 || t_side) return;
  State* s = state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  wait_locked(s, lock, t);
  if (s->error) std::rethrow_exception(s->error);
}

void SideStream::flush() {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  flush_locked(s, s->enqueued);
}

}  // namespace phalanx::sim
