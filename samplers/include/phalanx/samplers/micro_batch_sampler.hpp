#pragma once
// Exact mode's sampler (docs/samplers.md, docs/exact.md): the sample -> micro-batch
// assignment does not depend on the number of workers; the world size only decides which
// rank computes which micro-batches.
//
//   order    = DistributedSampler's epoch order for one replica (shuffled_order(N, seed,
//              epoch), or 0..N-1 without shuffling)
//   padded   = order repeated from its start (cyclically) up to the next multiple of B,
//              or cut to the last multiple of B with drop_last
//   step t   = positions [tB, (t+1)B) of padded          (steps_per_epoch = |padded| / B)
//   micro j  = positions [tB + jM, tB + (j+1)M)           (j = 0 .. B/M - 1)
//   rank r   = the contiguous block j = rK .. rK + K - 1,   K = B / (M W)
//
// indices() yields this rank's micro-batches step by step, so a DataLoader with batch size M
// over it gives K micro-batches per step, in global micro-batch order.
#include <cstdint>
#include <vector>

#include "phalanx/samplers/sampler.hpp"

namespace phalanx::samplers {

struct MicroBatchSamplerOptions {
  std::int64_t global_batch = 0;  ///< B: samples per optimizer step, all ranks together
  std::int64_t micro_batch = 0;   ///< M: samples per forward/backward; divides B
  /// -1: the default world's size/rank (as DistributedSampler); W must divide B / M
  int num_replicas = -1;
  int rank = -1;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

class MicroBatchSampler : public Sampler {
 public:
  /// Throws ValueError (one line, what to change) for an empty dataset, M < 1, B < 1,
  /// M not dividing B, W not dividing B / M, a rank outside [0, W), or drop_last with N < B.
  MicroBatchSampler(std::int64_t dataset_size, const MicroBatchSamplerOptions& options = {});
  /// This rank's samples of the epoch: for each step, its K micro-batches in order.
  std::vector<std::int64_t> indices() const override;
  std::int64_t size() const override { return steps_ * per_rank_ * micro_; }
  bool shuffles() const override { return shuffle_; }

  /// The padded epoch order (every rank computes the same, whatever W is).
  std::vector<std::int64_t> epoch_order() const;
  std::int64_t steps_per_epoch() const { return steps_; }
  std::int64_t micro_batches_per_step() const { return global_ / micro_; }  ///< B / M
  std::int64_t micro_batches_per_rank() const { return per_rank_; }         ///< K = B / (M W)
  /// The global index j (0 .. B/M - 1) of this rank's k-th micro-batch of a step.
  std::int64_t micro_batch_index(std::int64_t k) const { return rank_ * per_rank_ + k; }
  std::int64_t global_batch() const { return global_; }
  std::int64_t micro_batch() const { return micro_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  std::int64_t n_, global_, micro_;
  int num_replicas_, rank_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_;
  std::int64_t steps_ = 0, per_rank_ = 0;
};

}  // namespace phalanx::samplers
