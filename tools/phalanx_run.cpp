// phalanx-run: the launcher (torchrun for Phalanx). See `phalanx-run --help` and
// docs/launcher.md.
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <phalanx/parallel.hpp>

#include "launcher/job_rounds.hpp"
#include "launcher/launch_options.hpp"
#include "launcher/node_rank.hpp"
#include "launcher/rdzv_token.hpp"
#include "launcher/stop_report.hpp"
#include "launcher/worker_group.hpp"

using namespace phalanx;
using namespace phalanx::launcher;

namespace {

/// 16 random bytes as hex; false (with `error` set) when the system cannot give them: an
/// all-zero token would let any process on the host join the job.
bool random_token(std::string& token, std::string& error) {
  unsigned char b[16];
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
    else if (n < 0 && errno == EINTR) continue;
    else break;  // ENOSYS (old kernel) or another failure: try /dev/urandom
  }
  if (got < sizeof b) {
    got = 0;
    const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      error = std::string("cannot open /dev/urandom: ") + std::strerror(errno);
      return false;
    }
    while (got < sizeof b) {
      const ssize_t n = ::read(fd, b + got, sizeof b - got);
      if (n > 0) got += static_cast<std::size_t>(n);
      else if (n < 0 && errno == EINTR) continue;
      else break;
    }
    const int read_errno = errno;
    ::close(fd);
    if (got < sizeof b) {
      error = "short read of /dev/urandom (" + std::to_string(got) + " of 16 bytes" +
              (read_errno ? std::string(": ") + std::strerror(read_errno) : std::string()) + ")";
      return false;
    }
  }
  static const char* hex = "0123456789abcdef";
  token.clear();
  for (unsigned char c : b) token += hex[c >> 4], token += hex[c & 15];
  return true;
}

void print_tail(int rank, const std::vector<std::string>& tail) {
  if (!tail.empty()) {
    std::fprintf(stderr, "phalanx-run: last %zu line(s) of rank %d:\n", tail.size(), rank);
    for (const auto& l : tail) std::fprintf(stderr, "  | %s\n", l.c_str());
  } else {
    std::fprintf(stderr, "phalanx-run: rank %d printed nothing.\n", rank);
  }
}

void print_failure(const std::string& lead, const WorkerFailure& f, const std::vector<std::string>& tail,
                   int stopped, int local_world, int nnodes) {
  const std::string where = nnodes > 1 ? " on node " + std::to_string(f.node) : "";
  // Its own words from its failure record (not the launcher's own "killed by signal" post).
  const bool own_words = !f.message.empty() && f.message.rfind("killed by signal", 0) != 0;
  const std::string detail = own_words ? " (it said: " + f.message + ")" : "";
  std::fprintf(stderr, "phalanx-run: %srank %d%s (pid %d) %s%s", lead.c_str(), f.rank, where.c_str(), f.pid,
               describe_exit(f).c_str(), detail.c_str());
  // The others that were still running were stopped; the rest had ended on their own
  // (a rank that finished its batches before a peer with more failed: uneven inputs).
  const int others = local_world - 1, ended = others - stopped;
  if (stopped < 0 || others <= 0)
    std::fprintf(stderr, ".\n");
  else if (stopped == 0)
    std::fprintf(stderr, "; the other worker%s on this node had already ended.\n", others == 1 ? "" : "s");
  else if (ended > 0)
    std::fprintf(stderr, "; stopped the %d other worker(s) still running on this node (%d had already ended).\n",
                 stopped, ended);
  else
    std::fprintf(stderr, "; stopped the other %d of %d worker(s) on this node.\n", stopped, local_world);
  print_tail(f.rank, tail);
}

/// What differs when node 0's store refuses a node's token: the --rdzv-id (or secret), or
/// the token given by hand.
std::string token_source(const LaunchOptions& o) {
  if (!o.rdzv_id.empty())
    return std::string("--rdzv-id (this node's: '") + o.rdzv_id + "') or " + kRdzvSecretEnv;
  return "PHALANX_RDZV_TOKEN (or --rdzv-token)";
}

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

/// "node N", or "this launcher" while its node rank is not assigned yet.
std::string who(const LaunchOptions& o) {
  return o.node_rank >= 0 ? "node " + std::to_string(o.node_rank) : std::string("this launcher");
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions o;
  int code = 0;
  if (!parse_options(argc, argv, o, code)) return code;
  if (o.rdzv_token.empty() && o.nnodes == 1) {
    std::string error;
    if (!random_token(o.rdzv_token, error)) {
      std::fprintf(stderr, "phalanx-run: cannot make a job token: %s; pass one with --rdzv-token\n", error.c_str());
      return 1;
    }
  }
  if (o.nnodes > 1 && !o.rdzv_id.empty() && !o.rdzv_id_has_secret)
    std::fprintf(stderr,
                 "phalanx-run: note: the job token comes from --rdzv-id alone (%s is not set): anyone who knows "
                 "the id and can reach %s:%d can join or stop the job.\n",
                 kRdzvSecretEnv, o.master_addr.c_str(), o.master_port);
  install_signal_handlers();

  // The launcher of node 0 hosts the job's rendezvous store for the whole job (restarts
  // included: each attempt uses its own key prefix), bound to the master address only.
  // Without --node-rank, node 0 is the launcher that can bind the endpoint on its machine.
  std::unique_ptr<TcpStoreServer> server;
  int port = o.master_port;
  bool hosting = o.node_rank == 0;
  if (o.assign_node_rank) {
    std::string error;
    const EndpointBind b = probe_endpoint(o.master_addr, o.master_port, error);
    if (b == EndpointBind::kError) {
      std::fprintf(stderr, "phalanx-run: %s\n", error.c_str());
      return 2;
    }
    hosting = b == EndpointBind::kFree;
  }
  if (hosting) {
    TcpStoreOptions so;
    so.host = o.master_addr;
    so.port = o.master_port;
    so.token = o.rdzv_token;
    try {
      server = std::make_unique<TcpStoreServer>(so);
      port = server->port();
    } catch (const ConfigError& e) {
      if (!o.assign_node_rank) {
        std::fprintf(stderr, "phalanx-run: %s\n", e.what());
        return 2;
      }
      hosting = false;  // another launcher bound the port since the probe: it hosts
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx-run: %s\n", e.what());
      return 2;
    }
  }
  std::unique_ptr<RefusalWatch> refusals;
  if (server && o.nnodes > 1) refusals = std::make_unique<RefusalWatch>(*server, token_source(o));
  if (server && o.nnodes > 1)
    if (const std::string note = loopback_endpoint_note(o.master_addr); !note.empty())
      std::fprintf(stderr, "phalanx-run: %s\n", note.c_str());
  // The launcher's own client of the job's store: failure records (blame), and with several
  // nodes the rounds the launchers agree on.
  std::shared_ptr<Store> store;
  {
    TcpStoreOptions co;
    co.host = o.master_addr;
    co.port = port;
    co.token = o.rdzv_token;
    // Node 0's store is in this process. Another node waits for it as long as its workers
    // would (--timeout, else PHALANX_TIMEOUT, else 300 s), and at least --rdzv-timeout.
    std::chrono::milliseconds start_wait = ms(o.rdzv_timeout);
    try {
      start_wait = std::max(start_wait, o.timeout > 0 ? ms(o.timeout) : default_timeout());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx-run: %s\n", e.what());
      return 2;
    }
    co.timeout = hosting ? std::chrono::milliseconds(5000) : start_wait;
    try {
      store = std::make_shared<TcpStore>(co);
    } catch (const ConfigError& e) {  // node 0's store refused this node's token
      std::fprintf(stderr,
                   "phalanx-run: %s: node 0's store at %s:%d belongs to another job (it refused this node's "
                   "token): start every node with the same %s.\n",
                   who(o).c_str(), o.master_addr.c_str(), port, token_source(o).c_str());
      return 2;
    } catch (const std::exception& e) {
      if (o.nnodes > 1) {
        std::fprintf(stderr, "phalanx-run: %s: %s\n", who(o).c_str(), e.what());
        return 1;
      }
      // One node: blame by what the launcher sees alone.
    }
  }
  if (o.assign_node_rank) {
    if (hosting) {
      o.node_rank = 0;
    } else {
      try {
        o.node_rank = claim_node_rank(*store, o.nnodes);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "phalanx-run: this launcher: cannot get a node rank from the job's store: %s\n",
                     e.what());
        return 1;
      }
      if (o.node_rank < 0) {
        std::fprintf(stderr,
                     "phalanx-run: the job at %s:%d already has its %d nodes (node ranks 0 to %d are taken): this "
                     "launcher is one too many; check --nnodes, or give another job its own --rdzv-endpoint "
                     "port (a launcher restarted after its own died: give it its old --node-rank).\n",
                     o.master_addr.c_str(), port, o.nnodes, o.nnodes - 1);
        return 2;
      }
    }
    std::fprintf(stderr, "phalanx-run: node %d of %d (%s)\n", o.node_rank, o.nnodes,
                 hosting ? ("hosts the job's store on " + o.master_addr + ":" + std::to_string(port)).c_str()
                         : "node rank assigned by the job's store, in arrival order");
  }
  std::unique_ptr<JobRounds> rounds;
  if (o.nnodes > 1) {
    // The store is up now: the rounds (and the failure records) get a client of their own
    // whose calls give up within --rdzv-timeout, so a node 0 that is stopped (SIGSTOP) or
    // unreachable is given up on in that time, not in the workers' timeout.
    TcpStoreOptions co;
    co.host = o.master_addr;
    co.port = port;
    co.token = o.rdzv_token;
    co.timeout = std::min(ms(o.rdzv_timeout), store->timeout());
    try {
      store = std::make_shared<TcpStore>(co);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx-run: node %d: %s\n", o.node_rank, e.what());
      return 1;
    }
    const auto tick = std::min(std::max(ms(o.monitor_interval), std::chrono::milliseconds(20)),
                               std::chrono::milliseconds(1000));
    rounds = std::make_unique<JobRounds>(store, o.nnodes, o.node_rank, tick, ms(o.rdzv_timeout));
  }

  const bool progress = ::isatty(1) == 1;
  const int world = o.nnodes * o.nproc_per_node;
  int first_round = 0;
  if (rounds) {
    std::string fatal;
    try {
      first_round = rounds->join(o.nproc_per_node, fatal);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx-run: node %d: %s\n", o.node_rank, e.what());
      return 1;
    }
    if (!fatal.empty()) {
      rounds->post_fatal(first_round, fatal);
      std::fprintf(stderr, "phalanx-run: %s\n", fatal.c_str());
      return 2;
    }
    if (first_round > 0)
      std::fprintf(stderr, "phalanx-run: node %d joins the job in round %d (restart %d).\n", o.node_rank, first_round,
                   first_round);
  }
  for (int k = first_round;; ++k) {
    Attempt a;
    a.master_port = port;
    a.token = o.rdzv_token;
    a.restart_count = k;
    a.store = store.get();
    a.progress_passthrough = progress;
    if (rounds) {
      rounds->begin(k);
      a.stop_fd = rounds->wake_fd();
      a.stop_reason = [&] { return rounds->why(); };
      a.store_lost = [&] { return rounds->store_lost(); };
      a.on_first_failure = [&, k](const WorkerFailure& f) {
        rounds->close(k, "rank " + std::to_string(f.rank) + " " + describe_exit(f));
      };
    }
    const Outcome r = run_workers(o, a);
    if (!r.launch_error.empty()) {
      std::fprintf(stderr, "phalanx-run: %s; stopped the %d worker(s) already started.\n", r.launch_error.c_str(),
                   r.stopped_others);
      if (rounds) rounds->close(k, r.launch_error);
    }
    // A stop asked for: a signal to this launcher, workers that saved on a signal of their
    // own (srun's, kill's), or rank 0's stop record (also when its save failed). The job ends
    // here, with no restart; the other nodes read this node's report.
    const auto stop_rec = read_stop_record(store.get(), k);
    if (r.interrupted || (r.stopped_after_save > 0 && !r.blamed) || (stop_rec && !r.ok)) {
      const int sig = r.signal_received ? r.signal_received : stop_rec && stop_rec->signal ? stop_rec->signal : SIGTERM;
      if (rounds) {
        rounds->close(k, r.interrupted ? std::string("its launcher got ") + strsignal(sig)
                                       : std::string("its workers were asked to stop (") + strsignal(sig) + ")");
        NodeReport mine;
        mine.node = o.node_rank;
        mine.interrupted = sig;
        try {
          store->set("phalanx/launch/r" + std::to_string(k) + "/report/" + std::to_string(o.node_rank), to_json(mine));
        } catch (const std::exception&) {
        }
        rounds->leave(k);
      }
      return report_stop(r, stop_rec, o);
    }

    std::optional<WorkerFailure> blamed = r.blamed;
    std::vector<std::string> tail = r.tail;
    if (!rounds) {
      if (r.ok) return 0;
      if (blamed) print_failure("", *blamed, tail, r.stopped_others, o.nproc_per_node, 1);
    } else {
      if (!r.stopped_because.empty())
        std::fprintf(stderr, "phalanx-run: node %d: stopped %d worker(s): %s\n", o.node_rank, r.stopped_others,
                     r.stopped_because.c_str());
      NodeReport mine;
      mine.node = o.node_rank;
      mine.ok = r.ok;
      mine.max_restarts = o.max_restarts;
      mine.failure = r.blamed;
      mine.tail = r.tail;
      std::vector<NodeReport> reports;
      try {
        reports = rounds->exchange(k, mine, [] { return take_signal(); });
      } catch (const Interrupted& e) {
        std::fprintf(stderr, "phalanx-run: got %s while waiting for the other nodes; the job ends.\n",
                     strsignal(e.sig));
        return 128 + e.sig;
      } catch (const std::exception& e) {
        if (r.stopped_because != e.what()) std::fprintf(stderr, "phalanx-run: node %d: %s\n", o.node_rank, e.what());
        // A worker of this node that failed on its own is worth naming; one this launcher
        // stopped is not the cause.
        const bool own = r.blamed && blame_tier(*r.blamed) < 2;
        if (own) print_failure("on this node, ", *r.blamed, r.tail, -1, o.nproc_per_node, o.nnodes);
        return own ? exit_code_for(*r.blamed) : 1;
      }
      for (const auto& rep : reports)
        if (!rep.fatal.empty()) {
          std::fprintf(stderr, "phalanx-run: node %d: %s; the job ends.\n", rep.node, rep.fatal.c_str());
          rounds->finish(k, take_signal);
          return 2;
        }
      for (const auto& rep : reports)
        if (rep.interrupted) {
          std::fprintf(stderr, "phalanx-run: node %d's launcher got %s; the job ends.\n", rep.node,
                       strsignal(rep.interrupted));
          rounds->finish(k, take_signal);
          return r.stopped_after_save == o.nproc_per_node ? report_stop(r, read_stop_record(store.get(), k), o) : 1;
        }
      const auto verdict = job_blame(reports);
      if (!verdict) {
        bool all_ok = true;
        for (const auto& rep : reports) all_ok = all_ok && rep.ok;
        if (all_ok) {
          rounds->finish(k, take_signal);
          return 0;
        }
      }
      if (verdict) {
        blamed = verdict->failure;
        tail = verdict->tail;
        print_failure("the job failed in round " + std::to_string(k) + ": ", *blamed, tail, -1, o.nproc_per_node,
                      o.nnodes);
      } else {
        std::fprintf(stderr, "phalanx-run: round %d was stopped before any worker failed.\n", k);
      }
      o.max_restarts = reports[0].max_restarts;  // node 0's budget is the job's
    }
    if (k >= o.max_restarts) {
      if (o.max_restarts > 0) std::fprintf(stderr, "phalanx-run: giving up after %d restart(s).\n", o.max_restarts);
      if (rounds) rounds->finish(k, take_signal);
      return blamed ? exit_code_for(*blamed) : 1;
    }
    std::fprintf(stderr, "phalanx-run: restarting the group (restart %d of %d, world size %d).\n", k + 1,
                 o.max_restarts, world);
  }
}
