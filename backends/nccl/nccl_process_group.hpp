#pragma once
// The NCCL communication backend (CUDA tensors). One communicator per group, its unique id
// passed through the Store. Collectives run on a dedicated stream that first waits (an
// event, no host synchronisation) for the work already queued on the compute stream. The
// group's worker thread then watches the collective: when it does not finish within the
// timeout, or NCCL reports an asynchronous error (a dead peer), the communicator is
// aborted and the waiting rank gets a TimeoutError/CommError instead of a hang.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::nccl_backend {

class NcclProcessGroup : public ProcessGroup {
 public:
  explicit NcclProcessGroup(const BackendConfig& config);
  ~NcclProcessGroup() override;
  std::string backend_name() const override { return "nccl"; }
  int device() const { return device_; }

 protected:
  /// Asks the worker's watch loop to abort the communicator (ncclCommAbort, from the
  /// worker thread, which owns it): a stuck collective returns within ~50 us of polling.
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
  /// Makes the comm stream wait for the compute stream, runs `enqueue`, then watches.
  template <typename Fn>
  void collective(const char* op, std::uint64_t seq, Fn&& enqueue);
  void check_tensor(const Tensor& t, const char* op) const;

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool aborted_ = false;
  std::atomic<bool> abort_requested_{false};
};

}  // namespace phalanx::nccl_backend
