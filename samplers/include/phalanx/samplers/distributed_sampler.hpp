#pragma once
#include "phalanx/core/arg.hpp"
#include "phalanx/samplers/sampler.hpp"

namespace phalanx::samplers {

/// Chainable, as libtorch's: `DistributedSamplerOptions().shuffle(false).seed(7)`.
struct DistributedSamplerOptions {
  DistributedSamplerOptions() = default;
  /// -1: the default world's size (1 before init_process_group; with -1 here or for rank,
  /// a launch environment of WORLD_SIZE > 1 without an initialised group is an error)
  PHALANX_ARG(int, num_replicas) = -1;
  PHALANX_ARG(int, rank) = -1;          ///< -1: the default world's rank
  PHALANX_ARG(bool, shuffle) = true;
  PHALANX_ARG(std::uint64_t, seed) = 0;
  PHALANX_ARG(bool, drop_last) = false;
};

/// PyTorch's DistributedSampler, index arithmetic for index arithmetic:
///   num_samples = ceil(N / W), or ceil((N - W) / W) with drop_last when N % W != 0
///   total_size  = num_samples * W
///   order       = shuffled_order(N, seed, epoch) or 0..N-1
///   pad by repeating the head of the order up to total_size (or cut to total_size with
///   drop_last), then rank r takes positions r, r + W, r + 2W, ...
/// So step k's global batch (B divisible by W) is positions [kB, (k+1)B) of the order,
/// whatever W is.
class DistributedSampler : public Sampler {
 public:
  explicit DistributedSampler(std::int64_t dataset_size, const DistributedSamplerOptions& options = {});
  std::vector<std::int64_t> indices() const override;
  std::int64_t size() const override { return num_samples_; }
  bool shuffles() const override { return shuffle_; }
  std::int64_t total_size() const { return num_samples_ * num_replicas_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  /// The padded epoch order before slicing (every rank computes the same).
  std::vector<std::int64_t> epoch_order() const;

 private:
  std::int64_t n_;
  int num_replicas_, rank_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_;
  std::int64_t num_samples_;
};

/// Groups another sampler's indices into batches.
class BatchSampler {
 public:
  BatchSampler(SamplerPtr sampler, std::int64_t batch_size, bool drop_last = false);
  std::vector<std::vector<std::int64_t>> batches() const;
  std::int64_t num_batches() const;
  Sampler& sampler() { return *sampler_; }

 private:
  SamplerPtr sampler_;
  std::int64_t batch_size_;
  bool drop_last_;
};

}  // namespace phalanx::samplers
