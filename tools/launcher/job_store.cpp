#include "job_store.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <phalanx/backends/default_timeout.hpp>
#include <phalanx/core/error.hpp>

#include "launch_error.hpp"
#include "node_rank.hpp"
#include "phalanx/parallel/internal/rdzv_token.hpp"

namespace phalanx::launcher {

/// Node 0: says once, in the launcher's words, that its store refused a connection with
/// another job's token (the store logs each refusal itself). The job keeps waiting for its
/// own nodes: anyone who reaches the port could otherwise end it.
class RefusalWatch {
 public:
  RefusalWatch(const TcpStoreServer& server, std::string source)
      : thread_([this, &server, source = std::move(source)] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return quit_; }))
            if (server.rejected_connections() > 0) {
              std::fprintf(stderr,
                           "phalanx-run: node 0: refused a launcher or worker with another job token: was another "
                           "node started with a different %s? This job keeps waiting for its own nodes.\n",
                           source.c_str());
              return;
            }
        }) {}
  ~RefusalWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool quit_ = false;
  std::thread thread_;
};

JobStore::JobStore() = default;
JobStore::JobStore(JobStore&&) noexcept = default;
JobStore::~JobStore() = default;

namespace {

/// What differs when node 0's store refuses a node's token: the --rdzv-id (or secret), or
/// the token given by hand.
std::string token_source(const LaunchOptions& o) {
  if (!o.rdzv_id.empty())
    return std::string("--rdzv-id (this node's: '") + o.rdzv_id + "') or " + parallel::kRdzvSecretEnv;
  return "PHALANX_RDZV_TOKEN (or --rdzv-token)";
}

/// "node N", or "this launcher" while its node rank is not assigned yet.
std::string who(const LaunchOptions& o) {
  return o.node_rank >= 0 ? "node " + std::to_string(o.node_rank) : std::string("this launcher");
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

TcpStoreOptions client_options(const LaunchOptions& o, int port, std::chrono::milliseconds timeout) {
  TcpStoreOptions co;
  co.host = o.master_addr;
  co.port = port;
  co.token = o.rdzv_token;
  co.timeout = timeout;
  return co;
}

/// Node 0 (or, without --node-rank, the launcher that can bind the endpoint) starts the
/// store; with several nodes it also watches for refused tokens.
void host_store(const LaunchOptions& o, JobStore& js) {
  js.port = o.master_port;
  js.hosting = o.node_rank == 0;
  if (o.assign_node_rank) {
    std::string error;
    const EndpointBind b = probe_endpoint(o.master_addr, o.master_port, error);
    if (b == EndpointBind::kError) throw LaunchError(2, error);
    js.hosting = b == EndpointBind::kFree;
  }
  if (js.hosting) {
    TcpStoreOptions so;
    so.host = o.master_addr;
    so.port = o.master_port;
    so.token = o.rdzv_token;
    try {
      js.server = std::make_unique<TcpStoreServer>(so);
      js.port = js.server->port();
    } catch (const ConfigError& e) {
      if (!o.assign_node_rank) throw LaunchError(2, e.what());
      js.hosting = false;  // another launcher bound the port since the probe: it hosts
    } catch (const std::exception& e) {
      throw LaunchError(2, e.what());
    }
  }
  if (js.server && o.nnodes > 1) js.refusals = std::make_unique<RefusalWatch>(*js.server, token_source(o));
  if (js.server && o.nnodes > 1)
    if (const std::string note = loopback_endpoint_note(o.master_addr); !note.empty())
      std::fprintf(stderr, "phalanx-run: %s\n", note.c_str());
}

/// The launcher's own client of the job's store: failure records (blame), and with several
/// nodes the rounds the launchers agree on.
void connect_store(const LaunchOptions& o, JobStore& js) {
  // Node 0's store is in this process. Another node waits for it as long as its workers
  // would (--timeout, else PHALANX_TIMEOUT, else 300 s), and at least --rdzv-timeout.
  std::chrono::milliseconds start_wait = ms(o.rdzv_timeout);
  try {
    start_wait = std::max(start_wait, o.timeout > 0 ? ms(o.timeout) : default_timeout());
  } catch (const std::exception& e) {
    throw LaunchError(2, e.what());
  }
  try {
    js.store = std::make_shared<TcpStore>(
        client_options(o, js.port, js.hosting ? std::chrono::milliseconds(5000) : start_wait));
  } catch (const ConfigError& e) {
    // The client's ConfigErrors are a refused token or a host that does not resolve (a
    // Kubernetes service whose DNS record is not there yet): only the first is another job.
    // The refusal's wording is pinned by backends_tests (test_stores.cpp).
    if (std::string(e.what()).find("refused this worker's job token") == std::string::npos)
      throw LaunchError(2, who(o) + ": " + e.what());
    throw LaunchError(2, who(o) + ": node 0's store at " + o.master_addr + ":" + std::to_string(js.port) +
                             " belongs to another job (it refused this node's token): start every node with the "
                             "same " + token_source(o) + ".");
  } catch (const std::exception& e) {
    if (o.nnodes > 1) throw LaunchError(1, who(o) + ": " + e.what());
    // One node: blame by what the launcher sees alone.
  }
}

/// Without --node-rank: node 0 is the host, the others take theirs from the store.
void assign_node_rank(LaunchOptions& o, const JobStore& js) {
  if (js.hosting) {
    o.node_rank = 0;
  } else {
    try {
      o.node_rank = claim_node_rank(*js.store, o.nnodes);
    } catch (const std::exception& e) {
      throw LaunchError(1, std::string("this launcher: cannot get a node rank from the job's store: ") + e.what());
    }
    if (o.node_rank < 0)
      throw LaunchError(2, "the job at " + o.master_addr + ":" + std::to_string(js.port) + " already has its " +
                               std::to_string(o.nnodes) + " nodes (node ranks 0 to " + std::to_string(o.nnodes - 1) +
                               " are taken): this launcher is one too many; check --nnodes, or give another job its "
                               "own --rdzv-endpoint port (a launcher restarted after its own died: give it its old "
                               "--node-rank).");
  }
  std::fprintf(stderr, "phalanx-run: node %d of %d (%s)\n", o.node_rank, o.nnodes,
               js.hosting ? ("hosts the job's store on " + o.master_addr + ":" + std::to_string(js.port)).c_str()
                          : "node rank assigned by the job's store, in arrival order");
}

/// Several nodes, once the store is up: the rounds (and the failure records) get a client of
/// their own whose calls give up within --rdzv-timeout, so a node 0 that is stopped
/// (SIGSTOP) or unreachable is given up on in that time, not in the workers' timeout.
void start_rounds(LaunchOptions& o, JobStore& js) {
  if (o.elastic()) {  // node ranks and rounds come from the membership (membership.hpp)
    try {
      js.store = std::make_shared<TcpStore>(
          client_options(o, js.port, std::min(ms(o.rdzv_timeout), js.store->timeout())));
    } catch (const std::exception& e) {
      throw LaunchError(1, who(o) + ": " + e.what());
    }
    o.node_rank = js.hosting ? 0 : -1;
    return;
  }
  try {
    js.store = std::make_shared<TcpStore>(
        client_options(o, js.port, std::min(ms(o.rdzv_timeout), js.store->timeout())));
  } catch (const std::exception& e) {
    throw LaunchError(1, "node " + std::to_string(o.node_rank) + ": " + e.what());
  }
  const auto tick = std::min(std::max(ms(o.monitor_interval), std::chrono::milliseconds(20)),
                             std::chrono::milliseconds(1000));
  js.rounds = std::make_unique<JobRounds>(js.store, o.nnodes, o.node_rank, tick, ms(o.rdzv_timeout));
}

}  // namespace

JobStore open_job_store(LaunchOptions& o) {
  JobStore js;
  host_store(o, js);
  connect_store(o, js);
  if (o.assign_node_rank && !o.elastic()) assign_node_rank(o, js);
  if (o.nnodes > 1) start_rounds(o, js);
  return js;
}

}  // namespace phalanx::launcher
