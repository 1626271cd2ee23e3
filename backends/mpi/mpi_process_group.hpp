#pragma once
// The MPI communication backend (docs/mpi.md): every collective of the ProcessGroup
// interface on one MPI call over a private duplicate of MPI_COMM_WORLD (errors returned,
// never fatal). MPI works on host memory: CPU tensors are used in place; tensors of any other
// device (CUDA, sim) are staged through a host buffer, as the Gloo plugin does.
//
// Operations run on the caller's thread by default (the Backend's inline mode: a 4-byte
// allreduce costs what MPI_Allreduce costs, with no hop to a worker thread); their Work is
// complete when the call returns. PHALANX_MPI_ASYNC=1 runs them on the group's worker thread
// instead (the caller overlaps computation with a collective in flight). Either way send and
// recv only post (MPI_Isend / MPI_Irecv) and complete on the group's completion thread.
// All MPI calls of the process are serialised by one lock (MpiCall, mpi_runtime.hpp: an atomic
// exchange when uncontended), so MPI_THREAD_SERIALIZED suffices.
#include <mpi.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::mpi_backend {

class MpiProcessGroup final : public Backend {
 public:
  explicit MpiProcessGroup(const BackendConfig& config);
  ~MpiProcessGroup() override;
  std::string name() const override { return "mpi"; }

 protected:
  /// The group is going away: a send or recv still waiting ends now (its Work fails).
  void on_close() noexcept override { closing_ = true; }
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
  /// Throws CommError "<describe(op, seq)> failed: MPI: <MPI_Error_string>" unless rc is MPI_SUCCESS.
  void check(int rc, const char* op, std::uint64_t seq) const;
  MPI_Datatype type_of(const Tensor& t) const;
  MPI_Op op_of(const Tensor& t, ReduceOp op) const;
  /// A reusable host buffer of at least `bytes` (used only under the MPI call lock).
  char* scratch(std::size_t bytes);
  /// The completion of a posted send or receive (on the completion thread): MPI_Test under
  /// the MPI call lock, yielding between tests, then sleeping; fails at the group's timeout.
  void wait_request(MPI_Request request, const Tensor& keep_alive, const char* op, std::uint64_t seq);

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op sum_fp16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  int tag_ub_ = 32767;
  std::mutex mpi_mu_;                // guards orphans_ (MPI calls hold MpiCall instead)
  std::vector<char> scratch_;        // under the MPI call lock (MpiCall)
  std::vector<Tensor> orphans_;      // buffers of timed-out requests MPI may still write (under mpi_mu_)
  std::atomic<bool> closing_{false};  // the destructor runs: pending waits end at once
};

}  // namespace phalanx::mpi_backend
