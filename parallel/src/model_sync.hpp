#pragma once
// DDP's construction-time checks and broadcasts.
#include <string>
#include <utility>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx::parallel {

/// Every rank's parameter names and shapes must equal rank 0's. On a mismatch every rank
/// (rank 0 included) throws the same ConfigError naming the first difference and the ranks.
void verify_same_model(ProcessGroup& pg, const std::vector<std::pair<std::string, Tensor>>& named);

/// Broadcasts the tensors from `root`, packed into one buffer per dtype (one collective).
void broadcast_coalesced(ProcessGroup& pg, const std::vector<Tensor>& tensors, int root = 0);

}  // namespace phalanx::parallel
