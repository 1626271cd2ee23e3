// What MPI at MPI_THREAD_SINGLE needs (docs/mpi.md, "Threads"): every MPI call on the
// thread that created the group (inline_work refuses any other), each operation on that
// thread's spare Work, and sends and receives completed by the waiter of their Work (an
// MPI_Test per step of Work::wait), since no thread of the group may call MPI.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "mpi_process_group.hpp"
#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/host_staging.hpp"

namespace phalanx::mpi_backend {

namespace {
/// Buffers of sends that MPI could neither complete nor cancel when their group was
/// destroyed (their requests were freed: MPI may still read them): kept until exit.
void keep_until_exit(const Tensor& t) {
  static auto* kept = new std::vector<Tensor>();  // never destroyed: MPI may outlive statics
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(t);
}
}  // namespace

WorkPtr MpiProcessGroup::inline_work(const InlineOp& op) {
  // MPI_THREAD_SERIALIZED: any thread (MpiCall serialises the MPI calls).
  if (!single_) return plugin_support::spare_work(op, op.take_seq(false), rank());
  if (std::this_thread::get_id() != owner_) wrong_thread(op.name());  // one compare
  // One thread issues every operation: the sequence number is a plain increment.
  const auto& work = plugin_support::spare_work(op, op.take_seq(true), rank());
  current_ = &work;  // for a send or receive that hands its Work to the waiter
  return work;
}

void MpiProcessGroup::wrong_thread(const char* op) const {
  throw ConfigError(detail::concat(
      op, " on rank ", rank(), " of ", size(), " (", name(),
      "): called from a thread other than the one that created the process group; MPI runs at "
      "MPI_THREAD_SINGLE here (every MPI call on one thread); call it from the thread that created the group, or "
      "set PHALANX_MPI_THREADS=serialized (any thread; each MPI call is slower)"));
}

void MpiProcessGroup::defer_to_waiter(std::shared_ptr<Posted> p) {
  // Complete what finished meanwhile (a send whose Work was dropped unwaited is never
  // polled: its request is freed here, not kept until the group ends), then forget what
  // ended and no Work's poll refers to any more. Only owner_ changes the list.
  for (auto& q : posted_) {
    if (q->ended) continue;
    int done = 0;
    const int rc = MPI_Test(&q->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {  // e.g. MPI_ERR_TRUNCATE: MPI ended the request; its poll reports it
      q->ended = true;
      q->error = rc;
    } else if (done) {
      q->ended = true;
      if (q->target.defined()) staging::copy_back(q->host, q->target);
    }
  }
  const std::shared_ptr<plugin_support::PluginWork>& work = *current_;  // this operation's
  p->work = work;
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.erase(std::remove_if(posted_.begin(), posted_.end(),
                                 [](const auto& q) { return q->ended && (q->reported || q->work.expired()); }),
                  posted_.end());
    posted_.push_back(p);
  }
  // The poll lives in the Work: it holds `p`, the Work is named in `p` weakly (no cycle).
  work->attach_poll([this, p = std::move(p)](std::exception_ptr& failure) { return poll_step(*p, failure); });
}

bool MpiProcessGroup::poll_step(Posted& p, std::exception_ptr& failure) {
  if (std::this_thread::get_id() != owner_) wrong_thread(p.op);  // the Work stays pending
  try {
    p.reported = poll(p);
    return p.reported;
  } catch (...) {  // the Work's lock is held: the bookkeeping only, the Work ends in its poll
    p.reported = true;
    failure = closing_ ? std::current_exception()  // ended by the group's end: not a job failure
                       : record_failure(describe(p.op, p.seq), std::current_exception());
    return true;
  }
}

bool MpiProcessGroup::poll(Posted& p) {
  if (p.ended) {  // completed (or failed) in defer_to_waiter's sweep
    check(p.error, p.op, p.seq);
    return true;
  }
  int done = 0;
  check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), p.op, p.seq);
  if (done) {
    p.ended = true;
    if (p.target.defined()) staging::copy_back(p.host, p.target);  // a staged receive lands in the caller's tensor
    return true;
  }
  if (closing_ || is_aborted())  // the request stays posted: end_posted() ends it
    throw CommError(describe(p.op, p.seq) + ": the process group was " + (closing_ ? "destroyed" : "aborted") +
                    " before the " + p.op + " completed");
  if (std::chrono::steady_clock::now() > p.deadline)
    throw TimeoutError(detail::concat(describe(p.op, p.seq), " timed out after ", timeout().count() / 1000.0,
                                      " s: the peer never posted the matching ",
                                      p.op == std::string("send") ? "recv" : "send", " (same tag?), or it has exited"));
  return false;
}

void MpiProcessGroup::end_posted() noexcept {
  using Clock = std::chrono::steady_clock;
  for (auto& p : posted_) {
    if (p->ended || p->request == MPI_REQUEST_NULL) continue;
    p->ended = true;
    int done = 0;
    MPI_Test(&p->request, &done, MPI_STATUS_IGNORE);  // a send may have completed meanwhile
    if (done) continue;
    MPI_Cancel(&p->request);
    // A cancelled receive completes at once; a send MPI cannot cancel (OpenMPI: once it has
    // started) would wait for its peer: give it 100 ms, then free it and keep its buffer.
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    while (!done && Clock::now() < until) {
      MPI_Test(&p->request, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::yield();
    }
    if (!done) {
      MPI_Request_free(&p->request);
      keep_until_exit(p->host);
    }
  }
  std::lock_guard<std::mutex> lock(posted_mu_);
  posted_.clear();
}

void MpiProcessGroup::on_abort() noexcept {
  // Like the group's other Works, they fail now; their requests stay posted (end_posted).
  try {
    std::vector<std::shared_ptr<plugin_support::PluginWork>> works;
    {
      std::lock_guard<std::mutex> lock(posted_mu_);
      for (auto& p : posted_)
        if (auto w = p->work.lock()) works.push_back(std::move(w));
    }
    for (auto& w : works)  // the group is aborted: record_failure gives the abort's error
      w->finish(record_failure(describe(w->op(), w->sequence_number()),
                               std::make_exception_ptr(CommError("the process group was aborted"))));
  } catch (...) {  // out of memory: the waiters' next poll reports the abort
  }
}

void MpiProcessGroup::drop_polls() noexcept {
  std::lock_guard<std::mutex> lock(posted_mu_);
  for (auto& p : posted_)
    if (auto w = p->work.lock())
      w->detach_poll(std::make_exception_ptr(CommError(detail::concat(
          w->op(), " #", w->sequence_number(), " on rank ", rank(),
          ": the process group was destroyed before it completed (nobody waited for it)"))));
}

void MpiProcessGroup::abandon_posted() noexcept {
  std::lock_guard<std::mutex> lock(posted_mu_);
  for (auto& p : posted_)
    if (!p->ended) keep_until_exit(p->host);
}

}  // namespace phalanx::mpi_backend
