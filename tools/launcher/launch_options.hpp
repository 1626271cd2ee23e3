#pragma once
// phalanx-run's options, parsed and validated before anything starts.
#include <string>
#include <vector>

namespace phalanx::launcher {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;     ///< the most nodes (MAX of --nnodes MIN:MAX)
  int min_nodes = 1;  ///< the fewest nodes the job runs on (MIN); < nnodes: elastic (elastic_job.hpp)
  double last_call = 30.0;   ///< elastic: seconds the first round waits for more nodes once MIN are in
  double keep_alive = 2.0;   ///< elastic: a launcher silent this long is gone (its node leaves the job)
  int node_rank = 0;  ///< -1 until the job's store assigns it (assign_node_rank)
  /// --nnodes > 1 without --node-rank: the launcher that can bind the endpoint hosts the
  /// store and is node 0, the others get their node rank from it (node_rank.hpp).
  bool assign_node_rank = false;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: a free port (single node only)
  int max_restarts = 0;
  double monitor_interval = 0.1;  ///< seconds between liveness checks
  double grace_period = 5.0;      ///< after a worker failed: seconds from SIGTERM to SIGKILL for the others
  /// Asked to stop (SIGTERM, SIGINT, SIGUSR1 ... to the launcher, or from another node):
  /// seconds from the stop signal to SIGKILL, for the workers to save (Kubernetes' default).
  double term_timeout = 30.0;
  int term_signal = 0;  ///< the signal workers get when the launcher is asked to stop; 0: the one it got
  std::string log_dir;
  std::string backend;
  double timeout = 0;  ///< seconds; 0 = leave PHALANX_TIMEOUT as is
  std::string rdzv_token;
  std::string rdzv_id;         ///< --rdzv-id: the token is derived from it (rdzv_token.hpp)
  bool rdzv_id_has_secret = false;  ///< PHALANX_RDZV_SECRET was mixed into the token
  bool standalone = false;     ///< --standalone: one node, a free port, a fresh token
  double rdzv_timeout = 60.0;  ///< seconds a launcher waits for a silent peer launcher (several nodes)
  std::vector<std::string> command;  ///< program and its arguments
  bool elastic_job = false;  ///< set per round of an elastic job: workers get PHALANX_ELASTIC=1
  bool elastic() const { return min_nodes < nnodes; }
};

/// Parses argv. Returns false and sets `exit_code` when the program should stop
/// (--help, or an invalid value: the message is printed).
bool parse_options(int argc, char** argv, LaunchOptions& out, int& exit_code);

/// Splits --rdzv-endpoint's HOST[:PORT] ("[v6]:PORT" for IPv6); the port defaults to
/// 29400 (torchrun's); 0 asks for a free port (a single node only: parse_options refuses it
/// for several). False with `error` set (one line) when it is malformed.
bool parse_endpoint(const std::string& text, std::string& host, int& port, std::string& error);

/// Resolves `program` like execvp would; empty when not found or not executable.
std::string resolve_program(const std::string& program);

}  // namespace phalanx::launcher
