#pragma once
// The launcher's summary of a failed round: the rank blamed (failed first), how it ended, what
// it said in its failure record, what became of the other workers, and its last lines.
#include <string>
#include <vector>

#include "blame.hpp"

namespace phalanx::launcher {

/// Prints "phalanx-run: <lead>rank R (pid P) exited with code C...", then the tail of its
/// output. `stopped`: the other workers of this node the launcher stopped (-1: not said);
/// `local_world`: this node's workers; `nnodes` > 1 names the node.
void print_failure(const std::string& lead, const WorkerFailure& f, const std::vector<std::string>& tail,
                   int stopped, int local_world, int nnodes);

}  // namespace phalanx::launcher
