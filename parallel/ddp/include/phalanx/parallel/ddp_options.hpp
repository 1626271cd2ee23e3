#pragma once
// DistributedDataParallel's options (docs/ddp.md), chainable as libtorch's:
//   parallel::DDPOptions().bucket_cap_mb(50).find_unused_parameters(true)
#include <cstdint>

#include "phalanx/core/arg.hpp"

namespace phalanx::parallel {

/// Exact mode (docs/exact.md): the same bits on any number of workers. The global batch is
/// split into micro-batches of a fixed size; each rank runs forward and backward once per
/// micro-batch it owns (micro_batches_per_rank() of them per step), and the backward of the
/// last one leaves in every .grad() the mean over the global batch, summed in 64-bit fixed
/// point so that the order of addition (hence the world size) does not matter.
struct ExactMode {
  bool enabled = false;
  std::int64_t global_batch = 0;  ///< samples per optimizer step, all ranks together
  std::int64_t micro_batch = 0;   ///< samples per forward/backward; divides global_batch
};

struct DDPOptions {
  DDPOptions() = default;
  PHALANX_ARG(double, bucket_cap_mb) = 25.0;      ///< bucket size after the first
  PHALANX_ARG(double, first_bucket_mb) = 1.0;     ///< the first bucket (the last layers) is small so it starts early
  PHALANX_ARG(bool, find_unused_parameters) = false;  ///< walk the graph each forward; unused parameters count as ready
  PHALANX_ARG(bool, broadcast_buffers) = true;    ///< broadcast buffers from rank 0 before each forward
  PHALANX_ARG(ExactMode, exact) = {};             ///< bit-exact across world sizes (off by default)
};

}  // namespace phalanx::parallel
