#pragma once
// Helpers shared by the benchmarks: timing and running a peer (PyTorch) in the same run.
#include <chrono>
#include <cstdio>
#include <string>

namespace phalanx::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Runs `command`, returns the number after `key=` in its output, or -1 when the peer
/// could not run (PyTorch missing: install python3-torch).
inline double run_peer(const std::string& command, const std::string& key) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  const auto pos = out.find(key + "=");
  if (rc != 0 || pos == std::string::npos) {
    std::fprintf(stderr, "peer failed (%s):\n%s\n", command.c_str(), out.c_str());
    return -1;
  }
  return std::stod(out.substr(pos + key.size() + 1));
}

/// Where the peers' scripts live (set by CMake).
inline std::string peer_script(const std::string& name) {
  return std::string(PHALANX_BENCH_DIR) + "/peers/" + name;
}

}  // namespace phalanx::bench
