#pragma once
// One phalanx-run job from its parsed options: the job token, the job's store (job_store.hpp),
// then the rounds of this node's workers (worker_group.hpp), agreed across nodes
// (job_rounds.hpp), restarted up to --max-restarts, and how the job ends: the summary of a
// failure (failure_report.hpp) or of a stop (stop_report.hpp), and the exit code.
#include "launch_error.hpp"
#include "launch_options.hpp"

namespace phalanx::launcher {

/// Runs the job and returns the launcher's exit code: 0, the blamed worker's (128 + signal
/// for a signal), kExitStoppedAfterSave or 128 + signal after a stop, 1 or 2 when the job
/// cannot go on. Throws LaunchError when it cannot start. Sets o.node_rank when the store
/// assigns it.
int launch_job(LaunchOptions& o);

}  // namespace phalanx::launcher
