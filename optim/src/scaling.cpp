#include "phalanx/optim/scaling.hpp"

#include <cmath>
#include <sstream>

#include "phalanx/core/error.hpp"

namespace phalanx::optim {

ScalingPlan linear_scaling(const ScalingOptions& o) {
  if (!(o.base_lr > 0)) throw ValueError(detail::concat("linear scaling: base_lr must be > 0, got ", o.base_lr));
  if (o.base_batch < 1)
    throw ValueError(detail::concat("linear scaling: base_batch must be >= 1, got ", o.base_batch));
  if (o.global_batch < 1)
    throw ValueError(detail::concat("linear scaling: global_batch must be >= 1, got ", o.global_batch));
  if (o.world_size < 1)
    throw ValueError(detail::concat("linear scaling: world_size must be >= 1, got ", o.world_size));
  if (o.global_batch < o.world_size)
    throw ValueError(detail::concat("linear scaling: global batch ", o.global_batch,
                                    " is smaller than the world size ", o.world_size,
                                    ": some workers would get no samples; raise the global batch "
                                    "(phalanx-train: --global-batch) or use fewer workers"));
  const std::int64_t rem = o.global_batch % o.world_size;
  if (rem != 0 && o.remainder == RemainderPolicy::Error)
    throw ValueError(detail::concat(
        "linear scaling: world size ", o.world_size, " does not divide the global batch ",
        o.global_batch, " (remainder ", rem, "); choose a global batch that is a multiple of ",
        o.world_size, " (phalanx-train: --global-batch ", o.global_batch - rem, " or ",
        o.global_batch - rem + o.world_size,
        "), or, in C++, allow uneven shares with ScalingOptions::remainder = RemainderPolicy::Uneven"));
  if (o.warmup_epochs < 0) throw ValueError("linear scaling: warmup_epochs must be >= 0");
  if (o.warmup_epochs > 0 && o.dataset_size < 1)
    throw ValueError("linear scaling: warmup in epochs needs the dataset size");

  ScalingPlan p;
  p.scale = static_cast<double>(o.global_batch) / static_cast<double>(o.base_batch);
  p.lr = o.base_lr * p.scale;
  p.per_rank_batch = o.global_batch / o.world_size;
  for (int r = 0; r < o.world_size; ++r) p.rank_batches.push_back(p.per_rank_batch + (r < rem ? 1 : 0));
  p.steps_per_epoch = o.dataset_size > 0 ? (o.dataset_size + o.global_batch - 1) / o.global_batch : 0;
  p.warmup_steps = p.scale > 1.0 && o.warmup_epochs > 0
                       ? static_cast<std::int64_t>(std::ceil(o.warmup_epochs * p.steps_per_epoch))
                       : 0;
  return p;
}

std::string ScalingPlan::describe() const {
  std::ostringstream os;
  std::int64_t global = 0;
  for (auto b : rank_batches) global += b;
  os << "global batch " << global << " = " << rank_batches.size() << " x " << per_rank_batch;
  if (global % static_cast<std::int64_t>(rank_batches.size()) != 0) os << " (uneven)";
  os << ", lr x " << scale << " = " << lr;
  if (warmup_steps > 0) os << ", warmup " << warmup_steps << " steps";
  return os.str();
}

}  // namespace phalanx::optim
