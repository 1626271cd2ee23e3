#pragma once
// Which ranks share a host, learnt at init through the rendezvous store, and the CPU
// backend `auto` picks from it (docs/ddp.md, "Backends"): every rank on one host -> shared
// memory ("shm") when its plugin can run on every rank, else Gloo; several hosts -> the
// hierarchical group (shm, or Gloo, within each host; Gloo between the hosts' leaders).
#include <chrono>
#include <string>
#include <vector>

#include "phalanx/backends/process_group.hpp"
#include "phalanx/backends/store.hpp"

namespace phalanx::parallel {

/// This process's host: PHALANX_HOST_ID when set (tests pose as several hosts on one
/// machine), else the hostname, the kernel's boot id, the device of /dev/shm, the pid
/// namespace and the launcher's node rank (GROUP_RANK, set by phalanx-run and torchrun): two
/// launchers, or two containers sharing the host's network but not its /dev/shm or pids,
/// are never taken for one host.
std::string host_identity();

/// This process's machine, whose cores it shares with every rank that has the same: the
/// kernel's boot id (containers and network namespaces on one machine share it), else the
/// hostname. PHALANX_HOST_ID does not change it.
std::string machine_identity();

struct HostTopology {
  std::vector<std::string> host_of_rank;  ///< every rank's host identity
  std::vector<bool> shm_ok;               ///< whether the shm plugin can run on that rank
  std::vector<std::string> machine_of_rank;  ///< every rank's machine_identity()
  int hosts = 1;
  /// The ranks on `rank`'s machine (every launcher's).
  int ranks_on_machine(int rank) const;
  /// Whether every rank on `rank`'s host can use shared memory.
  bool host_has_shm(int rank) const;
  bool all_shm() const;
};

/// Posts this rank's host identity and shm availability under "host/<rank>" of the
/// (prefixed) store and reads every rank's; a rank that never posts is a TimeoutError.
HostTopology exchange_hosts(Store& store, int rank, int world, std::chrono::milliseconds timeout);

/// The group `auto` builds for a CPU job from the exchanged topology: shm or gloo on one
/// host (gloo when shm cannot make its segment), the hierarchical group across hosts;
/// `hierarchical` (named) forces the hierarchical group even on one host.
ProcessGroupPtr create_for_hosts(bool hierarchical, const BackendConfig& config, const HostTopology& topology,
                                 const std::string& plugin_path);

}  // namespace phalanx::parallel
