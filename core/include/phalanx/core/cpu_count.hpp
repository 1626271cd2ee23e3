#pragma once
// How many cores this process may really use: the CPUs of its affinity mask, capped by a
// cgroup CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up.
// Waits decide from it whether to spin (a core each) or to block (more ranks than cores).
namespace phalanx {

/// At least 1.
int usable_cores();

}  // namespace phalanx
