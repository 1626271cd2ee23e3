// ProcessGroup's life: construction, abort, destruction, and the bookkeeping of a failed
// operation (the failure hook, the group broken). The operations and their checks are in
// process_group_operations.cpp, the worker and completion threads in work_queue.cpp, the
// running of one operation in run_operation.cpp.
#include "phalanx/backends/process_group.hpp"

#include <cmath>
#include <cstdlib>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/creation.hpp"
#include "phalanx/core/env.hpp"

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
      inline_ops_(be_->inline_ops()),
      skip_ready_wait_(env::choice("PHALANX_TEST_SKIP_READY_WAIT", "0", {"0", "1", "allreduce"})),
      skip_device_order_(env::choice("PHALANX_TEST_SKIP_DEVICE_ORDER", "0", {"0", "wait", "wait_allreduce", "hold"})) {
  be_->group_ = this;
  worker_exited_ = inline_ops_;
  completer_exited_ = true;  // started with the first deferred completion
  if (!inline_ops_) worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() {
  // Waiters of a device backend that never ran: destroyed after the backend, which finishes
  // or aborts its device work first.
  std::deque<std::pair<WorkPtr, std::function<void()>>> unfinished;
  destroying_.store(true, std::memory_order_release);
  be_->on_close();  // a wait that can no longer end well (a posted receive) returns now
  stop_threads();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [work, waiter] : completions_)
      work->finish(std::make_exception_ptr(CommError(detail::concat(
          work->op(), " #", work->sequence_number(), " on rank ", rank_,
          ": the process group was destroyed before it completed"))));
    // The waiters refer to the backend: never called again. A device backend's (their
    // tensors held for a device that may still use them) die after it; others' now.
    if (be_->orders_device_streams())
      unfinished.swap(completions_);
    else
      completions_.clear();
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
    // Works the backend completes itself (polled by their waiters) are its to fail, in on_abort.
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

Tensor ProcessGroup::symmetric_zeros(std::int64_t numel, DType dtype, Device device) {
  if (numel < 0) throw ValueError(detail::concat("symmetric_zeros: numel ", numel, " is negative"));
  if (device.is_cpu() && size_ > 1 && numel > 0) {
    std::exception_ptr aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted = abort_error_;
    }
    if (aborted) std::rethrow_exception(aborted);  // as every later operation fails (abort())
    Tensor t = backend_->alloc_symmetric(numel, dtype);
    if (t.defined()) return t;
  }
  return zeros({numel}, dtype, device);
}

std::uint64_t ProcessGroup::sequence_number() const {
  return next_seq_.load(std::memory_order_relaxed);
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

}  // namespace phalanx
