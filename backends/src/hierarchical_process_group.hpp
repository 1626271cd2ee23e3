#pragma once
// The hierarchical backend (public entry: phalanx/backends/hierarchical_process_group.hpp).
// It owns up to three sub-groups and drives them from its group's worker thread, one step
// after another, waiting for each step's Work.
#include <string>
#include <vector>

#include "phalanx/backends/hierarchical_process_group.hpp"

namespace phalanx {

class HierarchicalBackend final : public Backend {
 public:
  HierarchicalBackend(const BackendConfig& config, const HierarchyOptions& options);
  std::string name() const override { return name_; }

 protected:
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
  enum class Level { Intra, Inter, Direct };
  /// Waits for one step; a failure is rethrown with the same type, prefixed with this
  /// group's context (op, rank, which step, the host's ranks).
  void step(const WorkPtr& work, Level level, const char* op, std::uint64_t seq) const;
  void allreduce_impl(Tensor& t, ReduceOp op, std::uint64_t seq, const char* name);
  void broadcast_impl(Tensor& t, int root, std::uint64_t seq, const char* name);
  /// Every rank's input laid end to end in rank order's host blocks: rank q's slice starts
  /// at block_offset(q) * in.numel().
  Tensor allgather_impl(const Tensor& in, std::uint64_t seq, const char* name);
  std::int64_t block_offset(int q) const { return host_index_[q] * max_local_ + local_index_[q]; }
  bool is_leader() const { return local_index_[rank()] == 0; }

  std::string name_;
  std::vector<int> host_index_;   // rank -> host number
  std::vector<int> local_index_;  // rank -> index among its host's ranks
  std::vector<int> leader_;       // host -> its lowest rank
  std::vector<int> host_ranks_;   // the ranks of this rank's host
  int hosts_ = 1, max_local_ = 1;
  ProcessGroupPtr direct_;  // every rank (send/recv)
  ProcessGroupPtr intra_;   // this host's ranks; null when alone on the host
  ProcessGroupPtr inter_;   // the leaders; null on other ranks, or with one host
};

}  // namespace phalanx
