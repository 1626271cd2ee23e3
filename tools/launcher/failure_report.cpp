#include "failure_report.hpp"

#include <cstdio>

namespace phalanx::launcher {

namespace {

void print_tail(int rank, const std::vector<std::string>& tail) {
  if (!tail.empty()) {
    std::fprintf(stderr, "phalanx-run: last %zu line(s) of rank %d:\n", tail.size(), rank);
    for (const auto& l : tail) std::fprintf(stderr, "  | %s\n", l.c_str());
  } else {
    std::fprintf(stderr, "phalanx-run: rank %d printed nothing.\n", rank);
  }
}

}  // namespace

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

}  // namespace phalanx::launcher
