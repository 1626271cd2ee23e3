#include "phalanx/samplers/micro_batch_sampler.hpp"

#include "phalanx/core/error.hpp"
#include "phalanx/core/world.hpp"
#include "phalanx/samplers/distributed_sampler.hpp"

namespace phalanx::samplers {

MicroBatchSampler::MicroBatchSampler(std::int64_t n, const MicroBatchSamplerOptions& o)
    : n_(n), global_(o.global_batch), micro_(o.micro_batch), shuffle_(o.shuffle), drop_last_(o.drop_last), seed_(o.seed) {
  if (o.num_replicas == -1 || o.rank == -1) require_world_initialized("MicroBatchSampler");
  const WorldInfo world = default_world();
  num_replicas_ = o.num_replicas == -1 ? world.size : o.num_replicas;
  rank_ = o.rank == -1 ? world.rank : o.rank;
  if (num_replicas_ < 1)
    throw ValueError(detail::concat("MicroBatchSampler: num_replicas must be >= 1, got ", num_replicas_));
  if (rank_ < 0 || rank_ >= num_replicas_)
    throw ValueError(detail::concat("MicroBatchSampler: rank ", rank_, " is outside [0, ", num_replicas_,
                                    "); ranks count from 0 to num_replicas - 1"));
  if (n <= 0) throw ValueError(detail::concat("MicroBatchSampler: the dataset is empty (", n, " samples)"));
  if (global_ < 1) throw ValueError(detail::concat("MicroBatchSampler: the global batch must be >= 1, got ", global_));
  if (micro_ < 1) throw ValueError(detail::concat("MicroBatchSampler: the micro-batch must be >= 1, got ", micro_));
  if (global_ % micro_ != 0)
    throw ValueError(detail::concat("MicroBatchSampler: the micro-batch ", micro_, " does not divide the global batch ",
                                    global_, "; choose a divisor of ", global_));
  const std::int64_t per_step = global_ / micro_;
  if (per_step % num_replicas_ != 0)
    throw ValueError(detail::concat("MicroBatchSampler: ", num_replicas_, " workers do not divide the ", per_step,
                                    " micro-batches of a step (global batch ", global_, " / micro-batch ", micro_,
                                    "); use a number of workers that divides ", per_step));
  if (drop_last_ && n < global_)
    throw ValueError(detail::concat("MicroBatchSampler: drop_last with a global batch of ", global_, " and only ", n,
                                    " samples leaves no step; disable drop_last or lower the global batch"));
  per_rank_ = per_step / num_replicas_;
  steps_ = drop_last_ ? n / global_ : (n + global_ - 1) / global_;
}

std::vector<std::int64_t> MicroBatchSampler::epoch_order() const {
  // The order itself is DistributedSampler's for one replica (the same shuffle rule).
  DistributedSampler base(n_, DistributedSamplerOptions().num_replicas(1).rank(0).shuffle(shuffle_).seed(seed_));
  base.set_epoch(epoch_);
  std::vector<std::int64_t> order = base.epoch_order();
  const std::int64_t total = steps_ * global_;
  if (total < n_) {
    order.resize(static_cast<std::size_t>(total));
  } else {
    order.reserve(static_cast<std::size_t>(total));
    for (std::int64_t i = 0; static_cast<std::int64_t>(order.size()) < total; ++i)
      order.push_back(order[static_cast<std::size_t>(i % n_)]);
  }
  return order;
}

std::vector<std::int64_t> MicroBatchSampler::indices() const {
  const std::vector<std::int64_t> order = epoch_order();
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(size()));
  const std::int64_t block = per_rank_ * micro_;  // this rank's samples of a step
  for (std::int64_t t = 0; t < steps_; ++t) {
    const auto first = order.begin() + (t * global_ + rank_ * block);
    out.insert(out.end(), first, first + block);
  }
  return out;
}

}  // namespace phalanx::samplers
