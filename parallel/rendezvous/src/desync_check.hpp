#pragma once
// PHALANX_DEBUG=detail (like TORCH_DISTRIBUTED_DEBUG=DETAIL): before each collective runs,
// every rank posts the collective's signature (op, dtype, shape, root) under its index
// among collectives, reads every other rank's, and fails with DesyncError naming both
// ranks and both calls when they differ. Off by default; then ProcessGroup pays one branch
// per call.
#include <memory>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx::parallel {

/// True for PHALANX_DEBUG=detail; false when unset, empty or "off"; ConfigError otherwise.
bool debug_detail_enabled();

/// The check for a group of `world` ranks whose keys go to `store` (the group's prefixed,
/// failure-aware store).
ProcessGroup::CollectiveCheck make_desync_check(StorePtr store, int rank, int world);

}  // namespace phalanx::parallel
