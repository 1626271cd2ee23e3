#include "sim_stream.hpp"

#include <pthread.h>

#include <cstdlib>
#include <string>

#include "phalanx/core/error.hpp"

namespace phalanx::sim {

namespace {
thread_local bool t_comm_stream = false;
thread_local bool t_worker = false;  // the stream's own thread
}  // namespace

Mode mode_from_env() {
  const char* v = std::getenv("PHALANX_SIM_ASYNC");
  const std::string s = v ? v : "";
  if (s.empty() || s == "0") return Mode::Sync;
  if (s == "1" || s == "eager") return Mode::Eager;
  if (s == "lazy") return Mode::Lazy;
  throw ConfigError("PHALANX_SIM_ASYNC='" + s + "' is not a sim device mode: use 0 (synchronous), 1 (eager) or lazy");
}

bool on_comm_stream() { return t_comm_stream; }
void set_comm_stream(bool on) { t_comm_stream = on; }

Stream& Stream::instance() {
  static Stream* s = new Stream;  // never destroyed: storages may die during exit
  return *s;
}

Stream::Stream() : mode_(static_cast<int>(mode_from_env())) {
  // A forked child has no worker thread and may inherit a locked mutex: the queue is drained
  // before the fork and the child starts on fresh state.
  pthread_atfork(&Stream::before_fork, &Stream::after_fork_parent, &Stream::after_fork_child);
}

void Stream::before_fork() {
  Stream& st = instance();
  // Drained, not synchronised: an error a queued kernel raised stays for the parent's next
  // host wait (synchronize() would consume it here); the child starts clean.
  State* s = st.state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  if (!t_worker)
    while (s->completed < s->enqueued) st.wait_locked(s, lock, s->enqueued);
  lock.release();  // held across the fork; unlocked by the after_fork handlers
}
void Stream::after_fork_parent() { instance().state_.load()->mu.unlock(); }
void Stream::after_fork_child() {
  // The old state (its mutex locked, its worker absent here) is left behind on purpose.
  instance().state_.store(new State);
}

void Stream::set_mode(Mode m) {
  synchronize();
  mode_.store(static_cast<int>(m), std::memory_order_release);
}

void Stream::submit(std::function<void()> fn) {
  if (mode() == Mode::Sync || t_comm_stream || t_worker) {
    fn();
    return;
  }
  push(std::move(fn));
}

void Stream::submit_ordered(std::function<void()> fn) {
  // Also queued from the worker (a kernel's captured tensor dying after it ran): a kernel
  // queued later may still use the block through a raw pointer (gemm).
  if (mode() == Mode::Sync) {
    fn();
    return;
  }
  push(std::move(fn));
}

bool Stream::ready(const State& s) const {
  return mode() != Mode::Lazy || s.flush_to > s.completed || s.queue.size() > kLazyBound;
}

void Stream::on_worker_start() { t_worker = true; }

void Stream::synchronize() {
  if (t_worker) return;
  State* s = state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  // Until the queue is empty: the frees that the work run meanwhile queued included.
  while (s->completed < s->enqueued) wait_locked(s, lock, s->enqueued);
  if (s->error) {
    std::exception_ptr e = s->error;
    s->error = nullptr;
    std::rethrow_exception(e);
  }
}

std::uint64_t Stream::ticket() {
  if (mode() == Mode::Sync || t_comm_stream) return 0;
  return enqueued();
}

void Stream::wait_ticket(std::uint64_t t) {
  if (t == 0 || t_worker) return;
  State* s = state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  wait_locked(s, lock, t);
  // As cudaEventSynchronize returns a sticky error: the waiter (a collective about to read
  // its inputs) must not go on; the error stays for the compute thread's next host wait.
  if (s->error) std::rethrow_exception(s->error);
}

void Stream::note_allocation(std::size_t nbytes) {
  if (mode() != Mode::Lazy) return;
  State* s = state_.load();
  std::unique_lock<std::mutex> lock(s->mu);
  s->allocated += nbytes;
  if (s->allocated <= kLazyBytes) return;
  s->allocated = 0;
  // Waits, as a caching allocator short of memory synchronises: a flush the host does not
  // wait for is outrun by the host's next allocations. Never on the stream's own thread.
  if (t_worker) {
    flush_locked(s, s->enqueued);
    return;
  }
  // The frees the drained work queued as it ran included: they release the memory.
  while (s->completed < s->enqueued) wait_locked(s, lock, s->enqueued);
}

std::size_t Stream::pending() {
  State* s = state_.load();
  std::lock_guard<std::mutex> lock(s->mu);
  return s->queue.size();
}

}  // namespace phalanx::sim
