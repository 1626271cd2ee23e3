#pragma once
// What the Gloo backend reads from the environment, parsed once when a group is created
// (docs/algorithms.md); a bad value is a ConfigError naming the variable.
#include <cstddef>
#include <limits>

namespace phalanx::gloo_backend {

/// PHALANX_GLOO_ALLREDUCE: auto (the default: gloo_algorithm_policy.hpp decides), or one of
/// Gloo's algorithms on the event-driven mesh for every size.
enum class AllreduceAlgo { Auto, Ring, Bcube, RingChunked, HalvingDoubling };

struct GlooOptions {
  AllreduceAlgo algo = AllreduceAlgo::Auto;  ///< PHALANX_GLOO_ALLREDUCE
  /// PHALANX_GLOO_SYNC_MAX_BYTES: the largest allreduce on the busy-polling mesh (default:
  /// every size; 0 disables that mesh).
  std::size_t sync_max_bytes = std::numeric_limits<std::size_t>::max();
  std::size_t sync_chunk_bytes = std::size_t(1) << 20;  ///< PHALANX_GLOO_SYNC_CHUNK_BYTES
  bool busy_poll = true;  ///< PHALANX_GLOO_BUSY_POLL=0/1; default: spin while the machine's ranks fit its cores

  /// Reads the variables above; throws ConfigError for a value it cannot use.
  /// `ranks_on_machine`: the job's ranks on this machine (0: unknown); more than its usable
  /// cores and the sync mesh blocks instead of spinning, unless PHALANX_GLOO_BUSY_POLL says.
  static GlooOptions from_env(int ranks_on_machine);
};

}  // namespace phalanx::gloo_backend
