#pragma once
// For the plugins that run their operations on the caller's thread (Backend::inline_work:
// shm, MPI): a Work they may reuse and hand to its waiter, and each thread's spare one.
// Plugin-private (included by relative path, not installed): the group itself knows nothing
// of reuse or polling.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "phalanx/backends/backend.hpp"
#include "phalanx/backends/work.hpp"

namespace phalanx::plugin_support {

/// A Work a plugin made: it may restart it (reuse) and hand its end to its waiter (poll).
class PluginWork final : public Work {
 public:
  using Work::Work;
  using Work::attach_poll;
  using Work::detach_poll;
  using Work::Poll;
  using Work::polled;
  using Work::restart;
};

namespace detail {
/// A thread's spare Work; `op` remembers which literal the Work's name holds, so that the
/// name is copied only when it changes.
struct Spare {
  std::shared_ptr<PluginWork> work;
  const char* op = nullptr;
};
/// A new spare (the thread's first operation, or the last Work is still held): out of the
/// hot path, so that reusing one needs few registers.
[[gnu::noinline, gnu::cold]] __attribute__((visibility("hidden"))) inline void renew(Spare& spare, const InlineOp& op,
                                                                                  std::uint64_t seq, int rank) {
  spare.work = std::make_shared<PluginWork>(op.name(), seq, rank, op.work_timeout());
}
/// The thread's Spare, made on its first operation.
[[gnu::noinline, gnu::cold]] __attribute__((visibility("hidden"))) inline Spare* first_spare(Spare*& slot) {
  // Owns the Spare and frees it when the thread exits (a thread_local with a destructor,
  // touched only here).
  struct Owner {
    Spare*& slot;
    Spare spare;
    explicit Owner(Spare*& s) : slot(s) { slot = &spare; }
    ~Owner() { slot = nullptr; }
  };
  static thread_local Owner owner(slot);
  return &owner.spare;
}
}  // namespace detail

/// The Work for `op`, numbered `seq`: this thread's last one when nobody else holds it any
/// more (the caller waited and dropped it), else a new one that becomes the spare. No
/// allocation, no construction of a mutex and condition variable, per operation. Returns
/// the thread's slot, which holds it until the thread's next operation (of this plugin).
/// Hidden: each plugin has its own slot, reached without a PLT call or symbol lookup.
__attribute__((visibility("hidden"))) inline const std::shared_ptr<PluginWork>& spare_work(const InlineOp& op,
                                                                                            std::uint64_t seq,
                                                                                            int rank) {
  // Reached through a plain pointer in TLS (no guard, no destructor to register: one TLS
  // lookup per operation). initial-exec: the pointer sits at a fixed offset from the
  // thread pointer (no __tls_get_addr call); 8 bytes of the plugin's static TLS, which
  // glibc reserves room for even in a library loaded by dlopen().
  __attribute__((tls_model("initial-exec"))) static thread_local detail::Spare* slot = nullptr;
  detail::Spare* spare_ptr = slot;
  if (__builtin_expect(!spare_ptr, 0)) spare_ptr = detail::first_spare(slot);
  detail::Spare& spare = *spare_ptr;
  // Not a Work dropped while still pending (a send nobody waited for, whose poll the
  // backend may still need): that one is left to die with its poll, and replaced. Nor one
  // that was polled: its backend's list of posted operations still names it, and an abort
  // or the backend's end would fail it in its next life.
  if (__builtin_expect(spare.work && spare.work.use_count() == 1 && !spare.work->polled() &&
                           spare.work->is_completed(),
                       1)) {
    std::atomic_thread_fence(std::memory_order_acquire);  // the last holder's reads are done
    spare.work->restart(spare.op != op.name() ? op.name() : nullptr, seq, rank, op.work_timeout());
  } else {
    detail::renew(spare, op, seq, rank);
  }
  spare.op = op.name();
  return spare.work;
}

}  // namespace phalanx::plugin_support
