// phalanx-run: the launcher (torchrun for Phalanx). See `phalanx-run --help` and
// docs/launcher.md.
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>

#include <phalanx/parallel.hpp>

#include "launcher/launch_options.hpp"
#include "launcher/worker_group.hpp"

using namespace phalanx;
using namespace phalanx::launcher;

namespace {
std::string random_token() {
  unsigned char b[16] = {0};
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (::read(fd, b, sizeof b) < 0) {
    }
    ::close(fd);
  }
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) t += hex[c >> 4], t += hex[c & 15];
  return t;
}

void print_failure(const Outcome& r, int world) {
  std::string how = r.term_signal ? "was killed by signal " + std::to_string(r.term_signal) + " (" +
                                        strsignal(r.term_signal) + ")"
                                  : "exited with code " + std::to_string(r.exit_code);
  std::fprintf(stderr, "phalanx-run: rank %d (pid %d) %s; stopped the other %d of %d worker(s) on this node.\n",
               r.failed_rank, r.failed_pid, how.c_str(), r.stopped_others, world);
  if (!r.tail.empty()) {
    std::fprintf(stderr, "phalanx-run: last %zu line(s) of rank %d:\n", r.tail.size(), r.failed_rank);
    for (const auto& l : r.tail) std::fprintf(stderr, "  | %s\n", l.c_str());
  } else {
    std::fprintf(stderr, "phalanx-run: rank %d printed nothing.\n", r.failed_rank);
  }
}
}  // namespace

int main(int argc, char** argv) {
  LaunchOptions o;
  int code = 0;
  if (!parse_options(argc, argv, o, code)) return code;
  if (o.rdzv_token.empty() && o.nnodes == 1) o.rdzv_token = random_token();
  install_signal_handlers();

  // The launcher of node 0 hosts the job's rendezvous store for the whole job (restarts
  // included: each attempt uses its own key prefix), bound to the master address only.
  std::unique_ptr<TcpStoreServer> server;
  int port = o.master_port;
  if (o.node_rank == 0) {
    TcpStoreOptions so;
    so.host = o.master_addr;
    so.port = o.master_port;
    so.token = o.rdzv_token;
    try {
      server = std::make_unique<TcpStoreServer>(so);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "phalanx-run: %s\n", e.what());
      return 2;
    }
    port = server->port();
  }

  const int world = o.nnodes * o.nproc_per_node;
  for (int attempt = 0;; ++attempt) {
    const Outcome r = run_workers(o, port, o.rdzv_token, attempt);
    if (r.ok) return 0;
    if (r.interrupted) {
      std::fprintf(stderr, "phalanx-run: got %s, stopped all workers.\n", strsignal(r.signal_received));
      return 128 + r.signal_received;
    }
    print_failure(r, o.nproc_per_node);
    if (attempt >= o.max_restarts) {
      if (o.max_restarts > 0)
        std::fprintf(stderr, "phalanx-run: giving up after %d restart(s).\n", o.max_restarts);
      return r.term_signal ? 128 + r.term_signal : (r.exit_code ? r.exit_code : 1);
    }
    std::fprintf(stderr, "phalanx-run: restarting the group (restart %d of %d, world size %d).\n", attempt + 1,
                 o.max_restarts, world);
  }
}
