#include "phalanx/backends/backend.hpp"

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/process_group.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx {

Backend::Backend(int rank, int size, std::chrono::milliseconds timeout, bool inline_ops)
    : rank_(rank), size_(size), timeout_(timeout), inline_ops_(inline_ops) {
  if (size < 1) throw ConfigError(detail::concat("world size must be >= 1, got ", size));
  if (rank < 0 || rank >= size)
    throw ConfigError(detail::concat("rank ", rank, " is outside [0, ", size, ")"));
}

Backend::~Backend() = default;

void Backend::defer_completion(std::function<void()> waiter) {
  if (!group_)
    throw CommError(name() + ": defer_completion outside a run_* hook of its process group");
  group_->defer_completion(std::move(waiter));
}

void* Backend::ready_event() const {
  const auto* d = group_ ? group_->device_op_ : nullptr;
  return d && d->ready ? d->kernels->event_handle(d->ready) : nullptr;
}

void* Backend::done_event() const {
  const auto* d = group_ ? group_->device_op_ : nullptr;
  return d && d->done ? d->kernels->event_handle(d->done) : nullptr;
}

void Backend::complete_on_device(std::function<void()> waiter) {
  auto* d = group_ ? group_->device_op_ : nullptr;
  if (!d || !d->done)
    throw CommError(name() + ": complete_on_device outside a run_* hook on device tensors of a group whose "
                             "backend orders device streams (declare_device_streams)");
  d->enqueued = true;
  group_->defer_completion(std::move(waiter));
}

Tensor Backend::alloc_symmetric(std::int64_t, DType) { return {}; }

WorkPtr Backend::inline_work(const InlineOp& op) {
  return std::make_shared<Work>(op.name(), op.take_seq(false), rank_, op.work_timeout());
}

std::exception_ptr Backend::record_failure(const std::string& what, std::exception_ptr error) {
  return group_ ? group_->record_failure(what, std::move(error)) : error;
}

std::uint64_t Backend::sequence_number() const { return group_ ? group_->sequence_number() : 0; }

std::string Backend::describe(const std::string& op, std::uint64_t seq) const {
  return detail::concat(op, " #", seq, " on rank ", rank_, " of ", size_, " (", name(), ")");
}

}  // namespace phalanx
