// One operation on its Work: the collective check, the backend's run_* hook, then the
// Work's completion (now, on the completion thread, or by its waiter) or its failure.
// The worker thread runs queued operations through run_item; an inline backend runs its
// own through InlineOp::run, on the caller's thread.
#include "phalanx/backends/process_group.hpp"

namespace phalanx {

void ProcessGroup::run_item(Item& item) { run_op<false>(item.work, item.fn, item.signature); }

// kUnshared: the Work is not visible to any other thread yet (an inline operation: abort()
// does not see those), so success needs no lock nor notify.
template <bool kUnshared, class Fn>
void ProcessGroup::run_op(const WorkPtr& work, Fn& fn, const std::string& signature) {
  try {
    if (!signature.empty() && collective_check_) collective_check_(collective_index_++, signature);
    fn(work->sequence_number());
    if (pending_waiter_) {
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
    fail_item(work, std::current_exception());
  }
}

void ProcessGroup::run_inline_op(const InlineOp& op, const WorkPtr& work) {
  const auto fn = [&op](std::uint64_t seq) { op.invoke_(op.fn_, seq); };
  // Plain stores, no read-modify-write: a group's inline operations come from one thread at a time.
  inline_active_.store(true, std::memory_order_relaxed);
  run_op<true>(work, fn, *op.signature_);
  inline_active_.store(false, std::memory_order_release);
}

void InlineOp::run(const WorkPtr& work) const { group_->run_inline_op(*this, work); }

}  // namespace phalanx
