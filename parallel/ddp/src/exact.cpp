// Exact mode's helpers: see phalanx/parallel/exact.hpp and docs/exact.md.
#include "phalanx/parallel/exact.hpp"

#include <cstring>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/core/kernels.hpp"

namespace phalanx::parallel {

ExactPlan exact_plan(const ExactMode& mode, int world_size) {
  if (!mode.enabled) throw ConfigError("exact mode: not enabled (set DDPOptions::exact.enabled)");
  if (mode.global_batch <= 0 || mode.micro_batch <= 0)
    throw ConfigError(detail::concat("exact mode: the global batch (", mode.global_batch, ") and the micro-batch (",
                                     mode.micro_batch, ") must be positive"));
  if (mode.global_batch % mode.micro_batch != 0)
    throw ConfigError(detail::concat("exact mode: the micro-batch (", mode.micro_batch,
                                     ") does not divide the global batch (", mode.global_batch,
                                     "); pick a micro-batch that divides it"));
  ExactPlan plan;
  plan.micro_batches = mode.global_batch / mode.micro_batch;
  if (plan.micro_batches > (std::int64_t{1} << 30))
    throw ConfigError(detail::concat("exact mode: ", plan.micro_batches,
                                     " micro-batches per step is too many (at most 2^30); raise the micro-batch"));
  if (world_size <= 0 || plan.micro_batches % world_size != 0)
    throw ConfigError(detail::concat("exact mode: the world size (", world_size, ") does not divide the ",
                                     plan.micro_batches, " micro-batches of a step (global batch ", mode.global_batch,
                                     " / micro-batch ", mode.micro_batch,
                                     "); run on a number of workers that divides it, or change the batch sizes"));
  plan.per_rank = plan.micro_batches / world_size;
  return plan;
}

double exact_mean(ProcessGroup& pg, const std::vector<std::pair<std::int64_t, double>>& mine, std::int64_t count,
                  Device device) {
  if (count <= 0) throw ValueError(detail::concat("exact_mean: count must be positive, got ", count));
  // Slot i holds value i's bit pattern (zero on the ranks that did not run micro-batch i),
  // slot count + i how many ranks gave it: one nonzero term per slot, so the integer sum
  // is the value itself, whatever the order of addition.
  std::vector<std::int64_t> host(static_cast<std::size_t>(2 * count), 0);
  for (const auto& [index, value] : mine) {
    if (index < 0 || index >= count)
      throw ValueError(detail::concat("exact_mean: micro-batch index ", index, " is outside [0, ", count, ")"));
    if (host[count + index] != 0)
      throw ValueError(detail::concat("exact_mean: micro-batch index ", index, " is given twice on this rank"));
    std::memcpy(&host[index], &value, sizeof(double));
    host[count + index] = 1;
  }
  if (pg.size() > 1) {
    DeviceKernels& k = kernels_for(device);
    Tensor t = Tensor::empty({2 * count}, DType::Int64, device);
    k.copy_from_host(t.raw_data(), host.data(), host.size() * 8);
    pg.allreduce(t, ReduceOp::Sum)->wait();
    k.copy_to_host(host.data(), t.raw_data(), host.size() * 8);
  }
  double sum = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    if (host[count + i] != 1)
      throw ConfigError(detail::concat("exact_mean: micro-batch index ", i, " was given by ", host[count + i],
                                       " rank(s) instead of exactly one; every index in [0, ", count,
                                       ") must come from one rank"));
    double v;
    std::memcpy(&v, &host[i], sizeof(double));
    sum += v;
  }
  return sum / static_cast<double>(count);
}

}  // namespace phalanx::parallel
