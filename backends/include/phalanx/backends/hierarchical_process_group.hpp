#pragma once
// A process group for jobs that span hosts: within each host through a fast intra-host
// group (shared memory when the "shm" plugin can run, else Gloo), between hosts through one
// leader per host (the host's lowest rank) over Gloo (docs/design.md, "Hierarchical
// collectives"). parallel::init_process_group builds it when `auto` finds ranks on several
// hosts; it can also be built directly from a BackendConfig and every rank's host.
//
// Collectives (always the same steps in the same order, so results are deterministic):
//   allreduce       reduce to the leader within the host -> allreduce among the leaders ->
//                   broadcast from the leader within the host (avg: sums, then one division
//                   by the world size at the leader)
//   broadcast       within the root's host from the root -> among the leaders from the
//                   root's leader -> within every other host from its leader
//   reduce          reduce to the leader -> reduce among the leaders to the root's leader ->
//                   the root's leader sends the result to the root (when they differ)
//   allgather       gather to the leader -> allgather among the leaders (each host's block
//                   padded to the largest host) -> broadcast of all blocks within the host
//   gather          the allgather above; the root keeps the result
//   scatter         broadcast of the root's inputs laid end to end; each rank keeps its slice
//   reduce_scatter  allreduce of the inputs laid end to end; each rank keeps its slice
//   barrier         within the host -> among the leaders -> within the host
//   send / recv     directly, over a Gloo group of all ranks (created with the others)
#include <memory>
#include <string>
#include <vector>

#include "phalanx/backends/process_group.hpp"

namespace phalanx {

struct HierarchyOptions {
  /// Every rank's host identity (config.size entries): ranks with equal strings share a
  /// host. Hosts are numbered in order of their lowest rank.
  std::vector<std::string> host_of_rank;
  std::string intra_backend = "gloo";  ///< within this rank's host ("shm" or "gloo")
  std::string inter_backend = "gloo";  ///< among the leaders, and send/recv
  std::string plugin_path;              ///< as InitOptions::plugin_path
};

/// Creates the sub-groups through the plugin registry, under "hier/..." keys of
/// config.store (all ranks must call it, with the same host_of_rank). Throws ConfigError
/// for a host list that does not match the world size.
ProcessGroupPtr create_hierarchical_process_group(const BackendConfig& config, const HierarchyOptions& options);

}  // namespace phalanx
