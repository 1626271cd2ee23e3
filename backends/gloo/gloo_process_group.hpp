#pragma once
// The Gloo communication backend over TCP, Debian's libgloo 0.5. Gloo works on host memory:
// CPU tensors are used in place; tensors of any other device (CUDA, sim) are staged through
// a host buffer (copied in, the operation, copied back), as PyTorch's Gloo backend does.
#include <memory>

#include "phalanx/backends/process_group.hpp"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace phalanx::gloo_backend {

/// Allreduce algorithm (docs/algorithms.md): halving-doubling over the busy-polling mesh, in
/// pieces of PHALANX_GLOO_SYNC_CHUNK_BYTES (default 1 MiB), for messages of at most
/// PHALANX_GLOO_SYNC_MAX_BYTES (default: all; 0 disables the mesh); above that, or with
/// PHALANX_GLOO_ALLREDUCE=ring|bcube|ring_chunked|halving_doubling, Gloo's event-driven mesh.
/// PHALANX_GLOO_BUSY_POLL=0 makes the sync mesh block instead of spin.
enum class AllreduceAlgo { Auto, Ring, Bcube, RingChunked, HalvingDoubling };

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const BackendConfig& config);
  ~GlooBackend() override;
  std::string name() const override { return "gloo"; }

 protected:
  /// Fails every pair of the event-driven mesh (on a thread of its own), which wakes the
  /// operations waiting on them: a stuck broadcast, barrier, allgather, ... or large
  /// allreduce returns at once. An allreduce on the busy-polling mesh (small messages)
  /// holds its pair's lock and still ends at its timeout (Gloo offers no way in).
  void on_abort() noexcept override;
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
  template <typename Fn>
  void guarded(const char* op, std::uint64_t seq, Fn&& fn);
  void allreduce_impl(Tensor& t, ReduceOp op, std::uint64_t seq);

  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  // A second full mesh whose pairs are in synchronous busy-poll mode: the worker reads the
  // socket itself instead of waiting for Gloo's event-loop thread, which cuts the latency
  // of small allreduces (docs/algorithms.md). Null when disabled.
  std::shared_ptr<::gloo::Context> sync_context_;
  std::size_t sync_max_bytes_ = 0;
  std::size_t sync_chunk_bytes_ = 1u << 20;  ///< PHALANX_GLOO_SYNC_CHUNK_BYTES
  AllreduceAlgo algo_ = AllreduceAlgo::Auto;
};

}  // namespace phalanx::gloo_backend
