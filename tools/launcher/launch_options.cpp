#include "launch_options.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

namespace phalanx::launcher {

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool parse_options(int argc, char** argv, LaunchOptions& o, int& exit_code) {
  CLI::App app{
      "phalanx-run: start a data-parallel job, like torchrun.\n\n"
      "  phalanx-run --nproc-per-node 4 ./train --epochs 3\n\n"
      "Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
      "PHALANX_RDZV_TOKEN, PHALANX_RESTART_COUNT and PHALANX_STORE_HOSTED=1 (the launcher of node 0\n"
      "hosts the job's rendezvous store, so workers may start in any order), PHALANX_LINE_BUFFERED=1\n"
      "and PYTHONUNBUFFERED=1 (live output), PHALANX_PROGRESS=1 for rank 0 when this launcher's\n"
      "stdout is a terminal (its '\\r' progress bar is redrawn in place, at most 10 times a second),\n"
      "plus OMP_NUM_THREADS=1 and OPENBLAS_NUM_THREADS=1 unless already set. Output lines are\n"
      "prefixed with the rank. When a worker fails, the others are stopped (SIGTERM, then\n"
      "SIGKILL after the grace period) and a summary names the rank that failed first, its exit\n"
      "status and the tail of its output; the exit code is that worker's (128 + signal for a\n"
      "signal), 2 for a usage error. With several nodes, a failure on any node restarts (or ends)\n"
      "the whole job: the launchers agree on each round through node 0's store.",
      "phalanx-run"};
  std::string nproc = "1";
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "workers on this node: N or 'auto' (= cores)")
      ->capture_default_str();
  app.add_option("--nnodes", o.nnodes, "number of nodes")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's index in [0, nnodes)")->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr, "address of node 0 (the rendezvous host)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", o.master_port,
                 "rendezvous port; default: a free port (single node), required with --nnodes > 1")
      ->check(CLI::Range(0, 65535));
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart the whole group up to K times after a failure")
      ->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval, "seconds between liveness checks")
      ->capture_default_str()->check(CLI::Range(0.001, 60.0));
  app.add_option("--grace-period", o.grace_period, "seconds from SIGTERM to SIGKILL when stopping workers")
      ->capture_default_str()->check(CLI::Range(0.0, 600.0));
  app.add_option("--log-dir,--log_dir", o.log_dir, "write each rank's output to DIR/rank_<r>.log too");
  app.add_option("--backend", o.backend, "communication backend for the workers (PHALANX_BACKEND)");
  app.add_option("--timeout", o.timeout, "operation timeout in seconds for the workers (PHALANX_TIMEOUT)")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--rdzv-token", o.rdzv_token,
                 "job token (default: PHALANX_RDZV_TOKEN, else random for a single node); required "
                 "with --nnodes > 1, the same on every node (prefer the environment variable: "
                 "a command line is visible to every user in ps)");
  app.add_option("--rdzv-timeout", o.rdzv_timeout,
                 "several nodes: seconds to wait for another node's launcher that stopped answering "
                 "before giving up (and at least this long for node 0's store at start)")
      ->capture_default_str()->check(CLI::Range(0.1, 86400.0));
  app.footer("\nEverything from the worker program on (or after --) is passed to the workers.");
  // Split argv by hand: the launcher's options, then the program and its own arguments
  // (which may look like options: `phalanx-run --nproc-per-node 2 sh -c '...'`).
  std::vector<std::string> mine;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("-", 0) != 0) break;  // the program
    mine.push_back(a);
    const bool takes_value = a != "-h" && a != "--help" && a.find('=') == std::string::npos;
    if (takes_value && i + 1 < argc) mine.push_back(argv[++i]);
  }
  for (; i < argc; ++i) o.command.push_back(argv[i]);
  std::vector<std::string> reversed(mine.rbegin(), mine.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every usage error exits 2 (CLI11's own codes differ per error).
    exit_code = app.exit(e) == 0 ? 0 : 2;
    return false;
  }
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "phalanx-run: %s\n", msg.c_str());
    exit_code = 2;
    return false;
  };
  if (nproc == "auto") {
    o.nproc_per_node = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  } else {
    char* end = nullptr;
    const long v = std::strtol(nproc.c_str(), &end, 10);
    if (end == nproc.c_str() || *end || v < 1 || v > 4096)
      return fail("--nproc-per-node '" + nproc + "' must be a positive integer or 'auto'");
    o.nproc_per_node = static_cast<int>(v);
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return fail("--node-rank " + std::to_string(o.node_rank) + " must be in [0, " + std::to_string(o.nnodes) + ")");
  if (o.nnodes > 1 && o.master_port == 0)
    return fail("--master-port is required with --nnodes > 1 (every node must use the same one)");
  if (o.command.empty()) return fail("no worker program given (usage: phalanx-run [options] program [args...])");
  if (resolve_program(o.command[0]).empty())
    return fail("worker program '" + o.command[0] + "' not found or not executable");
  if (o.rdzv_token.empty())
    if (const char* t = std::getenv("PHALANX_RDZV_TOKEN")) o.rdzv_token = t;
  if (o.rdzv_token.empty() && o.nnodes > 1)
    return fail("--nnodes > 1 needs a job token shared by every node: set PHALANX_RDZV_TOKEN (or pass "
                "--rdzv-token) to the same secret on each node; without one anyone who can reach the "
                "store could join or stop the job");
  if (!o.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec || ::access(o.log_dir.c_str(), W_OK | X_OK) != 0)
      return fail("--log-dir '" + o.log_dir + "': cannot create or write to it (" +
                  (ec ? ec.message() : std::string(std::strerror(errno))) + "); give a writable folder");
  }
  return true;
}

}  // namespace phalanx::launcher
