#pragma once
// The Gloo communication backend over TCP, Debian's libgloo 0.5. Gloo works on host memory:
// CPU tensors are used in place; tensors of any other device (CUDA, sim) are staged through
// a host buffer (copied in, the operation, copied back), as PyTorch's Gloo backend does.
//
// The pieces: gloo_options (the environment), gloo_algorithm_policy (which allreduce for
// which message), this class (the connections, abort), gloo_collectives.cpp and
// gloo_p2p.cpp (the run_* hooks), gloo_support.hpp (what those two share).
#include <memory>

#include "gloo_options.hpp"
#include "phalanx/backends/backend.hpp"
#include "phalanx/backends/process_group.hpp"  // BackendConfig

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace phalanx::gloo_backend {

class GlooBackend final : public Backend {
 public:
  /// Connects the event-driven full mesh and, unless PHALANX_GLOO_SYNC_MAX_BYTES=0 or alone,
  /// the busy-polling one, through config.store (a TimeoutError names a peer that did not
  /// connect in time).
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
  /// Runs `fn`, turning Gloo's exceptions into TimeoutError / CommError that name the
  /// operation (gloo_support.hpp).
  template <typename Fn>
  void guarded(const char* op, std::uint64_t seq, Fn&& fn);
  void allreduce_impl(Tensor& t, ReduceOp op, std::uint64_t seq);

  GlooOptions options_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  // A second full mesh whose pairs are in synchronous busy-poll mode: the worker reads the
  // socket itself instead of waiting for Gloo's event-loop thread, which cuts the latency
  // of small allreduces (docs/algorithms.md). Null when disabled.
  std::shared_ptr<::gloo::Context> sync_context_;
};

}  // namespace phalanx::gloo_backend
