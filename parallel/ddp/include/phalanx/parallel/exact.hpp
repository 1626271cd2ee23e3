#pragma once
// Exact mode's helpers (docs/exact.md): the step's micro-batch counts, checked once for the
// DDP, the sampler and the trainer alike, and the mean of per-micro-batch values (the
// logged loss) with the same bits on any world size.
#include <cstdint>
#include <utility>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/parallel/ddp.hpp"

namespace phalanx::parallel {

/// One optimizer step in exact mode: `micro_batches` (K = global_batch / micro_batch)
/// backward passes over all ranks, `per_rank` (K / world_size) on each.
struct ExactPlan {
  std::int64_t micro_batches = 0;
  std::int64_t per_rank = 0;
};

/// Throws ConfigError (one line, what to do) when exact mode is off, a size is not
/// positive, the micro-batch does not divide the global batch, or the world size does not
/// divide the number of micro-batches.
ExactPlan exact_plan(const ExactMode& mode, int world_size);

/// The mean of `count` values, one per global micro-batch index in [0, count): each rank
/// passes the values of the micro-batches it ran, each with its index. The values are
/// summed in double in index order and divided by `count` once, so the result is the same
/// bits on every rank and on any world size. Collective: one allreduce (sum) of 2 * count
/// int64 on `device` (the process group's device: CUDA for nccl). Throws ValueError for an
/// index out of range or given twice on this rank, and ConfigError on every rank when an
/// index was given by no rank or by several.
double exact_mean(ProcessGroup& pg, const std::vector<std::pair<std::int64_t, double>>& mine,
                  std::int64_t count, Device device = Device::cpu());

}  // namespace phalanx::parallel
