#include "phalanx/samplers/distributed_sampler.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/samplers/shuffle.hpp"

namespace phalanx::samplers {

DistributedSampler::DistributedSampler(std::int64_t n, const DistributedSamplerOptions& o)
    : n_(n), shuffle_(o.shuffle()), drop_last_(o.drop_last()), seed_(o.seed()) {
  // Defaulting to the world of one when the launcher started several workers would make
  // each worker read the whole dataset alone.
  if (o.num_replicas() == -1 || o.rank() == -1) require_world_initialized("DistributedSampler");
  const WorldInfo world = default_world();
  num_replicas_ = o.num_replicas() == -1 ? world.size : o.num_replicas();
  rank_ = o.rank() == -1 ? world.rank : o.rank();
  // num_replicas given, rank taken from a world of another size: the ranks would read the
  // wrong shards silently (num_replicas(4) on 2 workers: half the data is never seen).
  if (o.num_replicas() != -1 && o.rank() == -1 && num_replicas_ != world.size)
    throw ConfigError(detail::concat("DistributedSampler: num_replicas ", num_replicas_,
                                     " was given but rank was not, and the world has ", world.size,
                                     " rank(s): set both num_replicas and rank, or neither"));
  if (num_replicas_ < 1)
    throw ValueError(detail::concat("DistributedSampler: num_replicas must be >= 1, got ", num_replicas_));
  if (rank_ < 0 || rank_ >= num_replicas_)
    throw ValueError(detail::concat("DistributedSampler: rank ", rank_, " is outside [0, ",
                                    num_replicas_, "); ranks count from 0 to num_replicas - 1"));
  if (n <= 0)
    throw ValueError(detail::concat("DistributedSampler: the dataset is empty (", n, " samples)"));
  if (drop_last_ && n % num_replicas_ != 0) {
    if (n < num_replicas_)
      throw ValueError(detail::concat(
          "DistributedSampler: ", n, " samples with drop_last across ", num_replicas_,
          " replicas leaves every rank with 0 samples; disable drop_last (samples are then "
          "repeated so each rank gets one) or use at most ", n, " workers"));
    num_samples_ = (n - num_replicas_ + num_replicas_ - 1) / num_replicas_;  // ceil((N-W)/W)
  } else {
    num_samples_ = (n + num_replicas_ - 1) / num_replicas_;  // ceil(N/W)
  }
}

std::vector<std::int64_t> DistributedSampler::epoch_order() const {
  std::vector<std::int64_t> order;
  if (shuffle_) {
    order = shuffled_order(n_, seed_, epoch_);
  } else {
    order.resize(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) order[i] = i;
  }
  const std::int64_t total = total_size();
  if (!drop_last_) {
    // Pad by repeating the head of the order (cyclically when padding exceeds N).
    for (std::int64_t i = 0; static_cast<std::int64_t>(order.size()) < total; ++i)
      order.push_back(order[static_cast<std::size_t>(i % n_)]);
  } else {
    order.resize(static_cast<std::size_t>(total));
  }
  return order;
}

std::vector<std::int64_t> DistributedSampler::indices() const {
  const std::vector<std::int64_t> order = epoch_order();
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(num_samples_));
  for (std::int64_t i = rank_; i < total_size(); i += num_replicas_) out.push_back(order[i]);
  return out;
}

BatchSampler::BatchSampler(SamplerPtr sampler, std::int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  if (!sampler_) throw ValueError("BatchSampler: sampler is null");
  if (batch_size < 1)
    throw ValueError(detail::concat("BatchSampler: batch size must be >= 1, got ", batch_size));
}

std::int64_t BatchSampler::num_batches() const {
  const std::int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

std::vector<std::vector<std::int64_t>> BatchSampler::batches() const {
  const auto idx = sampler_->indices();
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t b = 0; b < idx.size(); b += batch_size_) {
    const std::size_t e = std::min(idx.size(), b + batch_size_);
    if (drop_last_ && e - b < static_cast<std::size_t>(batch_size_)) break;
    out.emplace_back(idx.begin() + b, idx.begin() + e);
  }
  return out;
}

}  // namespace phalanx::samplers
