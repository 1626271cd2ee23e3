#pragma once
// The NCCL communication backend (CUDA tensors). One communicator per group, its unique id
// passed through the Store, created non-blocking (ncclConfig_t::blocking = 0) so that every
// wait is bounded by the group's timeout: the creation, each collective's enqueue (the first
// one connects the peers) and its completion. A timeout, an asynchronous NCCL error (a dead
// peer) or abort() aborts the communicator; the waiting rank gets a TimeoutError/CommError
// naming the operation and the ranks.
//
// Stream-ordered Works (docs/gpu.md, "Stream ordering"): collectives run on a dedicated
// stream that first waits on the device for the ready event the process group recorded on
// the compute stream when the caller issued the operation. The worker queues the collective,
// records its done event and goes on to the next one (no host round trip between DDP's
// buckets); the group's completion thread watches the done event (timeout, NCCL's
// asynchronous errors, abort) and completes the Work. Work::wait() makes the caller's
// compute stream wait for the done event and returns (Work::synchronize() blocks the
// host); the group holds the tensors until the done event completed. A barrier blocks
// the host until it finished on the GPU.
//
// Point-to-point: NCCL has no tags and runs a communicator's operations one after another, so
// a send posted alone waits on the GPU for its receive, and a ring of send-then-recv posted
// one by one deadlocks. Sends and receives are therefore only queued by the worker, and
// posted together as one ncclGroupStart/End (where they progress independently) when the
// next collective is issued, or when the worker has had nothing new to run for
// kP2pCoalesce: operations issued back to back (the ring) always share a group. A group
// still runs after the ones posted before it, so operations that can only finish together
// must be issued together (as PyTorch's batch_isend_irecv). Matching is NCCL's: between two
// ranks, sends and receives pair in the order they are issued; the tag is accepted and
// ignored (as PyTorch's NCCL backend does), so issue a pair's operations in the same order
// on both sides.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::nccl_backend {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendConfig& config);
  ~NcclBackend() override;
  std::string name() const override { return "nccl"; }
  int device() const { return device_; }

  /// How long the worker must have been idle before queued sends/receives are posted alone.
  static constexpr std::chrono::milliseconds kP2pCoalesce{2};

 protected:
  /// Asks the watch loops to abort the communicator (ncclCommAbort, from the thread that is
  /// watching): a stuck operation returns within ~50 us of polling.
  void on_abort() noexcept override { abort_requested_ = true; }
  void run_allreduce(Tensor& t, ReduceOp op, std::uint64_t seq) override;
  void run_broadcast(Tensor& t, int root, std::uint64_t seq) override;
  void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) override;
  void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) override;
  void run_reduce(Tensor& t, int root, ReduceOp op, std::uint64_t seq) override;
  void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) override;
  void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) override;
  void run_barrier(std::uint64_t seq) override;
  void run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) override;
  void run_recv(Tensor& t, int src, int tag, std::uint64_t seq) override;

 private:
  using Clock = std::chrono::steady_clock;
  /// One posted group of sends/receives and the event after it.
  struct P2pBatch {
    cudaEvent_t done = nullptr;
    ~P2pBatch();
  };
  struct P2pOp {
    bool send;
    Tensor tensor;  // keeps the buffer alive until the operation completed
    int peer;
    std::uint64_t seq;
    std::shared_ptr<P2pBatch> batch;  // set when posted (under mu_)
  };

  void create_communicator(const BackendConfig& c);
  /// Makes the comm stream wait for the operation's ready event, runs `enqueue`, records
  /// its done event and hands the watch to the completion thread (a barrier: watches here).
  template <typename Fn>
  void collective(const char* op, std::uint64_t seq, Fn&& enqueue);
  /// ... then runs `after` (more work on the comm stream) once NCCL has enqueued. `scratch`:
  /// tensors this thread allocated for the operation, held until it completed.
  template <typename Fn, typename After>
  void collective(const char* op, std::uint64_t seq, Fn&& enqueue, After&& after, std::vector<Tensor> scratch = {});
  void queue_p2p(bool send, const Tensor& t, int peer, std::uint64_t seq);
  void complete_p2p(P2pOp& op);
  /// Posts every queued send/receive as one group (mu_ held).
  void flush_p2p_locked(const char* op, std::uint64_t seq, Clock::time_point deadline);
  /// Waits until NCCL has enqueued what a non-blocking call started (mu_ held).
  void wait_enqueued_locked(const char* op, std::uint64_t seq, Clock::time_point deadline);
  /// Polls `done` until it completes, the deadline passes, NCCL fails or abort() is called.
  void watch(const char* op, std::uint64_t seq, cudaEvent_t done, Clock::time_point deadline);
  [[noreturn]] void fail_locked(const std::string& message, bool timeout);
  void check_alive_locked(const char* op, std::uint64_t seq) const;
  void check_tensor(const Tensor& t, const char* op) const;
  void ran(std::uint64_t seq) noexcept;
  /// Records, however a run_* hook ends, that the worker ran operation `seq`.
  struct Ran {
    NcclBackend* g;
    std::uint64_t seq;
    ~Ran() { g->ran(seq); }
  };

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // a barrier's, and waits for scratch
  Tensor barrier_;  // one float, allocated by the first barrier

  std::mutex mu_;  // the communicator, the stream's events and the p2p queue (worker and completion thread)
  bool aborted_ = false;
  std::atomic<bool> abort_requested_{false};
  std::vector<std::shared_ptr<P2pOp>> p2p_queue_;
  std::uint64_t ran_ = 0;            // operations the worker has run (its last seq + 1)
  Clock::time_point last_ran_at_{};  // when the worker last finished one
};

}  // namespace phalanx::nccl_backend
