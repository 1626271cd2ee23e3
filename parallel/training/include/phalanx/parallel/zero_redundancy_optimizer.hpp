#pragma once
// ZeroRedundancyOptimizer (ZeRO stage 1; PyTorch 1.13's torch.distributed.optim.
// ZeroRedundancyOptimizer, docs/ddp.md "ZeRO"): the optimizer state is sharded across the
// ranks. Parameters are partitioned greedily by size (largest first, each to the rank with
// the fewest elements so far, as PyTorch); each rank keeps an inner optimizer over its own
// shard only, steps it, and then every rank's updated shard is broadcast from its owner
// (one broadcast of a persistent flat buffer per rank), so all ranks end each step with
// the same parameters while each holds about 1/W of the state.
//
//   DDP ddp(model);
//   parallel::ZeroRedundancyOptimizer opt(ddp.parameters(), [](std::vector<Tensor> shard) {
//     return std::make_unique<optim::Adam>(std::move(shard), optim::AdamOptions{1e-3});
//   });
//   ... loss.backward(); opt.step(); ...
//   opt.consolidate_state_dict(0);               // every rank calls it
//   if (rank == 0) save(opt.state_dict());       // the replicated Adam's format
//
// It is an optim::Optimizer: one parameter group, or several given to the constructor as
// PyTorch's list of dicts (ZeroGroup: e.g. nanoGPT's AdamW with and without weight decay).
// Learning-rate schedulers drive its param_groups() and each step passes every group's
// options to the inner optimizer's group over this rank's part of it. Parameters are
// numbered across groups in group order, as in the replicated optimizer's state_dict.
#include <functional>
#include <memory>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/optim/optimizer.hpp"
#include "phalanx/parallel/join.hpp"

namespace phalanx::parallel {

/// Builds the inner optimizer over a list of parameters (called once for this rank's shard,
/// and once over all parameters to learn the defaults; optimizers allocate state lazily).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

/// One parameter group for ZeroRedundancyOptimizer's grouped constructor: its parameters and
/// the options that differ from the factory optimizer's defaults ({{"weight_decay", 0.0}}).
struct ZeroGroup {
  std::vector<Tensor> params;
  optim::Options overrides;
};

class ZeroRedundancyOptimizer : public optim::Optimizer, public Joinable {
 public:
  /// Parameters: float32 leaves on one device, the same list on every rank. pg: default group.
  ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make_optimizer,
                          ProcessGroupPtr pg = nullptr);
  /// Several groups (PyTorch's ZeroRedundancyOptimizer([{"params": ...}, ...])): each group
  /// is partitioned across the ranks in turn (largest first, to the rank with the fewest
  /// elements so far, as PyTorch), and each rank's inner optimizer has one group per group
  /// it owns parameters of. add_param_group after construction is not supported.
  ZeroRedundancyOptimizer(std::vector<ZeroGroup> groups, OptimizerFactory make_optimizer,
                          ProcessGroupPtr pg = nullptr);
  ~ZeroRedundancyOptimizer() override;

  /// Steps this rank's shard, then broadcasts every shard from its owner.
  void step() override;
  const char* name() const override { return "ZeroRedundancyOptimizer"; }

  /// The rank that owns parameter i (its index in the constructor's list).
  int owner_of(std::size_t param) const { return owner_[param]; }
  /// Parameter indices owned by `rank`, ascending.
  const std::vector<std::size_t>& shard(int rank) const { return shards_[rank]; }
  /// The optimizer over this rank's shard (null when the shard is empty).
  optim::Optimizer* local_optimizer() { return local_.get(); }
  /// Bytes of optimizer state this rank holds (its shard's buffers and step counters).
  std::size_t state_bytes() const;

  /// Collective (every rank calls it): gathers every rank's shard state to rank `to`, which
  /// then answers state_dict() with the replicated optimizer's format and indices.
  void consolidate_state_dict(int to = 0);
  /// On the rank that consolidated last: the full state (replicated format). Elsewhere, or
  /// before consolidate_state_dict, throws ValueError saying so.
  TensorMap state_dict() const override;
  /// Takes a full state dict (the replicated optimizer's or a consolidated one): each rank
  /// keeps its shard's entries. Every rank calls it with the same map.
  void load_state_dict(const TensorMap& state) override;

  // Join: a joined rank shadows the broadcasts of each step.
  void join_main_hook() override { sync_params(); }
  Device join_device() const override { return device_; }
  ProcessGroup& join_process_group() override { return *pg_; }

 private:
  void sync_params();
  ProcessGroupPtr pg_;
  Device device_;
  std::vector<Tensor> params_;
  std::vector<int> owner_;
  std::vector<std::vector<std::size_t>> shards_;
  std::vector<Tensor> flat_;                // per rank: its shard's parameters, packed
  std::vector<std::vector<Tensor>> views_;  // per rank: views of flat_ shaped like its parameters
  std::unique_ptr<optim::Optimizer> local_;
  std::size_t group_count_ = 1;            // groups given at construction
  std::vector<std::size_t> local_groups_;  // per inner group: the outer group it is part of
  TensorMap consolidated_;
  bool has_consolidated_ = false;
};

/// Bytes of optimizer state `opt` holds (its buffers and step counters): the replicated
/// optimizer's figure to compare ZeroRedundancyOptimizer::state_bytes() with.
std::size_t optimizer_state_bytes(const optim::Optimizer& opt);

}  // namespace phalanx::parallel
