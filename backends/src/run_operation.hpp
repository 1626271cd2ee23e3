#pragma once
// One operation on its Work: the collective check, the backend's run_* hook, then the
// Work's completion (now, on the completion thread, or by its waiter) or its failure.
// The worker thread runs queued operations (run_item, work_queue.cpp); call() runs an
// inline backend's on the caller's thread (process_group_operations.cpp).
#include <mutex>
#include <thread>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

// kUnshared: the Work is not visible to any other thread yet (an inline operation: abort()
// does not see those), so success needs no lock nor notify.
template <bool kUnshared, class Fn>
void ProcessGroup::run_op(const WorkPtr& work, Fn& fn, const std::string& signature) {
  try {
    if (!signature.empty() && collective_check_) collective_check_(collective_index_++, signature);
    fn(work->sequence_number());
    if (pending_waiter_) {
      if (pending_device_.kernels) {  // queued on the device: wait() waits there from now on
        const bool skip_wait = skip_device_order_ != "0" &&  // a test switch
                               (skip_device_order_ == "wait" ||
                                (skip_device_order_ == "wait_allreduce" && work->op() == "allreduce"));
        work->set_on_device(pending_device_.kernels, pending_device_.done, skip_wait);
        pending_device_ = DeviceOp{};
      }
      std::lock_guard<std::mutex> lock(mu_);
      completions_.emplace_back(work, std::move(pending_waiter_));
      pending_waiter_ = nullptr;
      if (!completer_.joinable()) {
        completer_exited_ = false;
        completer_ = std::thread([this] { completion_loop(); });
      }
      completion_cv_.notify_all();
    } else if (work->polled()) {
      // The backend handed its end to the waiter (Work::attach_poll): it stays pending.
    } else if (kUnshared) {
      work->finish_unshared();
    } else {
      work->finish();
    }
  } catch (...) {
    pending_waiter_ = nullptr;
    if (pending_device_.kernels) {
      pending_device_.kernels->event_destroy(pending_device_.done);
      pending_device_ = DeviceOp{};
    }
    fail_item(work, std::current_exception());
  }
}

}  // namespace phalanx
