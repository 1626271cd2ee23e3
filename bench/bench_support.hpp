#pragma once
// Helpers shared by the benchmarks: timing, running a peer (PyTorch) in the same run, the
// environment every figure depends on, medians with their spread, and the result rows that
// scripts/bench.sh collects into docs/benchmarks.md.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <phalanx/core/threads.hpp>  // blas_info(), get_num_threads()

#include "relocatable_paths.hpp"  // examples/support: data and peers found beside the executable

namespace phalanx::bench {

/// The CPU's model name from /proc/cpuinfo ("unknown" elsewhere).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

/// The 1, 5 and 15 minute load averages ("?" where /proc/loadavg cannot be read).
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  if (!(in >> a >> b >> c)) return "?";
  return a + " " + b + " " + c;
}

/// `name=value` of an environment variable, "unset" when it is not set.
inline std::string env_setting(const char* name) {
  const char* v = std::getenv(name);
  return std::string(name) + "=" + (v ? v : "unset");
}

/// OpenBLAS's core type, from blas_info()'s "(core: X)".
inline std::string blas_core() {
  const std::string info = blas_info();
  const auto at = info.find("(core: ");
  if (at == std::string::npos) return "unknown";
  const auto begin = at + 7;
  return info.substr(begin, info.find(')', begin) - begin);
}

/// What every figure depends on, printed by every benchmark before its figures (one shared
/// format; scripts/bench.sh reads the "# machine:" and "# phalanx:" lines): the CPU, the
/// cores, the load average, the BLAS library with its core type and the GEMM policy, and
/// the thread counts (Phalanx's = OpenBLAS's, and the variables that set them).
inline void print_environment(const char* bench_name) {
  std::printf("# %s\n# machine: CPU %s, %ld cores online; load average %s\n", bench_name, cpu_model().c_str(),
              ::sysconf(_SC_NPROCESSORS_ONLN), load_average().c_str());
  std::printf("# phalanx: BLAS %s; threads: phalanx %d, %s, %s\n", blas_info().c_str(), get_num_threads(),
              env_setting("OPENBLAS_NUM_THREADS").c_str(), env_setting("OMP_NUM_THREADS").c_str());
  std::fflush(stdout);
}

/// The load average again, after the figures (the machine is shared: a load that rose
/// during the run is visible).
inline void print_load_at_end() {
  std::printf("# load average at the end: %s\n", load_average().c_str());
  std::fflush(stdout);
}

/// Prints the peer's own environment line ("# peer: ..." from peers/bench_env.py) the first
/// time one is seen in a peer's output.
inline void relay_peer_environment(const std::string& out) {
  static bool shown = false;
  const auto at = out.find("# peer:");
  if (shown || at == std::string::npos) return;
  shown = true;
  std::printf("%s\n", out.substr(at, out.find('\n', at) - at).c_str());
  std::fflush(stdout);
}

/// The median of a series with its spread (fastest and slowest run). Negative entries
/// (a side that did not run) are dropped; `n` counts the runs kept.
struct Summary {
  double median = -1, lo = -1, hi = -1;
  int n = 0;
  bool ok() const { return n > 0 && median > 0; }
};

inline Summary summarise(const std::vector<double>& samples) {
  std::vector<double> v;
  for (double x : samples)
    if (x >= 0) v.push_back(x);
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size();
  const double med = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
  return {med, v.front(), v.back(), static_cast<int>(k)};
}

/// "27.3 [25.1, 31.0] ms" (median [fastest, slowest]), values divided by `scale`; "n/a"
/// when the series is empty.
inline std::string show(const Summary& s, const char* unit, double scale = 1) {
  if (!s.ok()) return "n/a";
  const double m = s.median / scale;
  const char* f = m >= 100 ? "%.0f [%.0f, %.0f] %s" : m >= 10 ? "%.1f [%.1f, %.1f] %s" : "%.2f [%.2f, %.2f] %s";
  char buf[128];
  std::snprintf(buf, sizeof buf, f, m, s.lo / scale, s.hi / scale, unit);
  return buf;
}

/// A row of the Markdown table that scripts/bench.sh writes into docs/benchmarks.md:
/// "ROW|bench|case|Phalanx|peer|ratio|bar", the ratio of the two medians (Phalanx / peer, a
/// time over a time: below 1 Phalanx is faster) with `bar` ("-" when none) after it.
inline double result_row(const std::string& bench, const std::string& what, const Summary& ours,
                         const std::string& peer_name, const Summary& theirs, const char* unit, double scale,
                         const std::string& bar) {
  const double r = ours.ok() && theirs.ok() ? ours.median / theirs.median : -1;
  char ratio[32] = "n/a";
  if (r > 0) std::snprintf(ratio, sizeof ratio, r >= 0.1 ? "%.2f" : "%.2g", r);  // 0.0014, not 0.00
  std::printf("ROW|%s|%s|%s (%d runs)|%s: %s (%d runs)|%s|%s\n", bench.c_str(), what.c_str(), show(ours, unit, scale).c_str(),
              ours.n, peer_name.c_str(), show(theirs, unit, scale).c_str(), theirs.n, ratio, bar.c_str());
  std::fflush(stdout);
  return r;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// `fn`'s time per call in microseconds: a warm-up of a tenth of `iters` (at least 5 calls),
/// then 5 runs of `iters` calls, their median with the fastest and slowest.
inline Summary time_us(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < std::max(5, iters / 10); ++i) fn();
  std::vector<double> samples;
  for (int r = 0; r < 5; ++r) {
    const double t = now_s();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back((now_s() - t) / iters * 1e6);
  }
  return summarise(samples);
}

/// The limit the memory-bound benchmarks name: memcpy of `bytes` between two buffers, its
/// time per copy in microseconds (time_us).
inline Summary memcpy_us(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  return time_us(iters, [&] {
    std::memcpy(b.data(), a.data(), bytes);
    asm volatile("" ::"r"(b.data()) : "memory");
  });
}

/// GB/s of `bytes` read and as many written in `us` microseconds (memcpy's rate counts both).
inline double copy_gbs(std::size_t bytes, double us) { return 2.0 * static_cast<double>(bytes) / (us * 1e-6) / 1e9; }

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
  relay_peer_environment(out);
  const auto pos = out.find(key + "=");
  if (rc != 0 || pos == std::string::npos) {
    std::fprintf(stderr, "peer failed (%s):\n%s\n", command.c_str(), out.c_str());
    return -1;
  }
  return std::stod(out.substr(pos + key.size() + 1));
}

/// Runs a shell command; its stdout and stderr together, `rc` its exit status.
inline std::string capture(const std::string& command, int* rc = nullptr) {
  std::string out;
  int status = -1;
  if (FILE* p = popen((command + " 2>&1").c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    status = pclose(p);
  }
  if (rc) *rc = status;
  return out;
}

/// Runs a peer that times `runs` runs itself and prints step_us= (median) min_us= max_us=;
/// relays its environment line. An empty Summary (and the output on stderr) when it failed.
inline Summary run_peer_summary(const std::string& command, int runs) {
  int rc = 0;
  const std::string out = capture(command, &rc);
  relay_peer_environment(out);
  const auto value = [&](const std::string& key) {
    const auto pos = out.find(key + "=");
    return pos == std::string::npos ? -1.0 : std::stod(out.substr(pos + key.size() + 1));
  };
  Summary s{value("step_us"), value("min_us"), value("max_us"), runs};
  if (rc != 0 || s.median < 0 || s.lo < 0 || s.hi < 0) {
    std::fprintf(stderr, "peer failed (%s):\n%s\n", command.c_str(), out.c_str());
    return {};
  }
  return s;
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
  relay_peer_environment(out);
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

/// A benchmark's main(): runs `run`, turning an exception (no peer script, no plugin, ...) into
/// one line on stderr and exit status 1. With `one_blas_thread`, first restarts the program
/// with OPENBLAS_NUM_THREADS=1: OpenBLAS starts its worker threads when it loads, and
/// openblas_set_num_threads(1) later leaves them alive and yielding on a 2-core machine.
inline int guarded_main(const char* name, int argc, char** argv, int (*run)(int, char**),
                        bool one_blas_thread = false) {
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  if (one_blas_thread && (!env || std::string(env) != "1")) {
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "%s: could not restart with OPENBLAS_NUM_THREADS=1; continuing\n", name);
  }
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace phalanx::bench
