// The worker thread and its queue (operations run one at a time in issue order), and the
// completion thread (point-to-point operations whose run_* hook only posted them:
// Backend::defer_completion). Inline groups start neither thread.
#include "phalanx/backends/process_group.hpp"

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/timeline.hpp"
#include "run_operation.hpp"

namespace phalanx {

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

WorkPtr ProcessGroup::enqueue(const char* op, std::function<void(std::uint64_t)> fn, std::string signature) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
  auto work = std::make_shared<Work>(op, seq, rank_, work_timeout());
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

void ProcessGroup::run_item(Item& item) { run_op<false>(item.work, item.fn, item.signature); }

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
      if (item.first->on_device()) {  // its stream may still use the tensors it holds
        std::lock_guard<std::mutex> lock(mu_);
        failed_device_waiters_.push_back(std::move(item.second));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    completing_.reset();
  }
}

}  // namespace phalanx
