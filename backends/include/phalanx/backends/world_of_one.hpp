#pragma once
#include "phalanx/backends/process_group.hpp"

namespace phalanx {

/// The built-in backend "single": a world of one, so every program runs as one process
/// with no plugin, launcher or network. Collectives are identities (allgather/gather/
/// scatter copy), done inline on the caller's thread with completed Work.
class WorldOfOneBackend final : public Backend {
 public:
  explicit WorldOfOneBackend(std::chrono::milliseconds timeout = default_timeout());
  std::string name() const override { return "single"; }

 protected:
  void run_allreduce(Tensor&, ReduceOp, std::uint64_t) override {}
  void run_broadcast(Tensor&, int, std::uint64_t) override {}
  void run_allgather(std::vector<Tensor>& out, const Tensor& in, std::uint64_t seq) override;
  void run_reduce_scatter(Tensor& out, std::vector<Tensor>& in, ReduceOp op, std::uint64_t seq) override;
  void run_reduce(Tensor&, int, ReduceOp, std::uint64_t) override {}
  void run_gather(std::vector<Tensor>& out, const Tensor& in, int root, std::uint64_t seq) override;
  void run_scatter(Tensor& out, std::vector<Tensor>& in, int root, std::uint64_t seq) override;
  void run_barrier(std::uint64_t) override {}
  void run_send(const Tensor& t, int dst, int tag, std::uint64_t seq) override;
  void run_recv(Tensor& t, int src, int tag, std::uint64_t seq) override;
};

/// A process group over a WorldOfOneBackend (what backend "single" creates).
ProcessGroupPtr make_world_of_one(std::chrono::milliseconds timeout = default_timeout());

}  // namespace phalanx
