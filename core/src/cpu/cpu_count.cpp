#include "phalanx/core/cpu_count.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

namespace phalanx {

namespace {

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// This process's cgroup path for the v2 hierarchy ("0::/path") or the v1 cpu controller.
std::string cgroup_path(bool v2) {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? controllers.empty() : (controllers.find("cpu") != std::string::npos &&
                                     (controllers == "cpu" || controllers.find("cpu,") != std::string::npos ||
                                      controllers.find(",cpu") != std::string::npos)))
      return line.substr(b + 1);
  }
  return "/";
}

// The quota in cores (0: none), from the cgroup's folder or, inside a container whose
// cgroup namespace hides the path, from the mount's root.
double quota_cores() {
  for (const std::string& path : {"/sys/fs/cgroup" + cgroup_path(true), std::string("/sys/fs/cgroup")}) {
    std::ifstream f(path + "/cpu.max");
    std::string quota;
    double period = 0;
    if (f >> quota >> period) return quota == "max" || period <= 0 ? 0 : std::stod(quota) / period;
  }
  for (const std::string& path : {"/sys/fs/cgroup/cpu" + cgroup_path(false), std::string("/sys/fs/cgroup/cpu")}) {
    std::ifstream q(path + "/cpu.cfs_quota_us"), p(path + "/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (q >> quota && p >> period) return quota <= 0 || period <= 0 ? 0 : quota / period;
  }
  return 0;
}

}  // namespace

int usable_cores() {
  // Read each time (a few small files, once per group made): a process may change its
  // affinity, and a forked child must not inherit its parent's answer.
  int cores = affinity_cores();
  try {
    if (const double q = quota_cores(); q > 0) cores = std::min(cores, static_cast<int>(std::ceil(q)));
  } catch (...) {  // an unreadable number: the affinity mask alone
  }
  return std::max(1, cores);
}

}  // namespace phalanx
