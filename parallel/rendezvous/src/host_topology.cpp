#include "host_topology.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include "phalanx/backends/comm_error.hpp"
#include "phalanx/backends/hierarchical_process_group.hpp"
#include "phalanx/backends/plugin_registry.hpp"
#include "phalanx/backends/prefix_store.hpp"
#include "phalanx/core/env.hpp"

namespace phalanx::parallel {

std::string host_identity() {
  if (const auto id = env::text("PHALANX_HOST_ID")) return *id;
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::string id = std::string(name) + "/" + boot;
  // Containers with host networking share the hostname and the boot id but not /dev/shm
  // (nor the pids): the device of /dev/shm and the pid namespace tell them apart, so that
  // auto does not pick shm across them.
  struct stat st{};
  if (::stat("/dev/shm", &st) == 0) id += "/shm " + std::to_string(static_cast<unsigned long long>(st.st_dev));
  char ns[64] = {0};
  if (::readlink("/proc/self/ns/pid", ns, sizeof ns - 1) > 0) id += std::string("/") + ns;
  if (const char* node = std::getenv("GROUP_RANK"); node && *node) id += std::string("/node ") + node;
  return id;
}

std::string machine_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  if (!boot.empty()) return boot;
  char name[256] = {0};
  ::gethostname(name, sizeof name - 1);
  return name;
}

int HostTopology::ranks_on_machine(int rank) const {
  return static_cast<int>(std::count(machine_of_rank.begin(), machine_of_rank.end(), machine_of_rank[rank]));
}

bool HostTopology::host_has_shm(int rank) const {
  for (std::size_t r = 0; r < host_of_rank.size(); ++r)
    if (host_of_rank[r] == host_of_rank[rank] && !shm_ok[r]) return false;
  return true;
}

bool HostTopology::all_shm() const {
  for (bool ok : shm_ok)
    if (!ok) return false;
  return true;
}

HostTopology exchange_hosts(Store& store, int rank, int world, std::chrono::milliseconds timeout) {
  // "<shm ok>" + machine + "\n" + host (a boot id holds no newline)
  const std::string mine = std::string(backend_available("shm") ? "1" : "0") + machine_identity() + "\n" + host_identity();
  store.set("host/" + std::to_string(rank), Bytes(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("host/" + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    throw TimeoutError(detail::concat("rendezvous timed out after ", timeout.count() / 1000.0, " s on rank ", rank,
                                      " while the ranks told each other their hosts; a rank stopped during init"));
  }
  HostTopology t;
  std::set<std::string> hosts;
  for (int r = 0; r < world; ++r) {
    const std::string v = store.get_string(keys[r]);
    const auto nl = v.find('\n');
    t.shm_ok.push_back(!v.empty() && v[0] == '1');
    t.machine_of_rank.push_back(nl == std::string::npos ? "" : v.substr(1, nl - 1));
    t.host_of_rank.push_back(nl == std::string::npos ? "" : v.substr(nl + 1));
    hosts.insert(t.host_of_rank.back());
  }
  t.hosts = static_cast<int>(hosts.size());
  return t;
}

ProcessGroupPtr create_for_hosts(bool hierarchical, const BackendConfig& config, const HostTopology& t,
                                 const std::string& plugin_path) {
  if (t.hosts == 1 && !hierarchical) {
    if (!t.all_shm()) return create_process_group("gloo", config, plugin_path);
    try {
      return create_process_group("shm", config, plugin_path);
    } catch (const BackendUnavailableError& e) {
      // Every rank gets this error together (rank 0 publishes it): all take gloo.
      if (config.rank == 0)
        std::fprintf(stderr, "phalanx: warning: auto: shared memory is unavailable (%s); using gloo on this host\n",
                     e.what());
      BackendConfig fallback = config;
      fallback.store = std::make_shared<PrefixStore>("gloo_fallback", config.store);
      return create_process_group("gloo", fallback, plugin_path);
    }
  }
  HierarchyOptions h;
  h.host_of_rank = t.host_of_rank;
  h.intra_backend = t.host_has_shm(config.rank) ? "shm" : "gloo";
  h.inter_backend = "gloo";
  h.plugin_path = plugin_path;
  return create_hierarchical_process_group(config, h);
}

}  // namespace phalanx::parallel
