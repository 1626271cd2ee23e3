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
/// A node that received prunes its folder as a saving rank 0 prunes its own: the newest
/// `keep_last` checkpoints stay (--keep-checkpoints; damaged files passed over are neither
/// counted nor removed; a folder whose newest file is another run's, which does not load
/// here, is not pruned at all). After a transfer that failed, the first local rank removes its
/// temporary and those a killed process left (remove_stale_received_temps, which the
/// trainer also calls at start on every node's first local rank); never another file.
std::int64_t share_newest_checkpoint(parallel::CheckpointDir& dir, const parallel::CheckpointExpect& expect,
                                     ProcessGroup& pg, Device device, int local_rank, int keep_last);

/// The temporary a transfer into `path` writes first: <path>.tmp.recv-<pid>-<host>.
std::string received_temp_name(const std::string& path);
/// Removes the temporaries of received_temp_name's naming in `dir` whose writer (this host's
/// process of that pid) is gone and that nobody holds locked (the writer's flock, held until
/// its rename: a live writer this host's pids do not show); returns how many.
int remove_stale_received_temps(const std::string& dir);

}  // namespace phalanx::trainer
