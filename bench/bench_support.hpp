#pragma once
// Helpers shared by the benchmarks: timing and running a peer (PyTorch) in the same run.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "relocatable_paths.hpp"  // examples/support: data and peers found beside the executable

namespace phalanx::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The Python that runs the peers: $PHALANX_PYTHON, else python3 on the PATH or
/// /usr/bin/python3 (Debian's python3-torch), whichever imports torch.
inline const std::string& python() { return relocatable::python(); }

/// Runs `command`, returns the number after `key=` in its output, or -1 when the peer
/// could not run (PyTorch missing: install python3-torch, or set PHALANX_PYTHON).
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

/// Runs `body(rank, out)` in `world` forked processes; returns what rank 0 wrote to `out`.
inline std::string run_ranks(int world, const std::function<void(int, std::FILE*)>& body) {
  const std::string out = "/tmp/phalanx_bench_" + std::to_string(::getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::FILE* f = r == 0 ? std::fopen(out.c_str(), "w") : nullptr;
      try {
        body(r, f);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench rank %d: %s\n", r, e.what());
        ::_exit(1);
      }
      if (f) std::fclose(f);
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  std::ifstream in(out);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(out.c_str());
  return all;
}

/// Runs a Python peer as `world` processes (torchrun's variables set by hand, as
/// ../shared/anchors/launch.sh does); returns rank 0's output.
inline std::string run_python_ranks(int world, int port, const std::string& script_and_args) {
  std::string cmd = "(";
  for (int r = world - 1; r >= 0; --r) {
    const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                            " WORLD_SIZE=" + std::to_string(world) + " RANK=" + std::to_string(r) +
                            " OMP_NUM_THREADS=1 ";
    cmd += env + python() + " " + script_and_args + (r > 0 ? " >/dev/null 2>&1 & " : "; wait");
  }
  cmd += ") 2>/dev/null";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

/// The number after `key=` in `text`, or -1.
inline double find_value(const std::string& text, const std::string& key) {
  const auto pos = text.find(key + "=");
  return pos == std::string::npos ? -1 : std::stod(text.substr(pos + key.size() + 1));
}

/// A peer's script: $PHALANX_PEERS_DIR/name, else peers/name beside the executable or one
/// folder up (the build tree links bench/peers there; the GPU bundle carries a copy). When
/// there is none it says so on stderr and returns `name`, so the peer fails and reads -1.
inline std::string peer_script(const std::string& name) {
  try {
    return relocatable::find_file("PHALANX_PEERS_DIR", "peers", name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peer %s: %s (its figures read -1)\n", name.c_str(), e.what());
    return name;
  }
}

/// An example's data file: $PHALANX_DATA_DIR/name, else data/name beside the executable or
/// one folder up (the build tree links examples/data there).
inline std::string data_file(const std::string& name) {
  return relocatable::find_file("PHALANX_DATA_DIR", "data", name);
}

}  // namespace phalanx::bench
