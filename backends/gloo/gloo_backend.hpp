#pragma once
// The Gloo communication backend over TCP, Debian's libgloo 0.5. Gloo works on host memory:
// CPU tensors are used in place; tensors of any other device (CUDA, sim) are staged through
// a host buffer (copied in, the operation, copied back), as PyTorch's Gloo backend does.
//
// The pieces: gloo_options (the environment), gloo_algorithm_policy (which allreduce for
// which message), this class (the connections, abort), gloo_collectives.cpp and
// gloo_p2p.cpp (the run_* hooks), gloo_support.hpp (what those two share).
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "gloo_options.hpp"
#include "phalanx/backends/backend.hpp"
#include "phalanx/backends/process_group.hpp"  // BackendConfig

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
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
  /// Ends the waits of the posted sends and receives (UnboundBuffer::abortWaitSend/Recv):
  /// their Works fail at once with "the process group was destroyed before it completed".
  /// A collective running on the worker is left alone (the group waits for it).
  void on_close() noexcept override;
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
  /// Returns once every rank has built its meshes (gloo_backend.cpp says why).
  static void wait_until_all_connected(const BackendConfig& c);
  template <typename Fn>
  void guarded(const char* op, std::uint64_t seq, Fn&& fn);
  void allreduce_impl(Tensor& t, ReduceOp op, std::uint32_t tag);
  /// The tag of the next collective: a count of collectives only, so that ranks that ran
  /// different numbers of sends and receives (the group's sequence number counts those
  /// too) still agree. Called once per collective, on the worker thread, in issue order.
  std::uint32_t next_collective_tag() { return collectives_++ & 0x7fffffffu; }
  /// A posted send or receive, until its wait ends (on_close aborts the waits).
  struct Posted {
    std::shared_ptr<::gloo::transport::UnboundBuffer> buf;
    Tensor host;  ///< the memory it reads or writes
    bool is_send;
  };
  void post(const std::shared_ptr<::gloo::transport::UnboundBuffer>& buf, const Tensor& host, bool is_send);
  /// Waits for a posted send or receive; throws CommError when the group is destroyed first.
  void wait_posted(const std::shared_ptr<::gloo::transport::UnboundBuffer>& buf, bool is_send,
                   const char* op, std::uint64_t seq);

  GlooOptions options_;
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;
  // A second full mesh whose pairs are in synchronous busy-poll mode: the worker reads the
  // socket itself instead of waiting for Gloo's event-loop thread, which cuts the latency
  // of small allreduces (docs/algorithms.md). Null when disabled.
  std::shared_ptr<::gloo::Context> sync_context_;
  std::uint32_t collectives_ = 0;  ///< collectives issued (the worker's alone)
  std::mutex posted_mu_;
  std::vector<Posted> posted_;      ///< sends and receives whose wait has not ended (or was aborted)
  bool closing_ = false;            ///< on_close ran (under posted_mu_)
};

}  // namespace phalanx::gloo_backend
