#pragma once
// The sim device's second stream (docs/devices.md, "The asynchronous mode"): the stream of a
// communication backend that orders device streams itself, as NCCL's own stream on a GPU
// (the test backend of async_sim_tests). Its items run in issue order on a thread of its
// own, which works on the communication stream (its copies run at once). Eager mode: as soon
// as it can; lazy: only when something waits for them (a host wait on one of its events,
// the compute stream's device-side wait, flush()), so a consumer on the compute stream that
// skips the device-side wait for a result runs before the result is written, every time.
// Synchronous mode: an item runs when it is submitted.
#include <cstdint>
#include <functional>

#include "sim_work_queue.hpp"

namespace phalanx::sim {

class SideStream : public WorkQueue {
 public:
  static SideStream& instance();

  /// Queues `fn` (runs it now in synchronous mode).
  void submit(std::function<void()> fn);
  /// The ticket an event recorded now gets: complete once that many items have run.
  std::uint64_t ticket();
  /// Blocks until the ticket's items ran; rethrows the first error an item raised (kept, as
  /// CUDA's errors are sticky).
  void wait_ticket(std::uint64_t t);
  /// Lets every queued item run, without waiting for them.
  void flush();

 private:
  SideStream();
  bool ready(const State& s) const override;
  void on_worker_start() override;
  void before_item() override;
};

}  // namespace phalanx::sim
