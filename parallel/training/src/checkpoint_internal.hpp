#pragma once
// Shared by checkpoint.cpp and checkpoint_dir.cpp.
#include <cstdint>

namespace phalanx::parallel::ckpt_internal {

/// Throws ConfigError unless `step` is set (>= 0): CheckpointState.step defaults to -1.
void require_step_set(std::int64_t step);

}  // namespace phalanx::parallel::ckpt_internal
