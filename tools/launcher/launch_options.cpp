#include "launch_options.hpp"

#include "phalanx/parallel/internal/rdzv_token.hpp"

#include <phalanx/backends/default_timeout.hpp>
#include <phalanx/core/env.hpp>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <csignal>
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

bool parse_endpoint(const std::string& text, std::string& host, int& port, std::string& error) {
  port = 29400;  // torchrun's default rendezvous port
  std::string port_text;
  if (!text.empty() && text[0] == '[') {  // [IPv6] or [IPv6]:PORT
    const auto close = text.find(']');
    if (close == std::string::npos || (close + 1 < text.size() && text[close + 1] != ':')) {
      error = "--rdzv-endpoint '" + text + "': write an IPv6 address as [ADDR] or [ADDR]:PORT";
      return false;
    }
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) port_text = text.substr(close + 2);
    if (close + 1 < text.size() && port_text.empty()) port_text = "?";
  } else {
    const auto colon = text.find(':');
    if (colon != std::string::npos && text.find(':', colon + 1) != std::string::npos) {
      error = "--rdzv-endpoint '" + text + "': write an IPv6 address in brackets, e.g. [::1]:29400";
      return false;
    }
    host = text.substr(0, colon);
    if (colon != std::string::npos) port_text = text.substr(colon + 1);
    if (colon != std::string::npos && port_text.empty()) port_text = "?";
  }
  if (host.empty()) {
    error = "--rdzv-endpoint '" + text + "' has no host: give HOST[:PORT] of node 0, e.g. 10.0.0.1:29400";
    return false;
  }
  if (!port_text.empty()) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(port_text.c_str(), &end, 10);
    if (end == port_text.c_str() || *end || errno || v < 0 || v > 65535) {
      error = "--rdzv-endpoint '" + text +
              "': the port must be a number in [0, 65535] (default 29400; 0: a free port, one node only)";
      return false;
    }
    port = static_cast<int>(v);
  }
  return true;
}

namespace {

/// torchrun options phalanx-run has no counterpart for, with what to do instead.
const char* unsupported_torchrun_option(const std::string& name) {
  if (name == "--tee" || name == "--redirects")
    return "phalanx-run always relays every rank's stdout and stderr with a [rank] prefix; use --log-dir DIR "
           "for a file per rank";
  if (name == "-m" || name == "--module" || name == "--run-path" || name == "--run_path")
    return "phalanx-run runs a program, not a Python module or path: write `phalanx-run [options] python3 -m "
           "MODULE args...`";
  if (name == "--rdzv-conf" || name == "--rdzv_conf")
    return "use --rdzv-timeout SECONDS (how long a launcher waits for a silent peer); there are no other "
           "rendezvous settings";
  if (name == "--role" || name == "--local-addr" || name == "--local_addr" || name == "--start-method" ||
      name == "--start_method" || name == "--local-ranks-filter" || name == "--local_ranks_filter" ||
      name == "--logs-specs" || name == "--logs_specs")
    return "phalanx-run has no such setting (see docs/launcher.md for the torchrun options it takes)";
  return nullptr;
}

bool takes_no_value(const std::string& a) {
  return a == "-h" || a == "--help" || a == "--standalone" || a == "--no-python" || a == "--no_python";
}

/// "TERM", "SIGTERM" or "15" (TERM, INT, USR1, USR2) into sig; false with `error` otherwise.
bool parse_term_signal(const std::string& text, int& sig, std::string& error) {
  std::string name = text;
  for (auto& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  const std::pair<const char*, int> known[] = {{"TERM", SIGTERM}, {"INT", SIGINT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
  for (const auto& [n, s] : known)
    if (name == n || name == std::to_string(s)) {
      sig = s;
      return true;
    }
  error = "--term-signal '" + text + "' must be TERM, INT, USR1 or USR2 (a signal the workers can catch to save)";
  return false;
}

/// "N" or "MIN:MAX" into lo_out and n (the most); false with a one-line `error` otherwise.
bool parse_nnodes(const std::string& text, int& n, int& lo_out, std::string& error) {
  auto number = [](const std::string& t, long& v) {
    char* end = nullptr;
    errno = 0;
    v = std::strtol(t.c_str(), &end, 10);
    return end != t.c_str() && !*end && !errno && v >= 1 && v <= (1 << 16);
  };
  const auto colon = text.find(':');
  long lo = 0, hi = 0;
  if (colon == std::string::npos) {
    if (!number(text, lo)) {
      error = "--nnodes '" + text + "' must be a number of nodes in [1, 65536] (or N:N)";
      return false;
    }
    n = lo_out = static_cast<int>(lo);
    return true;
  }
  if (!number(text.substr(0, colon), lo) || !number(text.substr(colon + 1), hi) || lo > hi) {
    error = "--nnodes '" + text + "' must be N or MIN:MAX with 1 <= MIN <= MAX";
    return false;
  }
  lo_out = static_cast<int>(lo);
  n = static_cast<int>(hi);
  return true;
}

/// What phalanx-run --help says before the options.
constexpr const char* kAbout =
    "phalanx-run: start a data-parallel job, like torchrun.\n\n"
    "  phalanx-run --standalone --nproc_per_node=4 ./train --epochs 3\n"
    "  phalanx-run --nnodes=2 --rdzv_id=JOB --rdzv_endpoint=HOST:PORT ./train   (each node)\n\n"
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
    "the whole job: the launchers agree on each round through node 0's store.";

/// What the command line parses into besides LaunchOptions' own fields: texts checked after
/// parsing, and the options whose presence matters.
struct RawOptions {
  std::string nproc = "1", nnodes = "1", endpoint, backend = "c10d", term_signal;
  bool no_python = false;
  bool pod_node_rank = false;  // the node rank came from a PyTorchJob pod's RANK (apply_pod_env)
  CLI::Option *nnodes_opt = nullptr, *node_rank_opt = nullptr, *addr_opt = nullptr, *port_opt = nullptr, *endpoint_opt = nullptr,
              *id_opt = nullptr, *token_opt = nullptr;
};

/// Declares every option, in --help's order.
void declare_options(CLI::App& app, LaunchOptions& o, RawOptions& r) {
  app.add_option("--nproc-per-node,--nproc_per_node", r.nproc,
                 "workers on this node: N, or 'auto'/'cpu' (= the number of cores)")
      ->capture_default_str()->envname("PET_NPROC_PER_NODE");
  r.nnodes_opt = app.add_option("--nnodes", r.nnodes, "number of nodes: N, or an elastic range MIN:MAX (nodes may leave and join)")
                     ->capture_default_str()->envname("PET_NNODES");
  r.node_rank_opt = app.add_option("--node-rank,--node_rank", o.node_rank,
                                   "this node's index in [0, nnodes); default with --nnodes > 1: the "
                                   "launcher on the --rdzv-endpoint machine that binds its port first is 0, "
                                   "the others get 1, 2, ... in arrival order")
                        ->capture_default_str()->envname("PET_NODE_RANK");
  r.addr_opt = app.add_option("--master-addr,--master_addr", o.master_addr, "address of node 0 (the rendezvous host)")
                   ->capture_default_str()->envname("PET_MASTER_ADDR");
  r.port_opt = app.add_option("--master-port,--master_port", o.master_port,
                              "rendezvous port; default: a free port (single node), required with --nnodes > 1")
                   ->check(CLI::Range(0, 65535))->envname("PET_MASTER_PORT");
  app.add_flag("--standalone", o.standalone,
               "a single-node job on loopback: a free port and a fresh random token (like torchrun's)")
      ->envname("PET_STANDALONE");
  r.endpoint_opt = app.add_option("--rdzv-endpoint,--rdzv_endpoint", r.endpoint,
                                  "HOST[:PORT] of node 0's rendezvous store (= --master-addr and "
                                  "--master-port; port 29400 when omitted)")
                       ->envname("PET_RDZV_ENDPOINT");
  r.id_opt = app.add_option("--rdzv-id,--rdzv_id", o.rdzv_id,
                            "the job's identity, the same on every node: the job token is derived from "
                            "it and PHALANX_RDZV_SECRET (set a secret: the id alone is not one; a single node "
                            "without a secret gets a random token)")
                 ->envname("PET_RDZV_ID");
  app.add_option("--rdzv-backend,--rdzv_backend", r.backend,
                 "'c10d' or 'static' (both mean node 0's TCP store); others are refused")
      ->capture_default_str()->envname("PET_RDZV_BACKEND");
  app.add_flag("--no-python,--no_python", r.no_python, "accepted for torchrun's sake: the program always runs as is")
      ->envname("PET_NO_PYTHON");
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart the whole group up to K times after a failure")
      ->capture_default_str()->check(CLI::Range(0, 1000))->envname("PET_MAX_RESTARTS");
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval, "seconds between liveness checks")
      ->capture_default_str()->check(CLI::Range(0.001, 60.0))->envname("PET_MONITOR_INTERVAL");
  app.add_option("--grace-period", o.grace_period, "seconds from SIGTERM to SIGKILL when stopping workers")
      ->capture_default_str()->check(CLI::Range(0.0, 600.0));
  app.add_option("--term-timeout,--term_timeout", o.term_timeout,
                 "asked to stop (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, SIGQUIT): seconds the workers get to save "
                 "and exit before SIGKILL")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  app.add_option("--term-signal,--term_signal", r.term_signal,
                 "the signal the workers get when the launcher is asked to stop: TERM, INT, USR1 or USR2 (default: the "
                 "one the launcher got)");
  app.add_option("--log-dir,--log_dir", o.log_dir, "write each rank's output to DIR/rank_<r>.log too")
      ->envname("PET_LOG_DIR");
  app.add_option("--backend", o.backend, "communication backend for the workers (PHALANX_BACKEND)");
  app.add_option("--timeout", o.timeout, "operation timeout in seconds for the workers (PHALANX_TIMEOUT)")
      ->check(CLI::Range(kMinTimeoutSeconds, kMaxTimeoutSeconds));
  r.token_opt = app.add_option(
      "--rdzv-token,--rdzv_token", o.rdzv_token,
      "job token (default: PHALANX_RDZV_TOKEN, else random for a single node); required "
      "with --nnodes > 1 unless --rdzv-id is given, the same on every node (prefer the environment "
      "variable: a command line is visible to every user in ps)");
  app.add_option("--rdzv-timeout,--rdzv_timeout", o.rdzv_timeout,
                 "several nodes: seconds to wait for another node's launcher that stopped answering "
                 "before giving up (and at least this long for node 0's store at start)")
      ->capture_default_str()->check(CLI::Range(0.1, 86400.0));
  app.add_option("--rdzv-last-call,--rdzv_last_call", o.last_call,
                 "elastic (--nnodes MIN:MAX): seconds the first round waits for more nodes once MIN have "
                 "joined (torchrun's last_call_timeout)")
      ->capture_default_str()->check(CLI::Range(0.0, 86400.0));
  app.add_option("--rdzv-keep-alive,--rdzv_keep_alive", o.keep_alive,
                 "elastic: seconds without a keep-alive after which a node's launcher is gone and the others "
                 "re-form the job without it")
      ->capture_default_str()->check(CLI::Range(0.2, 3600.0));
  app.footer("\nEverything from the worker program on (or after --) is passed to the workers. "
             "docs/launcher.md maps torchrun's options to these.");
}

/// Splits argv by hand: the launcher's options (into `mine`), then the program and its own
/// arguments (which may look like options: `phalanx-run --nproc-per-node 2 sh -c '...'`).
/// False with `error` set for a torchrun option phalanx-run does not take.
bool split_command_line(int argc, char** argv, std::vector<std::string>& mine, std::vector<std::string>& command,
                        std::string& error) {
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("-", 0) != 0) break;  // the program
    const std::string name = a.substr(0, a.find('='));
    if (const char* instead = unsupported_torchrun_option(name)) {
      error = "torchrun's " + name + " is not supported: " + instead;
      return false;
    }
    mine.push_back(a);
    const bool takes_value = !takes_no_value(a) && a.find('=') == std::string::npos;
    if (takes_value && i + 1 < argc) mine.push_back(argv[++i]);
  }
  for (; i < argc; ++i) command.push_back(argv[i]);
  return true;
}

/// --nproc-per-node: N, or 'auto'/'cpu' (the number of cores); false with `error` otherwise.
bool parse_nproc(const std::string& nproc, int& n, std::string& error) {
  if (nproc == "auto" || nproc == "cpu") {
    n = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  } else if (nproc == "gpu" || nproc == "xpu") {
    error = "--nproc-per-node " + nproc +
            ": phalanx-run does not count devices; give the number of workers (e.g. one per GPU: "
            "--nproc-per-node 4)";
    return false;
  } else {
    char* end = nullptr;
    const long v = std::strtol(nproc.c_str(), &end, 10);
    if (end == nproc.c_str() || *end || v < 1 || v > 4096) {
      error = "--nproc-per-node '" + nproc + "' must be a positive integer or 'auto'";
      return false;
    }
    n = static_cast<int>(v);
  }
  return true;
}

/// A pod of Kubeflow's PyTorchJob that gives no torchrun option (neither on the command line
/// nor as PET_*): the operator sets WORLD_SIZE = the pods, RANK = this pod's index and
/// MASTER_ADDR/MASTER_PORT = pod 0's service in every pod, so one container command serves
/// all of them. Taken only when all four are set and this launcher is not a worker of another
/// (PHALANX_STORE_HOSTED, which phalanx-run gives its workers, is unset). False with `error`
/// for a value that does not parse.
bool apply_pod_env(LaunchOptions& o, RawOptions& r, std::string& error) {
  for (const CLI::Option* given : {r.nnodes_opt, r.node_rank_opt, r.addr_opt, r.port_opt, r.endpoint_opt})
    if (given->count()) return true;
  if (o.standalone || env::text("PHALANX_STORE_HOSTED")) return true;
  const auto world = env::text("WORLD_SIZE"), rank = env::text("RANK"), addr = env::text("MASTER_ADDR"),
             port = env::text("MASTER_PORT");
  if (!world || !rank || !addr || !port) return true;
  try {
    const auto nodes = env::integer("WORLD_SIZE", 1, 1, 1 << 16);
    o.node_rank = static_cast<int>(env::integer("RANK", 0, 0, nodes - 1));
    o.master_port = static_cast<int>(env::integer("MASTER_PORT", 0, 1, 65535));
    r.nnodes = std::to_string(nodes);
    r.pod_node_rank = true;
  } catch (const std::exception& e) {
    error = std::string(e.what()) + " (read as a PyTorchJob pod's node count, node rank and store; pass --nnodes, "
                                    "--node-rank and --rdzv-endpoint to override)";
    return false;
  }
  o.master_addr = *addr;
  std::fprintf(stderr, "phalanx-run: node %d of %s from RANK and WORLD_SIZE (a PyTorchJob pod), node 0's store at %s:%d\n",
               o.node_rank, r.nnodes.c_str(), o.master_addr.c_str(), o.master_port);
  return true;
}

/// The first option given with --standalone that contradicts it ("" when none).
std::string standalone_clash(const LaunchOptions& o, const RawOptions& r) {
  if (o.nnodes > 1) return "--nnodes " + r.nnodes;
  if (r.endpoint_opt->count()) return "--rdzv-endpoint";
  if (r.addr_opt->count()) return "--master-addr";
  if (r.port_opt->count()) return "--master-port";
  if (r.node_rank_opt->count() && o.node_rank != 0) return "--node-rank " + std::to_string(o.node_rank);
  if (r.id_opt->count()) return "--rdzv-id";
  if (r.token_opt->count()) return "--rdzv-token";
  return "";
}

}  // namespace

bool parse_options(int argc, char** argv, LaunchOptions& o, int& exit_code) {
  CLI::App app{kAbout, "phalanx-run"};
  RawOptions raw;
  declare_options(app, o, raw);
  // The names the checks below use.
  auto& [nproc, nnodes, endpoint, backend, term_signal, no_python, pod_node_rank, nnodes_opt, node_rank_opt, addr_opt,
         port_opt, endpoint_opt, id_opt, token_opt] = raw;
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "phalanx-run: %s\n", msg.c_str());
    exit_code = 2;
    return false;
  };
  std::vector<std::string> mine;
  if (std::string error; !split_command_line(argc, argv, mine, o.command, error)) return fail(error);
  std::vector<std::string> reversed(mine.rbegin(), mine.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every usage error exits 2 (CLI11's own codes differ per error).
    exit_code = app.exit(e) == 0 ? 0 : 2;
    return false;
  }
  std::string error;
  if (!apply_pod_env(o, raw, error)) return fail(error);
  if (!parse_nnodes(nnodes, o.nnodes, o.min_nodes, error)) return fail(error);
  if (o.elastic() && node_rank_opt->count())
    return fail("--nnodes " + nnodes + " is elastic: node ranks change as nodes leave and join, so drop "
                "--node-rank (the launcher on --rdzv-endpoint's machine hosts the store, the others are ranked "
                "per round)");
  if (!term_signal.empty() && !parse_term_signal(term_signal, o.term_signal, error)) return fail(error);
  if (!parse_nproc(nproc, o.nproc_per_node, error)) return fail(error);
  if (backend != "c10d" && backend != "static")
    return fail("--rdzv-backend '" + backend +
                "' is not supported: phalanx-run's rendezvous is node 0's own TCP store; use "
                "--rdzv-backend=c10d (or static) with --rdzv-endpoint=HOST:PORT of node 0");
  if (endpoint_opt->count()) {
    if (addr_opt->count() || port_opt->count())
      return fail("give either --rdzv-endpoint HOST:PORT or --master-addr/--master-port, not both");
    if (!parse_endpoint(endpoint, o.master_addr, o.master_port, error)) return fail(error);
  }
  if (const std::string clash = o.standalone ? standalone_clash(o, raw) : ""; !clash.empty())
    return fail("--standalone is a single-node job on loopback with a free port and a fresh token; drop " + clash +
                " (or drop --standalone for a job across nodes)");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return fail("--node-rank " + std::to_string(o.node_rank) + " must be in [0, " + std::to_string(o.nnodes) + ")");
  if (o.nnodes > 1 && o.master_port == 0 && endpoint_opt->count())
    return fail("--rdzv-endpoint " + endpoint + ": port 0 (a free port) works for a single node only: the nodes of "
                "a job cannot agree on a port picked at random; give a fixed one, e.g. " + o.master_addr + ":29400");
  if (o.nnodes > 1 && o.master_port == 0)
    return fail("--master-port is required with --nnodes > 1 (or --rdzv-endpoint HOST:PORT): every node must "
                "use the same one");
  if (o.command.empty()) return fail("no worker program given (usage: phalanx-run [options] program [args...])");
  if (resolve_program(o.command[0]).empty())
    return fail("worker program '" + o.command[0] + "' not found or not executable");
  if (id_opt->count()) {
    if (token_opt->count())
      return fail("give either --rdzv-id (the token is derived from it) or --rdzv-token, not both");
    if (o.rdzv_id.empty() || o.rdzv_id.size() > 1024)
      return fail("--rdzv-id must be 1 to 1024 characters, the same on every node of the job");
    for (unsigned char c : o.rdzv_id)
      if (c < 0x20 || c == 0x7f) return fail("--rdzv-id must not contain control characters");
    const std::string secret = env::text(parallel::kRdzvSecretEnv).value_or("");
    o.rdzv_id_has_secret = !secret.empty();
    // One node without a secret gets a fresh random token (main): no other node needs to
    // compute it, and the id alone is guessable.
    if (o.nnodes > 1 || o.rdzv_id_has_secret)
      o.rdzv_token = parallel::derive_rdzv_token(o.rdzv_id, o.rdzv_id_has_secret ? secret : "");
  }
  if (o.rdzv_token.empty() && !o.standalone && !id_opt->count())
    o.rdzv_token = env::text("PHALANX_RDZV_TOKEN").value_or("");
  if (o.rdzv_token.empty() && o.nnodes > 1)
    return fail("--nnodes > 1 needs a job token shared by every node: pass --rdzv-id JOB (with "
                "PHALANX_RDZV_SECRET set to the same secret on each node), or set PHALANX_RDZV_TOKEN (or "
                "--rdzv-token) to the same secret on each node; without one anyone who can reach the "
                "store could join or stop the job");
  // A pod's RANK is its node rank, as --node-rank would be: a pod restarted by Kubernetes
  // comes back as the same node, where arrival order would find every rank taken.
  if (o.nnodes > 1 && !node_rank_opt->count() && !pod_node_rank) {
    o.assign_node_rank = true;
    o.node_rank = -1;
  }
  // PHALANX_TIMEOUT reaches every worker: checked here against the range --timeout has.
  if (o.timeout == 0) try {
      (void)default_timeout();
    } catch (const std::exception& e) {
      return fail(e.what());
    }
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
