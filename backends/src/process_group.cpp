#include "phalanx/backends/process_group.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/env.hpp"
#include "phalanx/core/tensor_impl.hpp"
#include "phalanx/core/timeline.hpp"

namespace phalanx {

std::chrono::milliseconds default_timeout() {
  if (!env::text("PHALANX_TIMEOUT")) return kDefaultTimeout;
  const double secs = env::real("PHALANX_TIMEOUT", 0, kMinTimeoutSeconds, kMaxTimeoutSeconds, "seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(secs * 1000)));
}

Backend* ProcessGroup::adopt(const BackendPtr& backend) {
  if (!backend) throw ValueError("ProcessGroup: the backend is null; pass the object a backend factory made");
  if (backend->group_)
    throw ValueError(detail::concat("ProcessGroup: the ", backend->name(),
                                    " backend already belongs to a process group; make one backend per group"));
  return backend.get();
}

ProcessGroup::ProcessGroup(BackendPtr backend)
    : backend_(std::move(backend)),
      be_(adopt(backend_)),
      rank_(be_->rank()),
      size_(be_->size()),
      timeout_(be_->timeout()),
      inline_ops_(be_->inline_ops()) {
  be_->group_ = this;
  worker_exited_ = inline_ops_;
  completer_exited_ = true;  // started with the first deferred completion
  if (!inline_ops_) worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() {
  destroying_.store(true, std::memory_order_release);
  be_->on_close();  // a wait that can no longer end well (a posted receive) returns now
  stop_threads();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [work, waiter] : completions_)
      work->finish(std::make_exception_ptr(CommError(detail::concat(
          work->op(), " #", work->sequence_number(), " on rank ", rank_,
          ": the process group was destroyed before it completed"))));
    completions_.clear();  // the waiters refer to the backend: gone before it
    // Polled Works nobody waited for: they fail, and their polls (which refer to this group
    // and the backend) are dropped; the backend ends the requests themselves (on_close, its
    // destructor).
    for (auto& weak : polled_)
      if (WorkPtr work = weak.lock())
        work->detach_poll(std::make_exception_ptr(CommError(detail::concat(
            work->op(), " #", work->sequence_number(), " on rank ", rank_,
            ": the process group was destroyed before it completed (nobody waited for it)"))));
    polled_.clear();
    // Anything still queued never ran: fail it rather than leave a waiter hanging.
    for (auto& item : queue_)
      item.work->finish(std::make_exception_ptr(CommError(detail::concat(
          item.work->op(), " #", item.work->sequence_number(), " on rank ", rank_,
          ": the process group was destroyed before it ran"))));
    queue_.clear();
  }
  // No thread can call into the backend any more: destroy it (with the plugin's destroy).
  be_->group_ = nullptr;
  backend_.reset();
}

bool ProcessGroup::stop_threads(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  closed_.store(true, std::memory_order_release);
  cv_.notify_all();
  completion_cv_.notify_all();
  const auto exited = [&] { return worker_exited_ && completer_exited_; };
  if (grace.count() < 0)
    exit_cv_.wait(lock, exited);
  else if (!exit_cv_.wait_for(lock, grace, exited))
    return false;  // a thread is blocked in the backend: do not join (nor destroy)
  lock.unlock();
  if (worker_.joinable()) worker_.join();
  if (completer_.joinable()) completer_.join();
  return true;
}

void ProcessGroup::abort(std::exception_ptr error) {
  if (!error) error = std::make_exception_ptr(CommError("the process group was aborted"));
  std::vector<WorkPtr> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_error_) return;
    abort_error_ = error;
    be_->aborted_.store(true, std::memory_order_release);
    if (broken_.empty()) broken_ = detail::message_of(error);
    closed_.store(true, std::memory_order_release);
    if (running_) victims.push_back(running_);
    if (completing_) victims.push_back(completing_);
    for (auto& item : queue_) victims.push_back(item.work);
    queue_.clear();  // never started: nothing in the backend refers to them
    // Deferred completions stay queued (the backend may still write into their buffers);
    // only their Works finish now.
    for (auto& c : completions_) victims.push_back(c.first);
    for (auto& weak : polled_)  // their polls stay: the backend's requests are still posted
      if (WorkPtr work = weak.lock()) victims.push_back(std::move(work));
  }
  for (auto& w : victims) w->finish(error);
  be_->on_abort();
}

bool ProcessGroup::operation_in_flight() const {
  if (inline_active_.load(std::memory_order_acquire)) return true;
  // The worker holds mu_ only for moments (it takes it again right after finishing a Work, to
  // clear running_). An exit handler may have interrupted the thread that holds it, so it
  // tries for a short while instead of blocking.
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  for (int i = 0; i < 50 && !lock.try_lock(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!lock.owns_lock()) return true;
  // A Work the worker has finished but not yet cleared (its waiter already returned) is over.
  const bool running = running_ && !running_->is_completed();
  const bool completing = completing_ && !completing_->is_completed();
  return running || !queue_.empty() || completing || !completions_.empty();
}

bool ProcessGroup::is_aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_error_ != nullptr;
}

void ProcessGroup::set_failure_hook(FailureHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_hook_ = std::move(hook);
}

void ProcessGroup::set_collective_check(CollectiveCheck check) {
  std::lock_guard<std::mutex> lock(mu_);
  collective_check_ = std::move(check);
  checking_.store(static_cast<bool>(collective_check_), std::memory_order_relaxed);
}

std::uint64_t ProcessGroup::sequence_number() const {
  return next_seq_.load(std::memory_order_relaxed);
}

WorkPtr ProcessGroup::enqueue(const char* op, std::function<void(std::uint64_t)> fn, std::string signature) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  auto work = std::make_shared<Work>(op, seq, rank_, timeout_ + std::chrono::seconds(5));
  if (abort_error_) {
    work->finish(abort_error_);  // the failure that ended the group, as it was reported
    return work;
  }
  if (stopping_) {
    work->finish(std::make_exception_ptr(CommError(describe(op, seq) + ": the process group is shut down")));
    return work;
  }
  if (!broken_.empty()) {
    work->finish(std::make_exception_ptr(
        CommError(describe(op, seq) + ": the process group is broken since an earlier failure (" +
                  broken_ + "); destroy it and re-initialise, or restart the job")));
    return work;
  }
  Item item{work, std::move(fn), std::move(signature)};
  if (inline_ops_) {  // not reached: call() runs an open inline group's operations itself
    lock.unlock();
    run_item(item);
    return work;
  }
  queue_.push_back(std::move(item));
  lock.unlock();
  cv_.notify_one();
  return work;
}

void ProcessGroup::worker_loop() {
  timeline::name_this_thread("process group worker");  // its row in PHALANX_TIMELINE
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ || queue_.empty()) {  // the destructor fails what is left
        worker_exited_ = true;
        exit_cv_.notify_all();
        return;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = item.work;
    }
    run_item(item);
    std::lock_guard<std::mutex> lock(mu_);
    running_.reset();
  }
}

void ProcessGroup::run_item(Item& item) { run_op<false>(item.work, item.fn, item.signature); }

// kUnshared: the Work is not visible to any other thread yet (call()'s inline path:
// abort() does not see inline operations), so success needs no lock nor notify.
template <bool kUnshared, class Fn>
void ProcessGroup::run_op(const WorkPtr& work, Fn& fn, const std::string& signature) {
  try {
    if (!signature.empty() && collective_check_) collective_check_(collective_index_++, signature);
    fn(work->sequence_number());
    if (pending_poll_) {
      attach_poll(work);
    } else if (pending_waiter_) {
      std::lock_guard<std::mutex> lock(mu_);
      completions_.emplace_back(work, std::move(pending_waiter_));
      pending_waiter_ = nullptr;
      if (!completer_.joinable()) {
        completer_exited_ = false;
        completer_ = std::thread([this] { completion_loop(); });
      }
      completion_cv_.notify_all();
    } else if (kUnshared) {
      work->finish_unshared();
    } else {
      work->finish();
    }
  } catch (...) {
    pending_waiter_ = nullptr;
    pending_poll_ = nullptr;
    fail_item(work, std::current_exception());
  }
}

template <class Body, class... Args>
WorkPtr ProcessGroup::call(const char* op, const std::string& signature, Body body, const Args&... args) {
  if (!be_->on_allowed_thread()) be_->wrong_thread(op);  // one compare, unless restricted
  // Open inline group: what enqueue() does, without mu_ (an abort racing this check is an
  // abort during the operation, as with the lock: inline operations are never `running_`).
  // The backend gets the caller's own handles: it writes their data, never the handles
  // (backend.hpp), so the const_cast changes nothing the caller can see but the data.
  if (inline_ops_ && !closed_.load(std::memory_order_acquire)) {
    auto fn = [&](std::uint64_t seq) { body(seq, const_cast<Args&>(args)...); };
    return run_inline(op, fn, signature);
  }
  // Queued: the closure holds copies of the handles until the worker runs it.
  return enqueue(op, [body, held = std::tuple<Args...>(args...)](std::uint64_t seq) mutable {
    std::apply([&](Args&... a) { body(seq, a...); }, held);
  }, signature);
}

template <class Fn>
WorkPtr ProcessGroup::run_inline(const char* op, Fn& fn, const std::string& signature) {
  {
    // One thread issues a restricted group's operations (Backend::restrict_to_this_thread):
    // its sequence number needs no atomic read-modify-write.
    std::uint64_t seq;
    if (be_->only_thread_ != std::thread::id()) {
      seq = next_seq_.load(std::memory_order_relaxed);
      next_seq_.store(seq + 1, std::memory_order_relaxed);
    } else {
      seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
    }
    const auto timeout = timeout_ + std::chrono::seconds(5);
    // This thread's last inline Work, reused once nobody else holds it (the caller waited
    // and dropped it): no allocation, no construction of its mutex and condition variable.
    // `op` remembers which literal its op_ holds, so that the name is copied only when it changes.
    struct Spare {
      WorkPtr work;
      const char* op = nullptr;
    };
    // Reached through a plain pointer in TLS (no guard, no destructor to register: one TLS
    // lookup per operation); a second thread_local, touched only on the thread's first
    // operation, owns it and frees it when the thread exits.
    struct SpareOwner {
      Spare*& slot;
      Spare spare;
      explicit SpareOwner(Spare*& s) : slot(s) { slot = &spare; }
      ~SpareOwner() { slot = nullptr; }
    };
    // initial-exec: the pointer sits at a fixed offset from the thread pointer (no
    // __tls_get_addr call); 8 bytes of libphalanx's static TLS, which glibc reserves room for
    // even when the library is dlopen()ed.
    __attribute__((tls_model("initial-exec"))) thread_local Spare* spare_slot = nullptr;
    Spare* spare_ptr = spare_slot;
    if (!spare_ptr) {
      thread_local SpareOwner owner(spare_slot);
      spare_ptr = &owner.spare;
    }
    Spare& spare = *spare_ptr;
    // Not a Work dropped while still pending (a send nobody waited for, whose poll the
    // backend may still need): that one is left to die with its poll, and replaced. Nor one
    // that was polled (a send or recv, Backend::defer_polled): its group's polled_ list still
    // names it, and that group's abort() or destructor would fail it in its next life (another
    // group's operation, or this one's racing an abort from another thread).
    if (spare.work && spare.work.use_count() == 1 && spare.work->done_.load(std::memory_order_acquire) &&
        !spare.work->polled_.load(std::memory_order_relaxed)) {
      std::atomic_thread_fence(std::memory_order_acquire);  // the last holder's reads are done
      Work& w = *spare.work;
      if (spare.op != op) {
        w.op_ = op;
        spare.op = op;
      }
      w.seq_ = seq;
      w.rank_ = rank_;
      w.timeout_ = timeout;
      if (w.error_) w.error_ = nullptr;
      w.done_.store(false, std::memory_order_relaxed);
    } else {
      spare.work = std::make_shared<Work>(op, seq, rank_, timeout);
      spare.op = op;
    }
    WorkPtr work = spare.work;  // copy-constructed (inline), not assigned
    inline_active_.store(true, std::memory_order_relaxed);
    run_op<true>(work, fn, signature);
    inline_active_.store(false, std::memory_order_release);
    return work;
  }
}

void ProcessGroup::fail_item(const WorkPtr& work, std::exception_ptr error) {
  work->finish(record_failure(describe(work->op(), work->sequence_number()), std::move(error)));
}

std::exception_ptr ProcessGroup::record_failure(const std::string& what, std::exception_ptr error) {
  FailureHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_error_) return abort_error_;  // already failed from outside; the backend catching up
    if (failed_) return error;  // a later failure: the first one was reported, the hook ran for it
    failed_ = true;
    hook = failure_hook_;
  }
  // The hook posts this rank's failure record and may name the peer that failed first
  // (its contract: it does not throw).
  if (hook)
    if (std::exception_ptr better = hook(error, what)) error = better;
  std::deque<Item> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = detail::message_of(error);
    closed_.store(true, std::memory_order_release);
    queued.swap(queue_);  // never started, and would only fail one by one (a timeout each)
  }
  for (auto& item : queued) item.work->finish(error);
  return error;
}

void ProcessGroup::defer_completion(std::function<void()> waiter) { pending_waiter_ = std::move(waiter); }

void ProcessGroup::defer_polled(std::function<bool()> poll) { pending_poll_ = std::move(poll); }

void ProcessGroup::attach_poll(const WorkPtr& work) {
  Work* w = work.get();  // the poll lives in the Work: a raw pointer, no cycle
  work->attach_poll([this, w, step = std::move(pending_poll_)](std::exception_ptr& failure) {
    if (!be_->on_allowed_thread()) be_->wrong_thread(w->op_.c_str());  // the Work stays pending
    try {
      return step();
    } catch (...) {  // Work::mu_ is held: the bookkeeping only, the Work ends in its poll
      failure = destroying_.load(std::memory_order_acquire)
                    ? std::current_exception()  // ended by on_close: not a job failure
                    : record_failure(describe(w->op_, w->seq_), std::current_exception());
      return true;
    }
  });
  pending_poll_ = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  // Forget the Works that ended or were dropped (the list stays as long as the pending ones).
  polled_.erase(std::remove_if(polled_.begin(), polled_.end(),
                               [](const std::weak_ptr<Work>& p) {
                                 const WorkPtr x = p.lock();
                                 return !x || x->done_.load(std::memory_order_acquire);
                               }),
                polled_.end());
  polled_.push_back(work);
}

void ProcessGroup::completion_loop() {
  for (;;) {
    std::pair<WorkPtr, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      completion_cv_.wait(lock, [&] { return stopping_ || !completions_.empty(); });
      if (stopping_ || completions_.empty()) {
        completer_exited_ = true;
        exit_cv_.notify_all();
        return;
      }
      item = std::move(completions_.front());
      completions_.pop_front();
      completing_ = item.first;
    }
    try {
      item.second();
      item.first->finish();
    } catch (...) {
      if (destroying_.load(std::memory_order_acquire))
        item.first->finish(std::current_exception());  // ended by on_close: not a job failure
      else
        fail_item(item.first, std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mu_);
    completing_.reset();
  }
}

void ProcessGroup::check_root(int root, const char* op) const {
  if (root < 0 || root >= size_)
    throw ValueError(detail::concat(op, ": root ", root, " is outside [0, ", size_, ")"));
}

void ProcessGroup::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw ValueError(detail::concat(op, ": peer ", peer, " must be another rank in [0, ", size_,
                                    ") (this is rank ", rank_, ")"));
}

namespace {
/// "allreduce(sum, float32 [4, 3])": what PHALANX_DEBUG=detail compares across ranks.
std::string signature(const char* op, const Tensor& t, const std::string& extra = {}) {
  return detail::concat(op, "(", extra, extra.empty() ? "" : ", ", dtype_name(t.dtype()), " ",
                        shape_str(t.shape()), ")");
}
std::string root_of(int root) { return "root " + std::to_string(root); }
void check_tensor(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw ValueError(detail::concat(op, ": ", what, " is undefined"));
}
void check_list(const std::vector<Tensor>& ts, const Tensor& like, int size, const char* op,
                const char* what) {
  if (static_cast<int>(ts.size()) != size)
    throw ValueError(detail::concat(op, ": expected ", size, " ", what, " tensors (one per rank), got ",
                                    ts.size()));
  for (const auto& t : ts) {
    check_tensor(t, op, what);
    if (t.numel() != like.numel() || t.dtype() != like.dtype())
      throw ShapeError(detail::concat(op, ": every ", what, " tensor must match ", like.str(), ", got ",
                                      t.str()));
  }
}
}  // namespace

namespace {
/// An operation's event in the timeline (docs/timeline.md) as the backend runs it: its
/// size in bytes (computed only while recording) and its sequence number.
template <class Bytes>
timeline::Span traced(const char* op, std::uint64_t seq, Bytes bytes) {
  return timeline::Span(op, "comm", "bytes", bytes, {"seq", static_cast<std::int64_t>(seq)});
}
}  // namespace

namespace {
const std::string kNoSignature;  // no collective check set: nothing to build, copy or move
}  // namespace

WorkPtr ProcessGroup::allreduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "allreduce", "tensor");
  const DType dt = t.impl()->dtype();  // inline (defined: checked)
  if ((dt == DType::Float16 || dt == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("allreduce: ") + dtype_name(dt) + " tensors support sum only");
  if (op == ReduceOp::Avg && dt != DType::Float32)
    throw TypeError("allreduce: avg needs a float32 tensor");
  const auto body = [this, op](std::uint64_t seq, Tensor& x) {
    const auto span = traced("allreduce", seq, [&] { return x.nbytes(); });
    be_->run_allreduce(x, op, seq);
  };
  if (!checking_.load(std::memory_order_relaxed)) return call("allreduce", kNoSignature, body, t);
  return call("allreduce", signature("allreduce", t, reduce_op_name(op)), body, t);
}

WorkPtr ProcessGroup::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast", "tensor");
  check_root(root, "broadcast");
  const auto body = [this, root](std::uint64_t seq, Tensor& x) {
    const auto span = traced("broadcast", seq, [&] { return x.nbytes(); });
    be_->run_broadcast(x, root, seq);
  };
  if (!checking_.load(std::memory_order_relaxed)) return call("broadcast", kNoSignature, body, t);
  return call("broadcast", signature("broadcast", t, root_of(root)), body, t);
}

WorkPtr ProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  check_tensor(input, "allgather", "input");
  check_list(outputs, input, size_, "allgather", "output");
  const auto body = [this](std::uint64_t seq, std::vector<Tensor>& out, Tensor& in) {
    const auto span = traced("allgather", seq, [&] { return in.nbytes(); });
    be_->run_allgather(out, in, seq);
  };
  return call("allgather", checking_.load(std::memory_order_relaxed) ? signature("allgather", input) : kNoSignature,
              body, outputs, input);
}

WorkPtr ProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output");
  check_list(inputs, output, size_, "reduce_scatter", "input");
  if ((output.dtype() == DType::Float16 || output.dtype() == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("reduce_scatter: ") + dtype_name(output.dtype()) + " tensors support sum only");
  if (op == ReduceOp::Avg && output.dtype() != DType::Float32)
    throw TypeError("reduce_scatter: avg needs float32 tensors");
  const auto body = [this, op](std::uint64_t seq, Tensor& out, std::vector<Tensor>& in) {
    const auto span = traced("reduce_scatter", seq, [&] {
      std::size_t n = 0;
      for (const auto& x : in) n += x.nbytes();
      return n;
    });
    be_->run_reduce_scatter(out, in, op, seq);
  };
  return call("reduce_scatter",
              checking_.load(std::memory_order_relaxed) ? signature("reduce_scatter", output, reduce_op_name(op))
                                                        : kNoSignature,
              body, output, inputs);
}

WorkPtr ProcessGroup::reduce(const Tensor& t, int root, ReduceOp op) {
  check_tensor(t, "reduce", "tensor");
  check_root(root, "reduce");
  if ((t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) && op != ReduceOp::Sum)
    throw TypeError(std::string("reduce: ") + dtype_name(t.dtype()) + " tensors support sum only");
  if (op == ReduceOp::Avg && t.dtype() != DType::Float32) throw TypeError("reduce: avg needs a float32 tensor");
  const auto body = [this, root, op](std::uint64_t seq, Tensor& x) {
    const auto span = traced("reduce", seq, [&] { return x.nbytes(); });
    be_->run_reduce(x, root, op, seq);
  };
  return call("reduce",
              checking_.load(std::memory_order_relaxed)
                  ? signature("reduce", t, std::string(reduce_op_name(op)) + ", " + root_of(root))
                  : kNoSignature,
              body, t);
}

WorkPtr ProcessGroup::gather(const std::vector<Tensor>& outputs, const Tensor& input, int root) {
  check_tensor(input, "gather", "input");
  check_root(root, "gather");
  if (rank_ == root) check_list(outputs, input, size_, "gather", "output");
  const auto body = [this, root](std::uint64_t seq, std::vector<Tensor>& out, Tensor& in) {
    const auto span = traced("gather", seq, [&] { return in.nbytes(); });
    be_->run_gather(out, in, root, seq);
  };
  return call("gather", checking_.load(std::memory_order_relaxed) ? signature("gather", input, root_of(root)) : kNoSignature,
              body, outputs, input);
}

WorkPtr ProcessGroup::scatter(const Tensor& output, const std::vector<Tensor>& inputs, int root) {
  check_tensor(output, "scatter", "output");
  check_root(root, "scatter");
  if (rank_ == root) check_list(inputs, output, size_, "scatter", "input");
  const auto body = [this, root](std::uint64_t seq, Tensor& out, std::vector<Tensor>& in) {
    const auto span = traced("scatter", seq, [&] { return out.nbytes(); });
    be_->run_scatter(out, in, root, seq);
  };
  return call("scatter",
              checking_.load(std::memory_order_relaxed) ? signature("scatter", output, root_of(root)) : kNoSignature,
              body, output, inputs);
}

WorkPtr ProcessGroup::barrier() {
  static const std::string kBarrier("barrier()");
  const auto body = [this](std::uint64_t seq) {
    const timeline::Span span("barrier", "comm", {"seq", static_cast<std::int64_t>(seq)});
    be_->run_barrier(seq);
  };
  return call("barrier", checking_.load(std::memory_order_relaxed) ? kBarrier : kNoSignature, body);
}

WorkPtr ProcessGroup::send(const Tensor& t, int dst, int tag) {
  check_tensor(t, "send", "tensor");
  check_peer(dst, "send");
  return call("send", kNoSignature, [this, dst, tag](std::uint64_t seq, Tensor& x) {
    const auto span = traced("send", seq, [&] { return x.nbytes(); });
    be_->run_send(x, dst, tag, seq);
  }, t);
}

WorkPtr ProcessGroup::recv(const Tensor& t, int src, int tag) {
  check_tensor(t, "recv", "tensor");
  check_peer(src, "recv");
  return call("recv", kNoSignature, [this, src, tag](std::uint64_t seq, Tensor& x) {
    const auto span = traced("recv", seq, [&] { return x.nbytes(); });
    be_->run_recv(x, src, tag, seq);
  }, t);
}

}  // namespace phalanx
