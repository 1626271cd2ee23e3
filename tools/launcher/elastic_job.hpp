#pragma once
// An elastic job (--nnodes MIN:MAX): rounds whose members change as nodes leave and join
// (membership.hpp), docs/launcher.md "Elastic membership". The launcher that hosts the store
// forms each round and decides how it ended; the others run the rounds they are admitted to.
#include "blame.hpp"
#include "job_store.hpp"
#include "launch_options.hpp"

#include <optional>

namespace phalanx::launcher {

/// Runs this launcher's part of the elastic job; returns its exit code. Throws LaunchError
/// when it cannot go on (fewer than MIN nodes after --rdzv-timeout, the store lost).
int launch_elastic(LaunchOptions& o, const JobStore& js);

/// A failure that recurs after a restart: the same message at the same training step
/// (launch_job.cpp).
bool recurs(const std::optional<WorkerFailure>& before, const std::optional<WorkerFailure>& now);

}  // namespace phalanx::launcher
