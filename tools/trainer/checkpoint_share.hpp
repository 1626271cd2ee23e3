#pragma once
// Nodes without a shared disk: before the ranks resume, every node's --checkpoint-dir gets
// the job's newest checkpoint that verifies, sent from a rank that has it over the job's
// own process group (docs/checkpoints.md, "How state travels").
#include <phalanx/backends/process_group.hpp>
#include <phalanx/parallel/checkpoint.hpp>

namespace phalanx::trainer {

/// Every rank takes part. Each rank finds the newest checkpoint in its folder that verifies
/// against `expect`; when some rank's is older than the job's newest (another node's folder,
/// empty, older or damaged), the lowest rank holding the newest broadcasts its bytes and the
/// first local rank of each such node writes them into its folder atomically (a temporary
/// file, fsync, rename) and loads it back to verify (its checksums). Returns the step shared
/// (-1: nothing was sent). Throws IoError when the file received does not verify.
std::int64_t share_newest_checkpoint(parallel::CheckpointDir& dir, const parallel::CheckpointExpect& expect,
                                     ProcessGroup& pg, Device device, int local_rank);

}  // namespace phalanx::trainer
